//! The verbs tests' set-up: softverbs (the software UC provider, a test double with Apple's
//! limits) loaded through BOLTCCL_IBV_LIBRARY exactly as `libibverbs.so.1` or `librdma.dylib`
//! would be, device matrices, network namespaces, and the rank-process workloads.

use super::harness::{free_port, is_worker};
use super::threads::ranks_on_threads;
use super::workload::suite;
use boltccl::{Algo, Backend, Config, Error, Group};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `target/<profile>/deps/libsoftverbs.so`, next to this test binary.
pub fn softverbs_lib() -> PathBuf {
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
pub fn matrix_file(name: &str, text: &str) -> PathBuf {
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
pub fn mesh_matrix(n: usize) -> PathBuf {
    let rows: Vec<String> = (0..n)
        .map(|i| {
            let cells: Vec<&str> = (0..n).map(|j| if i == j { "null" } else { "\"rdma_lo\"" }).collect();
            format!("[{}]", cells.join(","))
        })
        .collect();
    matrix_file(&format!("mesh{n}"), &format!("[{}]", rows.join(",")))
}

/// A ring over `rdma_lo` for `n` ranks: only neighbours are cabled; the other pairs use TCP.
pub fn ring_matrix(n: usize) -> PathBuf {
    let rows: Vec<String> = (0..n)
        .map(|i| {
            let cells: Vec<&str> =
                (0..n).map(|j| if j == (i + 1) % n || i == (j + 1) % n { "\"rdma_lo\"" } else { "null" }).collect();
            format!("[{}]", cells.join(","))
        })
        .collect();
    matrix_file(&format!("ring{n}"), &format!("[{}]", rows.join(",")))
}

pub fn verbs_env(n: usize) -> Vec<(&'static str, String)> {
    verbs_env_with(mesh_matrix(n))
}

pub fn verbs_env_with(matrix: PathBuf) -> Vec<(&'static str, String)> {
    vec![
        ("BOLTCCL_BACKEND", "verbs".into()),
        ("BOLTCCL_IBV_LIBRARY", softverbs_lib().display().to_string()),
        ("BOLTCCL_IBV_DEVICES", matrix.display().to_string()),
        ("SOFTVERBS_QUIET", "1".into()),
    ]
}

/// In-process config for rank `rank` of `n` (ranks as threads).
pub fn thread_cfg(rank: usize, n: usize, port: u16, timeout: Duration) -> Config {
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
        chunk_bytes: std::env::var("BOLTCCL_CHUNK_BYTES").ok().and_then(|v| v.parse().ok()),
        ..Config::default()
    }
}

/// `boltccl::init`, panicking with the error's message (what a user sees), not its Debug form.
pub fn init_or_panic() -> Group {
    boltccl::init().unwrap_or_else(|e| panic!("init failed: {e}"))
}

/// The rank-process side of every multi-process verbs test; what it runs is chosen by
/// BOLTCCL_TEST_WORKLOAD. Each verbs test binary calls it from its `verbs_worker` test.
pub fn worker() {
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
                let want = reference_digest_with(
                    g.size(),
                    cfg.algo,
                    cfg.chunk_bytes.unwrap_or(boltccl::config::NET_CHUNK_BYTES),
                    cfg.mesh_max_bytes,
                    &matrix,
                );
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
            let count = std::env::var("BOLTCCL_TEST_COUNT").map_or(1000, |v| v.parse().expect("a count"));
            let mut x = vec![1.0f32; count];
            let first = g.all_sum(&mut x);
            if g.rank() == 1 {
                // As in the field: a crash inside the provider kills one worker silently.
                // SAFETY: restoring the default action (Rust's handler only catches stack
                // overflows and would return) and raising the signal: the process dies.
                unsafe {
                    libc::signal(libc::SIGSEGV, libc::SIG_DFL);
                    libc::raise(libc::SIGSEGV);
                }
            }
            // Rank 1 may finish the first call, and die, while another rank still waits on a third
            // for its end of it: the group is dead, so that call may fail too, naming rank 1.
            let t = Instant::now();
            let e = first.err().unwrap_or_else(|| g.all_sum(&mut x).expect_err("rank 1 is gone"));
            println!("RESULT {:?} after {} ms: {e}", e.kind(), t.elapsed().as_millis());
        }
        "drop" => drop_workload(),
        "cycles" => cycles_workload(),
        other => panic!("unknown workload {other}"),
    }
}

/// The in-process reference digest for the same workload and settings, with algorithms chosen
/// for the cabling of the device matrix at `matrix`.
pub fn reference_digest(n: usize, algo: Algo, matrix: &Path) -> String {
    reference_digest_with(n, algo, 64, 256, matrix)
}

pub fn reference_digest_with(n: usize, algo: Algo, chunk_bytes: usize, mesh_max_bytes: usize, matrix: &Path) -> String {
    reference_digest_on(n, algo, chunk_bytes, mesh_max_bytes, boltccl::Cabling::from_links(cabling_of(matrix)))
}

/// The in-process reference digest for `cabling` (links, and hosts when it names them).
pub fn reference_digest_on(
    n: usize,
    algo: Algo,
    chunk_bytes: usize,
    mesh_max_bytes: usize,
    cabling: boltccl::Cabling,
) -> String {
    let cfg = Config {
        algo,
        chunk_bytes: Some(chunk_bytes),
        mesh_max_bytes,
        timeout: Duration::from_secs(20),
        ..Config::default()
    };
    let groups = Group::local_world_cabled(n, &cfg, cabling);
    let hs: Vec<_> = groups.into_iter().map(|g| std::thread::spawn(move || suite(&g))).collect();
    let d: Vec<u64> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    format!("{:x}", d[0])
}

/// `cabled[i][j]` from a device matrix file: a non-null cell is a cable.
pub fn cabling_of(matrix: &Path) -> Vec<Vec<bool>> {
    let text = std::fs::read_to_string(matrix).unwrap();
    let rows: Vec<Vec<serde_json::Value>> = serde_json::from_str(&text).unwrap();
    rows.iter().enumerate().map(|(i, r)| r.iter().enumerate().map(|(j, c)| i == j || !c.is_null()).collect()).collect()
}

/// Ranks as threads in this process, over softverbs: form a group of `n`, run `body` on each.
pub fn threads<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    body: impl Fn(Result<Group, Error>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let port = free_port();
    ranks_on_threads(n, move |r| body(Group::new(thread_cfg(r, n, port, timeout))))
}

/// Deterministic pseudo-random numbers (no dependency, same sequence every run).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self, below: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % below
    }
}

/// The deadline (`BOLTCCL_TIMEOUT_MS`) of the groups of [`drop_workload`].
pub const DROP_DEADLINE: Duration = Duration::from_millis(100);

/// The operations [`drop_workload`] runs: `BOLTCCL_TEST_OPS`, by default 3,000.
pub fn drop_ops(env: &[(&str, String)]) -> usize {
    let ops = env.iter().rev().find(|(k, _)| *k == "BOLTCCL_TEST_OPS").map(|(_, v)| v.clone());
    ops.or_else(|| std::env::var("BOLTCCL_TEST_OPS").ok()).and_then(|v| v.parse().ok()).unwrap_or(3000)
}

/// In a process whose provider drops 1% of datagrams: 2 ranks as threads run all_sums of random
/// lengths; each returns the exact answer or an error, never anything else. After an error the
/// group is poisoned, so a new one is formed. Runs [`drop_ops`] operations however long they
/// take (no time budget: the count of exact answers must not depend on the machine's speed;
/// each operation ends by its deadline at the latest). Prints `RESULT exact errors epochs`.
pub fn drop_workload() {
    let target = drop_ops(&[]);
    let (mut exact, mut errors, mut epoch) = (0usize, 0usize, 0u64);
    while exact + errors < target {
        epoch += 1;
        // Both ranks' providers use the same drop seed, so losses are often symmetric and then
        // only the deadline can tell: keep it short.
        let per_rank = threads(2, DROP_DEADLINE, move |g| {
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

/// Live provider objects, read through the same loaded copy of softverbs that boltccl uses.
pub fn live_objects(lib: &libloading::Library) -> [u64; 7] {
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

pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

pub fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    s.split(' ').nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 4
}

/// Form and tear down 2-rank groups (threads) `BOLTCCL_TEST_CYCLES` times under the process's
/// SOFTVERBS_FAIL_AFTER; after each, no provider object may be alive. Prints `RESULT ok failed`.
pub fn cycles_workload() {
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

/// `n` network namespaces, fully meshed by veth pairs (one per pair, its own /24), with /32
/// routes so every rank's first address is reachable over the direct link. Removed on drop.
pub struct MeshNetns {
    pub names: Vec<String>,
    /// Makes the interface names unique: this process's id and a count of calls.
    pub tag: u32,
}

pub fn ip(args: &[&str]) -> bool {
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
pub fn steer_flows_to_one_cpu(ns: &str, dev: &str) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()).min(32);
    let mask = format!("{:x}", (1u64 << cpus) - 1);
    let path = format!("/sys/class/net/{dev}/queues/rx-0/rps_cpus");
    let _ = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", &format!("echo {mask} > {path}")])
        .stderr(std::process::Stdio::null())
        .status();
}

impl MeshNetns {
    pub fn iface(&self, i: usize, j: usize) -> String {
        format!("bc{}{i}{j}", self.tag)
    }

    pub fn addr(&self, i: usize, j: usize) -> String {
        let (a, b) = (i.min(j), i.max(j));
        format!("10.251.{}.{}", 10 * a + b, i + 1)
    }

    /// The address each rank is known by: its end of the link to rank 0 (rank 0: toward rank 1).
    pub fn identity(&self, k: usize) -> String {
        if k == 0 {
            self.addr(0, 1)
        } else {
            self.addr(k, 0)
        }
    }

    pub fn create(n: usize) -> Option<MeshNetns> {
        // Unique per process and per call: tests of one binary run in parallel.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = (std::process::id() % 1000) * 10 + k % 10;
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

    /// The network namespace of rank `k`.
    pub fn ns(&self, k: usize) -> &str {
        &self.names[k]
    }

    /// Take the cable between ranks `i` and `j` down (both processes stay alive), or up again.
    pub fn set_link(&self, i: usize, j: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        assert!(ip(&["-n", self.ns(i), "link", "set", &self.iface(i, j), state]), "link {i}-{j} {state}");
    }

    /// Drop every packet into and out of rank `k`'s namespace with nftables (loopback aside),
    /// or remove that rule set.
    pub fn isolate(&self, k: usize, on: bool) {
        let script = if on {
            "add table inet bcclpart\n\
             add chain inet bcclpart input { type filter hook input priority 0; policy drop; }\n\
             add chain inet bcclpart output { type filter hook output priority 0; policy drop; }\n\
             add rule inet bcclpart input iif lo accept\n\
             add rule inet bcclpart output oif lo accept\n"
        } else {
            "delete table inet bcclpart\n"
        };
        let mut child = std::process::Command::new("ip")
            .args(["netns", "exec", self.ns(k), "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("run nft (apt-get install nftables)");
        use std::io::Write;
        child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success(), "nft in {}: {script}", self.ns(k));
    }

    /// Ready the links for softverbs' large datagrams, as `scripts/bench/netns.sh` does: a
    /// 9000-byte MTU (4 KiB datagrams are not IP-fragmented) and permanent neighbour entries
    /// (while ARP resolves, the kernel keeps only ~200 KB for a neighbour and drops the rest of
    /// a first burst, which UC turns into a lost message).
    pub fn ready_for_datagrams(&self) {
        let n = self.names.len();
        for i in 0..n {
            for j in (0..n).filter(|&j| j != i) {
                let dev = self.iface(i, j);
                assert!(ip(&["-n", self.ns(i), "link", "set", &dev, "mtu", "9000"]));
                let out = std::process::Command::new("ip")
                    .args(["netns", "exec", self.ns(j), "cat", &format!("/sys/class/net/{}/address", self.iface(j, i))])
                    .output()
                    .expect("read a MAC address");
                let mac = String::from_utf8_lossy(&out.stdout).trim().to_string();
                for addr in [self.addr(j, i), self.identity(j)] {
                    ip(&["-n", self.ns(i), "neigh", "replace", &addr, "lladdr", &mac, "dev", &dev, "nud", "permanent"]);
                }
            }
        }
    }

    /// Cap every link at `rate` (tc syntax, e.g. "150mbit") in each direction with tbf and a
    /// large queue (it delays rather than drops, which UC would turn into errors).
    pub fn limit_rate(&self, rate: &str) {
        self.ready_for_datagrams();
        let n = self.names.len();
        for i in 0..n {
            for j in (0..n).filter(|&j| j != i) {
                let dev = self.iface(i, j);
                let ok = std::process::Command::new("ip")
                    .args(["netns", "exec", self.ns(i), "tc", "qdisc", "replace", "dev", &dev, "root", "tbf"])
                    .args(["rate", rate, "burst", "64kb", "limit", "64mb"])
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "tc tbf on {dev}");
            }
        }
    }

    pub fn matrix(&self, n: usize) -> PathBuf {
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
