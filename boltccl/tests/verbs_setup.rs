//! The verbs transport over softverbs (the software UC provider, a test double with Apple's
//! limits), ranks as separate processes unless a test says otherwise: forming a group, and refusing to when nodes disagree or RDMA is missing, with messages that say what to fix.

mod common;

use boltccl::{Backend, Group};
use common::harness::free_port;
use common::harness::Job;
use common::verbs::*;
use std::time::Duration;

#[test]
fn verbs_worker() {
    worker();
}

/// Nodes given different device matrices (rank 0 thinks it has a full mesh, the others a ring)
/// would pick different algorithms: every rank refuses at start-up, naming the cause.
#[test]
fn different_device_matrices_are_refused_at_start_up() {
    let mesh = mesh_matrix(4).display().to_string();
    let outs = Job::new(4, "verbs_worker")
        .envs(verbs_env_with(ring_matrix(4)))
        .rank_env(0, "BOLTCCL_IBV_DEVICES", mesh)
        .spawn()
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
