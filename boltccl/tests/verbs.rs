//! The verbs transport over softverbs (the software UC provider, a test double with Apple's
//! limits), ranks as separate processes unless a test says otherwise.
//!
//! softverbs is built as a dev-dependency; its cdylib is loaded through BOLTCCL_IBV_LIBRARY
//! exactly as `libibverbs.so.1` or `librdma.dylib` would be.

mod common;

use boltccl::{Algo, Backend, Config, Error, Group};
use common::{free_port, is_worker, suite, RankOutput, Ranks};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `target/<profile>/deps/libsoftverbs.so`, next to this test binary.
fn softverbs_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps, deps.parent().unwrap()] {
        let p = dir.join("libsoftverbs.so");
        if p.exists() {
            return p;
        }
    }
    panic!("libsoftverbs.so not found near {} (it is a dev-dependency; run through cargo test)", exe.display());
}

/// Write a device matrix to the test's scratch directory.
fn matrix_file(name: &str, text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("verbs-matrices");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}-{}.json", std::process::id()));
    // Ranks as threads write the same file at once: write aside, then rename (atomic).
    let tmp = dir.join(format!("{name}-{}-{:?}.tmp", std::process::id(), std::thread::current().id()));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    p
}

/// A full mesh over `rdma_lo` for `n` ranks.
fn mesh_matrix(n: usize) -> PathBuf {
    let rows: Vec<String> = (0..n)
        .map(|i| {
            let cells: Vec<&str> = (0..n).map(|j| if i == j { "null" } else { "\"rdma_lo\"" }).collect();
            format!("[{}]", cells.join(","))
        })
        .collect();
    matrix_file(&format!("mesh{n}"), &format!("[{}]", rows.join(",")))
}

/// A ring over `rdma_lo` for `n` ranks: only neighbours are cabled; the other pairs use TCP.
fn ring_matrix(n: usize) -> PathBuf {
    let rows: Vec<String> = (0..n)
        .map(|i| {
            let cells: Vec<&str> =
                (0..n).map(|j| if j == (i + 1) % n || i == (j + 1) % n { "\"rdma_lo\"" } else { "null" }).collect();
            format!("[{}]", cells.join(","))
        })
        .collect();
    matrix_file(&format!("ring{n}"), &format!("[{}]", rows.join(",")))
}

fn verbs_env(n: usize) -> Vec<(&'static str, String)> {
    verbs_env_with(mesh_matrix(n))
}

fn verbs_env_with(matrix: PathBuf) -> Vec<(&'static str, String)> {
    vec![
        ("BOLTCCL_BACKEND", "verbs".into()),
        ("BOLTCCL_IBV_LIBRARY", softverbs_lib().display().to_string()),
        ("BOLTCCL_IBV_DEVICES", matrix.display().to_string()),
        ("SOFTVERBS_QUIET", "1".into()),
    ]
}

/// In-process config for rank `rank` of `n` (ranks as threads).
fn thread_cfg(rank: usize, n: usize, port: u16, timeout: Duration) -> Config {
    Config {
        rank,
        world_size: n,
        coordinator: Some(format!("127.0.0.1:{port}")),
        job_key: Some("test-key".into()),
        backend: Backend::Verbs,
        ibv_library: Some(softverbs_lib()),
        ibv_devices: Some(mesh_matrix(n)),
        timeout,
        init_timeout: Duration::from_secs(10),
        // Workers may be asked for zero-copy and a chunk size by their environment.
        ibv_zero_copy: std::env::var("BOLTCCL_IBV_ZERO_COPY").is_ok_and(|v| v == "1"),
        chunk_bytes: std::env::var("BOLTCCL_CHUNK_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(1 << 20),
        ..Config::default()
    }
}

fn outputs_ok(outs: &[RankOutput]) -> Vec<String> {
    outs.iter()
        .map(|o| {
            assert!(o.status.success(), "rank {} failed ({:?}):\n{}\n{}", o.rank, o.status, o.stdout, o.stderr);
            o.stdout
                .lines()
                .find_map(|l| l.split_once("RESULT ").map(|(_, d)| d.trim().to_string()))
                .unwrap_or_else(|| panic!("rank {} printed no result:\n{}\n{}", o.rank, o.stdout, o.stderr))
        })
        .collect()
}

/// `boltccl::init`, panicking with the error's message (what a user sees), not its Debug form.
fn init_or_panic() -> Group {
    boltccl::init().unwrap_or_else(|e| panic!("init failed: {e}"))
}

/// The rank-process side of every multi-process test here; what it runs is chosen by
/// BOLTCCL_TEST_WORKLOAD.
#[test]
fn verbs_worker() {
    if !is_worker() {
        return;
    }
    boltccl::log_to_stderr();
    match std::env::var("BOLTCCL_TEST_WORKLOAD").as_deref().unwrap_or("suite") {
        "suite" => {
            let g = init_or_panic();
            let d = format!("{:x}", suite(&g));
            // What the same workload gives in-process: real hardware must give the same bits.
            let cfg = g.config();
            if std::env::var("BOLTCCL_TEST_REFERENCE").is_ok() {
                let matrix = cfg.ibv_devices.clone().expect("the verbs backend has a device matrix");
                let want = reference_digest_with(g.size(), cfg.algo, cfg.chunk_bytes, cfg.mesh_max_bytes, &matrix);
                println!("REFERENCE {want} {}", if want == d { "MATCH" } else { "DIFFERS" });
            }
            println!("RESULT {d}");
        }
        "sums" => {
            let g = init_or_panic();
            let p = g.size() as f32;
            for round in 0..8 {
                let mut x: Vec<f32> = (0..50_000).map(|i| ((i + round + g.rank()) % 31) as f32).collect();
                g.all_sum(&mut x).expect("all_sum");
                for (i, v) in x.iter().enumerate() {
                    let want: f32 = (0..g.size()).map(|r| ((i + round + r) % 31) as f32).sum();
                    assert_eq!(*v, want, "round {round} element {i} (p={p})");
                }
            }
            println!("RESULT ok");
        }
        "die" => {
            let g = init_or_panic();
            let mut x = vec![1.0f32; 1000];
            g.all_sum(&mut x).expect("first all_sum");
            if g.rank() == 1 {
                // As in the field: a crash inside the provider kills one worker silently.
                // SAFETY: restoring the default action (Rust's handler only catches stack
                // overflows and would return) and raising the signal: the process dies.
                unsafe {
                    libc::signal(libc::SIGSEGV, libc::SIG_DFL);
                    libc::raise(libc::SIGSEGV);
                }
            }
            let t = Instant::now();
            let e = g.all_sum(&mut x).expect_err("rank 1 is gone");
            println!("RESULT {:?} after {} ms: {e}", e.kind(), t.elapsed().as_millis());
        }
        "drop" => drop_workload(),
        "cycles" => cycles_workload(),
        other => panic!("unknown workload {other}"),
    }
}

/// The in-process reference digest for the same workload and settings, with algorithms chosen
/// for the cabling of the device matrix at `matrix`.
fn reference_digest(n: usize, algo: Algo, matrix: &Path) -> String {
    reference_digest_with(n, algo, 64, 256, matrix)
}

fn reference_digest_with(n: usize, algo: Algo, chunk_bytes: usize, mesh_max_bytes: usize, matrix: &Path) -> String {
    let cfg = Config { algo, chunk_bytes, mesh_max_bytes, timeout: Duration::from_secs(20), ..Config::default() };
    let groups = Group::local_world_cabled(n, &cfg, boltccl::Cabling::from_links(cabling_of(matrix)));
    let hs: Vec<_> = groups.into_iter().map(|g| std::thread::spawn(move || suite(&g))).collect();
    let d: Vec<u64> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    format!("{:x}", d[0])
}

/// `cabled[i][j]` from a device matrix file: a non-null cell is a cable.
fn cabling_of(matrix: &Path) -> Vec<Vec<bool>> {
    let text = std::fs::read_to_string(matrix).unwrap();
    let rows: Vec<Vec<serde_json::Value>> = serde_json::from_str(&text).unwrap();
    rows.iter().enumerate().map(|(i, r)| r.iter().enumerate().map(|(j, c)| i == j || !c.is_null()).collect()).collect()
}

fn conformance(n: usize, algos: &[Algo]) {
    conformance_on(n, algos, mesh_matrix(n), "full mesh")
}

fn conformance_on(n: usize, algos: &[Algo], matrix: PathBuf, topo: &str) {
    for &algo in algos {
        let t = Instant::now();
        let mut env = verbs_env_with(matrix.clone());
        env.extend([
            ("BOLTCCL_ALGO", algo.name().to_string()),
            ("BOLTCCL_CHUNK_BYTES", "64".into()),
            ("BOLTCCL_MESH_MAX_BYTES", "256".into()),
            ("BOLTCCL_TIMEOUT_MS", "20000".into()),
            ("BOLTCCL_LOG", "boltccl=info".into()),
        ]);
        let outs = Ranks::spawn(n, "verbs_worker", &env).wait(Duration::from_secs(180));
        let d = outputs_ok(&outs);
        for o in &outs {
            assert!(o.stderr.contains("RDMA verbs mesh ready"), "rank {} did not use verbs:\n{}", o.rank, o.stderr);
        }
        assert!(d.iter().all(|x| x == &d[0]), "world {n} {algo:?}: ranks differ: {d:?}");
        assert_eq!(d[0], reference_digest(n, algo, &matrix), "world {n} {algo:?}: verbs and in-process results differ");
        eprintln!("verbs conformance: {n} ranks, {topo}, {algo:?}: ok in {:.1?}", t.elapsed());
    }
}

#[test]
fn conformance_2_ranks_full_mesh() {
    conformance(2, &[Algo::Auto, Algo::Mesh, Algo::Direct, Algo::Ring]);
}

#[test]
fn conformance_3_ranks_full_mesh() {
    conformance(3, &[Algo::Auto, Algo::Direct, Algo::Ring]);
}

#[test]
fn conformance_4_ranks_full_mesh() {
    conformance(4, &[Algo::Auto, Algo::Mesh, Algo::Direct, Algo::Ring]);
}

/// Zero-copy sends (raw packets from caller memory after a header packet), with a cache of 3
/// registrations per queue pair so that eviction and the staged fallback both happen.
#[test]
fn conformance_3_ranks_zero_copy() {
    let mut env = verbs_env(3);
    env.extend([
        ("BOLTCCL_IBV_ZERO_COPY", "1".to_string()),
        ("BOLTCCL_IBV_MR_CACHE", "3".to_string()),
        ("BOLTCCL_CHUNK_BYTES", "64".into()),
        ("BOLTCCL_MESH_MAX_BYTES", "256".into()),
        ("BOLTCCL_LOG", "boltccl=info".into()),
    ]);
    for algo in [Algo::Auto, Algo::Ring] {
        env.push(("BOLTCCL_ALGO", algo.name().to_string()));
        let outs = Ranks::spawn(3, "verbs_worker", &env).wait(Duration::from_secs(180));
        let d = outputs_ok(&outs);
        assert!(d.iter().all(|x| x == &d[0]), "{algo:?}: ranks differ: {d:?}");
        assert_eq!(d[0], reference_digest(3, algo, &mesh_matrix(3)), "{algo:?}: zero-copy changed the results");
        for o in &outs {
            let line = o.stderr.lines().find(|l| l.contains("RDMA zero-copy:")).unwrap_or_else(|| {
                panic!("rank {}: no zero-copy summary:\n{}", o.rank, o.stderr);
            });
            let count = |word: &str| -> u64 {
                let before = line.split(word).next().unwrap_or("");
                before.split_whitespace().last().and_then(|n| n.parse().ok()).unwrap_or(0)
            };
            println!("rank {} {algo:?}: {}", o.rank, line.split("RDMA ").nth(1).unwrap_or(line));
            assert!(count(" packets sent from caller memory") > 0, "rank {}: {line}", o.rank);
            assert!(count(" evictions") > 0, "rank {}: the 3-entry cache never evicted: {line}", o.rank);
        }
        env.pop();
    }
}

/// Rings: neighbours over RDMA; with `ring` only neighbours talk, with `auto` the other pairs
/// go over TCP in the same exchange.
#[test]
fn conformance_5_ranks_ring() {
    conformance_on(5, &[Algo::Ring, Algo::Auto], ring_matrix(5), "ring");
}

#[test]
fn conformance_6_ranks_ring() {
    conformance_on(6, &[Algo::Ring, Algo::Auto], ring_matrix(6), "ring");
}

/// A rank whose every `ibv_post_recv` is 2 ms late loses nothing: senders wait for credits.
#[test]
fn late_receives_lose_no_data() {
    let mut env = verbs_env(2);
    env.extend([("BOLTCCL_TEST_WORKLOAD", "sums".into()), ("BOLTCCL_CHUNK_BYTES", "16384".into())]);
    let mut ranks = Ranks::spawn(0, "verbs_worker", &env);
    // Rank 1 gets the delay; rank 0 sends as fast as credits allow.
    let port = free_port();
    for rank in 0..2 {
        let mut c = std::process::Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "verbs_worker", "--nocapture", "--test-threads=1"])
            .env("BOLTCCL_TEST_ROLE", "worker")
            .env("BOLTCCL_RANK", rank.to_string())
            .env("BOLTCCL_WORLD_SIZE", "2")
            .env("BOLTCCL_COORDINATOR", format!("127.0.0.1:{port}"))
            .env("BOLTCCL_JOB_KEY", "k")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for (k, v) in &env {
            c.env(k, v);
        }
        if rank == 1 {
            c.env("SOFTVERBS_RECV_DELAY_US", "2000");
        }
        ranks.children.push(c.spawn().unwrap());
    }
    let outs = ranks.wait(Duration::from_secs(120));
    assert!(outputs_ok(&outs).iter().all(|r| r == "ok"));
}

/// A rank that dies mid-job is reported on the others within moments, not a hang.
#[test]
fn dead_peer_is_reported_quickly() {
    let mut env = verbs_env(3);
    env.extend([("BOLTCCL_TEST_WORKLOAD", "die".into()), ("BOLTCCL_TIMEOUT_MS", "30000".into())]);
    let outs = Ranks::spawn(3, "verbs_worker", &env).wait(Duration::from_secs(60));
    for o in outs.iter().filter(|o| o.rank != 1) {
        let r = outputs_ok(std::slice::from_ref(o)).pop().unwrap();
        assert!(r.starts_with("PeerLost") || r.starts_with("Aborted"), "rank {}: {r}", o.rank);
        let ms: u64 = r.split(" after ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        assert!(ms < 5_000, "rank {} took {ms} ms to notice (timeout is 30 s): {r}", o.rank);
        assert!(r.contains("rank 1"), "rank {}: the culprit is not named: {r}", o.rank);
    }
}

/// Spawn the worker for `n` ranks with `env`, plus `extra[rank]` for single ranks.
fn spawn_with(n: usize, env: &[(&str, String)], extra: &[(usize, &str, &str)]) -> Ranks {
    let port = free_port();
    let mut ranks = Ranks { children: vec![] };
    for rank in 0..n {
        let mut c = std::process::Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "verbs_worker", "--nocapture", "--test-threads=1"])
            .env("BOLTCCL_TEST_ROLE", "worker")
            .env("BOLTCCL_RANK", rank.to_string())
            .env("BOLTCCL_WORLD_SIZE", n.to_string())
            .env("BOLTCCL_COORDINATOR", format!("127.0.0.1:{port}"))
            .env("BOLTCCL_JOB_KEY", "k")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        for (_, k, v) in extra.iter().filter(|(r, _, _)| *r == rank) {
            c.env(k, v);
        }
        ranks.children.push(c.spawn().unwrap());
    }
    ranks
}

/// "Couldn't allocate protection domain" on one node, during start-up: that rank names the
/// verb, cause and fix; the others say which rank failed and why, not a stale errno
/// (JACCL's "Recv failed with errno=2").
#[test]
fn protection_domain_failure_on_one_rank_is_explained_everywhere() {
    // softverbs counts query_port and two query_gid first: the 4th counted verb is alloc_pd.
    let outs = spawn_with(3, &verbs_env(3), &[(1, "SOFTVERBS_FAIL_AFTER", "3")]).wait(Duration::from_secs(60));
    for o in &outs {
        assert!(!o.status.success(), "rank {} should have failed", o.rank);
        let text = format!("{}{}", o.stdout, o.stderr);
        println!("rank {}: {}", o.rank, text.lines().find(|l| l.contains("init")).unwrap_or(""));
        assert!(text.contains("allocating a protection domain"), "rank {}: {text}", o.rank);
        assert!(text.contains("port is down") && text.contains("reboot"), "rank {}: {text}", o.rank);
        if o.rank != 1 {
            assert!(text.contains("rank 1 aborted the group"), "rank {}: {text}", o.rank);
        }
        assert!(o.elapsed < Duration::from_secs(20), "rank {} took {:?}", o.rank, o.elapsed);
    }
}

/// Nodes given different device matrices (rank 0 thinks it has a full mesh, the others a ring)
/// would pick different algorithms: every rank refuses at start-up, naming the cause.
#[test]
fn different_device_matrices_are_refused_at_start_up() {
    let mesh = mesh_matrix(4).display().to_string();
    let outs = spawn_with(4, &verbs_env_with(ring_matrix(4)), &[(0, "BOLTCCL_IBV_DEVICES", &mesh)])
        .wait(Duration::from_secs(60));
    for o in &outs {
        assert!(!o.status.success(), "rank {} should have failed", o.rank);
        let text = format!("{}{}", o.stdout, o.stderr);
        assert!(text.contains("describes different cabling"), "rank {}: {text}", o.rank);
        assert!(o.elapsed < Duration::from_secs(20), "rank {} took {:?}", o.rank, o.elapsed);
    }
}

/// `auto` on a node without RDMA next to nodes with it: refused at start-up, naming the rank.
#[test]
fn auto_disagreement_is_named_at_start_up() {
    let port = free_port();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let mut cfg = thread_cfg(r, 2, port, Duration::from_secs(5));
            cfg.backend = Backend::Auto;
            if r == 1 {
                cfg.ibv_library = Some("/nonexistent/libibverbs.so.1".into());
            }
            std::thread::spawn(move || Group::new(cfg).err().map(|e| e.to_string()))
        })
        .collect();
    for h in hs {
        let e = h.join().unwrap().expect("mixed transports must not form a group");
        println!("{e}");
        assert!(e.contains("rank 1") && e.contains("RDMA is unavailable") && e.contains("=tcp"), "{e}");
    }
}

/// Ranks as threads in this process: form a group of `n` with `cfg`, run `body` on each.
fn threads<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    body: impl Fn(Result<Group, Error>) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let port = free_port();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let body = body.clone();
            std::thread::spawn(move || body(Group::new(thread_cfg(r, n, port, timeout))))
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
}

/// Asking for a device that is not there names the devices that are.
#[test]
fn unknown_device_is_named_with_the_alternatives() {
    let port = free_port();
    let m = matrix_file("nodev", r#"[[null,"rdma_nope0"],["rdma_nope0",null]]"#);
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let mut cfg = thread_cfg(r, 2, port, Duration::from_secs(5));
            cfg.ibv_devices = Some(m.clone());
            std::thread::spawn(move || Group::new(cfg).err().map(|e| e.to_string()))
        })
        .collect();
    for h in hs {
        let e = h.join().unwrap().expect("a missing device must fail");
        println!("{e}");
        assert!(
            (e.contains("rdma_nope0 not found") && e.contains("rdma_lo")) || e.contains("aborted"),
            "unhelpful: {e}"
        );
    }
}

/// A missing verbs library: `verbs` says what to install, `auto` falls back to TCP and works.
#[test]
fn missing_library_is_unsupported_and_auto_falls_back_to_tcp() {
    let port = free_port();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let mut cfg = thread_cfg(r, 2, port, Duration::from_secs(5));
            cfg.ibv_library = Some("/nonexistent/libibverbs.so.1".into());
            cfg.backend = Backend::Auto;
            std::thread::spawn(move || {
                let g = Group::new(cfg).expect("auto falls back to TCP");
                let mut x = vec![1.0f32; 100];
                g.all_sum(&mut x).unwrap();
                x[0]
            })
        })
        .collect();
    for h in hs {
        assert_eq!(h.join().unwrap(), 2.0);
    }
    let mut cfg = thread_cfg(0, 2, free_port(), Duration::from_secs(5));
    cfg.ibv_library = Some("/nonexistent/libibverbs.so.1".into());
    let e = Group::new(cfg).err().expect("verbs without a library fails").to_string();
    println!("{e}");
    assert!(e.contains("unsupported") && e.contains("BOLTCCL_IBV_LIBRARY=/nonexistent"), "{e}");
}

/// The 11th queue pair on a device fails with errno 16; the message names the limit. Six ranks
/// as threads of one process need 30 QPs on `rdma_lo` (softverbs counts per process).
#[test]
fn eleventh_queue_pair_is_explained() {
    let errs = threads(6, Duration::from_secs(5), |g| g.err().map(|e| e.to_string()));
    let busy: Vec<&String> = errs.iter().flatten().filter(|e| e.contains("errno 16")).collect();
    println!("{busy:?}");
    assert!(!busy.is_empty(), "no rank hit the QP limit: {errs:?}");
    assert!(busy[0].contains("allows 10") && busy[0].contains("reboot"), "{}", busy[0]);
    assert!(errs.iter().all(Option::is_some), "every rank must fail, not hang: {errs:?}");
}

/// Deterministic pseudo-random numbers (no dependency, same sequence every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % below
    }
}

/// In a process whose provider drops 1% of datagrams: 2 ranks as threads run all_sums of random
/// lengths; each returns the exact answer or an error, never anything else. After an error the
/// group is poisoned, so a new one is formed. Prints `RESULT exact errors`.
fn drop_workload() {
    let target: usize = std::env::var("BOLTCCL_TEST_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let budget = Instant::now() + Duration::from_secs(50);
    let (mut exact, mut errors, mut epoch) = (0usize, 0usize, 0u64);
    while exact + errors < target && Instant::now() < budget {
        epoch += 1;
        // Both ranks' providers use the same drop seed, so losses are often symmetric and then
        // only the deadline can tell: keep it short.
        let per_rank = threads(2, Duration::from_millis(100), move |g| {
            let g = g.expect("forming a group does not touch the lossy data path");
            let t0 = Instant::now();
            let mut rng = Lcg(epoch);
            let (mut ok, mut err) = (0usize, 0usize);
            for op in 0..200 {
                let n = 1 + rng.next(3000);
                let mut x: Vec<f32> = (0..n).map(|i| ((i * 7 + op + g.rank() * 3) % 101) as f32).collect();
                match g.all_sum(&mut x) {
                    Ok(()) => {
                        for (i, v) in x.iter().enumerate() {
                            let want = ((i * 7 + op) % 101 + (i * 7 + op + 3) % 101) as f32;
                            assert_eq!(*v, want, "WRONG ANSWER: epoch {epoch} op {op} element {i} of {n}");
                        }
                        ok += 1;
                    }
                    Err(e) => {
                        if std::env::var("BOLTCCL_TEST_VERBOSE").is_ok() {
                            eprintln!("epoch {epoch} op {op} failed {:?} into the epoch: {e}", t0.elapsed());
                        }
                        err += 1;
                        break;
                    }
                }
            }
            (ok, err)
        });
        for (ok, err) in per_rank {
            exact += ok;
            errors += err;
        }
    }
    println!("RESULT {exact} {errors} {epoch}");
}

#[test]
fn one_percent_loss_gives_exact_answers_or_errors() {
    lossy_all_sums(&[], 1000);
}

/// The same with zero-copy sends (raw packets) and 4 KiB chunks, so most pieces go raw.
#[test]
fn one_percent_loss_with_zero_copy_gives_exact_answers_or_errors() {
    lossy_all_sums(
        &[("BOLTCCL_IBV_ZERO_COPY", "1"), ("BOLTCCL_CHUNK_BYTES", "4096"), ("BOLTCCL_TEST_OPS", "1500")],
        500,
    );
}

fn lossy_all_sums(extra: &[(&'static str, &str)], min_exact: usize) {
    let mut env = verbs_env(2);
    env.extend([
        ("BOLTCCL_TEST_WORKLOAD", "drop".into()),
        ("SOFTVERBS_DROP_RATE", "0.01".into()),
        ("SOFTVERBS_SEED", "12345".into()),
    ]);
    env.extend(extra.iter().map(|&(k, v)| (k, v.to_string())));
    let t = Instant::now();
    let outs = Ranks::spawn(1, "verbs_worker", &env).wait(Duration::from_secs(90));
    let r = outputs_ok(&outs).pop().unwrap();
    let v: Vec<usize> = r.split(' ').map(|x| x.parse().unwrap()).collect();
    eprintln!("1% loss {extra:?}: {} exact, {} errors over {} groups in {:.1?}", v[0], v[1], v[2], t.elapsed());
    assert!(v[1] > 0, "no operation failed: were datagrams dropped at all?");
    assert!(v[0] >= min_exact, "too few operations completed to mean anything: {r}");
}

/// Live provider objects, read through the same loaded copy of softverbs that boltccl uses.
fn live_objects(lib: &libloading::Library) -> [u64; 7] {
    let mut c = [0u64; 7];
    // SAFETY: softverbs_live_objects(struct softverbs_counters *) fills seven u64 counters.
    let r = unsafe {
        let f: libloading::Symbol<'_, unsafe extern "C" fn(*mut u64) -> i32> =
            lib.get(b"softverbs_live_objects\0").unwrap();
        f(c.as_mut_ptr())
    };
    assert_eq!(r, 0);
    c
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    s.split(' ').nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 4
}

/// Form and tear down 2-rank groups (threads) `BOLTCCL_TEST_CYCLES` times under the process's
/// SOFTVERBS_FAIL_AFTER; after each, no provider object may be alive. Prints `RESULT ok failed`.
fn cycles_workload() {
    let cycles: usize = std::env::var("BOLTCCL_TEST_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(80);
    // SAFETY: loading softverbs again only takes a reference to the already-loaded copy (and
    // keeps it loaded, so its counters cannot reset between groups).
    let lib = unsafe { libloading::Library::new(softverbs_lib()) }.unwrap();
    let (mut ok, mut failed) = (0, 0);
    let (mut fds0, mut rss0) = (0, 0);
    for cycle in 0..cycles {
        let results = threads(2, Duration::from_secs(2), |g| {
            let g = g?;
            let mut x = vec![1.0f32; 1000];
            g.all_sum(&mut x)?;
            assert_eq!(x[999], 2.0);
            Ok::<(), Error>(())
        });
        if results.iter().all(|r| r.is_ok()) {
            ok += 1;
        } else {
            failed += 1;
        }
        let live = live_objects(&lib);
        assert_eq!(
            live, [0; 7],
            "cycle {cycle}: live objects (lists, ctxs, pds, cqs, qps, mrs, threads) after {results:?}"
        );
        if cycle == 10 {
            (fds0, rss0) = (open_fds(), rss_kib());
        }
        if cycle > 10 {
            assert!(open_fds() <= fds0 + 8, "cycle {cycle}: fds grew from {fds0} to {}", open_fds());
            assert!(rss_kib() <= rss0 + 64 * 1024, "cycle {cycle}: RSS grew from {rss0} to {} KiB", rss_kib());
        }
    }
    println!("RESULT {ok} {failed}");
}

#[test]
fn init_teardown_cycles_with_injected_failures_leak_nothing() {
    let t = Instant::now();
    let (mut ok, mut failed) = (0, 0);
    // unset = no failure; small values fail set-up at each step, larger ones fail mid-collective.
    for fail_after in ["", "2", "3", "4", "5", "7", "9", "12", "20", "40", "80"] {
        let mut env = verbs_env(2);
        env.push(("BOLTCCL_TEST_WORKLOAD", "cycles".into()));
        if !fail_after.is_empty() {
            env.push(("SOFTVERBS_FAIL_AFTER", fail_after.into()));
        }
        let outs = Ranks::spawn(1, "verbs_worker", &env).wait(Duration::from_secs(120));
        let r = outputs_ok(&outs).pop().unwrap();
        let v: Vec<usize> = r.split(' ').map(|x| x.parse().unwrap()).collect();
        if fail_after.is_empty() {
            assert_eq!(v[1], 0, "cycles failed without injected faults");
        }
        ok += v[0];
        failed += v[1];
    }
    eprintln!("init/teardown: {ok} clean cycles, {failed} with injected failures, in {:.1?}", t.elapsed());
    assert!(failed > 0, "no injected failure took effect");
}

/// `n` network namespaces, fully meshed by veth pairs (one per pair, its own /24), with /32
/// routes so every rank's first address is reachable over the direct link. Removed on drop.
struct MeshNetns {
    names: Vec<String>,
    tag: u32,
}

fn ip(args: &[&str]) -> bool {
    std::process::Command::new("ip")
        .args(args)
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// veth hands a packet to the backlog of whichever CPU sent it, so a flow whose sender thread
/// migrates can be reordered; a cable never reorders, and UC drops a message whose fragments
/// do. RPS steers each flow to one CPU. Best effort: without it the test may still pass.
fn steer_flows_to_one_cpu(ns: &str, dev: &str) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()).min(32);
    let mask = format!("{:x}", (1u64 << cpus) - 1);
    let path = format!("/sys/class/net/{dev}/queues/rx-0/rps_cpus");
    let _ = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", &format!("echo {mask} > {path}")])
        .stderr(std::process::Stdio::null())
        .status();
}

impl MeshNetns {
    fn iface(&self, i: usize, j: usize) -> String {
        format!("bc{}{i}{j}", self.tag)
    }

    fn addr(&self, i: usize, j: usize) -> String {
        let (a, b) = (i.min(j), i.max(j));
        format!("10.251.{}.{}", 10 * a + b, i + 1)
    }

    /// The address each rank is known by: its end of the link to rank 0 (rank 0: toward rank 1).
    fn identity(&self, k: usize) -> String {
        if k == 0 {
            self.addr(0, 1)
        } else {
            self.addr(k, 0)
        }
    }

    fn create(n: usize) -> Option<MeshNetns> {
        let tag = std::process::id() % 10_000;
        let mut ns = MeshNetns { names: vec![], tag };
        for k in 0..n {
            let name = format!("bcclv{tag}_{k}");
            if !ip(&["netns", "add", &name]) {
                return None; // drop removes the ones made
            }
            ns.names.push(name);
            ip(&["-n", &ns.names[k], "link", "set", "lo", "up"]);
        }
        for i in 0..n {
            for j in i + 1..n {
                let (a, b) = (ns.iface(i, j), ns.iface(j, i));
                let ok =
                    ip(&["link", "add", &a, "netns", &ns.names[i], "type", "veth", "peer", &b, "netns", &ns.names[j]])
                        && ip(&["-n", &ns.names[i], "addr", "add", &format!("{}/24", ns.addr(i, j)), "dev", &a])
                        && ip(&["-n", &ns.names[j], "addr", "add", &format!("{}/24", ns.addr(j, i)), "dev", &b])
                        && ip(&["-n", &ns.names[i], "link", "set", &a, "up"])
                        && ip(&["-n", &ns.names[j], "link", "set", &b, "up"]);
                if !ok {
                    return None;
                }
                steer_flows_to_one_cpu(&ns.names[i], &a);
                steer_flows_to_one_cpu(&ns.names[j], &b);
            }
        }
        for i in 0..n {
            for j in (0..n).filter(|&j| j != i) {
                let route = format!("{}/32", ns.identity(j));
                if !ip(&["-n", &ns.names[i], "route", "replace", &route, "dev", &ns.iface(i, j)]) {
                    return None;
                }
            }
        }
        Some(ns)
    }

    fn matrix(&self, n: usize) -> PathBuf {
        let rows: Vec<String> = (0..n)
            .map(|i| {
                let cells: Vec<String> = (0..n)
                    .map(|j| if i == j { "null".into() } else { format!("\"rdma_{}\"", self.iface(i, j)) })
                    .collect();
                format!("[{}]", cells.join(","))
            })
            .collect();
        matrix_file("netns", &format!("[{}]", rows.join(",")))
    }
}

impl Drop for MeshNetns {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth ends (and so their peers).
        for n in &self.names {
            ip(&["netns", "del", n]);
        }
    }
}

/// Four ranks, each in its own network namespace, joined by veth pairs: every pair has its
/// own device, as Macs joined by Thunderbolt cables do.
#[test]
fn conformance_4_ranks_in_network_namespaces() {
    let n = 4;
    let Some(ns) = MeshNetns::create(n) else {
        eprintln!("SKIPPED conformance_4_ranks_in_network_namespaces: cannot create network namespaces (needs root and iproute2 `ip`)");
        return;
    };
    let matrix = ns.matrix(n);
    let port = 29_000 + (std::process::id() % 1000) as u16;
    for algo in [Algo::Auto, Algo::Direct, Algo::Ring] {
        let t = Instant::now();
        let mut ranks = Ranks { children: vec![] };
        for k in 0..n {
            let mut c = std::process::Command::new("ip");
            c.args(["netns", "exec", &ns.names[k]])
                .arg(std::env::current_exe().unwrap())
                .args(["--exact", "verbs_worker", "--nocapture", "--test-threads=1"])
                .env("BOLTCCL_TEST_ROLE", "worker")
                .env("BOLTCCL_RANK", k.to_string())
                .env("BOLTCCL_WORLD_SIZE", n.to_string())
                .env("BOLTCCL_COORDINATOR", format!("{}:{port}", ns.identity(0)))
                .env("BOLTCCL_JOB_KEY", "k")
                .env("BOLTCCL_ALGO", algo.name())
                .env("BOLTCCL_CHUNK_BYTES", "64")
                .env("BOLTCCL_MESH_MAX_BYTES", "256")
                .env("BOLTCCL_LOG", "boltccl=info")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            for (key, v) in verbs_env_with(matrix.clone()) {
                c.env(key, v);
            }
            ranks.children.push(c.spawn().unwrap());
        }
        let outs = ranks.wait(Duration::from_secs(120));
        let d = outputs_ok(&outs);
        assert!(d.iter().all(|x| x == &d[0]), "{algo:?}: ranks differ: {d:?}");
        assert_eq!(
            d[0],
            reference_digest(n, algo, &matrix),
            "{algo:?}: verbs across namespaces differs from in-process"
        );
        for o in &outs {
            assert!(o.stderr.contains("RDMA verbs mesh ready"), "rank {} did not use verbs:\n{}", o.rank, o.stderr);
        }
        eprintln!("verbs conformance: {n} ranks in network namespaces, {algo:?}: ok in {:.1?}", t.elapsed());
    }
}

/// The probe `auto` and `boltccl doctor` share, through a real verbs library (softverbs):
/// devices, port state, IPv4-mapped GID.
#[test]
fn probe_sees_the_software_devices() {
    let p = boltccl::probe::RdmaProbe::load(Some(&softverbs_lib()));
    assert!(p.library().is_ok());
    let names = p.device_names().unwrap();
    assert!(names.iter().any(|n| n == "rdma_lo"), "no rdma_lo: {names:?}");
    let lo = p.device("rdma_lo").unwrap();
    assert!(lo.active);
    assert_eq!(lo.ipv4_gid, Some((1, std::net::Ipv4Addr::LOCALHOST)), "softverbs puts the mapped GID at index 1");
    assert_eq!(lo.prefix, Some(8));
}

/// Two ranks in two namespaces joined by two veth pairs ("cables"), each on its own /24, with
/// strict reverse-path filtering so a packet that leaves by the wrong cable is dropped, as it
/// would never arrive over a Thunderbolt cable that goes elsewhere. The device matrix lists
/// the cables in opposite orders on the two ranks: boltccl must match them by subnet (a
/// crossed pairing would time out), then stripe messages over both.
#[test]
fn two_cables_listed_in_different_orders_are_matched() {
    let tag = std::process::id() % 10_000;
    let mut ns = MeshNetns { names: vec![], tag };
    let names = [format!("bcclc{tag}_0"), format!("bcclc{tag}_1")];
    let dev = |c: usize, end: char| format!("bx{tag}{c}{end}");
    let mut ok = true;
    for n in &names {
        ok &= ip(&["netns", "add", n]);
        if ok {
            ns.names.push(n.clone());
        }
    }
    for c in 0..2 {
        let (a, b) = (dev(c, 'a'), dev(c, 'b'));
        ok = ok
            && ip(&["link", "add", &a, "netns", &names[0], "type", "veth", "peer", &b, "netns", &names[1]])
            && ip(&["-n", &names[0], "addr", "add", &format!("10.253.{c}.1/24"), "dev", &a])
            && ip(&["-n", &names[1], "addr", "add", &format!("10.253.{c}.2/24"), "dev", &b])
            && ip(&["-n", &names[0], "link", "set", &a, "up"])
            && ip(&["-n", &names[1], "link", "set", &b, "up"]);
    }
    for n in &names {
        ok = ok && ip(&["-n", n, "link", "set", "lo", "up"]);
        for key in ["net.ipv4.conf.all.rp_filter=1", "net.ipv4.conf.default.rp_filter=1"] {
            ok = ok
                && std::process::Command::new("ip")
                    .args(["netns", "exec", n, "sysctl", "-qw", key])
                    .status()
                    .is_ok_and(|s| s.success());
        }
        for c in 0..2 {
            let end = if n == &names[0] { 'a' } else { 'b' };
            let key = format!("net.ipv4.conf.{}.rp_filter=1", dev(c, end));
            ok = ok
                && std::process::Command::new("ip")
                    .args(["netns", "exec", n, "sysctl", "-qw", &key])
                    .status()
                    .is_ok_and(|s| s.success());
        }
    }
    if !ok {
        eprintln!("SKIPPED two_cables_listed_in_different_orders_are_matched: cannot set up namespaces (needs root, iproute2 and sysctl)");
        return;
    }
    // Row 0: cable 0 then 1. Row 1: cable 1 then 0.
    let m = matrix_file(
        "twocables",
        &format!(
            r#"[[null,["rdma_{}","rdma_{}"]],[["rdma_{}","rdma_{}"],null]]"#,
            dev(0, 'a'),
            dev(1, 'a'),
            dev(1, 'b'),
            dev(0, 'b')
        ),
    );
    let port = 29_000 + (std::process::id() % 1000) as u16 + 1000;
    let mut ranks = Ranks { children: vec![] };
    for (k, name) in names.iter().enumerate() {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", name])
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", "verbs_worker", "--nocapture", "--test-threads=1"])
            .env("BOLTCCL_TEST_ROLE", "worker")
            .env("BOLTCCL_RANK", k.to_string())
            .env("BOLTCCL_WORLD_SIZE", "2")
            .env("BOLTCCL_COORDINATOR", format!("10.253.0.1:{port}"))
            .env("BOLTCCL_JOB_KEY", "k")
            .env("BOLTCCL_CHUNK_BYTES", "64")
            .env("BOLTCCL_MESH_MAX_BYTES", "256")
            .env("BOLTCCL_TIMEOUT_MS", "5000")
            .env("BOLTCCL_LOG", "boltccl=info")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for (key, v) in verbs_env_with(m.clone()) {
            c.env(key, v);
        }
        ranks.children.push(c.spawn().unwrap());
    }
    let outs = ranks.wait(Duration::from_secs(120));
    let d = outputs_ok(&outs);
    assert_eq!(d[0], d[1]);
    assert_eq!(d[0], reference_digest(2, Algo::Auto, &m));
    assert!(
        outs.iter().any(|o| o.stderr.contains("listed in another order there: matched by subnet")),
        "the crossed listing was not noticed:\n{}",
        outs[0].stderr
    );
    drop(ns);
}
