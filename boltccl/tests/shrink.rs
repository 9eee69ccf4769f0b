//! Groups that survive: `Group::abort` from another thread, and `Group::shrink` after a rank
//! is killed mid-collective (rank 0, the coordinator, among the cases), over TCP and shared
//! memory, with real processes started directly.
//!
//! What each case checks on every survivor: the shrink gives a group of the survivors, ranks
//! renumbered in the old order, whose all_sums (small and large, so every algorithm's
//! messages cross the reused links) give the exact sums; no TCP connection and no queue pair
//! was made for it (the process's TCP sockets, and its UDP sockets, one per softverbs queue
//! pair, after the shrink are subsets of those before); and the time from the kill to the first
//! correct all_sum of the new group, printed.

mod common;

use common::harness::{is_worker, one_job_at_a_time, Job, RankOutput};
use common::verbs::verbs_env;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// The inodes of this process's sockets listed in `tables` (from /proc: sockets whose inode is
/// in those tables).
fn sockets(tables: &[&str]) -> BTreeSet<u64> {
    let mut listed: BTreeSet<u64> = BTreeSet::new();
    for table in tables {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            if let Some(inode) = line.split_whitespace().nth(9).and_then(|i| i.parse().ok()) {
                listed.insert(inode);
            }
        }
    }
    let mut mine = BTreeSet::new();
    for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else { continue };
        let t = target.to_string_lossy();
        if let Some(inode) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')).and_then(|s| s.parse().ok()) {
            if listed.contains(&inode) {
                mine.insert(inode);
            }
        }
    }
    mine
}

/// This process's TCP connections (and listeners).
fn tcp_sockets() -> BTreeSet<u64> {
    sockets(&["/proc/self/net/tcp", "/proc/self/net/tcp6"])
}

/// This process's UDP sockets: over softverbs each queue pair is one (its number is the port),
/// so these count the queue pairs.
fn queue_pairs() -> BTreeSet<u64> {
    sockets(&["/proc/self/net/udp", "/proc/self/net/udp6"])
}

/// All_sums of `n` elements, each rank's value its rank + 1: every element must be the sum.
/// The error is a line to print: `WRONG ...` for a wrong sum, `NEW_GROUP_ERR ...` for a call
/// that failed (a rank of the new group died too).
fn check_sums(g: &boltccl::Group, n: usize) -> Result<(), String> {
    let mut buf = vec![(g.rank() + 1) as f32; n];
    g.all_sum(&mut buf).map_err(|e| format!("NEW_GROUP_ERR {e}"))?;
    let want = (g.size() * (g.size() + 1) / 2) as f32;
    match buf.iter().position(|&x| x != want) {
        Some(i) => Err(format!("WRONG all_sum of {n}: element {i} is {}, want {want}", buf[i])),
        None => Ok(()),
    }
}

/// A rank: a first all_sum, a file saying so, all_sums until one fails (a rank was killed, or
/// aborted); then shrink, check the new group, print what happened.
///
/// `MODE=abort`: rank `ABORTER` calls `abort()` from a second thread while its all_sum waits
/// for the other ranks, which start theirs only after it aborted.
#[test]
fn shrink_worker() {
    if !is_worker() {
        return;
    }
    boltccl::log_to_stderr();
    let g = boltccl::init().unwrap_or_else(|e| panic!("init: {e}"));
    let mut buf = vec![1.0f32; 1 << 20];
    g.all_sum(&mut buf).unwrap();
    let before = tcp_sockets();
    let qps_before = queue_pairs();
    println!("QPS_BEFORE {}", qps_before.len());
    std::fs::write(Path::new(&env("READY_DIR")).join(g.rank().to_string()), "").unwrap();
    let old_rank = g.rank();
    let err = if env("MODE") == "abort" {
        let aborter: usize = env("ABORTER").parse().unwrap();
        if g.rank() == aborter {
            let t = Instant::now();
            let e = std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(300));
                    g.abort();
                    g.abort();
                });
                g.all_sum(&mut buf).unwrap_err()
            });
            println!("ABORTED_AFTER {}", t.elapsed().as_millis());
            e
        } else {
            // Starts its all_sum only after the aborter's abort (at 300 ms): it must fail.
            std::thread::sleep(Duration::from_millis(1000));
            g.all_sum(&mut buf).unwrap_err()
        }
    } else {
        loop {
            if let Err(e) = g.all_sum(&mut buf) {
                break e;
            }
        }
    };
    println!("ERR_AT {}", now_ms());
    println!("ERR {err}");
    let t = Instant::now();
    let g2 = match g.shrink() {
        Ok(g2) => g2,
        Err(e) => {
            println!("SHRINK_ERR {e}");
            return;
        }
    };
    let shrink_ms = t.elapsed().as_secs_f64() * 1e3;
    // The old group is done.
    let old = g.barrier().unwrap_err();
    assert!(matches!(old, boltccl::Error::Poisoned(_)), "the old group after a shrink: {old}");
    for n in [1, 1000, 4 << 20] {
        if let Err(e) = check_sums(&g2, n) {
            println!("{e}");
            return;
        }
        if n == 1 {
            // The first call of the new group is back: it works.
            println!("WORKING_AT {}", now_ms());
        }
    }
    println!("SHRINK_MS {shrink_ms:.2}");
    println!("NEW {old_rank} {} {}", g2.rank(), g2.size());
    let after = tcp_sockets();
    let new: Vec<_> = after.difference(&before).collect();
    println!("NEW_TCP {}", new.len());
    println!("NEW_QPS {}", queue_pairs().difference(&qps_before).count());
    // Every survivor is done with the new group before any leaves (a rank of it killed
    // meanwhile makes this fail, which a test may expect).
    if let Err(e) = g2.barrier() {
        println!("FINAL_ERR {e}");
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Tcp,
    Shm,
    /// RDMA over softverbs.
    Verbs,
}

/// Start `n` ranks, wait for their first all_sum, kill `victims` (none: `MODE=abort`), and
/// return (when, the outputs).
fn run(n: usize, backend: Backend, victims: &[usize], extra: &[(&str, &str)]) -> (u128, Vec<RankOutput>) {
    run_with_late_kill(n, backend, victims, None, extra)
}

/// [`run`], and `late`: kill this rank too, this long after the first kills (while the others
/// notice, or vote).
fn run_with_late_kill(
    n: usize,
    backend: Backend,
    victims: &[usize],
    late: Option<(usize, Duration)>,
    extra: &[(&str, &str)],
) -> (u128, Vec<RankOutput>) {
    let dir = tempfile::tempdir().unwrap();
    let mut job = Job::new(n, "shrink_worker")
        .env("READY_DIR", dir.path().display().to_string())
        .env("BOLTCCL_TIMEOUT_MS", "20000");
    job = match backend {
        Backend::Tcp => job.env("BOLTCCL_BACKEND", "tcp"),
        Backend::Shm => job.env("BOLTCCL_BACKEND", "shm"),
        Backend::Verbs => job.envs(verbs_env(n)),
    };
    for (k, v) in extra {
        job = job.env(*k, *v);
    }
    let ranks = job.spawn();
    let until = Instant::now() + Duration::from_secs(60);
    while (0..n).any(|r| !dir.path().join(r.to_string()).exists()) {
        assert!(Instant::now() < until, "{n} ranks over {backend:?} never finished a first all_sum");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    let at = now_ms();
    let kill = |v: usize| {
        let pid = rustix::process::Pid::from_raw(ranks.children[v].id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::Kill).unwrap();
    };
    victims.iter().for_each(|&v| kill(v));
    if let Some((v, after)) = late {
        std::thread::sleep(after);
        kill(v);
    }
    (at, ranks.wait(Duration::from_secs(90)))
}

/// A rank stopped (SIGSTOP) mid-collective: the others time out, shrink without it once it
/// has not voted within the deadline, and sum right; continued, its own shrink fails saying it
/// was left out.
#[test]
fn a_stalled_rank_is_left_out_and_told_so() {
    let _one = one_job_at_a_time();
    let label = "3 ranks over TCP, SIGSTOP of rank 2, shrink";
    let dir = tempfile::tempdir().unwrap();
    let ranks = Job::new(3, "shrink_worker")
        .env("READY_DIR", dir.path().display().to_string())
        .env("BOLTCCL_TIMEOUT_MS", "1500")
        .env("BOLTCCL_BACKEND", "tcp")
        .spawn();
    let until = Instant::now() + Duration::from_secs(60);
    while (0..3).any(|r| !dir.path().join(r.to_string()).exists()) {
        assert!(Instant::now() < until, "{label}: never finished a first all_sum");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    let pid = rustix::process::Pid::from_raw(ranks.children[2].id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::Stop).unwrap();
    // The others time out (1.5 s), then wait up to 1.5 s for its vote, then go on.
    std::thread::sleep(Duration::from_millis(6_000));
    rustix::process::kill_process(pid, rustix::process::Signal::Cont).unwrap();
    let outs = ranks.wait(Duration::from_secs(60));
    survivors_shrank(label, 3, &[2], 0, &outs[..2]);
    let o = &outs[2];
    let err =
        o.field("SHRINK_ERR ").unwrap_or_else(|| panic!("{label}: rank 2 was not told:\n{}\n{}", o.stdout, o.stderr));
    assert!(err.contains("without this rank"), "{label}: rank 2: {err}");
}

/// Every survivor shrank to the same group of the survivors, renumbered in order, which
/// summed right, over the old links. Returns the ms from the kill to each survivor's first
/// correct all_sum in the new group.
fn survivors_shrank(label: &str, n: usize, victims: &[usize], at: u128, outs: &[RankOutput]) -> Vec<u128> {
    let alive: Vec<usize> = (0..n).filter(|r| !victims.contains(r)).collect();
    let mut times = Vec::new();
    for o in outs.iter().filter(|o| alive.contains(&o.rank)) {
        let show = || format!("{label}: rank {}:\n{}\n{}", o.rank, o.stdout, o.stderr);
        assert!(o.status.success(), "{} exited {:?}", show(), o.status);
        assert!(
            o.field("WRONG ").is_none() && o.field("SHRINK_ERR ").is_none() && o.field("NEW_GROUP_ERR ").is_none(),
            "{}",
            show()
        );
        let new = o.field("NEW ").unwrap_or_else(|| panic!("{}: no new group", show()));
        let want = format!("{} {} {}", o.rank, alive.iter().position(|&r| r == o.rank).unwrap(), alive.len());
        assert_eq!(new, want, "{}", show());
        assert_eq!(o.field("NEW_TCP "), Some("0"), "{}: the shrink opened TCP connections", show());
        assert_eq!(o.field("NEW_QPS "), Some("0"), "{}: the shrink made queue pairs", show());
        assert!(o.field("FINAL_ERR ").is_none(), "{}", show());
        let working: u128 = o.field("WORKING_AT ").unwrap().parse().unwrap();
        times.push(working - at);
    }
    eprintln!("{label}: from the kill to a working group: {times:?} ms");
    times
}

fn killed(n: usize, backend: Backend, victims: &[usize]) {
    let _one = one_job_at_a_time();
    let label = format!("{n} ranks over {backend:?}, kill -9 of {victims:?}, shrink");
    let (at, outs) = run(n, backend, victims, &[]);
    let times = survivors_shrank(&label, n, victims, at, &outs);
    if backend == Backend::Verbs {
        // The count sees the queue pairs: the old group had one to each peer at least.
        for o in outs.iter().filter(|o| !victims.contains(&o.rank)) {
            let qps: usize = o.field("QPS_BEFORE ").unwrap().parse().unwrap();
            assert!(qps >= n - 1, "{label}: rank {} counted {qps} queue pairs before the shrink", o.rank);
        }
    }
    // Far inside the deadline (20 s): a death is named at once, and the survivors' votes
    // need no wait.
    assert!(times.iter().all(|&t| t < 5_000), "{label}: {times:?} ms");
}

#[test]
fn three_ranks_over_tcp_shrink_to_two_after_a_kill() {
    killed(3, Backend::Tcp, &[1]);
}

#[test]
fn four_ranks_over_tcp_shrink_to_three_after_rank_0_is_killed() {
    killed(4, Backend::Tcp, &[0]);
}

#[test]
fn three_ranks_over_shared_memory_shrink_to_two_after_a_kill() {
    killed(3, Backend::Shm, &[2]);
}

#[test]
fn four_ranks_over_shared_memory_shrink_to_three_after_rank_0_is_killed() {
    killed(4, Backend::Shm, &[0]);
}

/// Over RDMA (softverbs: UC queue pairs with Apple's semantics) the survivors keep their queue
/// pairs: markers both ways drop what the failed call left on them.
#[test]
fn three_ranks_over_rdma_shrink_to_two_after_a_kill() {
    killed(3, Backend::Verbs, &[1]);
}

#[test]
fn four_ranks_over_rdma_shrink_to_three_after_rank_0_is_killed() {
    killed(4, Backend::Verbs, &[0]);
}

/// A second rank dies while the others notice the first death or vote: every survivor ends
/// within the deadline, and those whose shrink succeeds have one and the same group, which
/// sums right (whoever fails says so; nobody hangs, nobody gets a different group).
#[test]
fn a_second_death_during_the_shrink_never_gives_two_groups() {
    let _one = one_job_at_a_time();
    for delay_ms in [0u64, 3, 30, 100, 150, 200, 250, 300] {
        let label = format!("4 ranks over TCP, rank 3 killed, rank 2 {delay_ms} ms later");
        let (_, outs) = run_with_late_kill(4, Backend::Tcp, &[3], Some((2, Duration::from_millis(delay_ms))), &[]);
        let mut groups = Vec::new();
        for o in outs.iter().filter(|o| o.rank < 2) {
            let show = || format!("{label}: rank {}:\n{}\n{}", o.rank, o.stdout, o.stderr);
            assert!(o.status.success(), "{} exited {:?}", show(), o.status);
            assert!(o.elapsed < Duration::from_secs(45), "{}: took {:?}", show(), o.elapsed);
            assert!(o.field("WRONG ").is_none(), "{}", show());
            // The group a successful shrink gave: its size, from its first all_sum's line or
            // (when rank 2 was in it and died next) from the error naming rank 2.
            if let Some(err) = o.field("FINAL_ERR ") {
                // The group of three formed and summed right; rank 2 died before its end.
                assert!(err.contains("rank 2"), "{}: {err}", show());
            }
            match (o.field("NEW "), o.field("SHRINK_ERR "), o.field("NEW_GROUP_ERR ")) {
                (Some(new), None, None) => groups.push(new.split(' ').nth(2).unwrap().to_string()),
                (None, Some(err), None) => eprintln!("{label}: rank {} failed its shrink: {err}", o.rank),
                (None, None, Some(err)) if err.contains("rank 2") => {
                    eprintln!("{label}: rank {}'s new group lost rank 2: {err}", o.rank);
                    groups.push("3".into());
                }
                _ => panic!("{}: neither a new group nor a shrink error", show()),
            }
        }
        eprintln!("{label}: new group sizes of the survivors that shrank: {groups:?}");
        assert!(groups.windows(2).all(|w| w[0] == w[1]), "{label}: two different groups: {groups:?}");
    }
}

/// `abort()` from another thread stops the blocked call at once and reaches every rank, which
/// then shrink to a group of all of them over the same links.
fn aborted(backend: Backend) {
    let _one = one_job_at_a_time();
    let label = format!("3 ranks over {backend:?}, rank 1 aborts");
    let (_, outs) = run(3, backend, &[], &[("MODE", "abort"), ("ABORTER", "1")]);
    for o in &outs {
        let show = || format!("{label}: rank {}:\n{}\n{}", o.rank, o.stdout, o.stderr);
        let err = o.field("ERR ").unwrap_or_else(|| panic!("{}: no error", show()));
        assert!(err.contains("rank 1") && err.contains("abort"), "{}: {err}", show());
        if o.rank == 1 {
            let ms: u128 = o.field("ABORTED_AFTER ").unwrap().parse().unwrap();
            eprintln!("{label}: the aborted call returned {ms} ms in (the abort at 300 ms)");
            // The abort comes 300 ms in; "at once" is well before the 20 s deadline.
            assert!((300..1_500).contains(&ms), "{}: the aborted call returned after {ms} ms", show());
        }
    }
    survivors_shrank(&label, 3, &[], 0, &outs);
}

#[test]
fn abort_from_another_thread_then_shrink_over_tcp() {
    aborted(Backend::Tcp);
}

#[test]
fn abort_from_another_thread_then_shrink_over_shared_memory() {
    aborted(Backend::Shm);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The figures (`scripts/bench.sh shrink`): 20 kills each at 3 -> 2 and 4 -> 3 ranks over TCP,
/// shared memory and RDMA (softverbs); the median time from the kill to the first all_sum of the new group
/// on the slowest survivor, and of the `shrink` call itself.
#[test]
#[ignore = "a benchmark: scripts/bench.sh shrink"]
fn shrink_times() {
    if common::harness::not_in_a_debug_build("shrink_times", "scripts/bench.sh shrink") {
        return;
    }
    let _one = one_job_at_a_time();
    let runs: usize = std::env::var("SHRINK_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    println!(
        "| ranks | links | kill -> working group, ms (median of {runs}) | shrink() call, ms | new TCP connections | new queue pairs |"
    );
    println!("|---|---|---|---|---|---|");
    let rows = [
        (3, Backend::Tcp),
        (4, Backend::Tcp),
        (3, Backend::Shm),
        (4, Backend::Shm),
        (3, Backend::Verbs),
        (4, Backend::Verbs),
    ];
    for (n, backend) in rows {
        let (mut working, mut calls, mut opened, mut made) = (Vec::new(), Vec::new(), 0, 0);
        for _ in 0..runs {
            let label = format!("{n} ranks over {backend:?}");
            let (at, outs) = run(n, backend, &[1], &[]);
            let times = survivors_shrank(&label, n, &[1], at, &outs);
            working.push(*times.iter().max().unwrap() as f64);
            let slowest = outs.iter().filter_map(|o| o.field("SHRINK_MS ")?.parse::<f64>().ok()).fold(0.0, f64::max);
            calls.push(slowest);
            opened += outs.iter().filter_map(|o| o.field("NEW_TCP ")?.parse::<usize>().ok()).sum::<usize>();
            made += outs.iter().filter_map(|o| o.field("NEW_QPS ")?.parse::<usize>().ok()).sum::<usize>();
        }
        println!(
            "| {n} -> {} | {backend:?} | {:.1} | {:.2} | {opened} | {made} |",
            n - 1,
            median(working),
            median(calls)
        );
    }
}
