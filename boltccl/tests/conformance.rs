//! Conformance: every collective × world sizes 1–8 × lengths {0, 1, prime, many chunks} ×
//! every element type × every algorithm, over the in-process transport (ranks as threads),
//! over TCP and over shared memory (ranks as separate processes). Results are checked against a sequential reference
//! and must be bitwise identical on all ranks — and, for the rank-order algorithms (mesh,
//! direct), identical between algorithms; each algorithm gives the same bits over every
//! transport.

mod common;

use boltccl::{Algo, Config, Group};
use common::harness::{is_worker, results, Ranks};
use common::threads::on_threads;
use common::workload::{all_to_all_and_rooted_suite, suite};
use std::collections::HashMap;
use std::time::Duration;

const ALGOS: [Algo; 5] = [Algo::Auto, Algo::Mesh, Algo::Direct, Algo::Ring, Algo::Doubling];

/// The algorithms that fold in rank order, so give the same bits as each other.
fn rank_order(algo: Algo) -> bool {
    matches!(algo, Algo::Mesh | Algo::Direct)
}
/// Small chunks, so short buffers take the multi-chunk paths.
const CHUNK: usize = 64;

fn run_in_process(n: usize, algo: Algo) -> Vec<u64> {
    // A small mesh threshold so `auto` uses both mesh and direct within the suite.
    // Small rings, so frames wrap around them and writers wait for room.
    let cfg = Config {
        algo,
        chunk_bytes: Some(CHUNK),
        mesh_max_bytes: 256,
        shm_ring_bytes: 4096,
        timeout: Duration::from_secs(20),
        ..Config::default()
    };
    on_threads(Group::local_world_with(n, &cfg), |_, g| suite(g))
}

#[test]
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
fn in_process_every_world_size_and_algorithm() {
    for n in 1..=8 {
        let mut rank_order_digest = None;
        for algo in ALGOS {
            let digests = run_in_process(n, algo);
            assert!(digests.iter().all(|&d| d == digests[0]), "world {n} {algo:?}: ranks differ: {digests:x?}");
            if rank_order(algo) {
                let d = *rank_order_digest.get_or_insert(digests[0]);
                assert_eq!(
                    d, digests[0],
                    "world {n}: {algo:?} gave different bits from the other rank-order algorithms"
                );
            }
        }
    }
}

/// The rank-process side of the TCP test.
#[test]
fn tcp_worker() {
    if !is_worker() {
        return;
    }
    boltccl::log_to_stderr();
    let g = boltccl::init().expect("init");
    let d = suite(&g);
    println!("DIGEST {d:x}");
}

#[test]
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
fn tcp_processes_every_world_size_and_algorithm() {
    let mut per_world: HashMap<(usize, Algo), String> = HashMap::new();
    for n in 1..=8 {
        for algo in ALGOS {
            let env = [
                ("BOLTCCL_BACKEND", "tcp".to_string()),
                ("BOLTCCL_ALGO", algo.name().to_string()),
                ("BOLTCCL_CHUNK_BYTES", CHUNK.to_string()),
                ("BOLTCCL_MESH_MAX_BYTES", "256".to_string()),
                ("BOLTCCL_TIMEOUT_MS", "20000".to_string()),
            ];
            let outs = Ranks::spawn(n, "tcp_worker", &env).wait(Duration::from_secs(120));
            let d = results(&outs, "DIGEST ");
            assert!(d.iter().all(|x| x == &d[0]), "world {n} {algo:?}: ranks differ: {d:?}");
            per_world.insert((n, algo), d[0].clone());
            if algo == Algo::Direct {
                assert_eq!(per_world[&(n, Algo::Mesh)], d[0], "world {n}: {algo:?} over TCP gave different bits");
            }
        }
    }
    // Several connections per peer: pieces are striped across them, results unchanged.
    for algo in [Algo::Auto, Algo::Ring] {
        let env = [
            ("BOLTCCL_BACKEND", "tcp".to_string()),
            ("BOLTCCL_ALGO", algo.name().to_string()),
            ("BOLTCCL_CHUNK_BYTES", CHUNK.to_string()),
            ("BOLTCCL_MESH_MAX_BYTES", "256".to_string()),
            ("BOLTCCL_TCP_STREAMS", "3".to_string()),
        ];
        let d = results(&Ranks::spawn(4, "tcp_worker", &env).wait(Duration::from_secs(120)), "DIGEST ");
        assert!(d.iter().all(|x| x == &d[0]), "4 ranks, 3 streams, {algo:?}: ranks differ: {d:?}");
        if algo == Algo::Auto {
            assert_eq!(per_world[&(4, Algo::Auto)], d[0], "3 streams per peer changed the results");
        }
    }
    // The in-process transport must give exactly the same bits as TCP.
    for (n, algo) in [(1, Algo::Auto), (3, Algo::Auto), (8, Algo::Auto), (5, Algo::Doubling)] {
        let mem = format!("{:x}", run_in_process(n, algo)[0]);
        assert_eq!(per_world[&(n, algo)], mem, "world {n} {algo:?}: TCP and in-process results differ");
    }
}

/// The same over shared memory (ranks as processes on this host): rings of the default size;
/// 4 KiB rings with 1 MiB chunks, so frames are larger than the ring, wrap around it and wait
/// for room; and 4 KiB pieces pulled straight from the sender's memory (shorter ones through
/// the ring). The bits equal TCP's and the in-process transport's.
#[test]
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
fn shm_processes_every_world_size_and_algorithm() {
    let variants = [
        ("1048576", CHUNK, "65536", vec![1, 2, 3, 4, 5, 6, 7, 8]),
        ("4096", 1 << 20, "0", vec![2, 3, 5, 8]),
        ("1048576", 4096, "4096", vec![2, 3, 5, 8]),
    ];
    for (ring, chunk, pull, sizes) in variants {
        for n in sizes {
            let mut rank_order_bits: Option<String> = None;
            for algo in ALGOS {
                let env = [
                    ("BOLTCCL_BACKEND", "shm".to_string()),
                    ("BOLTCCL_SHM_RING_BYTES", ring.to_string()),
                    ("BOLTCCL_SHM_PULL_BYTES", pull.to_string()),
                    ("BOLTCCL_ALGO", algo.name().to_string()),
                    ("BOLTCCL_CHUNK_BYTES", chunk.to_string()),
                    ("BOLTCCL_MESH_MAX_BYTES", "256".to_string()),
                    ("BOLTCCL_TIMEOUT_MS", "20000".to_string()),
                    ("BOLTCCL_LOG", "boltccl=info".to_string()),
                ];
                let outs = Ranks::spawn(n, "tcp_worker", &env).wait(Duration::from_secs(120));
                let d = results(&outs, "DIGEST ");
                assert!(d.iter().all(|x| x == &d[0]), "world {n} {algo:?} ring {ring}: ranks differ: {d:?}");
                if n > 1 {
                    for o in &outs {
                        assert!(
                            o.stderr.contains("shared-memory links ready"),
                            "rank {} did not use shared memory",
                            o.rank
                        );
                    }
                }
                if rank_order(algo) {
                    let first = rank_order_bits.get_or_insert_with(|| d[0].clone());
                    assert_eq!(first, &d[0], "world {n} ring {ring}: {algo:?} over shared memory gave different bits");
                }
                if algo != Algo::Ring {
                    let mem = format!("{:x}", run_in_process(n, algo)[0]);
                    assert_eq!(mem, d[0], "world {n}: shared memory and in-process results differ");
                }
            }
        }
    }
}

/// Threads pull pieces straight from each other's memory as processes do: the same bits as
/// through the rings.
#[test]
fn pulls_between_threads_give_the_same_bits() {
    let digest = |pull: usize| {
        let cfg = Config { chunk_bytes: Some(4096), shm_pull_bytes: pull, mesh_max_bytes: 256, ..Config::default() };
        on_threads(Group::local_world_with(3, &cfg), |_, g| suite(g))[0]
    };
    assert_eq!(digest(4096), digest(0));
}

/// The ring all-gather, reduce-scatter and broadcast cut large calls into segments and
/// pieces: with 64-byte chunks, 5000 floats per rank cross several segment boundaries (and
/// hundreds of pipelined broadcast steps), at world sizes where halves and blocks are uneven.
#[test]
fn ring_collectives_across_segments() {
    let n = 5000;
    for p in [2, 3, 5] {
        let cfg = Config {
            algo: Algo::Ring,
            chunk_bytes: Some(CHUNK),
            timeout: Duration::from_secs(20),
            ..Config::default()
        };
        on_threads(Group::local_world_with(p, &cfg), move |r, g| {
            let mine: Vec<f32> = (0..n).map(|i| (r * 10_000 + i) as f32).collect();
            let mut all = vec![-1.0f32; n * p];
            g.all_gather(&mine, &mut all).unwrap();
            for (i, v) in all.iter().enumerate() {
                assert_eq!(*v, ((i / n) * 10_000 + i % n) as f32, "all_gather p={p} element {i}");
            }
            let input: Vec<f32> = (0..n * p).map(|i| ((r + i) % 7) as f32).collect();
            let mut out = vec![-1.0f32; n];
            g.reduce_scatter(&input, &mut out).unwrap();
            for (i, v) in out.iter().enumerate() {
                let want: usize = (0..p).map(|q| (q + r * n + i) % 7).sum();
                assert_eq!(*v, want as f32, "reduce_scatter p={p} rank {r} element {i}");
            }
            let root = p - 1;
            let mut b: Vec<f32> = if r == root { (0..n).map(|i| (i % 1000) as f32).collect() } else { vec![0.0; n] };
            g.broadcast(&mut b, root).unwrap();
            assert!(b.iter().enumerate().all(|(i, v)| *v == (i % 1000) as f32), "broadcast p={p} rank {r}");
        });
    }
}

/// The rank-process side of `all_to_all_and_rooted_over_tcp_and_shm`.
#[test]
fn all_to_all_worker() {
    if !is_worker() {
        return;
    }
    boltccl::log_to_stderr();
    let g = boltccl::init().expect("init");
    println!("DIGEST {:x}", all_to_all_and_rooted_suite(&g));
}

/// all_to_all, all_to_all_v, gather, scatter and reduce alone, quicker than the whole suite
/// (which runs them too): ranks as processes over TCP and over shared memory, 1 to 8 ranks,
/// both all-to-all schedules (direct under `auto`, pairwise under `ring`) and every reduce
/// form; the same bits as in process.
#[test]
fn all_to_all_and_rooted_over_tcp_and_shm() {
    for backend in ["tcp", "shm"] {
        for n in [1, 2, 3, 4, 5, 8] {
            for algo in [Algo::Auto, Algo::Ring, Algo::Mesh, Algo::Direct] {
                let env = [
                    ("BOLTCCL_BACKEND", backend.to_string()),
                    ("BOLTCCL_ALGO", algo.name().to_string()),
                    ("BOLTCCL_CHUNK_BYTES", CHUNK.to_string()),
                    ("BOLTCCL_MESH_MAX_BYTES", "256".to_string()),
                    ("BOLTCCL_SHM_RING_BYTES", "4096".to_string()),
                    ("BOLTCCL_TIMEOUT_MS", "20000".to_string()),
                ];
                let d = results(&Ranks::spawn(n, "all_to_all_worker", &env).wait(Duration::from_secs(120)), "DIGEST ");
                assert!(d.iter().all(|x| x == &d[0]), "{backend} world {n} {algo:?}: ranks differ: {d:?}");
                let cfg = Config {
                    algo,
                    chunk_bytes: Some(CHUNK),
                    mesh_max_bytes: 256,
                    timeout: Duration::from_secs(20),
                    ..Config::default()
                };
                let mem = on_threads(Group::local_world_with(n, &cfg), |_, g| all_to_all_and_rooted_suite(g));
                assert_eq!(format!("{:x}", mem[0]), d[0], "{backend} world {n} {algo:?}: differs from in process");
            }
        }
    }
}
