//! Start the ranks of a boltccl job, locally or over ssh, and supervise them.
//!
//! The one launcher behind `boltccl launch` and `python -m boltccl.launch`. It generates the
//! job key, sets each rank's environment, prefixes every output line with the rank, and when
//! any rank fails stops the others (unless told to keep going), prints every failing rank's
//! last stderr lines and exits non-zero.

mod hostfile;

pub use hostfile::{load_hostfile, parse_hostfile};

use boltccl::config::{self, HostEntry};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Lines of stderr kept per rank for the failure report.
const TAIL: usize = 40;
/// How long ranks get to exit after SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(2);
/// How long the ranks' last output may take to arrive after they exited.
const DRAIN: Duration = Duration::from_secs(1);
/// Coordinator port on the first host of a hostfile job, unless told otherwise.
pub const DEFAULT_REMOTE_PORT: u16 = 32323;

/// Where the ranks run.
#[derive(Debug, Clone)]
pub enum Placement {
    /// This many ranks on this machine (coordinator on 127.0.0.1).
    Local(usize),
    /// One rank per host entry, started over ssh (`BOLTCCL_SSH` replaces the `ssh` command).
    Hosts(Vec<HostEntry>),
}

/// A job to launch.
#[derive(Debug, Clone)]
pub struct Job {
    /// Where the ranks run.
    pub placement: Placement,
    /// Coordinator port (default: a free port for local runs, [`DEFAULT_REMOTE_PORT`] for hosts).
    pub port: Option<u16>,
    /// Extra environment for every rank.
    pub env: Vec<(String, String)>,
    /// Pin local ranks to cores when there are at least as many ranks as cores, as mpirun
    /// does: it keeps the scheduler from shuffling busy-polling ranks between cores (about 20%
    /// lower small-message latency at 4 ranks on 2 cores), and keeps a rank's threads on its
    /// own core (an MLX program's 4-byte all_sum at 2 ranks on 2 cores: 160-180 us unpinned,
    /// 19-22 us pinned, measured 2026-12-01).
    pub pin: bool,
    /// Kill everything if the job runs longer than this.
    pub timeout: Option<Duration>,
    /// Let the other ranks run on when one fails, for programs whose survivors go on without
    /// it (`Group::shrink`, as `boltccl-llm serve` heals); the job still exits with the first
    /// failure's code once every rank has exited.
    pub keep_going: bool,
    /// Command and arguments to run on every rank.
    pub command: Vec<String>,
}

impl Job {
    /// `n` local ranks of `command`, pinned when they take every core, no time limit.
    pub fn local(n: usize, command: Vec<String>) -> Job {
        Job {
            placement: Placement::Local(n),
            port: None,
            env: Vec::new(),
            pin: true,
            timeout: None,
            keep_going: false,
            command,
        }
    }

    fn ranks(&self) -> usize {
        match &self.placement {
            Placement::Local(n) => *n,
            Placement::Hosts(h) => h.len(),
        }
    }
}

/// The variable that points MLX's `mpi` backend at its MPI library.
pub const MLX_MPI_LIBNAME: &str = "MLX_MPI_LIBNAME";

/// The file name of libboltccl_mpi on this platform (`libboltccl_mpi.so`, `.dylib`).
pub fn mpi_library_name() -> String {
    format!("{}boltccl_mpi{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

impl Job {
    /// Point MLX's `mpi` backend in every rank at `library` (libboltccl_mpi), so that
    /// `mx.distributed` runs over boltccl, unless `MLX_MPI_LIBNAME` is already set, in the
    /// launcher's environment or by the job's own `env`, or no library was found.
    pub fn with_mlx_mpi_library(mut self, library: Option<std::path::PathBuf>) -> Job {
        let given = std::env::var_os(MLX_MPI_LIBNAME).is_some() || self.env.iter().any(|(k, _)| k == MLX_MPI_LIBNAME);
        if let Some(lib) = library.filter(|l| !given && l.is_file()) {
            self.env.push((MLX_MPI_LIBNAME.into(), lib.display().to_string()));
        }
        self
    }
}

/// Parse `KEY=VALUE` (the `--env` option of both front ends).
pub fn parse_env(kv: &str) -> Result<(String, String), String> {
    let (k, v) = kv.split_once('=').ok_or_else(|| format!("--env {kv}: expected KEY=VALUE"))?;
    Ok((k.to_string(), v.to_string()))
}

struct Rank {
    child: Child,
    tail: Arc<Mutex<VecDeque<String>>>,
    sink: Sink,
    status: Option<ExitStatus>,
    /// It failed on its own (not stopped by the launcher after another rank failed).
    failed: bool,
}

fn job_key() -> String {
    let mut k = [0u8; 16];
    getrandom::getrandom(&mut k).expect("the OS random source works");
    k.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where one rank's output goes.
#[derive(Clone)]
enum Sink {
    /// Printed with a `[rank] ` prefix, stdout to stdout and stderr to stderr.
    Print,
    /// Kept, stdout and stderr interleaved by line (for [`run_captured`]).
    Keep(Arc<Mutex<String>>),
}

/// Copy `stream` line by line to `sink`, keeping stderr's last lines in `tail`; says `done`
/// at end of file.
fn relay(
    rank: usize,
    stream: impl Read + Send + 'static,
    to_stderr: bool,
    tail: Arc<Mutex<VecDeque<String>>>,
    sink: Sink,
    done: mpsc::Sender<()>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if to_stderr {
                let mut t = tail.lock();
                if t.len() == TAIL {
                    t.pop_front();
                }
                t.push_back(line.clone());
            }
            match (&sink, to_stderr) {
                (Sink::Keep(buf), _) => {
                    let mut b = buf.lock();
                    b.push_str(&line);
                    b.push('\n');
                }
                (Sink::Print, true) => drop(writeln!(std::io::stderr().lock(), "[{rank}] {line}")),
                (Sink::Print, false) => drop(writeln!(std::io::stdout().lock(), "[{rank}] {line}")),
            }
        }
        let _ = done.send(());
    });
}

/// Quote for a POSIX shell (the remote side of ssh runs one).
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Exit code of a job stopped at its time limit (as `timeout(1)` exits).
pub const TIMED_OUT: i32 = 124;

/// Run the job, relaying every rank's output with a `[rank] ` prefix. Returns the process
/// exit code: 0 when every rank succeeded, the first failing rank's code (1 when it died of a
/// signal), [`TIMED_OUT`] at the time limit, 2 when the job could not start.
pub fn run(job: &Job) -> i32 {
    match launch(job, &Sink::Print) {
        Ok((code, _)) => code,
        Err(e) => {
            eprintln!("boltccl launch: {e}");
            2
        }
    }
}

/// Run the job, keeping each rank's output (stdout and stderr interleaved by line) instead of
/// printing it: for programs and tests that look at what every rank said. Returns the exit
/// code as [`run`] does, and the outputs in rank order.
pub fn run_captured(job: &Job) -> Result<(i32, Vec<String>), String> {
    launch(job, &Sink::Keep(Arc::default()))
}

fn launch(job: &Job, sink: &Sink) -> Result<(i32, Vec<String>), String> {
    let hosts = match &job.placement {
        Placement::Hosts(h) if h.is_empty() => return Err("the hostfile lists no hosts".into()),
        Placement::Hosts(h) => Some(h),
        Placement::Local(0) => return Err("say how many ranks: -n N (at least 1), or --hostfile FILE".into()),
        Placement::Local(_) => None,
    };
    if job.command.is_empty() {
        return Err("no command given: `boltccl launch -n N -- PROGRAM [ARGS]`".into());
    }
    let n = job.ranks();
    let key = job_key();
    let coordinator = match hosts {
        None => {
            let port = match job.port {
                Some(p) => p,
                None => boltccl::free_coordinator_port(std::net::Ipv4Addr::LOCALHOST.into())
                    .map_err(|e| format!("no free port on 127.0.0.1: {e}"))?,
            };
            format!("127.0.0.1:{port}")
        }
        Some(h) => {
            let first = h[0].ips.first().unwrap_or(&h[0].ssh);
            format!("{first}:{}", job.port.unwrap_or(DEFAULT_REMOTE_PORT))
        }
    };
    let start = Instant::now();
    let (done, done_rx) = mpsc::channel();
    let mut ranks = Vec::with_capacity(n);
    // Read once: spawning moves this thread to each rank's core and back.
    let pinned = (hosts.is_none() && job.pin).then(|| cores_if_every_core_is_taken(n)).flatten();
    for rank in 0..n {
        let mut env: Vec<(String, String)> = vec![
            (config::RANK.into(), rank.to_string()),
            (config::WORLD_SIZE.into(), n.to_string()),
            (config::COORDINATOR.into(), coordinator.clone()),
            (config::JOB_KEY.into(), key.clone()),
        ];
        let local = match hosts {
            None => n,
            Some(h) => h.iter().filter(|e| e.ssh == h[rank].ssh).count(),
        };
        env.push((config::LOCAL_WORLD_SIZE.into(), local.to_string()));
        if let Some(ip) = hosts.and_then(|h| h[rank].ips.first()) {
            env.push((config::BIND.into(), ip.clone()));
        }
        env.extend(job.env.iter().cloned());
        let mut cmd = match hosts {
            None => {
                let mut c = Command::new(&job.command[0]);
                c.args(&job.command[1..]);
                c.envs(env.iter().map(|(k, v)| (k, v)));
                c
            }
            Some(h) => {
                // The remote shell gets the environment inline and the caller's directory.
                let ssh = std::env::var("BOLTCCL_SSH").unwrap_or_else(|_| "ssh".into());
                let mut parts: Vec<String> = ssh.split_whitespace().map(String::from).collect();
                let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| ".".into());
                let assignments: Vec<String> = env.iter().map(|(k, v)| format!("{k}={}", shell_quote(v))).collect();
                let remote = format!(
                    "cd {} && exec env {} {}",
                    shell_quote(&cwd),
                    assignments.join(" "),
                    job.command.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ")
                );
                let mut c = Command::new(parts.remove(0));
                c.args(parts).args(["-o", "BatchMode=yes", &h[rank].ssh, &remote]);
                c
            }
        };
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let core = pinned.as_ref().map(|cores| usize::from(cores[rank % cores.len()]));
        let mut child = spawn_on(&mut cmd, core).map_err(|e| format!("cannot start `{}`: {e}", job.command[0]))?;
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let sink = match sink {
            Sink::Print => Sink::Print,
            Sink::Keep(_) => Sink::Keep(Arc::default()),
        };
        relay(rank, child.stdout.take().expect("piped"), false, tail.clone(), sink.clone(), done.clone());
        relay(rank, child.stderr.take().expect("piped"), true, tail.clone(), sink.clone(), done.clone());
        ranks.push(Rank { child, tail, sink, status: None, failed: false });
    }
    let code = supervise(&mut ranks, job.timeout, job.keep_going, start);
    // The ranks are gone; give their output a moment to drain (a grandchild that kept a pipe
    // open must not hold the launcher).
    let drain = Instant::now() + DRAIN;
    for _ in 0..2 * ranks.len() {
        if done_rx.recv_timeout(drain.saturating_duration_since(Instant::now())).is_err() {
            break;
        }
    }
    report_failures(&ranks);
    let outputs = ranks
        .iter()
        .map(|r| match &r.sink {
            Sink::Keep(buf) => buf.lock().clone(),
            Sink::Print => String::new(),
        })
        .collect();
    Ok((code, outputs))
}

/// The cores to pin local ranks to, rank r on the (r mod k)-th, when the `n` ranks leave no
/// core free. Then each rank has a core's worth of CPU anyway, and on its own core a rank's
/// threads hand work to each other (an MLX program's main and communication threads) without
/// waking a core that another rank's polling keeps busy. They are the cores this launcher may
/// run on, so under `taskset` or in a cpuset its ranks stay inside the set; none off Linux.
fn cores_if_every_core_is_taken(n: usize) -> Option<Vec<u16>> {
    let cores = boltccl::cpus();
    // A CPU quota below the cores allowed leaves no core free sooner.
    let free = std::thread::available_parallelism().map_or(cores.len(), |p| p.get().min(cores.len()));
    (!cores.is_empty() && n >= free).then_some(cores)
}

/// Spawn `cmd`, on `core` alone if given. The child inherits the spawning thread's affinity,
/// so this thread moves to the core for the spawn and back: the child runs pinned from its
/// first instruction (pinning it after the spawn would race with the threads it starts).
#[cfg(target_os = "linux")]
fn spawn_on(cmd: &mut Command, core: Option<usize>) -> std::io::Result<Child> {
    use rustix::process::{sched_getaffinity, sched_setaffinity, CpuSet};
    let Some(core) = core else { return cmd.spawn() };
    let mut one = CpuSet::new();
    one.set(core);
    let before = match sched_getaffinity(None) {
        Ok(before) => before,
        Err(e) => {
            eprintln!("boltccl launch: could not read this thread's cores ({e}); the rank runs unpinned");
            return cmd.spawn();
        }
    };
    if let Err(e) = sched_setaffinity(None, &one) {
        eprintln!("boltccl launch: could not pin a rank to core {core} ({e}); it runs unpinned");
        return cmd.spawn();
    }
    let child = cmd.spawn();
    if let Err(e) = sched_setaffinity(None, &before) {
        eprintln!("boltccl launch: could not restore this thread's cores ({e})");
    }
    child
}

/// Spawn `cmd`: macOS has no way to pin a thread to a core, so ranks run where the OS puts
/// them.
#[cfg(not(target_os = "linux"))]
fn spawn_on(cmd: &mut Command, _core: Option<usize>) -> std::io::Result<Child> {
    cmd.spawn()
}

/// Wait for every rank; stop them all when one fails (unless `keep_going`) or the time limit
/// passes. Returns the job's exit code.
fn supervise(ranks: &mut [Rank], limit: Option<Duration>, keep_going: bool, start: Instant) -> i32 {
    let mut first_failed: Option<usize> = None;
    let mut stopping: Option<Instant> = None;
    let mut timed_out = false;
    loop {
        for (i, r) in ranks.iter_mut().enumerate() {
            if r.status.is_none() {
                if let Ok(Some(st)) = r.child.try_wait() {
                    r.status = Some(st);
                    // A rank that exits with an error code failed on its own; one killed by
                    // our SIGTERM after the first failure did not.
                    if !st.success() && (stopping.is_none() || st.code().is_some()) {
                        r.failed = true;
                        first_failed.get_or_insert(i);
                        if keep_going && stopping.is_none() {
                            eprintln!(
                                "boltccl launch: rank {i} failed ({}); the others go on (--keep-going)",
                                describe(st)
                            );
                        }
                    }
                }
            }
        }
        let running: Vec<usize> = (0..ranks.len()).filter(|&i| ranks[i].status.is_none()).collect();
        if running.is_empty() {
            break;
        }
        let over_time = limit.is_some_and(|l| start.elapsed() > l);
        if ((first_failed.is_some() && !keep_going) || over_time) && stopping.is_none() {
            if let (true, Some(l)) = (over_time, limit) {
                timed_out = true;
                eprintln!("boltccl launch: timed out after {:.0} s; stopping every rank", l.as_secs_f64());
            } else if let Some(i) = first_failed {
                eprintln!("boltccl launch: a rank failed (rank {i}); stopping the other ranks");
            }
            for &i in &running {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_child(&ranks[i].child),
                    rustix::process::Signal::Term,
                );
            }
            stopping = Some(Instant::now());
        }
        if stopping.is_some_and(|t| t.elapsed() > GRACE) {
            for &i in &running {
                let _ = ranks[i].child.kill();
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    match first_failed {
        Some(i) => ranks[i].status.and_then(|s| s.code()).filter(|&c| c != 0).unwrap_or(1),
        None if timed_out => TIMED_OUT,
        None => 0,
    }
}

/// Print the last stderr lines of every rank that failed on its own.
fn report_failures(ranks: &[Rank]) {
    let mut err = std::io::stderr().lock();
    for (i, r) in ranks.iter().enumerate().filter(|(_, r)| r.failed) {
        let st = r.status.expect("exited");
        let _ = writeln!(err, "\n=== rank {i} failed ({}) — last lines of its stderr:", describe(st));
        for line in r.tail.lock().iter() {
            let _ = writeln!(err, "    {line}");
        }
    }
}

fn describe(st: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "unknown status".into(),
    }
}
