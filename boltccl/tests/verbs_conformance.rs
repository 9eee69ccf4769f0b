//! The verbs transport over softverbs (the software UC provider, a test double with Apple's
//! limits), ranks as separate processes unless a test says otherwise: every collective, bit for bit against the in-process reference, over a mesh, a ring, zero-copy sends, network namespaces and several cables per pair.

mod common;

use boltccl::Algo;
use common::harness::Job;
use common::harness::{results, Ranks};
use common::verbs::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[test]
fn verbs_worker() {
    worker();
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
        let d = results(&outs, "RESULT ");
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
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
fn conformance_3_ranks_full_mesh() {
    conformance(3, &[Algo::Auto, Algo::Direct, Algo::Ring]);
}

#[test]
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
fn conformance_4_ranks_full_mesh() {
    conformance(4, &[Algo::Auto, Algo::Mesh, Algo::Direct, Algo::Ring]);
}

/// Zero-copy sends (raw packets from caller memory after a header packet), with a cache of 3
/// registrations per queue pair so that eviction and the staged fallback both happen.
#[test]
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
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
        let d = results(&outs, "RESULT ");
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
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
fn conformance_5_ranks_ring() {
    conformance_on(5, &[Algo::Ring, Algo::Auto], ring_matrix(5), "ring");
}

#[test]
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
fn conformance_6_ranks_ring() {
    conformance_on(6, &[Algo::Ring, Algo::Auto], ring_matrix(6), "ring");
}

/// Four ranks, each in its own network namespace, joined by veth pairs: every pair has its
/// own device, as Macs joined by Thunderbolt cables do.
#[test]
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
fn conformance_4_ranks_in_network_namespaces() {
    let n = 4;
    let Some(ns) = MeshNetns::create(n) else {
        common::harness::prerequisite_missing(
            "conformance_4_ranks_in_network_namespaces",
            "cannot create network namespaces (needs root and iproute2 `ip`)",
        );
        return;
    };
    let matrix = ns.matrix(n);
    let port = 29_000 + (std::process::id() % 1000) as u16;
    for algo in [Algo::Auto, Algo::Direct, Algo::Ring] {
        let t = Instant::now();
        let names = ns.names.clone();
        let ranks = Job::new(n, "verbs_worker")
            .coordinator(format!("{}:{port}", ns.identity(0)))
            .wrap(move |k| ["ip", "netns", "exec", &names[k]].map(String::from).to_vec())
            .envs(verbs_env_with(matrix.clone()))
            .env("BOLTCCL_ALGO", algo.name())
            .env("BOLTCCL_CHUNK_BYTES", "64")
            .env("BOLTCCL_MESH_MAX_BYTES", "256")
            .env("BOLTCCL_LOG", "boltccl=info")
            .spawn();
        let outs = ranks.wait(Duration::from_secs(120));
        let d = results(&outs, "RESULT ");
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

/// Two network namespaces ("hosts") for ranks 0-1 and 2-3, and a device matrix cabling every
/// pair across them; `None` (the test failed as missing a prerequisite) without namespaces.
fn two_hosts(test: &str) -> Option<(MeshNetns, PathBuf)> {
    let Some(ns) = MeshNetns::create(2) else {
        common::harness::prerequisite_missing(test, "cannot create network namespaces (needs root and iproute2 `ip`)");
        return None;
    };
    let cell = |i: usize, j: usize| {
        if i / 2 == j / 2 {
            "null".to_string()
        } else {
            format!("\"rdma_{}\"", ns.iface(i / 2, j / 2))
        }
    };
    let rows: Vec<String> =
        (0..4).map(|i| format!("[{}]", (0..4).map(|j| cell(i, j)).collect::<Vec<_>>().join(","))).collect();
    let matrix = matrix_file(test, &format!("[{}]", rows.join(",")));
    Some((ns, matrix))
}

/// Four ranks on the two hosts, `auto` backend: shared memory inside each host, softverbs
/// between them with `rdma` (else TCP).
fn two_hosts_job(ns: &MeshNetns, matrix: &std::path::Path, port: u16, rdma: bool) -> Job {
    let names = ns.names.clone();
    let job = Job::new(4, "verbs_worker")
        .coordinator(format!("{}:{port}", ns.identity(0)))
        .wrap(move |k| ["ip", "netns", "exec", &names[k / 2]].map(String::from).to_vec())
        .env("BOLTCCL_BACKEND", "auto")
        .env("SOFTVERBS_QUIET", "1");
    if rdma {
        job.env("BOLTCCL_IBV_LIBRARY", softverbs_lib().display().to_string())
            .env("BOLTCCL_IBV_DEVICES", matrix.display().to_string())
    } else {
        job
    }
}

/// Two "hosts" (network namespaces) of two ranks each: shared memory between the ranks of a
/// host; across hosts RDMA (softverbs over the veth between them) with `auto` and a device
/// matrix, or TCP without one. Every rank gets the in-process reference's bits.
#[test]
fn two_hosts_of_two_ranks_share_memory_inside() {
    let Some((ns, matrix)) = two_hosts("two_hosts_of_two_ranks_share_memory_inside") else { return };
    // Shared memory inside each host: the two-level all-reduce, folded host by host.
    let cabling = boltccl::Cabling::from_links(cabling_of(&matrix)).with_hosts(vec![0, 0, 2, 2]);
    let reference = reference_digest_on(4, Algo::Auto, 64, 256, cabling);
    let port = 29_500 + (std::process::id() % 400) as u16;
    for rdma in [true, false] {
        let outs = two_hosts_job(&ns, &matrix, port, rdma)
            .env("BOLTCCL_CHUNK_BYTES", "64")
            .env("BOLTCCL_MESH_MAX_BYTES", "256")
            .env("BOLTCCL_LOG", "boltccl=info")
            .spawn()
            .wait(Duration::from_secs(120));
        let d = results(&outs, "RESULT ");
        assert!(d.iter().all(|x| x == &d[0]), "rdma {rdma}: ranks differ: {d:?}");
        assert_eq!(d[0], reference, "rdma {rdma}: two hosts differ from in-process");
        for o in &outs {
            assert!(o.stderr.contains("shared-memory links ready"), "rank {} shared no memory:\n{}", o.rank, o.stderr);
            assert_eq!(
                o.stderr.contains("RDMA verbs mesh ready"),
                rdma,
                "rank {}: RDMA between hosts {}:\n{}",
                o.rank,
                if rdma { "missing" } else { "unexpected" },
                o.stderr
            );
        }
    }
}

/// Two hosts of two ranks, all-reduce in two levels: a rank that dies (SIGSEGV, as a provider
/// crash would) is named on every other rank within 5 s, on the small (mesh inside, mesh
/// across) and the large (reduce-scatter, direct across, all-gather) paths, with TCP or
/// softverbs between the hosts. The large calls stay small (80 KB, above a 1 KiB mesh limit):
/// softverbs' UDP datagrams overflow socket buffers under megabytes of traffic, and their loss
/// is (rightly) reported as lost messages rather than the death this test looks for.
#[test]
fn two_hosts_a_dead_rank_is_named_on_every_rank() {
    let Some((ns, matrix)) = two_hosts("two_hosts_a_dead_rank_is_named_on_every_rank") else { return };
    let port = 29_900 + (std::process::id() % 90) as u16;
    for (k, (rdma, count)) in [(false, 100), (false, 20_000), (true, 100), (true, 20_000)].into_iter().enumerate() {
        let outs = two_hosts_job(&ns, &matrix, port + k as u16, rdma)
            .env("BOLTCCL_TEST_WORKLOAD", "die")
            .env("BOLTCCL_TEST_COUNT", count.to_string())
            .env("BOLTCCL_MESH_MAX_BYTES", "1024")
            .env("BOLTCCL_TIMEOUT_MS", "30000")
            .spawn()
            .wait(Duration::from_secs(60));
        for o in outs.iter().filter(|o| o.rank != 1) {
            let label = format!("rdma {rdma}, {count} floats, rank {}", o.rank);
            let r = results(std::slice::from_ref(o), "RESULT ")
                .pop()
                .unwrap_or_else(|| panic!("{label}: no result:\n{}", o.stderr));
            assert!(r.starts_with("PeerLost") || r.starts_with("Aborted"), "{label}: {r}");
            let ms: u64 = r.split(" after ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
            assert!(ms < 5_000, "{label}: took {ms} ms to notice (timeout is 30 s): {r}");
            assert!(r.contains("rank 1"), "{label}: the dead rank is not named: {r}");
        }
    }
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
        common::harness::prerequisite_missing(
            "two_cables_listed_in_different_orders_are_matched",
            "cannot set up namespaces (needs root, iproute2 and sysctl)",
        );
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
    let netns = names.clone();
    let ranks = Job::new(2, "verbs_worker")
        .coordinator(format!("10.253.0.1:{port}"))
        .wrap(move |k| ["ip", "netns", "exec", &netns[k]].map(String::from).to_vec())
        .envs(verbs_env_with(m.clone()))
        .env("BOLTCCL_CHUNK_BYTES", "64")
        .env("BOLTCCL_MESH_MAX_BYTES", "256")
        .env("BOLTCCL_TIMEOUT_MS", "5000")
        .env("BOLTCCL_LOG", "boltccl=info")
        .spawn();
    let outs = ranks.wait(Duration::from_secs(120));
    let d = results(&outs, "RESULT ");
    assert_eq!(d[0], d[1]);
    assert_eq!(d[0], reference_digest(2, Algo::Auto, &m));
    assert!(
        outs.iter().any(|o| o.stderr.contains("listed in another order there: matched by subnet")),
        "the crossed listing was not noticed:\n{}",
        outs[0].stderr
    );
    drop(ns);
}
