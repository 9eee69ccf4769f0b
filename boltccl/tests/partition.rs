//! Network faults with every process alive, ranks in network namespaces joined by veth pairs
//! (one per pair of ranks, like cables), over TCP and over verbs (softverbs), started directly:
//! - **partitions** mid-collective — the cable between rank 0 and rank 1 taken down, or every
//!   packet of one rank dropped by nftables — at 2, 3 and 4 ranks: every rank fails within the
//!   deadline (`BOLTCCL_TIMEOUT_MS`, plus a margin), naming a rank; when the link comes back,
//!   nothing hangs: every process exits;
//! - **a brief partition** (shorter than the deadline) over TCP: the collective resumes (TCP
//!   retransmits) and the answers are exact;
//! - **a slow but live link** (tc tbf) on which one 64 MiB all_sum takes several times
//!   `BOLTCCL_TIMEOUT_MS`: it succeeds, exactly, because the deadline counts from the last
//!   progress.
//!
//! Needs root, iproute2, tc and nftables: skipped outside CI when they are missing, a failure
//! in CI (`CI` set).

mod common;

use common::harness::{in_ci, is_worker, one_job_at_a_time, prerequisite_missing, Job, RankOutput, Ranks};
use common::verbs::{verbs_env_with, MeshNetns};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// A rank. `loop`: one all_sum, a `ready-<rank>` file, then all_sums (checked) until one fails
/// (then an `err-<rank>` file) or `ROUNDS` pass (then `DONE`, and `LONGEST start end`: when its
/// longest call started and ended, ms since the epoch). `slow`: one timed 64 MiB all_sum.
#[test]
fn partition_worker() {
    if !is_worker() {
        return;
    }
    boltccl::log_to_stderr();
    let value = |q: usize, i: usize, round: usize| ((q * 7 + i + round) % 29) as f32;
    // The slow call's 64 MiB input is made before init, whose bootstrap lines the ranks up:
    // made after it, a rank held up making it on a busy machine reached the call more than a
    // deadline after its peer, which timed out waiting for it.
    let slow_input = (env("WORKLOAD") == "slow").then(|| {
        let r: usize = env("BOLTCCL_RANK").parse().expect("BOLTCCL_RANK");
        (0..16 << 20).map(|i| value(r, i, 0)).collect::<Vec<f32>>()
    });
    let g = boltccl::init().unwrap_or_else(|e| panic!("init: {e}"));
    let (r, p) = (g.rank(), g.size());
    let dir = env("STATE_DIR");
    let mark = |what: &str| std::fs::write(Path::new(&dir).join(format!("{what}-{r}")), "").unwrap();
    match env("WORKLOAD").as_str() {
        "loop" => {
            let n = 1 << 20; // 4 MiB
            let rounds: usize = env("ROUNDS").parse().unwrap_or(1_000_000);
            let mut longest = (0, 0);
            for round in 0..rounds {
                let mut x: Vec<f32> = (0..n).map(|i| value(r, i, round)).collect();
                let t = Instant::now();
                let started = now_ms();
                match g.all_sum(&mut x) {
                    Ok(()) => {
                        let ended = now_ms();
                        if ended - started > longest.1 - longest.0 {
                            longest = (started, ended);
                        }
                        for (i, v) in x.iter().enumerate().step_by(997) {
                            let want: f32 = (0..p).map(|q| value(q, i, round)).sum();
                            assert_eq!(*v, want, "WRONG ANSWER round {round} element {i}");
                        }
                        if round == 0 {
                            mark("ready");
                        }
                    }
                    Err(e) => {
                        println!("ERR_AT {}", now_ms());
                        println!("ERR {} ms: {e}", t.elapsed().as_millis());
                        mark("err");
                        return;
                    }
                }
            }
            println!("DONE {rounds}");
            println!("LONGEST {} {}", longest.0, longest.1);
        }
        "slow" => {
            let mut x = slow_input.expect("made above");
            let t = Instant::now();
            g.all_sum(&mut x).unwrap_or_else(|e| panic!("slow all_sum failed after {:?}: {e}", t.elapsed()));
            let took = t.elapsed();
            for (i, v) in x.iter().enumerate().step_by(101) {
                let want: f32 = (0..p).map(|q| value(q, i, 0)).sum();
                assert_eq!(*v, want, "WRONG ANSWER element {i}");
            }
            println!("SLOW {}", took.as_millis());
        }
        other => panic!("unknown workload {other}"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Tcp,
    Verbs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// The veth between ranks 0 and 1 down.
    LinkDown,
    /// Every packet of rank `n - 1` dropped by nftables.
    Isolate,
}

fn namespaces(test: &str, n: usize) -> Option<MeshNetns> {
    let ns = MeshNetns::create(n);
    if ns.is_none() {
        prerequisite_missing(test, "cannot create network namespaces (needs root and iproute2 `ip`)");
    }
    if ns.is_some() && std::process::Command::new("nft").arg("--version").output().is_err() {
        prerequisite_missing(test, "nft not found (apt-get install nftables; scripts/test.sh does)");
        return None;
    }
    ns
}

fn job(ns: &MeshNetns, n: usize, backend: Backend, state: &Path, timeout_ms: u64) -> Job {
    let names = ns.names.clone();
    let port = 20_000 + (std::process::id() % 20_000) as u16 + ns.tag as u16 % 1000;
    let mut job = Job::new(n, "partition_worker")
        .coordinator(format!("{}:{port}", ns.identity(0)))
        .wrap(move |k| ["ip", "netns", "exec", &names[k]].map(String::from).to_vec())
        .env("STATE_DIR", state.display().to_string())
        .env("BOLTCCL_TIMEOUT_MS", timeout_ms.to_string())
        .env("BOLTCCL_INIT_TIMEOUT_MS", "30000");
    if backend == Backend::Verbs {
        job = job.envs(verbs_env_with(ns.matrix(n)));
    }
    job
}

fn wait_for(state: &Path, what: &str, ranks: impl IntoIterator<Item = usize> + Clone, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while ranks.clone().into_iter().any(|r| !state.join(format!("{what}-{r}")).exists()) {
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

fn partitioned(test: &str, n: usize, backend: Backend, cut: Cut) {
    let _one = one_job_at_a_time();
    let Some(ns) = namespaces(test, n) else { return };
    let timeout = 2_000u64;
    let state = tempfile::tempdir().unwrap();
    let label = format!("{n} ranks over {backend:?}, {cut:?}");
    if backend == Backend::Verbs {
        ns.ready_for_datagrams();
    }
    let ranks: Ranks = job(&ns, n, backend, state.path(), timeout).env("WORKLOAD", "loop").spawn();
    if !wait_for(state.path(), "ready", 0..n, Duration::from_secs(60)) {
        panic!("{label}: ranks never got going:\n{}", summary(&ranks.wait(Duration::ZERO)));
    }
    std::thread::sleep(Duration::from_millis(50));
    let at = now_ms();
    match cut {
        Cut::LinkDown => ns.set_link(0, 1, false),
        Cut::Isolate => ns.isolate(n - 1, true),
    }
    // Every rank fails within the deadline (and a margin); then the link comes back.
    let failed = wait_for(state.path(), "err", 0..n, Duration::from_millis(timeout * 3 + 10_000));
    let back = Instant::now();
    match cut {
        Cut::LinkDown => ns.set_link(0, 1, true),
        Cut::Isolate => ns.isolate(n - 1, false),
    }
    let outs: Vec<RankOutput> = ranks.wait(Duration::from_secs(15));
    let exited = back.elapsed();
    assert!(failed, "{label}: not every rank failed:\n{}", summary(&outs));
    for o in &outs {
        assert!(o.status.success(), "{label}: rank {} did not exit by itself ({:?}):\n{}", o.rank, o.status, o.stderr);
        let err_at: u128 = o.field("ERR_AT ").unwrap().parse().unwrap();
        let err = o.field("ERR ").unwrap();
        // An error before the cut is not caused by it: a failure, not "0 ms".
        let after = err_at
            .checked_sub(at)
            .unwrap_or_else(|| panic!("{label}: rank {} failed {} ms before the cut: {err}", o.rank, at - err_at));
        eprintln!("{label}: rank {} failed {after} ms after the cut: {err}", o.rank);
        // At the deadline: not long before it (the deadline counts from the last progress, a
        // little before the cut), nor long after it; both bounds scale with the deadline.
        let t = timeout as u128;
        assert!((t / 2..t * 5 / 2).contains(&after), "{label}: rank {} failed {after} ms after the cut: {err}", o.rank);
        // It names a rank at the cut: an end of the link taken down; the isolated rank, on
        // every other rank (the isolated one may name any rank: all are cut off from it).
        let at_cut: Vec<usize> = match cut {
            Cut::LinkDown => vec![0, 1],
            Cut::Isolate if o.rank == n - 1 => (0..n - 1).collect(),
            Cut::Isolate => vec![n - 1],
        };
        let named = at_cut.iter().any(|q| err.contains(&format!("rank {q}")));
        assert!(named, "{label}: rank {} names none of ranks {at_cut:?}: {err}", o.rank);
    }
    let exit_limit = Duration::from_millis(timeout * 5);
    assert!(exited < exit_limit, "{label}: processes took {exited:?} to exit after the link came back");
}

fn summary(outs: &[RankOutput]) -> String {
    outs.iter().map(|o| format!("rank {} ({:?}): {}\n{}", o.rank, o.status, o.stdout, o.stderr)).collect()
}

#[test]
fn link_down_fails_every_rank_within_the_deadline_over_tcp() {
    for n in 2..=4 {
        partitioned("link_down_fails_every_rank_within_the_deadline_over_tcp", n, Backend::Tcp, Cut::LinkDown);
    }
}

#[test]
fn link_down_fails_every_rank_within_the_deadline_over_verbs() {
    for n in 2..=4 {
        partitioned("link_down_fails_every_rank_within_the_deadline_over_verbs", n, Backend::Verbs, Cut::LinkDown);
    }
}

#[test]
fn dropped_traffic_fails_every_rank_within_the_deadline() {
    let test = "dropped_traffic_fails_every_rank_within_the_deadline";
    partitioned(test, 3, Backend::Tcp, Cut::Isolate);
    partitioned(test, 3, Backend::Verbs, Cut::Isolate);
}

/// A partition shorter than the deadline: TCP retransmits, the all_sums resume, exactly.
#[test]
fn brief_partition_is_survived_over_tcp() {
    let test = "brief_partition_is_survived_over_tcp";
    let n = 3;
    let _one = one_job_at_a_time();
    let Some(ns) = namespaces(test, n) else { return };
    let state = tempfile::tempdir().unwrap();
    let ranks = job(&ns, n, Backend::Tcp, state.path(), 8_000).env("WORKLOAD", "loop").env("ROUNDS", "40").spawn();
    assert!(wait_for(state.path(), "ready", 0..n, Duration::from_secs(60)));
    ns.set_link(0, 1, false);
    let down = now_ms(); // the link is down by now (`ip` has returned)
    std::thread::sleep(Duration::from_millis(1_000));
    let up = now_ms(); // and still down until after this
    ns.set_link(0, 1, true);
    for o in ranks.wait(Duration::from_secs(120)) {
        assert!(o.status.success(), "rank {} ({:?}):\n{}\n{}", o.rank, o.status, o.stdout, o.stderr);
        assert_eq!(o.field("DONE "), Some("40"), "rank {} failed:\n{}", o.rank, o.stdout);
        // Without a call held up by the outage the test proves nothing (the calls all done
        // before the cut, or all after it): on every rank, one call began in the first half of
        // the outage at the latest and ended after the link came back.
        let longest: Vec<u128> = o.field("LONGEST ").unwrap().split(' ').map(|v| v.parse().unwrap()).collect();
        let midway = down + (up - down) / 2;
        assert!(
            longest[0] < midway && longest[1] > up,
            "rank {}: no call was held up by the outage ({down}..{up}): the longest ran {}..{}",
            o.rank,
            longest[0],
            longest[1]
        );
    }
}

/// One 64 MiB all_sum over links capped so that it takes several deadlines: it succeeds.
fn slow_link(test: &str, backend: Backend, rate: &str, timeout_ms: u64) {
    let _one = one_job_at_a_time();
    let n = 2;
    let Some(ns) = namespaces(test, n) else { return };
    ns.limit_rate(rate);
    let state = tempfile::tempdir().unwrap();
    let outs =
        job(&ns, n, backend, state.path(), timeout_ms).env("WORKLOAD", "slow").spawn().wait(Duration::from_secs(180));
    for o in &outs {
        assert!(o.status.success(), "{backend:?} at {rate}: rank {} failed:\n{}\n{}", o.rank, o.stdout, o.stderr);
        let ms: u64 = o.field("SLOW ").unwrap().parse().unwrap();
        eprintln!("{backend:?}, links at {rate}: the 64 MiB all_sum took {ms} ms with BOLTCCL_TIMEOUT_MS={timeout_ms}");
        assert!(ms > 2 * timeout_ms, "{backend:?}: {ms} ms is not slower than the deadline: the test proves nothing");
    }
}

#[test]
fn slow_live_link_outlasts_the_deadline_over_tcp() {
    slow_link("slow_live_link_outlasts_the_deadline_over_tcp", Backend::Tcp, "150mbit", 1_000);
}

#[test]
fn slow_live_link_outlasts_the_deadline_over_verbs() {
    slow_link("slow_live_link_outlasts_the_deadline_over_verbs", Backend::Verbs, "150mbit", 1_000);
}

/// The prerequisite check itself: in CI, a missing namespace is a failure, never a skip.
#[test]
fn ci_runs_the_namespace_tests() {
    if in_ci() {
        assert!(MeshNetns::create(2).is_some(), "CI is set but network namespaces cannot be created (run as root)");
    }
}
