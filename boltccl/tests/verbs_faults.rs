//! The verbs transport over softverbs (the software UC provider, a test double with Apple's
//! limits), ranks as separate processes unless a test says otherwise: lost, late, repeated,
//! reordered, corrupted and failing messages, dying ranks and failing verbs: exact answers or
//! errors, never a hang or a leak.

mod common;

use common::harness::Job;
use common::harness::{one_job_at_a_time, results, Ranks};
use common::verbs::*;
use std::time::{Duration, Instant};

#[test]
fn verbs_worker() {
    worker();
}

/// A rank whose every `ibv_post_recv` is 2 ms late loses nothing: senders wait for credits.
#[test]
fn late_receives_lose_no_data() {
    let mut env = verbs_env(2);
    env.extend([("BOLTCCL_TEST_WORKLOAD", "sums".into()), ("BOLTCCL_CHUNK_BYTES", "16384".into())]);
    // Rank 1 gets the delay; rank 0 sends as fast as credits allow.
    let outs = Job::new(2, "verbs_worker")
        .envs(env)
        .rank_env(1, "SOFTVERBS_RECV_DELAY_US", "2000")
        .spawn()
        .wait(Duration::from_secs(120));
    assert!(results(&outs, "RESULT ").iter().all(|r| r == "ok"));
}

/// A rank that dies mid-job is reported on the others within moments, not a hang.
#[test]
fn dead_peer_is_reported_quickly() {
    let mut env = verbs_env(3);
    env.extend([("BOLTCCL_TEST_WORKLOAD", "die".into()), ("BOLTCCL_TIMEOUT_MS", "30000".into())]);
    let outs = Ranks::spawn(3, "verbs_worker", &env).wait(Duration::from_secs(60));
    for o in outs.iter().filter(|o| o.rank != 1) {
        let r = results(std::slice::from_ref(o), "RESULT ").pop().unwrap();
        assert!(r.starts_with("PeerLost") || r.starts_with("Aborted"), "rank {}: {r}", o.rank);
        let ms: u64 = r.split(" after ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        assert!(ms < 5_000, "rank {} took {ms} ms to notice (timeout is 30 s): {r}", o.rank);
        assert!(r.contains("rank 1"), "rank {}: the culprit is not named: {r}", o.rank);
    }
}

/// "Couldn't allocate protection domain" on one node, during start-up: that rank names the
/// verb, cause and fix; the others say which rank failed and why, not a stale errno
/// (JACCL's "Recv failed with errno=2").
#[test]
fn protection_domain_failure_on_one_rank_is_explained_everywhere() {
    // softverbs counts query_port and two query_gid first: the 4th counted verb is alloc_pd.
    let outs = Job::new(3, "verbs_worker")
        .envs(verbs_env(3))
        .rank_env(1, "SOFTVERBS_FAIL_AFTER", "3")
        .spawn()
        .wait(Duration::from_secs(60));
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

#[test]
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
fn one_percent_loss_gives_exact_answers_or_errors() {
    lossy_all_sums(&[], 1000);
}

/// The same with zero-copy sends (raw packets) and 4 KiB chunks, so most pieces go raw.
#[test]
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
fn one_percent_loss_with_zero_copy_gives_exact_answers_or_errors() {
    lossy_all_sums(
        &[("BOLTCCL_IBV_ZERO_COPY", "1"), ("BOLTCCL_CHUNK_BYTES", "4096"), ("BOLTCCL_TEST_OPS", "1500")],
        500,
    );
}

fn lossy_all_sums(extra: &[(&'static str, &str)], min_exact: usize) {
    let mut faults = vec![("SOFTVERBS_DROP_RATE", "0.01")];
    faults.extend_from_slice(extra);
    faulty_all_sums(&faults, min_exact);
}

/// 2 ranks (threads of one process) over softverbs injecting `faults` run a fixed number of
/// all_sums of random lengths, forming a new group after each failure: every result is exact
/// or an error (a wrong element fails the worker), some of each. One job at a time: the groups'
/// deadline is short (100 ms), and jobs side by side on 2 cores would time out for want of a
/// core rather than for the faults.
fn faulty_all_sums(faults: &[(&'static str, &str)], min_exact: usize) {
    let _one = one_job_at_a_time();
    let mut env = verbs_env(2);
    env.extend([("BOLTCCL_TEST_WORKLOAD", "drop".into()), ("SOFTVERBS_SEED", "12345".into())]);
    env.extend(faults.iter().map(|&(k, v)| (k, v.to_string())));
    let t = Instant::now();
    // A hang guard, not a speed test: every operation ends by its deadline at the latest.
    let limit = DROP_DEADLINE * drop_ops(&env) as u32 + Duration::from_secs(60);
    let outs = Ranks::spawn(1, "verbs_worker", &env).wait(limit);
    let r = results(&outs, "RESULT ").pop().unwrap();
    let v: Vec<usize> = r.split(' ').map(|x| x.parse().unwrap()).collect();
    eprintln!("{faults:?}: {} exact, {} errors, 0 wrong over {} groups in {:.1?}", v[0], v[1], v[2], t.elapsed());
    assert!(v[1] > 0, "no operation failed: did the faults take effect?");
    assert!(v[0] >= min_exact, "too few operations completed to mean anything: {r}");
}

/// A datagram sent twice: a repeated one-packet message is caught by the sequence numbers, a
/// repeated fragment makes its message incomplete (dropped): errors, never wrong data.
#[test]
fn duplicated_datagrams_give_exact_answers_or_errors() {
    faulty_all_sums(&[("SOFTVERBS_DUP_RATE", "0.01"), ("BOLTCCL_TEST_OPS", "1200")], 600);
}

/// A datagram overtaken by the next: messages out of order are caught by the sequence numbers,
/// fragments out of order drop their message.
#[test]
fn reordered_datagrams_give_exact_answers_or_errors() {
    faulty_all_sums(&[("SOFTVERBS_REORDER_RATE", "0.01"), ("BOLTCCL_TEST_OPS", "1200")], 600);
}

/// A bit flipped in a datagram (header or payload): its checksum fails and it is dropped, as
/// hardware drops a packet failing its ICRC; the message is lost, the operation fails.
#[test]
fn corrupted_datagrams_give_exact_answers_or_errors() {
    faulty_all_sums(&[("SOFTVERBS_CORRUPT_RATE", "0.004"), ("BOLTCCL_TEST_OPS", "1200")], 600);
}

/// All of them at once, with zero-copy sends and 4 KiB chunks (raw packets carry no link
/// header: only their immediate data is checked).
#[test]
fn every_datagram_fault_at_once_with_zero_copy_gives_exact_answers_or_errors() {
    faulty_all_sums(
        &[
            ("SOFTVERBS_DROP_RATE", "0.003"),
            ("SOFTVERBS_DUP_RATE", "0.003"),
            ("SOFTVERBS_REORDER_RATE", "0.003"),
            ("SOFTVERBS_CORRUPT_RATE", "0.003"),
            ("BOLTCCL_IBV_ZERO_COPY", "1"),
            ("BOLTCCL_CHUNK_BYTES", "4096"),
            ("BOLTCCL_TEST_OPS", "1500"),
        ],
        300,
    );
}

#[test]
#[ignore = "full tier: scripts/test.sh runs it (cargo test -- --include-ignored)"]
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
        let r = results(&outs, "RESULT ").pop().unwrap();
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
