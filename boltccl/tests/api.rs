//! API behaviour with ranks as threads: argument errors leave the group usable, concurrent
//! calls are rejected, errors poison the group, split forms independent sub-groups, and
//! send/recv mismatches are errors on both sides.

mod common;

use boltccl::{Config, Error, ErrorKind, Group};
use common::threads::on_threads as on_all;
use std::time::Duration;

fn world(n: usize) -> Vec<Group> {
    Group::local_world_with(n, &Config { timeout: Duration::from_secs(5), ..Config::default() })
}

#[test]
fn argument_errors_are_local_and_say_what_to_do() {
    let out = on_all(world(2), |_, g| {
        let mut out = vec![0f32; 5];
        let e = g.all_gather(&[1f32, 2.0], &mut out).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("needs size × input = 2 × 2 = 4"), "{e}");
        let e = g.broadcast(&mut out, 7).unwrap_err();
        assert!(e.to_string().contains("root 7 is out of range"), "{e}");
        let e = g.send(&out, g.rank()).unwrap_err();
        assert!(e.to_string().contains("itself"), "{e}");
        let e = g.all_sum_into(&[1f32; 3], &mut out).unwrap_err();
        assert!(e.to_string().contains("same length"), "{e}");
        let e = g.bytes().all_reduce(boltccl::ReduceOp::Sum, boltccl::DType::F32, None, &mut [0u8; 7]).unwrap_err();
        assert!(e.to_string().contains("not a whole number of float32"), "{e}");
        // Still usable.
        let mut x = [1i64; 3];
        g.all_sum(&mut x).unwrap();
        x
    });
    assert!(out.iter().all(|x| x == &[2, 2, 2]));
}

#[test]
fn concurrent_calls_on_one_group_are_rejected() {
    let mut gs = world(2);
    let g1 = gs.pop().unwrap();
    let g0 = std::sync::Arc::new(gs.pop().unwrap());
    let g0b = g0.clone();
    // Rank 0 starts an all_sum that waits for rank 1; meanwhile another thread tries a barrier.
    let h = std::thread::spawn(move || {
        let mut x = [1u32; 4];
        g0b.all_sum(&mut x).map(|_| x)
    });
    std::thread::sleep(Duration::from_millis(100));
    let e = g0.barrier().unwrap_err();
    assert!(matches!(e, Error::Busy), "{e}");
    assert!(e.to_string().contains("must not overlap"));
    let mut y = [2u32; 4];
    g1.all_sum(&mut y).unwrap();
    assert_eq!(h.join().unwrap().unwrap(), [3; 4]);
    assert_eq!(y, [3; 4]);
}

#[test]
fn a_timeout_poisons_the_group_with_the_original_cause() {
    let mut gs = Group::local_world_with(2, &Config { timeout: Duration::from_millis(300), ..Config::default() });
    let _silent = gs.pop().unwrap();
    let g0 = gs.pop().unwrap();
    let mut x = [1f32; 8];
    let e = g0.all_sum(&mut x).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(e.to_string().contains("waiting for rank 1"), "{e}");
    let again = g0.barrier().unwrap_err();
    assert!(matches!(&again, Error::Poisoned(inner) if inner.kind() == ErrorKind::Timeout), "{again}");
    assert_eq!(again.rank(), Some(1));
}

#[test]
fn mismatched_send_and_recv_fail_on_both_sides() {
    // Each rank: the send's or recv's result, then a barrier's (the next call on the group).
    let out = on_all(world(2), |r, g| {
        let first = if r == 0 { g.send(&[1f32; 10], 1) } else { g.recv(&mut [0f32; 9], 0) };
        (first, g.barrier())
    });
    let e1 = out[1].0.as_ref().unwrap_err();
    assert!(e1.to_string().contains("10 float32"), "{e1}");
    assert_eq!(e1.kind(), ErrorKind::Mismatch, "{e1}");
    assert_eq!(e1.rank(), Some(0), "the receiver blames the sender: {e1}");
    // The sender's message may already be on its way, so its send may succeed; then it learns
    // through the receiver's abort, and its next call fails (at once, not at the deadline).
    let (send, next) = &out[0];
    let e0 =
        send.as_ref().err().unwrap_or_else(|| next.as_ref().expect_err("the sender never learned of the mismatch"));
    assert_eq!(e0.kind(), ErrorKind::Aborted, "the sender learns through the abort, not a timeout: {e0}");
    assert_eq!(e0.rank(), Some(1), "{e0}");
    assert!(e0.to_string().contains("10 float32"), "the sender is told why: {e0}");
    // Both groups are poisoned.
    assert!(out[1].1.is_err(), "the receiver's group is still usable after a mismatch");
}

#[test]
fn split_forms_independent_ordered_subgroups() {
    let out = on_all(world(6), |r, g| {
        // Even and odd ranks; keys reverse the order; rank 5 opts out.
        let color = if r == 5 { None } else { Some((r % 2) as u32) };
        let sub = g.split(color, -(r as i64)).unwrap();
        let Some(sub) = sub else {
            let mut y = [1u8];
            g.all_sum(&mut y).unwrap();
            return (r, None);
        };
        let mut x = [r as u64];
        sub.all_sum(&mut x).unwrap();
        let mut ranks = vec![0u64; sub.size()];
        sub.all_gather(&[r as u64], &mut ranks).unwrap();
        // The parent still works afterwards.
        let mut y = [1u8];
        g.all_sum(&mut y).unwrap();
        (r, Some((sub.rank(), sub.size(), x[0], ranks, y[0])))
    });
    for (r, res) in out {
        match r {
            5 => assert!(res.is_none()),
            _ => {
                let (sr, ss, sum, ranks, parent) = res.unwrap();
                let expect: Vec<u64> = if r % 2 == 0 { vec![4, 2, 0] } else { vec![3, 1] };
                assert_eq!(ss, expect.len());
                assert_eq!(ranks, expect, "ordered by key (descending rank)");
                assert_eq!(ranks[sr], r as u64);
                assert_eq!(sum, expect.iter().sum::<u64>());
                assert_eq!(parent, 6);
            }
        }
    }
}

#[test]
fn calls_on_sibling_groups_in_different_orders_fail_instead_of_mixing() {
    let out = on_all(world(2), |r, g| {
        let sub = g.split(Some(0), 0).unwrap().unwrap();
        let mut x = [1f32; 4];
        if r == 0 {
            sub.all_sum(&mut x)
        } else {
            g.all_sum(&mut x)
        }
    });
    assert!(out.iter().all(|r| r.is_err()), "{out:?}");
    assert!(out.iter().any(|r| r.as_ref().unwrap_err().to_string().contains("another group")), "{out:?}");
}

#[test]
fn interrupt_check_stops_a_blocked_call() {
    let mut gs = world(2);
    let _other = gs.pop().unwrap();
    let g0 = gs.pop().unwrap();
    g0.set_interrupt_check(Some(std::sync::Arc::new(|| true)));
    let t = std::time::Instant::now();
    let e = g0.barrier().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Interrupted);
    assert!(t.elapsed() < Duration::from_secs(2));
}
