//! The chaos soak (`scripts/soak.sh --minutes N`): jobs of 2-4 rank processes, one after
//! another, each in network namespaces joined by veth pairs, over TCP or verbs (softverbs),
//! with random algorithms and chunk sizes, run random collectives (every call, element type,
//! reduction, size from 0 to 4 MiB, root) and check every element against a reference computed
//! locally — while the driver injects one random fault per job: `kill -9` of a rank, `SIGSTOP`
//! of a rank (continued later), a partition (a veth taken down, or every packet of a rank
//! dropped by nftables, restored later), garbage on the coordinator's port, lost, repeated,
//! reordered and corrupted datagrams (verbs), a device that fails (verbs), or none.
//!
//! A worker runs several epochs: after an error it drops its group and forms a new one (as a
//! user restarting would); a dead rank ends the job. Every worker reports its calls, its errors
//! by kind, wrong answers, and its open files and RSS after its first and last epoch. The driver
//! watches every rank's heartbeat (a file touched at every call): a live, unstopped rank silent
//! for longer than `BOLTCCL_TIMEOUT_MS` + `BOLTCCL_INIT_TIMEOUT_MS` + 5 s is a hang.
//!
//! It prints: jobs, faults by kind, calls, errors by kind, wrong answers (must be 0), hangs
//! (must be 0), and the largest growth of open files and RSS within a worker, and fails unless
//! wrong answers and hangs are 0. `#[ignore]`d: `scripts/soak.sh` runs it in a release build
//! (`SOAK_SECONDS`, `SOAK_SEED`); needs root, iproute2, tc and nftables.

mod common;

use boltccl::{Algo, DType, Group, ReduceOp};
use common::harness::{is_worker, Job};
use common::verbs::{verbs_env_with, MeshNetns};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TIMEOUT_MS: u64 = 2_000;
const INIT_TIMEOUT_MS: u64 = 6_000;
/// Silence longer than this on a live, unstopped rank is a hang.
const HANG_MS: u64 = TIMEOUT_MS + INIT_TIMEOUT_MS + 5_000;

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Deterministic random numbers (xorshift), the same on every rank for the same seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// Rank `r`'s element `i` of call `salt`: small integers, exact in every element type, so
/// every reduction order gives the same answer and any misplaced or corrupted element shows.
fn value(dtype: DType, r: usize, i: usize, salt: u64) -> i64 {
    let x = ((r * 7 + i * 3 + salt as usize * 5) % 17) as i64;
    if matches!(dtype, DType::U8 | DType::U16 | DType::U32 | DType::U64) {
        x % 9
    } else {
        x - 8
    }
}

fn encode(dtype: DType, vals: impl Iterator<Item = i64>) -> Vec<u8> {
    let mut out = Vec::new();
    for v in vals {
        match dtype {
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::F64 => out.extend((v as f64).to_le_bytes()),
            DType::F16 => out.extend(boltccl::f16::from_f64(v as f64).to_le_bytes()),
            DType::BF16 => out.extend(boltccl::bf16::from_f64(v as f64).to_le_bytes()),
            DType::I8 => out.extend((v as i8).to_le_bytes()),
            DType::I16 => out.extend((v as i16).to_le_bytes()),
            DType::I32 => out.extend((v as i32).to_le_bytes()),
            DType::I64 => out.extend(v.to_le_bytes()),
            DType::U8 => out.extend((v as u8).to_le_bytes()),
            DType::U16 => out.extend((v as u16).to_le_bytes()),
            DType::U32 => out.extend((v as u32).to_le_bytes()),
            DType::U64 => out.extend((v as u64).to_le_bytes()),
        }
    }
    out
}

fn reduce(op: ReduceOp, vals: impl Iterator<Item = i64>) -> i64 {
    let v: Vec<i64> = vals.collect();
    match op {
        ReduceOp::Sum => v.iter().sum(),
        ReduceOp::Max => *v.iter().max().unwrap(),
        ReduceOp::Min => *v.iter().min().unwrap(),
    }
}

/// One random call, the same on every rank (drawn from the shared generator): run it, and
/// compare every element with the reference. `Ok(None)` when right, `Ok(Some(what))` when an
/// element is wrong.
fn random_call(g: &Group, rng: &mut Rng, salt: u64) -> boltccl::Result<Option<String>> {
    let (r, p) = (g.rank(), g.size());
    let dtype = rng.pick(&DType::ALL);
    let op = rng.pick(&ReduceOp::ALL);
    let e = dtype.size();
    let max_elems = (4 << 20) / e / p;
    let n = rng.pick(&[0usize, 1, 7, 100, 1000, 10_000, 100_000, 1_000_000]).min(max_elems);
    let kind = rng.below(8);
    let root = rng.below(p);
    let mine = |k: usize| encode(dtype, (0..k).map(|i| value(dtype, r, i, salt)));
    let wrong = |what: &str, got: &[u8], want: Vec<u8>| -> Option<String> {
        (got != want.as_slice()).then(|| {
            let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0) / e;
            format!("{what} of {n} {} (op {}): element {i} differs", dtype.name(), op.name())
        })
    };
    let b = g.bytes();
    Ok(match kind {
        0 | 1 => {
            let mut x = mine(n);
            b.all_reduce(op, dtype, None, &mut x)?;
            wrong("all_reduce", &x, encode(dtype, (0..n).map(|i| reduce(op, (0..p).map(|q| value(dtype, q, i, salt))))))
        }
        2 => {
            let mut out = vec![0xAAu8; n * e * p];
            b.all_gather(dtype, &mine(n), &mut out)?;
            let want = encode(dtype, (0..n * p).map(|i| value(dtype, i / n.max(1), i % n.max(1), salt)));
            wrong("all_gather", &out, want)
        }
        3 => {
            let input = mine(n * p);
            let mut out = vec![0xAAu8; n * e];
            b.reduce_scatter(op, dtype, &input, &mut out)?;
            let want = encode(dtype, (0..n).map(|i| reduce(op, (0..p).map(|q| value(dtype, q, r * n + i, salt)))));
            wrong("reduce_scatter", &out, want)
        }
        4 => {
            let mut x = if r == root { mine(n) } else { vec![0x55u8; n * e] };
            b.broadcast(dtype, &mut x, root)?;
            wrong("broadcast", &x, encode(dtype, (0..n).map(|i| value(dtype, root, i, salt))))
        }
        5 => {
            g.barrier()?;
            None
        }
        6 => {
            // Around the ring; even ranks send first.
            let (to, from) = ((r + 1) % p, (r + p - 1) % p);
            let mut got = vec![0u8; n * e];
            if r % 2 == 0 {
                b.send(dtype, &mine(n), to)?;
                b.recv(dtype, &mut got, from)?;
            } else {
                b.recv(dtype, &mut got, from)?;
                b.send(dtype, &mine(n), to)?;
            }
            wrong("recv", &got, encode(dtype, (0..n).map(|i| value(dtype, from, i, salt))))
        }
        _ => {
            // A split into even and odd ranks, and an all_sum in each half.
            let sub = g.split(Some((r % 2) as u32), r as i64)?.expect("a colour");
            let members: Vec<usize> = (0..p).filter(|q| q % 2 == r % 2).collect();
            let mut x = mine(n);
            sub.bytes().all_reduce(ReduceOp::Sum, dtype, None, &mut x)?;
            let want = encode(dtype, (0..n).map(|i| members.iter().map(|&q| value(dtype, q, i, salt)).sum()));
            wrong("split all_sum", &x, want)
        }
    })
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    s.split(' ').nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 4
}

/// A rank of a soak job: epochs of random calls, a new group after each failure.
#[test]
fn soak_worker() {
    if !is_worker() {
        return;
    }
    boltccl::log_to_stderr();
    let rank: usize = env("BOLTCCL_RANK").parse().unwrap();
    let seed: u64 = env("SOAK_JOB_SEED").parse().unwrap();
    let calls_per_epoch: usize = env("SOAK_CALLS").parse().unwrap();
    let ports: Vec<String> = env("SOAK_PORTS").split(',').map(String::from).collect();
    let host = env("SOAK_HOST");
    let hb = PathBuf::from(env("SOAK_DIR")).join(format!("hb-{rank}"));
    let hb_tmp = hb.with_extension("tmp");
    // Written aside and renamed: the driver never reads a half-written heartbeat.
    let beat = |at: &str| {
        std::fs::write(&hb_tmp, format!("{} {at}", now_ms())).unwrap();
        std::fs::rename(&hb_tmp, &hb).unwrap();
    };
    let (mut calls, mut wrong) = (0u64, 0u64);
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut first: Option<(usize, u64)> = None;
    let mut last = (0usize, 0u64);
    for (epoch, port) in ports.iter().enumerate() {
        beat(&format!("init {epoch}"));
        std::env::set_var("BOLTCCL_COORDINATOR", format!("{host}:{port}"));
        let g = match boltccl::init() {
            Ok(g) => g,
            Err(e) => {
                *errors.entry(format!("init_{}", e.kind().name())).or_default() += 1;
                eprintln!("epoch {epoch}: init: {e}");
                beat("init failed");
                // A rank is gone (or the network is): the job is over for this rank.
                break;
            }
        };
        let mut rng = Rng::new(seed ^ (epoch as u64) << 32);
        for c in 0..calls_per_epoch {
            beat(&format!("epoch {epoch} call {c}"));
            match random_call(&g, &mut rng, (epoch * 100_000 + c) as u64) {
                Ok(None) => calls += 1,
                Ok(Some(what)) => {
                    wrong += 1;
                    println!("WRONG epoch {epoch} call {c}: {what}");
                }
                Err(e) => {
                    *errors.entry(e.kind().name().to_string()).or_default() += 1;
                    eprintln!("epoch {epoch} call {c}: {e}");
                    break;
                }
            }
        }
        beat(&format!("epoch {epoch} drop"));
        drop(g);
        // Freed memory back to the system first, so RSS counts what is still allocated, not
        // what the allocator keeps for later (4 MiB buffers and 16 MiB of scratch come and go).
        // SAFETY: malloc_trim only releases free heap memory; no pointer is touched.
        unsafe { libc::malloc_trim(0) };
        let now = (open_fds(), rss_kib());
        first.get_or_insert(now);
        last = now;
    }
    beat("done");
    let first = first.unwrap_or(last);
    let errs: Vec<String> = errors.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "SUMMARY calls={calls} wrong={wrong} fds={},{} rss={},{} errors={}",
        first.0,
        last.0,
        first.1,
        last.1,
        errs.join(",")
    );
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    None,
    Kill,
    Stop,
    LinkDown,
    Isolate,
    Garbage,
    Datagrams,
    DeviceFails,
}

#[derive(Default)]
struct Totals {
    jobs: u64,
    faults: BTreeMap<String, u64>,
    calls: u64,
    errors: BTreeMap<String, u64>,
    wrong: u64,
    hangs: u64,
    /// Workers that exited abnormally (a panic) without being killed by the driver.
    crashes: u64,
    fd_growth: i64,
    rss_growth_kib: i64,
    worker_runs: u64,
    hang_notes: Vec<String>,
    wrong_notes: Vec<String>,
    /// Why groups did not re-form: each distinct message (digits masked), with the job's fault
    /// and a count, so the report says what the `init_*` errors were.
    init_failures: BTreeMap<String, u64>,
}

fn summary_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(' ').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// One job: set up namespaces, start the ranks, inject the fault, watch heartbeats, collect.
fn job(seed: u64, t: &mut Totals) {
    let mut rng = Rng::new(seed);
    let n = rng.pick(&[2usize, 3, 4]);
    let verbs = rng.below(2) == 1;
    let algo = rng.pick(&[Algo::Auto, Algo::Mesh, Algo::Direct, Algo::Ring, Algo::Doubling]);
    let chunk = rng.pick(&[4096usize, 65_536, 262_144, 1 << 20]);
    let mut fault = rng.pick(&[
        Fault::None,
        Fault::Kill,
        Fault::Stop,
        Fault::LinkDown,
        Fault::Isolate,
        Fault::Garbage,
        Fault::Datagrams,
        Fault::DeviceFails,
    ]);
    if !verbs && matches!(fault, Fault::Datagrams | Fault::DeviceFails) {
        fault = Fault::Kill;
    }
    let victim = rng.below(n);
    let epochs = 2 + rng.below(4);
    let calls = 20 + rng.below(60);
    let Some(ns) = MeshNetns::create(n) else { panic!("cannot create network namespaces: the soak needs root") };
    if verbs {
        ns.ready_for_datagrams();
    }
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<String> = (0..epochs).map(|e| (30_000 + (seed % 20_000) as usize + e).to_string()).collect();
    let names = ns.names.clone();
    let mut j = Job::new(n, "soak_worker")
        .wrap(move |k| ["ip", "netns", "exec", &names[k]].map(String::from).to_vec())
        .env("SOAK_JOB_SEED", seed.to_string())
        .env("SOAK_CALLS", calls.to_string())
        .env("SOAK_PORTS", ports.join(","))
        .env("SOAK_HOST", ns.identity(0))
        .env("SOAK_DIR", dir.path().display().to_string())
        .env("BOLTCCL_ALGO", algo.name())
        .env("BOLTCCL_CHUNK_BYTES", chunk.to_string())
        .env("BOLTCCL_TIMEOUT_MS", TIMEOUT_MS.to_string())
        .env("BOLTCCL_INIT_TIMEOUT_MS", INIT_TIMEOUT_MS.to_string())
        .env("BOLTCCL_LOG", std::env::var("SOAK_LOG").unwrap_or_else(|_| "error".into()));
    if verbs {
        j = j.envs(verbs_env_with(ns.matrix(n)));
    }
    match fault {
        Fault::Datagrams => {
            let rate = ["0.001", "0.003", "0.01"][rng.below(3)];
            for k in ["SOFTVERBS_DROP_RATE", "SOFTVERBS_DUP_RATE", "SOFTVERBS_REORDER_RATE", "SOFTVERBS_CORRUPT_RATE"] {
                j = j.env(k, rate);
            }
            j = j.env("SOFTVERBS_SEED", seed.to_string());
        }
        Fault::DeviceFails => j = j.rank_env(victim, "SOFTVERBS_FAIL_AFTER", (20 + rng.below(3000)).to_string()),
        _ => {}
    }
    let ranks = j.spawn();
    let pids: Vec<i32> = ranks.children.iter().map(|c| c.id() as i32).collect();
    let started = Instant::now();
    let fault_after = Duration::from_millis(300 + rng.below(3000) as u64);
    let mut injected = false;
    let mut stopped_until: Option<Instant> = None;
    let mut restore: Option<(Instant, Fault)> = None;
    let signal = |pid: i32, s: rustix::process::Signal| {
        let _ = rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), s);
    };
    let alive = |pid: i32| -> bool {
        // A zombie (exited, not yet reaped) counts as gone.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit(") ").next().and_then(|x| x.split(' ').next()).is_some_and(|st| st != "Z"))
    };
    let mut hung = false;
    loop {
        let now = Instant::now();
        if !injected && now - started >= fault_after {
            injected = true;
            match fault {
                Fault::Kill => signal(pids[victim], rustix::process::Signal::Kill),
                Fault::Stop => {
                    signal(pids[victim], rustix::process::Signal::Stop);
                    stopped_until = Some(now + Duration::from_millis(TIMEOUT_MS * 2));
                }
                Fault::LinkDown if n >= 2 => {
                    ns.set_link(0, 1, false);
                    restore = Some((now + Duration::from_millis(TIMEOUT_MS * 2), fault));
                }
                Fault::Isolate => {
                    ns.isolate(victim, true);
                    restore = Some((now + Duration::from_millis(TIMEOUT_MS * 2), fault));
                }
                Fault::Garbage => {
                    // 5,000 random bytes at the coordinator port of every epoch, from the last
                    // rank's namespace, every 300 ms for 6 s (a later epoch's port opens later).
                    let targets: Vec<String> = ports.iter().map(|p| format!("{}/{p}", ns.identity(0))).collect();
                    let from = ns.names[n - 1].clone();
                    let script = targets
                        .iter()
                        .map(|t| format!("(exec 3<>/dev/tcp/{t} && head -c 5000 /dev/urandom >&3) 2>/dev/null;"))
                        .collect::<String>();
                    std::thread::spawn(move || {
                        for _ in 0..20 {
                            let _ = std::process::Command::new("ip")
                                .args(["netns", "exec", &from, "bash", "-c", &script])
                                .stdout(std::process::Stdio::null())
                                .stderr(std::process::Stdio::null())
                                .status();
                            std::thread::sleep(Duration::from_millis(300));
                        }
                    });
                }
                _ => {}
            }
        }
        if let Some(until) = stopped_until {
            if now >= until {
                signal(pids[victim], rustix::process::Signal::Cont);
                stopped_until = None;
            }
        }
        if let Some((until, f)) = restore {
            if now >= until {
                match f {
                    Fault::LinkDown => ns.set_link(0, 1, true),
                    Fault::Isolate => ns.isolate(victim, false),
                    _ => {}
                }
                restore = None;
            }
        }
        let running: Vec<usize> = (0..n).filter(|&k| alive(pids[k])).collect();
        if running.is_empty() {
            break;
        }
        // A hang: a running, unstopped rank whose heartbeat is older than the limit.
        for &k in &running {
            if stopped_until.is_some() && k == victim {
                continue;
            }
            // No heartbeat yet: silent since the job started.
            let hb = std::fs::read_to_string(dir.path().join(format!("hb-{k}"))).unwrap_or_default();
            let (beat, where_) = hb.split_once(' ').unwrap_or(("0", "starting"));
            let beat: u64 = beat.parse().unwrap_or(0);
            let silent = if beat == 0 { (now - started).as_millis() as u64 } else { now_ms().saturating_sub(beat) };
            if silent > HANG_MS {
                hung = true;
                t.hang_notes.push(format!(
                    "seed {seed}: rank {k} of {n} ({}, {algo:?}, chunk {chunk}, fault {fault:?} on rank {victim}) silent for {silent} ms in {where_}",
                    if verbs { "verbs" } else { "tcp" }
                ));
            }
        }
        if hung {
            for &k in &running {
                signal(pids[k], rustix::process::Signal::Cont);
                signal(pids[k], rustix::process::Signal::Kill);
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if stopped_until.is_some() {
        signal(pids[victim], rustix::process::Signal::Cont);
    }
    match restore {
        Some((_, Fault::LinkDown)) => ns.set_link(0, 1, true),
        Some((_, Fault::Isolate)) => ns.isolate(victim, false),
        _ => {}
    }
    let outs = ranks.wait(Duration::from_secs(10));
    t.jobs += 1;
    *t.faults.entry(format!("{fault:?}")).or_default() += 1;
    t.hangs += u64::from(hung);
    for o in outs.iter().filter(|_| hung) {
        let tail: Vec<&str> = o.stderr.lines().rev().take(6).collect();
        t.hang_notes.push(format!("  seed {seed} rank {} ({:?}) stderr, last lines first: {tail:?}", o.rank, o.status));
    }
    for o in &outs {
        for w in o.stdout.lines().filter(|l| l.starts_with("WRONG")) {
            t.wrong_notes.push(format!("seed {seed} rank {}: {w}", o.rank));
        }
        let killed_by_us = hung || (fault == Fault::Kill && o.rank == victim);
        if !killed_by_us && !o.status.success() {
            t.crashes += 1;
            let tail: Vec<&str> = o.stderr.lines().rev().take(5).collect();
            t.hang_notes.push(format!("seed {seed} rank {} exited {:?}: {tail:?}", o.rank, o.status));
        }
        for l in o.stderr.lines().filter_map(|l| l.split_once(": init: ").map(|(_, e)| e)) {
            let masked: String = l.chars().take(160).map(|c| if c.is_ascii_digit() { '#' } else { c }).collect();
            *t.init_failures.entry(format!("{fault:?}: {masked}")).or_default() += 1;
        }
        let Some(s) = o.field("SUMMARY ") else {
            continue;
        };
        let s = format!("SUMMARY {s}");
        t.worker_runs += 1;
        t.calls += summary_field(&s, "calls").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        t.wrong += summary_field(&s, "wrong").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let pair = |key: &str| -> (i64, i64) {
            let v: Vec<i64> =
                summary_field(&s, key).unwrap_or("0,0").split(',').filter_map(|x| x.parse().ok()).collect();
            (v.first().copied().unwrap_or(0), v.get(1).copied().unwrap_or(0))
        };
        let (f0, f1) = pair("fds");
        let (r0, r1) = pair("rss");
        t.fd_growth = t.fd_growth.max(f1 - f0);
        t.rss_growth_kib = t.rss_growth_kib.max(r1 - r0);
        for kv in summary_field(&s, "errors").unwrap_or("").split(',').filter(|x| !x.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap();
            *t.errors.entry(k.to_string()).or_default() += v.parse::<u64>().unwrap_or(0);
        }
    }
    drop(ns);
}

fn report(t: &Totals, elapsed: Duration) -> String {
    let fmt = |m: &BTreeMap<String, u64>| m.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
    format!(
        "soak: {:.1} min, {} jobs ({} worker runs); faults: {}; calls completed and checked: {}; errors by kind: {}; \
         wrong answers: {}; hangs: {}; crashes: {}; largest growth within a worker: {} open files, {} KiB RSS",
        elapsed.as_secs_f64() / 60.0,
        t.jobs,
        t.worker_runs,
        fmt(&t.faults),
        t.calls,
        fmt(&t.errors),
        t.wrong,
        t.hangs,
        t.crashes,
        t.fd_growth,
        t.rss_growth_kib
    )
}

#[test]
#[ignore = "the chaos soak: scripts/soak.sh runs it (root, release build)"]
fn chaos_soak() {
    if common::harness::not_in_a_debug_build("chaos_soak", "scripts/soak.sh") {
        return;
    }
    let seconds: u64 = env("SOAK_SECONDS").parse().unwrap_or(60);
    let mut seed: u64 = env("SOAK_SEED").parse().unwrap_or_else(|_| now_ms());
    eprintln!("soak: {seconds} s, first job seed {seed}");
    let start = Instant::now();
    let mut t = Totals::default();
    let mut last_report = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        job(seed, &mut t);
        seed = seed.wrapping_add(1);
        if last_report.elapsed() > Duration::from_secs(60) {
            eprintln!("{}", report(&t, start.elapsed()));
            last_report = Instant::now();
        }
    }
    let line = report(&t, start.elapsed());
    println!("{line}");
    if let Some(path) = std::env::var_os("SOAK_REPORT") {
        std::fs::write(Path::new(&path), format!("{line}\n")).unwrap();
    }
    for n in t.hang_notes.iter().chain(&t.wrong_notes) {
        eprintln!("  {n}");
    }
    let mut init: Vec<(&String, &u64)> = t.init_failures.iter().collect();
    init.sort_by(|a, b| b.1.cmp(a.1));
    for (why, count) in init.iter().take(12) {
        println!("  init failed {count}x after {why}");
    }
    assert_eq!(t.wrong, 0, "wrong answers: {:?}", t.wrong_notes);
    assert_eq!(t.hangs, 0, "hangs: {:?}", t.hang_notes);
    assert_eq!(t.crashes, 0, "crashes: {:?}", t.hang_notes);
    assert!(t.calls > 0, "no call completed");
}
