//! Ranks as real processes: each re-runs this test binary's worker test with the rank's
//! environment, and every rank is killed if still running at the deadline.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// True when running in CI (`CI` set, as GitHub Actions and `.ci/run` do, and not "false" or
/// "0"): there a test whose prerequisite is missing (root, a model file, a GPU driver) fails
/// instead of skipping, so CI cannot go green without running it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// A test cannot run here because `why`: outside CI, say so (SKIPPED) and let the caller
/// return; in CI, fail.
pub fn prerequisite_missing(test: &str, why: &str) {
    assert!(!in_ci(), "{test}: {why}, and CI is set: in CI this test must run");
    eprintln!("SKIPPED {test}: {why}");
}

/// True in a debug (unoptimised) build, after saying that `test` is not run there: for the
/// `#[ignore]`d tests that only an optimised build runs (minutes unoptimised, a benchmark, the
/// soak). `cargo test -- --include-ignored`, the full tier's debug run, reaches them too; they
/// return there, and `runs_it` runs them in a release build.
pub fn not_in_a_debug_build(test: &str, runs_it: &str) -> bool {
    if cfg!(debug_assertions) {
        eprintln!("NOT RUN {test}: release build only ({runs_it} runs it)");
    }
    cfg!(debug_assertions)
}

/// A free TCP port on loopback for rank 0 to listen on later (below the ephemeral range, so
/// no connection of a test running alongside is given it meanwhile).
///
/// Never the same port twice in one test binary: its tests run side by side and may each
/// hold many ports handed out in advance (the mismatch matrix takes one per case), and a port
/// that is free now can be handed to two of them. Two jobs on one port join the wrong group.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = boltccl::free_coordinator_port(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Held while a test runs its job, so the test binary runs those jobs one at a time (each file
/// says why its tests need that). A test that failed holding it does not block the others.
pub fn one_job_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static JOBS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    JOBS.lock().unwrap_or_else(|e| e.into_inner())
}

/// True in a re-executed rank process.
pub fn is_worker() -> bool {
    std::env::var("BOLTCCL_TEST_ROLE").as_deref() == Ok("worker")
}

/// A job of rank processes to start: the worker test to run, the environment of every rank
/// and of single ranks, and optionally a command each rank runs under (`ip netns exec ...`).
pub struct Job {
    n: usize,
    test: String,
    coordinator: String,
    env: Vec<(String, String)>,
    per_rank: Vec<(usize, String, String)>,
    wrap: Option<Box<dyn Fn(usize) -> Vec<String>>>,
}

impl Job {
    /// `n` ranks of the worker test `test`, the coordinator on a free loopback port.
    pub fn new(n: usize, test: &str) -> Job {
        Job {
            n,
            test: test.into(),
            coordinator: format!("127.0.0.1:{}", free_port()),
            env: Vec::new(),
            per_rank: Vec::new(),
            wrap: None,
        }
    }

    /// Where rank 0 listens.
    pub fn coordinator(mut self, addr: impl Into<String>) -> Job {
        self.coordinator = addr.into();
        self
    }

    /// A variable for every rank.
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Job {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Variables for every rank.
    pub fn envs<K: Into<String>, V: Into<String>>(mut self, vars: impl IntoIterator<Item = (K, V)>) -> Job {
        self.env.extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// A variable for rank `rank` only (set after the common ones, so it wins).
    pub fn rank_env(mut self, rank: usize, k: impl Into<String>, v: impl Into<String>) -> Job {
        self.per_rank.push((rank, k.into(), v.into()));
        self
    }

    /// Run rank r under the command `wrap(r)` (e.g. `ip netns exec NS`).
    pub fn wrap(mut self, wrap: impl Fn(usize) -> Vec<String> + 'static) -> Job {
        self.wrap = Some(Box::new(wrap));
        self
    }

    /// Start every rank.
    pub fn spawn(self) -> Ranks {
        self.start(0..self.n)
    }

    /// Start some of the ranks (the others later, or never), in the order given.
    pub fn start(&self, ranks: impl IntoIterator<Item = usize>) -> Ranks {
        let exe = std::env::current_exe().unwrap();
        let children = ranks
            .into_iter()
            .map(|rank| {
                let prefix = self.wrap.as_ref().map(|w| w(rank)).unwrap_or_default();
                let mut c = match prefix.split_first() {
                    Some((cmd, args)) => {
                        let mut c = Command::new(cmd);
                        c.args(args).arg(&exe);
                        c
                    }
                    None => Command::new(&exe),
                };
                c.args(["--exact", &self.test, "--nocapture", "--test-threads=1"])
                    .env("BOLTCCL_TEST_ROLE", "worker")
                    .env("BOLTCCL_RANK", rank.to_string())
                    .env("BOLTCCL_WORLD_SIZE", self.n.to_string())
                    .env("BOLTCCL_COORDINATOR", &self.coordinator)
                    .env("BOLTCCL_JOB_KEY", "test-key")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                c.envs(self.env.iter().map(|(k, v)| (k, v)));
                for (_, k, v) in self.per_rank.iter().filter(|(r, _, _)| *r == rank) {
                    c.env(k, v);
                }
                c.spawn().unwrap()
            })
            .collect::<Vec<Child>>();
        Ranks::draining(children)
    }
}

/// Started rank processes. Their stdout and stderr are read as they come (a rank that writes
/// more than a pipe holds must not block on a test that has not called `wait` yet).
pub struct Ranks {
    pub children: Vec<Child>,
    outputs: Vec<(Output, Output)>,
}

/// What one pipe of a rank has written so far, read by its own thread.
type Output = (std::sync::Arc<std::sync::Mutex<Vec<u8>>>, Option<std::thread::JoinHandle<()>>);

fn drain(pipe: Option<impl std::io::Read + Send + 'static>) -> Output {
    let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handle = pipe.map(|mut p| {
        let buf = buf.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = p.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                buf.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        })
    });
    (buf, handle)
}

/// Output of one rank process.
#[derive(Debug)]
pub struct RankOutput {
    pub rank: usize,
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl RankOutput {
    /// The text after the first `key` on any line of stdout.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.stdout.lines().find_map(|l| l.split_once(key).map(|(_, v)| v.trim()))
    }
}

impl Ranks {
    /// `n` ranks of the worker test `test_name`, every rank with `env`.
    pub fn spawn<K: AsRef<str>>(n: usize, test_name: &str, env: &[(K, String)]) -> Ranks {
        Job::new(n, test_name).envs(env.iter().map(|(k, v)| (k.as_ref().to_string(), v.clone()))).spawn()
    }

    /// What rank `i` (in start order) has written to stdout so far.
    pub fn stdout_so_far(&self, i: usize) -> String {
        String::from_utf8_lossy(&self.outputs[i].0 .0.lock().unwrap()).into_owned()
    }

    fn draining(mut children: Vec<Child>) -> Ranks {
        let outputs = children.iter_mut().map(|c| (drain(c.stdout.take()), drain(c.stderr.take()))).collect();
        Ranks { children, outputs }
    }

    /// Wait for every rank (up to `limit`), then return their outputs in rank order.
    pub fn wait(self, limit: Duration) -> Vec<RankOutput> {
        let start = Instant::now();
        let handles: Vec<_> = self
            .children
            .into_iter()
            .zip(self.outputs)
            .enumerate()
            .map(|(rank, (mut child, (out, err)))| {
                std::thread::spawn(move || {
                    let deadline = start + limit;
                    loop {
                        if let Some(_st) = child.try_wait().unwrap() {
                            break;
                        }
                        if Instant::now() > deadline {
                            let _ = child.kill();
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    let elapsed = start.elapsed();
                    let status = child.wait().unwrap();
                    let text = |(buf, h): Output| {
                        if let Some(h) = h {
                            let _ = h.join();
                        }
                        let b = buf.lock().unwrap();
                        String::from_utf8_lossy(&b).into_owned()
                    };
                    RankOutput { rank, status, stdout: text(out), stderr: text(err), elapsed }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }
}

/// Every rank must have succeeded and printed `key`: the rest of that line, in rank order.
pub fn results(outs: &[RankOutput], key: &str) -> Vec<String> {
    outs.iter()
        .map(|o| {
            assert!(o.status.success(), "rank {} failed ({:?}):\n{}\n{}", o.rank, o.status, o.stdout, o.stderr);
            o.field(key)
                .unwrap_or_else(|| panic!("rank {} printed no {key}:\n{}\n{}", o.rank, o.stdout, o.stderr))
                .to_string()
        })
        .collect()
}
