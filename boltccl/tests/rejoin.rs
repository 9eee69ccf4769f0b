//! Kill, shrink, join, verify, in a loop: a rank is killed mid-collective, the survivors
//! shrink and check their sums, a replacement process is started and everyone forms a group of
//! the old size with `Group::grow`, which must sum right too. Over TCP and shared memory, with
//! real processes; rank 0 (the coordinator) among the ranks killed.
//!
//! What it proves, every round: no wrong sum, no call or bootstrap past its deadline (the
//! supervisor gives every step one), and, over the whole loop, no growth in a long-lived
//! rank's open files or memory. `REJOIN_SECS` sets the loop's length (the full tier runs a
//! short loop; `scripts/bench.sh rejoin` the 10-minute one).

mod common;

use common::harness::{free_port, is_worker, one_job_at_a_time};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Open files of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4
}

/// All_sums of several sizes (so every algorithm's messages cross the links), each rank's value
/// its rank + 1, and an all_gather of every rank's own pattern: the exact answers or a line
/// saying what was wrong.
fn verify(g: &boltccl::Group) -> Result<(), String> {
    for n in [1usize, 1000, 1 << 20] {
        let mut buf = vec![(g.rank() + 1) as f32; n];
        g.all_sum(&mut buf).map_err(|e| format!("CALL_ERR all_sum of {n}: {e}"))?;
        let want = (g.size() * (g.size() + 1) / 2) as f32;
        if let Some(i) = buf.iter().position(|&x| x != want) {
            return Err(format!("WRONG all_sum of {n}: element {i} is {}, want {want}", buf[i]));
        }
    }
    let mine: Vec<u32> = (0..4096u32).map(|i| i.wrapping_mul(2654435761) ^ g.rank() as u32).collect();
    let mut all = vec![0u32; mine.len() * g.size()];
    g.all_gather(&mine, &mut all).map_err(|e| format!("CALL_ERR all_gather: {e}"))?;
    for (r, part) in all.chunks(mine.len()).enumerate() {
        if part.iter().enumerate().any(|(i, &x)| x != (i as u32).wrapping_mul(2654435761) ^ r as u32) {
            return Err(format!("WRONG all_gather: rank {r}'s part"));
        }
    }
    Ok(())
}

/// A rank, driven by lines on stdin:
/// - `run`: all_sums until one fails (the supervisor killed a rank), then `shrink` and verify;
/// - `grow SIZE ADDR KEY`: a group of SIZE with the newcomers, then verify;
/// - `quit`: a last barrier, and exit.
///
/// It answers each with one line (`@ ` first, beside the test harness's lines): `RUNNING`, then `SHRUNK rank size` / `GROWN rank size fds
/// rss_kib`, or `FAILED why`.
#[test]
fn rejoin_worker() {
    if !is_worker() {
        return;
    }
    boltccl::log_to_stderr();
    let say = |line: String| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "@ {line}").unwrap();
        out.flush().unwrap();
    };
    let mut g = boltccl::init().unwrap_or_else(|e| panic!("init: {e}"));
    if let Err(e) = verify(&g) {
        say(format!("FAILED {e}"));
        return;
    }
    say(format!("GROWN {} {} {} {}", g.rank(), g.size(), open_fds(), rss_kib()));
    let mut buf = vec![1.0f32; 1 << 16];
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["run"] => {
                say("RUNNING".into());
                while g.all_sum(&mut buf).is_ok() {}
                g = match g.shrink() {
                    Ok(next) => next,
                    Err(e) => return say(format!("FAILED shrink: {e}")),
                };
                if let Err(e) = verify(&g) {
                    return say(format!("FAILED {e}"));
                }
                say(format!("SHRUNK {} {}", g.rank(), g.size()));
            }
            ["grow", size, addr, key] => {
                g = match g.grow(size.parse().unwrap(), addr, key) {
                    Ok(next) => next,
                    Err(e) => return say(format!("FAILED grow: {e}")),
                };
                if let Err(e) = verify(&g) {
                    return say(format!("FAILED {e}"));
                }
                say(format!("GROWN {} {} {} {}", g.rank(), g.size(), open_fds(), rss_kib()));
            }
            ["quit"] => {
                if let Err(e) = g.barrier() {
                    say(format!("FAILED last barrier: {e}"));
                }
                return;
            }
            _ => panic!("rejoin_worker: unknown command {line:?}"),
        }
    }
}

/// A rank process and the answers it has printed, `@ ` lines (read by a thread, so a full pipe
/// never blocks it; the test harness's own lines are dropped).
struct Rank {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// Its open files and KiB resident after each round it lived through.
    history: Vec<(usize, u64)>,
}

impl Rank {
    fn start(rank: usize, size: usize, coordinator: &str, key: &str, backend: &str) -> Rank {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "rejoin_worker", "--nocapture", "--test-threads=1"])
            .env("BOLTCCL_TEST_ROLE", "worker")
            .env("BOLTCCL_RANK", rank.to_string())
            .env("BOLTCCL_WORLD_SIZE", size.to_string())
            .env("BOLTCCL_COORDINATOR", coordinator)
            .env("BOLTCCL_JOB_KEY", key)
            .env("BOLTCCL_BACKEND", backend)
            .env("BOLTCCL_TIMEOUT_MS", "10000")
            .env("BOLTCCL_INIT_TIMEOUT_MS", "20000")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The harness's "test rejoin_worker ... " may open the line.
                let Some(at) = line.find("@ ") else { continue };
                if tx.send(line[at + 2..].to_string()).is_err() {
                    return;
                }
            }
        });
        Rank { child, stdin, lines, history: Vec::new() }
    }

    fn tell(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap_or_else(|e| panic!("a rank's stdin: {e}"));
    }

    /// Its next line that starts with `want`, within `limit`: any other answer, its exit, or no
    /// answer in time fails the test.
    fn expect(&mut self, want: &str, limit: Duration, what: &str) -> String {
        match self.lines.recv_timeout(limit) {
            Ok(line) if line.starts_with(want) => line,
            Ok(line) => panic!("{what}: expected {want}, got: {line}"),
            Err(RecvTimeoutError::Timeout) => panic!("{what}: no {want} within {limit:?} (a hang)"),
            Err(RecvTimeoutError::Disconnected) => panic!("{what}: the rank exited before {want}"),
        }
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a loop did.
struct Summary {
    rounds: usize,
    /// The longest-lived rank's open files and KiB resident after each round.
    longest: Vec<(usize, u64)>,
    /// Medians, in ms: from the kill to every survivor's verified shrunk group, and from the
    /// `grow` command to every rank's verified grown group (the newcomer's start included).
    shrink_ms: f64,
    grow_ms: f64,
}

fn median_ms(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

/// Kill, shrink, grow and verify with `n` ranks over `backend` for `secs` seconds (at least one
/// round). The victims take turns over the ranks, so rank 0 and the newest rank are killed too;
/// one rank (rank 1 at the start) is never killed, to watch its files and memory.
fn rejoin_loop(n: usize, backend: &str, secs: u64) -> Summary {
    let step = Duration::from_secs(30);
    let key = |round: usize| format!("rejoin-{backend}-{round}");
    let coordinator = format!("127.0.0.1:{}", free_port());
    let mut ranks: Vec<Rank> = (0..n).map(|r| Rank::start(r, n, &coordinator, &key(0), backend)).collect();
    for (r, rank) in ranks.iter_mut().enumerate() {
        rank.expect("GROWN", step, &format!("{backend}: rank {r}'s first group"));
    }
    let watched = ranks[1].child.id();
    let until = Instant::now() + Duration::from_secs(secs);
    let mut round = 0;
    let (mut shrinks, mut grows) = (Vec::new(), Vec::new());
    while round == 0 || Instant::now() < until {
        round += 1;
        let what = |s: &str| format!("{backend}, round {round}: {s}");
        for rank in ranks.iter_mut() {
            rank.tell("run");
        }
        for rank in ranks.iter_mut() {
            rank.expect("RUNNING", step, &what("run"));
        }
        // The victim: the next in turn that is not the watched rank.
        let mut victim = round % n;
        if ranks[victim].child.id() == watched {
            victim = (victim + 1) % n;
        }
        std::thread::sleep(Duration::from_millis(round as u64 % 20));
        let killed = Instant::now();
        ranks.remove(victim).kill();
        for (r, rank) in ranks.iter_mut().enumerate() {
            let line = rank.expect("SHRUNK", step, &what("shrink"));
            assert_eq!(line, format!("SHRUNK {r} {}", n - 1), "{}", what("the shrunk group"));
        }
        shrinks.push(killed.elapsed());
        let grown = Instant::now();
        let coordinator = format!("127.0.0.1:{}", free_port());
        for rank in ranks.iter_mut() {
            rank.tell(&format!("grow {n} {coordinator} {}", key(round)));
        }
        ranks.push(Rank::start(n - 1, n, &coordinator, &key(round), backend));
        for (r, rank) in ranks.iter_mut().enumerate() {
            let line = rank.expect("GROWN", step, &what("grow"));
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(f[1..3], [r.to_string(), n.to_string()], "{}: {line}", what("the grown group"));
            rank.history.push((f[3].parse().unwrap(), f[4].parse().unwrap()));
        }
        grows.push(grown.elapsed());
    }
    let long = ranks.iter().find(|r| r.child.id() == watched).unwrap();
    let summary = Summary {
        rounds: round,
        longest: long.history.clone(),
        shrink_ms: median_ms(shrinks),
        grow_ms: median_ms(grows),
    };
    for rank in ranks.iter_mut() {
        rank.tell("quit");
    }
    for mut rank in ranks {
        let limit = Instant::now() + step;
        loop {
            if let Some(status) = rank.child.try_wait().unwrap() {
                assert!(status.success(), "{backend}: a rank's last barrier: {status:?}");
                break;
            }
            assert!(Instant::now() < limit, "{backend}: a rank did not exit after quit");
            std::thread::sleep(Duration::from_millis(10));
        }
        // A FAILED line from the last barrier.
        if let Ok(line) = rank.lines.recv_timeout(Duration::from_millis(100)) {
            panic!("{backend}: at the end: {line}");
        }
    }
    summary
}

fn checked_loop(backend: &str, secs: u64) {
    let _one = one_job_at_a_time();
    let s = rejoin_loop(3, backend, secs);
    let h = &s.longest;
    let rounds = h.len();
    // After rounds 1, n/4, n/2, 3n/4 and n.
    let at: Vec<usize> = [1, rounds / 4, rounds / 2, rounds * 3 / 4, rounds].iter().map(|&k| k.max(1) - 1).collect();
    let fds: Vec<usize> = at.iter().map(|&i| h[i].0).collect();
    let rss: Vec<u64> = at.iter().map(|&i| h[i].1).collect();
    eprintln!(
        "{backend}: {} rounds of kill/shrink/grow/verify in {secs} s; the longest-lived rank ({rounds} rounds), \
         after rounds 1, n/4, n/2, 3n/4, n: open files {fds:?}, KiB resident {rss:?}; medians: kill -> verified \
         shrunk group {:.1} ms, grow -> verified grown group {:.1} ms",
        s.rounds, s.shrink_ms, s.grow_ms
    );
    let first = h[0].0;
    assert!(h.iter().all(|&(f, _)| f == first), "{backend}: open files changed over {rounds} rounds: {fds:?}");
    // Memory may settle (the allocator's arenas fill in the first rounds) but must not climb:
    // the second half of the loop adds at most 1 MiB. A leaked group (its rings, buffers,
    // threads) is far larger.
    let (mid, last) = (h[rounds / 2].1, h[rounds - 1].1);
    assert!(last <= mid + 1024, "{backend}: resident memory climbed {mid} -> {last} KiB over the second half: {rss:?}");
}

fn secs() -> u64 {
    std::env::var("REJOIN_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(3)
}

#[test]
fn kill_shrink_join_verify_over_tcp() {
    checked_loop("tcp", secs());
}

#[test]
fn kill_shrink_join_verify_over_shared_memory() {
    checked_loop("shm", secs());
}
