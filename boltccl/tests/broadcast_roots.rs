//! Ranks that call `broadcast` with different roots: every rank fails, naming a rank that
//! disagrees and both roots, within moments — never two "roots" that each keep their own data
//! and return (the bug this file was written for: at 2 ranks, root 0 on rank 0 and root 1 on
//! rank 1 returned normally on both).
//!
//! Covered: 2, 3 and 4 ranks; in process (threads), and ranks as threads of this process each
//! forming its group over TCP (loopback), shared memory and verbs (softverbs; 2 and 3 ranks),
//! each test checking that its links are of the kind it names; small buffers (the root sends to
//! everyone), large ones (scatter then all-gather) and the ring. The rank processes of the
//! mismatch matrix (`mismatch.rs`) repeat the root cases between processes over TCP and shared
//! memory.

mod common;

use boltccl::{Algo, Backend, Config, Error, Group, LinkKind};
use common::harness::free_port;
use common::threads::{on_threads, ranks_on_threads};
use common::verbs::thread_cfg;
use std::time::{Duration, Instant};

/// Root assignments that disagree somewhere, for `n` ranks.
fn disagreements(n: usize) -> Vec<Vec<usize>> {
    let mut v = vec![
        (0..n).collect::<Vec<_>>(), // every rank thinks it is the root
        (0..n).map(|r| if r == n - 1 { 1 } else { 0 }).collect(),
        (0..n).map(|r| if r == 0 { n - 1 } else { 0 }).collect(),
    ];
    if n >= 3 {
        // Rank 1 agrees with rank 0, rank 2 follows rank 1's root: no pair of a root and its
        // receiver disagree directly on who sends to whom.
        v.push((0..n).map(|r| if r == 2 { 1 } else { 0 }).collect());
        v.push((0..n).map(|r| r % 2).collect());
    }
    v
}

/// Every rank's outcome of `broadcast(x, roots[rank])` with `count` floats.
fn outcome(g: &Group, roots: &[usize], count: usize) -> (Result<(), Error>, Duration, Vec<f32>) {
    let r = g.rank();
    let mut x = vec![r as f32 + 1.0; count];
    let t = Instant::now();
    let res = g.broadcast(&mut x, roots[r]);
    (res, t.elapsed(), x)
}

fn check(label: &str, roots: &[usize], outs: Vec<(Result<(), Error>, Duration, Vec<f32>)>) {
    for (r, (res, took, _)) in outs.into_iter().enumerate() {
        let e = match res {
            Ok(()) => panic!("{label} roots {roots:?}: rank {r} returned normally (a silent wrong answer)"),
            Err(e) => e.to_string(),
        };
        assert!(took < Duration::from_secs(5), "{label} roots {roots:?}: rank {r} took {took:?}: {e}");
        assert!(e.contains("root"), "{label} roots {roots:?}: rank {r}: not about the root: {e}");
        // The error names a rank that disagrees with some other rank, and two different roots.
        let names_a_culprit = (0..roots.len())
            .filter(|&q| roots.iter().any(|&x| x != roots[q]))
            .any(|q| e.contains(&format!("rank {q}")));
        assert!(names_a_culprit, "{label} roots {roots:?}: rank {r} names no disagreeing rank: {e}");
        let (theirs, ours) = roots_named(&e)
            .unwrap_or_else(|| panic!("{label} roots {roots:?}: rank {r} does not give both roots: {e}"));
        assert!(theirs != ours && roots.contains(&theirs) && roots.contains(&ours), "{label} {roots:?}: {e}");
    }
}

/// The two roots in "... used root X but this rank used Y".
fn roots_named(e: &str) -> Option<(usize, usize)> {
    let rest = &e[e.find("used root ")? + "used root ".len()..];
    let (x, rest) = rest.split_once(" but this rank used ")?;
    let y: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((x.parse().ok()?, y.parse().ok()?))
}

const SIZES: [(&str, usize); 2] = [("small", 100), ("large", 300_000)];

#[test]
fn disagreeing_roots_fail_on_every_rank_in_process() {
    for n in 2..=4 {
        for algo in [Algo::Auto, Algo::Ring] {
            for (size, count) in SIZES {
                for roots in disagreements(n) {
                    let cfg = Config { algo, timeout: Duration::from_secs(30), ..Config::default() };
                    let roots2 = roots.clone();
                    let outs = on_threads(Group::local_world_with(n, &cfg), move |_, g| outcome(g, &roots2, count));
                    check(&format!("in process, {n} ranks, {algo:?}, {size}"), &roots, outs);
                }
            }
        }
    }
}

/// Ranks as threads forming their group over `backend`, `sizes` of them; every link must be of
/// the kind `link`.
fn disagreeing_roots_over(backend: Backend, link: LinkKind, sizes: std::ops::RangeInclusive<usize>) {
    for n in sizes {
        for algo in [Algo::Auto, Algo::Ring] {
            for (size, count) in SIZES {
                for roots in disagreements(n) {
                    let port = free_port();
                    let roots2 = roots.clone();
                    let outs = ranks_on_threads(n, move |r| {
                        let base = match backend {
                            Backend::Verbs => thread_cfg(r, n, port, Duration::from_secs(30)),
                            _ => Config { backend, ..Config::default() },
                        };
                        let cfg = Config {
                            rank: r,
                            world_size: n,
                            coordinator: Some(format!("127.0.0.1:{port}")),
                            job_key: Some("roots".into()),
                            algo,
                            timeout: Duration::from_secs(30),
                            init_timeout: Duration::from_secs(20),
                            ..base
                        };
                        // A rank still forming its group when the others (done forming) find the
                        // mismatch learns of it there (seen over verbs): its outcome is that error.
                        let g = match Group::new(cfg) {
                            Ok(g) => g,
                            Err(e @ Error::Aborted { .. }) => return (Err(e), Duration::ZERO, Vec::new()),
                            Err(e) => panic!("rank {r}: the group does not form: {e}"),
                        };
                        for q in (0..n).filter(|&q| q != r) {
                            assert_eq!(g.link_kind(q).unwrap(), link, "rank {r}'s link to rank {q} over {backend:?}");
                        }
                        outcome(&g, &roots2, count)
                    });
                    check(&format!("{backend:?}, {n} ranks, {algo:?}, {size}"), &roots, outs);
                }
            }
        }
    }
}

#[test]
fn disagreeing_roots_fail_on_every_rank_over_tcp() {
    disagreeing_roots_over(Backend::Tcp, LinkKind::Tcp, 2..=4);
}

#[test]
fn disagreeing_roots_fail_on_every_rank_over_shared_memory() {
    disagreeing_roots_over(Backend::Shm, LinkKind::SharedMemory, 2..=4);
}

/// At 2 and 3 ranks: softverbs allows a process 10 queue pairs a device, as Apple's provider
/// does, and 4 ranks as threads of one process need 12.
#[test]
fn disagreeing_roots_fail_on_every_rank_over_verbs() {
    disagreeing_roots_over(Backend::Verbs, LinkKind::Rdma, 2..=3);
}

/// The fix adds frames, not a hang or a changed answer: agreeing roots still broadcast, every
/// root, both algorithms.
#[test]
fn agreeing_roots_still_broadcast() {
    for n in 2..=4 {
        for algo in [Algo::Auto, Algo::Ring] {
            for (_, count) in SIZES {
                for root in 0..n {
                    let cfg = Config { algo, ..Config::default() };
                    let outs =
                        on_threads(Group::local_world_with(n, &cfg), move |_, g| outcome(g, &vec![root; n], count));
                    for (r, (res, _, x)) in outs.into_iter().enumerate() {
                        res.unwrap_or_else(|e| panic!("{n} ranks {algo:?} root {root}: rank {r}: {e}"));
                        assert!(x.iter().all(|&v| v == root as f32 + 1.0), "rank {r} did not get root {root}'s data");
                    }
                }
            }
        }
    }
}
