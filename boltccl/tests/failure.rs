//! Failure behaviour with ranks as real processes: a killed rank, a stopped rank, a rank that
//! never starts, a wrong job key, mismatched calls, garbage on the coordinator port. Nothing
//! may hang; every surviving rank must get an error that names the culprit.

mod common;

use common::harness::{is_worker, one_job_at_a_time, Job, Ranks};
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// The rank-process side of every scenario.
#[test]
fn failure_worker() {
    if !is_worker() {
        return;
    }
    boltccl::log_to_stderr();
    let rank: usize = env("BOLTCCL_RANK").parse().unwrap();
    let scenario = env("SCENARIO");
    let g = match boltccl::init() {
        Ok(g) => g,
        Err(e) => {
            println!("INIT_ERR [{}] {e}", e.kind());
            return;
        }
    };
    match scenario.as_str() {
        "kill" | "stop" => {
            let victim: usize = env("VICTIM").parse().unwrap();
            let mut buf = vec![1.0f32; 4 << 20]; // 16 MiB: long enough to be caught mid-call
            g.all_sum(&mut buf).unwrap();
            if rank == victim {
                let stamp = env("STAMP");
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(30));
                    std::fs::write(&stamp, now_ms().to_string()).unwrap();
                    let sig =
                        if scenario == "kill" { rustix::process::Signal::Kill } else { rustix::process::Signal::Stop };
                    rustix::process::kill_process(rustix::process::getpid(), sig).unwrap();
                });
            }
            for _ in 0..100_000 {
                if let Err(e) = g.all_sum(&mut buf) {
                    println!("ERR_AT {}", now_ms());
                    println!("ERR {e}");
                    // Poisoned: the next call fails at once with the original cause.
                    let t = Instant::now();
                    let again = g.barrier().unwrap_err();
                    println!("AGAIN {} {}", t.elapsed().as_millis(), again);
                    return;
                }
            }
            println!("NO_ERROR");
        }
        "mismatch" => {
            let n: usize = env(&format!("COUNT_{rank}")).parse().unwrap();
            let mut buf = vec![1.0f32; n];
            let t = Instant::now();
            match g.all_sum(&mut buf) {
                Ok(()) => println!("NO_ERROR"),
                Err(e) => println!("ERR {} ms: {e}", t.elapsed().as_millis()),
            }
        }
        "plain" => {
            let mut buf = vec![rank as f32; 1000];
            g.all_sum(&mut buf).unwrap();
            println!("SUM {}", buf[0]);
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// The links every failure scenario runs over: TCP sockets and shared memory.
const BACKENDS: [&str; 2] = ["tcp", "shm"];

/// Rank 2 of 4 killed or stopped mid-call: (rank, ms from the signal to its error, the error)
/// of every other rank. One job at a time: two 4-rank jobs at once on a 2-core machine starve
/// each other's ranks, and the callers time how soon each rank hears of it.
fn dead_or_stalled_rank(scenario: &str, backend: &str, timeout_ms: u64) -> Vec<(usize, u128, String)> {
    let _one = one_job_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("stamp");
    let victim = 2usize;
    let outs = Ranks::spawn(
        4,
        "failure_worker",
        &[
            ("BOLTCCL_BACKEND", backend.into()),
            ("SCENARIO", scenario.into()),
            ("VICTIM", victim.to_string()),
            ("STAMP", stamp.display().to_string()),
            ("BOLTCCL_TIMEOUT_MS", timeout_ms.to_string()),
        ],
    )
    .wait(Duration::from_millis(timeout_ms * 3 + 20_000));
    let stamp: u128 = std::fs::read_to_string(&stamp).expect("the victim recorded when it died").parse().unwrap();
    outs.into_iter()
        .filter(|o| o.rank != victim)
        .map(|o| {
            let at: u128 = o
                .field("ERR_AT ")
                .unwrap_or_else(|| panic!("rank {} got no error:\n{}\n{}", o.rank, o.stdout, o.stderr))
                .parse()
                .unwrap();
            let err = o.field("ERR ").unwrap().to_string();
            let again = o.field("AGAIN ").unwrap().to_string();
            let again_ms: u128 = again.split(' ').next().unwrap().parse().unwrap();
            assert!(
                again_ms < 100,
                "rank {}: a call after the failure took {again_ms} ms instead of failing at once",
                o.rank
            );
            assert!(again.contains("unusable after an earlier error"), "rank {}: {again}", o.rank);
            assert!(
                again.contains(&format!("rank {victim}")),
                "rank {}: later error does not keep the cause: {again}",
                o.rank
            );
            // An error before the signal is not caused by it: a failure, not "0 ms".
            let after = at
                .checked_sub(stamp)
                .unwrap_or_else(|| panic!("rank {} failed {} ms before the signal: {err}", o.rank, stamp - at));
            (o.rank, after, err)
        })
        .collect()
}

#[test]
fn killed_rank_is_named_by_every_survivor_long_before_the_deadline() {
    for backend in BACKENDS {
        // Long before the deadline: within a tenth of it (3 s of 30 s).
        let timeout = 30_000;
        for (rank, after, err) in dead_or_stalled_rank("kill", backend, timeout) {
            assert!(err.contains("rank 2"), "{backend}: rank {rank}: error does not name rank 2: {err}");
            let limit = timeout as u128 / 10;
            assert!(after < limit, "{backend}: rank {rank} took {after} ms to notice (limit {limit}): {err}");
        }
    }
}

#[test]
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
fn stopped_rank_fails_the_others_at_the_deadline() {
    for backend in BACKENDS {
        // At the deadline: from three quarters of it (it counts from the last progress, a little
        // before the stop) to five times it.
        let timeout = 2_000;
        for (rank, after, err) in dead_or_stalled_rank("stop", backend, timeout) {
            assert!(err.contains("rank 2"), "{backend}: rank {rank}: error does not name rank 2: {err}");
            assert!(err.contains("timed out"), "{backend}: rank {rank}: not a timeout: {err}");
            let t = timeout as u128;
            assert!(
                (t * 3 / 4..t * 5).contains(&after),
                "{backend}: rank {rank} failed {after} ms after the stop: {err}"
            );
        }
    }
}

/// Rank 2 of 3 never starts: at the init deadline both ranks that did fail with a timeout
/// that names rank 2 (rank 1 learns it from the coordinator), not with a configuration error.
#[test]
fn a_rank_that_never_starts_is_named_at_the_init_deadline() {
    let t = Instant::now();
    let outs = Job::new(3, "failure_worker")
        .env("SCENARIO", "plain")
        .env("BOLTCCL_INIT_TIMEOUT_MS", "2000")
        .start([0, 1])
        .wait(Duration::from_secs(30));
    for o in &outs {
        let err =
            o.field("INIT_ERR ").unwrap_or_else(|| panic!("rank {} formed a group of 3 with 2:\n{}", o.rank, o.stdout));
        assert!(err.starts_with("[timeout]"), "rank {}: not a timeout: {err}", o.rank);
        assert!(err.contains("never joined: rank 2"), "rank {}: rank 2 not named: {err}", o.rank);
        assert!(err.contains("BOLTCCL_INIT_TIMEOUT_MS"), "rank {}: no hint: {err}", o.rank);
    }
    assert!(t.elapsed() < Duration::from_secs(15), "took {:?}", t.elapsed());
}

#[test]
fn wrong_job_key_is_rejected() {
    let outs = Job::new(2, "failure_worker")
        .env("SCENARIO", "plain")
        .env("BOLTCCL_INIT_TIMEOUT_MS", "3000")
        .rank_env(0, "BOLTCCL_JOB_KEY", "right-key")
        .rank_env(1, "BOLTCCL_JOB_KEY", "wrong-key")
        .spawn()
        .wait(Duration::from_secs(30));
    let (out0, err0, out1) = (&outs[0].stdout, &outs[0].stderr, &outs[1].stdout);
    assert!(out1.contains("INIT_ERR") && out1.contains("authentication failed"), "rank 1:\n{out1}");
    assert!(out1.contains("job key"), "rank 1's message should say what to fix:\n{out1}");
    assert!(out0.contains("INIT_ERR"), "rank 0 must fail, not form a group:\n{out0}");
    assert!(err0.contains("rejected a connection"), "rank 0 should log the rejection:\n{err0}");
}

#[test]
fn mismatched_counts_fail_on_every_rank() {
    for (label, base, backend) in BACKENDS.iter().flat_map(|&b| [("mesh", 1000usize, b), ("direct", 300_000, b)]) {
        let mut env = vec![("SCENARIO", "mismatch".to_string()), ("BOLTCCL_BACKEND", backend.to_string())];
        let keys: Vec<String> = (0..4).map(|r| format!("COUNT_{r}")).collect();
        for (r, k) in keys.iter().enumerate() {
            env.push((k.as_str(), if r == 2 { base - 1 } else { base }.to_string()));
        }
        let outs = Ranks::spawn(4, "failure_worker", &env).wait(Duration::from_secs(60));
        for o in &outs {
            let err = o
                .field("ERR ")
                .unwrap_or_else(|| panic!("{label}: rank {} got no error:\n{}{}", o.rank, o.stdout, o.stderr));
            let ms: u128 = err.split(' ').next().unwrap().parse().unwrap();
            assert!(ms < 5_000, "{label}: rank {} took {ms} ms (deadline is 30 s: it must not wait for it)", o.rank);
            assert!(
                err.contains(&format!("{}", base - 1)),
                "{label}: rank {}: error does not show the odd count: {err}",
                o.rank
            );
        }
    }
}

#[test]
fn garbage_on_the_coordinator_port_is_rejected_and_the_group_still_forms() {
    let port = common::harness::free_port();
    let job = Job::new(3, "failure_worker")
        .coordinator(format!("127.0.0.1:{port}"))
        .env("SCENARIO", "plain")
        .env("BOLTCCL_JOB_KEY", "k")
        .env("BOLTCCL_INIT_TIMEOUT_MS", "20000");
    let r0 = job.start([0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let connect = || loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("coordinator never listened: {e}"),
        }
    };
    // A silent client, an HTTP request, random bytes, and a right magic with a wrong version.
    let silent = connect();
    connect().write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    connect().write_all(&[0xff; 4096]).unwrap();
    let mut v = b"BOLTCCL\0".to_vec();
    v.extend_from_slice(&999u16.to_le_bytes());
    v.extend_from_slice(&[0u8; 16]);
    connect().write_all(&v).unwrap();
    let others = job.start(1..3);
    let mut outs = r0.wait(Duration::from_secs(60));
    outs.extend(others.wait(Duration::from_secs(60)));
    drop(silent);
    for (r, o) in outs.iter().enumerate() {
        assert!(o.stdout.contains("SUM 3"), "rank {r} did not finish its all_sum:\n{}\n{}", o.stdout, o.stderr);
    }
    let log0 = &outs[0].stderr;
    assert!(log0.matches("rejected a connection").count() >= 3, "rank 0 should log each rejection:\n{log0}");
}
