//! Large counts:
//! - an int8 all_sum of more than 2^31 elements (about 2 GiB a rank) at 2 ranks, processes over
//!   TCP and over shared memory (each test checks its links are of the kind it names): every
//!   element exact (the inputs repeat every 251 bytes, a prime, so an index that wrapped at
//!   2^31 or 2^32, or a block landing in the wrong place, shows);
//! - small chunks (64 bytes) so that the step and piece numbers of the message header pass
//!   4096 (what the old 12-bit fields held) in the direct all-reduce, point-to-point, the ring
//!   all-gather and the ring broadcast: every element exact, in process, over TCP and over
//!   shared memory.
//!
//! - the header packing is checked in every build: a step or piece too large to number is an
//!   `InvalidArgument` error, never two pieces with one number (`packing_is_checked_in_this_build`,
//!   which `scripts/test.sh` runs in a release build, where a `debug_assert` would be gone).
//!
//! These tests are `#[ignore]`d, and return at once in an unoptimised build (minutes there, on
//! 64-byte frames and 2 GiB buffers), where the full tier's `--include-ignored` reaches them:
//! `scripts/test.sh` runs them in a release build, with `--include-ignored` (about 35 s; 4-5 GiB
//! of memory at the peak).

mod common;

use boltccl::{Algo, Backend, Config, Group, LinkKind};
use common::harness::{free_port, is_worker, not_in_a_debug_build, one_job_at_a_time, results, Job};
use common::threads::{on_threads, ranks_on_threads};
use std::time::{Duration, Instant};

const PERIOD: usize = 251;

/// What runs the ignored tests below, in a release build.
const RELEASE: &str = "scripts/test.sh: cargo test --release -p boltccl --test large_counts -- --include-ignored";

/// Rank `r`'s input pattern: one period of bytes.
fn period(r: usize) -> Vec<u8> {
    (0..PERIOD).map(|i| ((i * 7 + r * 31 + 3) % 256) as u8).collect()
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// A rank of the 2^31-element all_sum. Fills with memcpy and checks with memcmp, a period at a
/// time, so an unoptimised test build spends its time in the library, not here.
#[test]
fn large_worker() {
    if !is_worker() {
        return;
    }
    boltccl::log_to_stderr();
    let g = boltccl::init().unwrap_or_else(|e| panic!("init: {e}"));
    let (r, p) = (g.rank(), g.size());
    let link = g.link_kind((r + 1) % p).unwrap();
    assert_eq!(format!("{link:?}"), env("EXPECT_LINK"), "the test runs over another transport than it names");
    let n: usize = env("LARGE_COUNT").parse().unwrap();
    let mine = period(r);
    let t = Instant::now();
    let mut buf: Vec<i8> = vec![0; n];
    {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
        for c in bytes.chunks_mut(PERIOD) {
            let k = c.len();
            c.copy_from_slice(&mine[..k]);
        }
    }
    let filled = t.elapsed();
    let t = Instant::now();
    g.all_sum(&mut buf).unwrap_or_else(|e| panic!("all_sum of {n} int8: {e}"));
    let took = t.elapsed();
    let want: Vec<u8> = (0..PERIOD).map(|i| (0..p).fold(0u8, |acc, q| acc.wrapping_add(period(q)[i]))).collect();
    let bytes: &[u8] = bytemuck::cast_slice(&buf);
    for (k, c) in bytes.chunks(PERIOD).enumerate() {
        if c != &want[..c.len()] {
            let i = c.iter().zip(&want).position(|(a, b)| a != b).unwrap();
            panic!("WRONG ANSWER: element {} is {} instead of {}", k * PERIOD + i, c[i] as i8, want[i] as i8);
        }
    }
    println!("RESULT exact {n} {} {}", filled.as_millis(), took.as_millis());
}

/// More than 2^31 int8 elements at 2 rank processes over `backend`, exact. About 2 GiB a rank;
/// each rank's buffer is one allocation of 2^31 + 4099 bytes. One job at a time: two would
/// need twice the memory.
fn int8_all_sum_of_more_than_2_31_elements(backend: &str, link: LinkKind) {
    let _one = one_job_at_a_time();
    let n = (1usize << 31) + 4099;
    let t = Instant::now();
    let outs = Job::new(2, "large_worker")
        .env("LARGE_COUNT", n.to_string())
        .env("BOLTCCL_TIMEOUT_MS", "120000")
        .env("BOLTCCL_BACKEND", backend)
        .env("EXPECT_LINK", format!("{link:?}"))
        .spawn()
        .wait(Duration::from_secs(900));
    for line in results(&outs, "RESULT ") {
        let v: Vec<&str> = line.split(' ').collect();
        assert_eq!(v[0], "exact");
        eprintln!("{n} int8 elements at 2 ranks over {link:?}: filled in {} ms, all_sum in {} ms", v[2], v[3]);
    }
    eprintln!("2^31 + 4099 int8 all_sum over {link:?}: {:.1?} in all", t.elapsed());
}

#[test]
#[ignore = "release build: scripts/test.sh runs it"]
fn int8_all_sum_of_more_than_2_31_elements_at_2_ranks_over_tcp() {
    if not_in_a_debug_build("int8_all_sum_of_more_than_2_31_elements_at_2_ranks_over_tcp", RELEASE) {
        return;
    }
    int8_all_sum_of_more_than_2_31_elements("tcp", LinkKind::Tcp);
}

#[test]
#[ignore = "release build: scripts/test.sh runs it"]
fn int8_all_sum_of_more_than_2_31_elements_at_2_ranks_over_shared_memory() {
    if not_in_a_debug_build("int8_all_sum_of_more_than_2_31_elements_at_2_ranks_over_shared_memory", RELEASE) {
        return;
    }
    int8_all_sum_of_more_than_2_31_elements("shm", LinkKind::SharedMemory);
}

/// Rank `r`'s value at `i`, for the small-chunk calls: every rank and index different.
fn value(r: usize, i: usize) -> i32 {
    ((i * 13 + r * 1_000_003) % 100_003) as i32
}

/// With 64-byte chunks, each call here numbers more than 4096 steps or pieces: the direct
/// all-reduce and send/recv (below), the ring all-gather and broadcast ([`ring_calls`]).
fn small_chunk_calls(g: &Group) -> Result<(), String> {
    let (r, p) = (g.rank(), g.size());
    // Direct all-reduce: 2 ranks, 36 MiB of int32: 294,912 pieces of 64 B per 18 MiB shard,
    // in batches of 64: 4,608 steps.
    let n = 9 << 20;
    let mut x: Vec<i32> = (0..n).map(|i| value(r, i)).collect();
    g.all_sum(&mut x).map_err(|e| e.to_string())?;
    if let Some(i) = (0..n).find(|&i| x[i] != (0..p).map(|q| value(q, i)).sum::<i32>()) {
        return Err(format!("direct all_sum element {i}"));
    }
    // Point to point: 1 MiB in 16,384 pieces (one step), around the ring of ranks.
    let m = 1 << 18;
    let mine: Vec<i32> = (0..m).map(|i| value(r, i)).collect();
    let mut got = vec![0i32; m];
    let (to, from) = ((r + 1) % p, (r + p - 1) % p);
    let sr = if r % 2 == 0 {
        g.send(&mine, to).and_then(|_| g.recv(&mut got, from))
    } else {
        g.recv(&mut got, from).and_then(|_| g.send(&mine, to))
    };
    sr.map_err(|e| e.to_string())?;
    if let Some(i) = (0..m).find(|&i| got[i] != value(from, i)) {
        return Err(format!("recv element {i}"));
    }
    Ok(())
}

fn ring_calls(g: &Group) -> Result<(), String> {
    let (r, p) = (g.rank(), g.size());
    // Ring all-gather: segments of 8 KiB of each rank's 40 MiB: 5,120 steps.
    let m = 10 << 20;
    let mine: Vec<i32> = (0..m).map(|i| value(r, i)).collect();
    let mut all = vec![0i32; m * p];
    g.all_gather(&mine, &mut all).map_err(|e| e.to_string())?;
    if let Some(i) = (0..m * p).find(|&i| all[i] != value(i / m, i % m)) {
        return Err(format!("ring all_gather element {i}"));
    }
    // Ring broadcast: 1 MiB, each half in 4,096 pieces (numbered 0..4095), so 2 MiB: 8,192.
    let n = 1 << 19;
    let mut x: Vec<i32> = if r == 1 { (0..n).map(|i| value(1, i)).collect() } else { vec![-1; n] };
    g.broadcast(&mut x, 1).map_err(|e| e.to_string())?;
    if let Some(i) = (0..n).find(|&i| x[i] != value(1, i)) {
        return Err(format!("ring broadcast element {i}"));
    }
    Ok(())
}

/// In whatever build this is (scripts/test.sh: release), packing a step or piece that does not
/// fit is an error that says what to do, and the largest that fit stay distinct.
#[test]
#[ignore = "release build: scripts/test.sh runs it"]
fn packing_is_checked_in_this_build() {
    if not_in_a_debug_build("packing_is_checked_in_this_build", RELEASE) {
        return;
    }
    use boltccl::fuzz::{part, Phase};
    let e = part(Phase::Reduce, 1 << 24, 0).unwrap_err();
    assert_eq!(e.kind(), boltccl::ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("BOLTCCL_CHUNK_BYTES"), "{e}");
    assert!(part(Phase::Gather, 0, 1 << 32).is_err());
    let top = part(Phase::Reduce, (1 << 24) - 1, u32::MAX as usize).unwrap();
    assert_ne!(top, part(Phase::Reduce, 0, u32::MAX as usize).unwrap());
    assert_ne!(top, part(Phase::Reduce, (1 << 24) - 1, 0).unwrap());
    assert_ne!(part(Phase::Reduce, 4096, 0).unwrap(), part(Phase::Reduce, 0, 0).unwrap(), "no 12-bit wrap");
    println!("packing checked with debug assertions {}", if cfg!(debug_assertions) { "on" } else { "off" });
}

fn cfg(algo: Algo) -> Config {
    Config { algo, chunk_bytes: Some(64), timeout: Duration::from_secs(60), ..Config::default() }
}

#[test]
#[ignore = "release build: scripts/test.sh runs it"]
fn steps_and_pieces_past_4096_in_process() {
    if not_in_a_debug_build("steps_and_pieces_past_4096_in_process", RELEASE) {
        return;
    }
    let outs = on_threads(Group::local_world_with(2, &cfg(Algo::Direct)), |_, g| small_chunk_calls(g));
    assert!(outs.iter().all(Result::is_ok), "{outs:?}");
    let outs = on_threads(Group::local_world_with(3, &cfg(Algo::Ring)), |_, g| ring_calls(g));
    assert!(outs.iter().all(Result::is_ok), "{outs:?}");
}

/// The small-chunk calls with ranks as threads that form their group over `backend`, each
/// checking that its links are of the kind `link`. (Beside the 2^31-element jobs: these need
/// little memory.)
fn steps_and_pieces_past_4096_over(backend: Backend, link: LinkKind) {
    for (n, algo) in [(2usize, Algo::Direct), (3, Algo::Ring)] {
        let port = free_port();
        let outs = ranks_on_threads(n, move |r| {
            let g = Group::new(Config {
                rank: r,
                world_size: n,
                coordinator: Some(format!("127.0.0.1:{port}")),
                job_key: Some("large".into()),
                init_timeout: Duration::from_secs(20),
                backend,
                ..cfg(algo)
            })
            .map_err(|e| e.to_string())?;
            let kinds: Vec<LinkKind> = (0..n).filter(|&q| q != r).map(|q| g.link_kind(q).unwrap()).collect();
            if kinds.iter().any(|&k| k != link) {
                return Err(format!("rank {r}: links {kinds:?}, not {link:?}"));
            }
            if algo == Algo::Direct {
                small_chunk_calls(&g)
            } else {
                ring_calls(&g)
            }
        });
        assert!(outs.iter().all(Result::is_ok), "{n} ranks {algo:?} over {backend:?}: {outs:?}");
    }
}

#[test]
#[ignore = "release build: scripts/test.sh runs it"]
fn steps_and_pieces_past_4096_over_tcp() {
    if not_in_a_debug_build("steps_and_pieces_past_4096_over_tcp", RELEASE) {
        return;
    }
    steps_and_pieces_past_4096_over(Backend::Tcp, LinkKind::Tcp);
}

#[test]
#[ignore = "release build: scripts/test.sh runs it"]
fn steps_and_pieces_past_4096_over_shared_memory() {
    if not_in_a_debug_build("steps_and_pieces_past_4096_over_shared_memory", RELEASE) {
        return;
    }
    steps_and_pieces_past_4096_over(Backend::Shm, LinkKind::SharedMemory);
}
