//! `boltccl launch`: run N ranks of a command, locally or over ssh.
//!
//! Generates the job key, sets each rank's environment, prefixes every output line with the
//! rank, and when any rank fails stops the others, prints every failing rank's last stderr
//! lines and exits non-zero.

use boltccl::config::{self, parse_launch_hostfile, HostEntry};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Lines of stderr kept per rank for the failure report.
const TAIL: usize = 40;
/// How long ranks get to exit after SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(2);

/// Options of `boltccl launch`.
#[derive(clap::Args, Debug, Clone)]
pub struct LaunchArgs {
    /// Number of local ranks (on 127.0.0.1).
    #[arg(short = 'n', long, conflicts_with = "hostfile")]
    pub ranks: Option<usize>,
    /// JSON hostfile (MLX launcher format: [{"ssh": "host", "ips": ["10.0.0.1"]}, ...], or a
    /// list of host names): one rank per entry, started over ssh.
    #[arg(long)]
    pub hostfile: Option<PathBuf>,
    /// Coordinator port (default: a free port for local runs, 32323 for hostfiles).
    #[arg(long)]
    pub port: Option<u16>,
    /// Extra environment for every rank (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Kill everything if the job runs longer than this many seconds (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub timeout_s: u64,
    /// Command and arguments to run on every rank.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

struct Rank {
    child: Child,
    tail: Arc<Mutex<VecDeque<String>>>,
    status: Option<ExitStatus>,
}

fn job_key() -> String {
    let mut k = [0u8; 16];
    getrandom::getrandom(&mut k).expect("the OS random source works");
    k.iter().map(|b| format!("{b:02x}")).collect()
}

fn relay(rank: usize, stream: impl Read + Send + 'static, to_stderr: bool, tail: Arc<Mutex<VecDeque<String>>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if to_stderr {
                let mut t = tail.lock();
                if t.len() == TAIL {
                    t.pop_front();
                }
                t.push_back(line.clone());
                drop(t);
                let _ = writeln!(std::io::stderr().lock(), "[{rank}] {line}");
            } else {
                let _ = writeln!(std::io::stdout().lock(), "[{rank}] {line}");
            }
        }
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

/// Run the job; returns the process exit code.
pub fn run(args: &LaunchArgs) -> i32 {
    match launch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("boltccl launch: {e}");
            2
        }
    }
}

fn launch(args: &LaunchArgs) -> Result<i32, String> {
    let hosts: Option<Vec<HostEntry>> = match &args.hostfile {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            Some(parse_launch_hostfile(&text).map_err(|e| format!("{}: {e}", p.display()))?)
        }
        None => None,
    };
    let n = match (&hosts, args.ranks) {
        (Some(h), _) => h.len(),
        (None, Some(n)) if n > 0 => n,
        _ => return Err("say how many ranks: -n N, or --hostfile FILE".into()),
    };
    let key = job_key();
    let coordinator = match &hosts {
        None => {
            let port = match args.port {
                Some(p) => p,
                None => std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map_err(|e| format!("no free port on 127.0.0.1: {e}"))?
                    .port(),
            };
            format!("127.0.0.1:{port}")
        }
        Some(h) => {
            let first = h[0].ips.first().unwrap_or(&h[0].ssh);
            format!("{first}:{}", args.port.unwrap_or(32323))
        }
    };
    let mut extra = Vec::new();
    for kv in &args.env {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("--env {kv}: expected KEY=VALUE"))?;
        extra.push((k.to_string(), v.to_string()));
    }
    let start = Instant::now();
    let mut ranks = Vec::with_capacity(n);
    for rank in 0..n {
        let mut env: Vec<(String, String)> = vec![
            (config::RANK.into(), rank.to_string()),
            (config::WORLD_SIZE.into(), n.to_string()),
            (config::COORDINATOR.into(), coordinator.clone()),
            (config::JOB_KEY.into(), key.clone()),
        ];
        let local = match &hosts {
            None => n,
            Some(h) => h.iter().filter(|e| e.ssh == h[rank].ssh).count(),
        };
        env.push((config::LOCAL_WORLD_SIZE.into(), local.to_string()));
        if let Some(ip) = hosts.as_ref().and_then(|h| h[rank].ips.first()) {
            env.push((config::BIND.into(), ip.clone()));
        }
        env.extend(extra.iter().cloned());
        let mut cmd = match &hosts {
            None => {
                let mut c = Command::new(&args.command[0]);
                c.args(&args.command[1..]);
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
                    args.command.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ")
                );
                let mut c = Command::new(parts.remove(0));
                c.args(parts).args(["-o", "BatchMode=yes", &h[rank].ssh, &remote]);
                c
            }
        };
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("cannot start `{}`: {e}", args.command[0]))?;
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        relay(rank, child.stdout.take().expect("piped"), false, tail.clone());
        relay(rank, child.stderr.take().expect("piped"), true, tail.clone());
        ranks.push(Rank { child, tail, status: None });
    }
    supervise(&mut ranks, args.timeout_s, start)
}

fn supervise(ranks: &mut [Rank], timeout_s: u64, start: Instant) -> Result<i32, String> {
    let mut failed: Vec<usize> = Vec::new();
    let mut stopping: Option<Instant> = None;
    loop {
        for (i, r) in ranks.iter_mut().enumerate() {
            if r.status.is_none() {
                if let Ok(Some(st)) = r.child.try_wait() {
                    r.status = Some(st);
                    // A rank that exits with an error code failed on its own; one killed by
                    // our SIGTERM after the first failure did not.
                    if !st.success() && (stopping.is_none() || st.code().is_some()) {
                        failed.push(i);
                    }
                }
            }
        }
        let running: Vec<usize> = (0..ranks.len()).filter(|&i| ranks[i].status.is_none()).collect();
        if running.is_empty() {
            break;
        }
        let over_time = timeout_s > 0 && start.elapsed() > Duration::from_secs(timeout_s);
        if (!failed.is_empty() || over_time) && stopping.is_none() {
            if over_time {
                eprintln!("boltccl launch: the job ran past --timeout-s {timeout_s}; stopping every rank");
            } else {
                eprintln!("boltccl launch: rank {} failed; stopping the other ranks", failed[0]);
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
    // Let the relay threads flush what the ranks printed last.
    std::thread::sleep(Duration::from_millis(50));
    let timed_out = timeout_s > 0 && start.elapsed() > Duration::from_secs(timeout_s);
    if failed.is_empty() && !timed_out {
        return Ok(0);
    }
    let mut err = std::io::stderr().lock();
    for &i in &failed {
        let st = ranks[i].status.expect("exited");
        let _ = writeln!(err, "\n=== rank {i} failed ({}) — last lines of its stderr:", describe(st));
        for line in ranks[i].tail.lock().iter() {
            let _ = writeln!(err, "    {line}");
        }
    }
    Ok(failed.first().and_then(|&i| ranks[i].status.and_then(|s| s.code())).filter(|&c| c != 0).unwrap_or(1))
}

fn describe(st: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "unknown status".into(),
    }
}
