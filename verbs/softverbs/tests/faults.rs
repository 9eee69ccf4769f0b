//! Fault injection from the environment: drop rate, delivery delay, device failure after N
//! operations, late receive posting (and how credits make it lossless).

mod common;

use std::time::{Duration, Instant};

use common::*;
use softverbs::*;
use verbs_abi::*;

#[test]
fn drop_rate_loses_messages_deterministically() {
    let _g = serial();
    let run = || {
        let p = Pair::new(&[("SOFTVERBS_DROP_RATE", "0.3"), ("SOFTVERBS_SEED", "7")], &[], IBV_MTU_4096);
        let mut abuf = pattern(64, 1);
        let mut bbuf = vec![0u8; 64 * 32];
        let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
        let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
        for (i, chunk) in bbuf.chunks_mut(64).enumerate() {
            assert_eq!(post_recv(p.bqp, lkey(bmr), chunk, i as u64), 0);
        }
        let mut imms = Vec::new();
        for i in 0..32u32 {
            assert_eq!(send_buf(p.aqp, amr, &abuf, i as u64, Some(i)), 0);
            assert_eq!(poll_ok(p.acq).status, IBV_WC_SUCCESS, "sends complete even when lost");
            // Let each message land before the next so the receive order is deterministic.
            if let Some(r) = poll(p.bcq, Duration::from_millis(30)) {
                imms.push(u32::from_be(r.imm_data));
            }
        }
        while let Some(r) = poll(p.bcq, Duration::from_millis(100)) {
            imms.push(u32::from_be(r.imm_data));
        }
        dereg(amr);
        dereg(bmr);
        p.close();
        imms
    };
    let first = run();
    let second = run();
    assert!(first.len() < 32 && first.len() > 10, "30% loss: got {} of 32", first.len());
    assert_eq!(first, second, "same seed, same losses");
    assert_no_leaks();
}

#[test]
fn delivery_delay() {
    let _g = serial();
    let p = Pair::new(&[], &[("SOFTVERBS_DELAY_US", "200000")], IBV_MTU_4096);
    let mut abuf = pattern(64, 1);
    let mut bbuf = vec![0u8; 64];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf, 1), 0);
    let t0 = Instant::now();
    assert_eq!(send_buf(p.aqp, amr, &abuf, 1, None), 0);
    poll_ok(p.acq);
    let r = poll_ok(p.bcq);
    let dt = t0.elapsed();
    assert_eq!(r.status, IBV_WC_SUCCESS);
    assert!(dt >= Duration::from_millis(190), "delivered after {dt:?}");
    assert!(dt < Duration::from_secs(5));
    dereg(amr);
    dereg(bmr);
    p.close();
    assert_no_leaks();
}

#[test]
fn device_fails_after_n_operations() {
    let _g = serial();
    // Counted operations on b: alloc_pd, create_cq, create_qp, query_gid, 3 x modify_qp = 7,
    // reg_mr = 8, two post_recv = 10. The 11th operation fails.
    let p = Pair::new(&[], &[("SOFTVERBS_FAIL_AFTER", "10")], IBV_MTU_4096);
    let mut abuf = pattern(64, 1);
    let mut bbuf = vec![0u8; 64];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf[..32], 1), 0);
    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf[32..], 2), 0);
    // The 11th operation fails with EIO ...
    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf[32..], 3), libc::EIO);
    // ... outstanding receives complete with an error status ...
    let r1 = poll_ok(p.bcq);
    let r2 = poll_ok(p.bcq);
    assert_eq!((r1.wr_id, r1.status, r2.wr_id, r2.status), (1, IBV_WC_WR_FLUSH_ERR, 2, IBV_WC_WR_FLUSH_ERR));
    // ... later verbs fail too ...
    // SAFETY: live context.
    let pd = unsafe { ibv_alloc_pd(p.b.ctx) };
    assert!(pd.is_null());
    assert_eq!(errno(), libc::EIO);
    // ... and messages are no longer delivered.
    assert_eq!(send_buf(p.aqp, amr, &abuf, 9, None), 0);
    poll_ok(p.acq);
    assert!(poll(p.bcq, Duration::from_millis(200)).is_none());
    // Teardown still works and releases everything.
    dereg(amr);
    dereg(bmr);
    p.close();
    assert_no_leaks();
}

/// The receiver posts each receive late (100 ms per `post_recv`). Without flow control the
/// sender's messages arrive before the receive exists and are dropped (UC); with credits
/// (the receiver tells the sender after posting) nothing is lost.
#[test]
fn late_receives_lose_data_without_credits_but_not_with_credits() {
    let _g = serial();
    const N: usize = 4;
    // Naive: the receiver thread posts (slowly) while the sender sends right away.
    let p = Pair::new(&[], &[("SOFTVERBS_RECV_DELAY_US", "100000")], IBV_MTU_4096);
    let mut abuf = pattern(64, 1);
    let mut bbuf = vec![0u8; 64 * N];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    let bqp = p.bqp as usize;
    let (bkey, baddr) = (lkey(bmr), bbuf.as_mut_ptr() as usize);
    let poster = std::thread::spawn(move || {
        for i in 0..N {
            // SAFETY: bbuf outlives the thread (joined below); chunks do not overlap.
            let chunk = unsafe { std::slice::from_raw_parts_mut((baddr + 64 * i) as *mut u8, 64) };
            assert_eq!(post_recv(bqp as *mut ibv_qp, bkey, chunk, i as u64), 0);
        }
    });
    for i in 0..N {
        assert_eq!(send_buf(p.aqp, amr, &abuf, i as u64, None), 0);
        poll_ok(p.acq);
    }
    poster.join().unwrap();
    let mut naive = 0;
    while poll(p.bcq, Duration::from_millis(200)).is_some() {
        naive += 1;
    }
    assert!(naive < N, "late receives should lose data without credits");
    dereg(amr);
    dereg(bmr);
    p.close();

    // With credits: post, then grant a credit; the sender sends only against credits.
    let p = Pair::new(&[], &[("SOFTVERBS_RECV_DELAY_US", "100000")], IBV_MTU_4096);
    let mut abuf = pattern(64, 1);
    let mut acredit = vec![0u8; 64 * N];
    let mut bbuf = vec![0u8; 64 * N];
    let mut bcredit = vec![0u8; 8];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let acmr = p.a.reg(&mut acredit, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    let bcmr = p.b.reg(&mut bcredit, IBV_ACCESS_LOCAL_WRITE);
    // The sender (no delay) posts receives for credits up front.
    for (i, c) in acredit.chunks_mut(64).enumerate() {
        assert_eq!(post_recv(p.aqp, lkey(acmr), c, 1000 + i as u64), 0);
    }
    let mut received = 0;
    let mut sent = 0;
    let deadline = Instant::now() + WAIT;
    for (i, chunk) in bbuf.chunks_mut(64).enumerate() {
        assert_eq!(post_recv(p.bqp, lkey(bmr), chunk, i as u64), 0); // slow
        assert_eq!(send_buf(p.bqp, bcmr, &bcredit, 500 + i as u64, Some(1)), 0); // credit
                                                                                 // Sender: wait for the credit, then send one message.
        loop {
            let wc = poll_ok(p.acq);
            if wc.opcode == IBV_WC_RECV {
                assert_eq!(wc.status, IBV_WC_SUCCESS);
                break;
            }
        }
        assert_eq!(send_buf(p.aqp, amr, &abuf, sent, None), 0);
        sent += 1;
        // Receiver: drain its CQ (credit send completions and data).
        while received < sent as usize && Instant::now() < deadline {
            if let Some(wc) = poll(p.bcq, Duration::from_millis(50)) {
                assert_eq!(wc.status, IBV_WC_SUCCESS);
                if wc.opcode == IBV_WC_RECV {
                    received += 1;
                }
            }
        }
    }
    assert_eq!(received, N, "credits make late receives lossless");
    for mr in [amr, acmr, bmr, bcmr] {
        dereg(mr);
    }
    p.close();
    assert_no_leaks();
}

#[test]
fn bad_environment_value_fails_open() {
    let _g = serial();
    std::env::set_var("SOFTVERBS_DROP_RATE", "lots");
    let ctx = open_lo();
    std::env::remove_var("SOFTVERBS_DROP_RATE");
    assert!(ctx.is_null());
    assert_eq!(errno(), libc::EINVAL);
    assert_no_leaks();
}

/// Sends 16 one-packet messages (immediate = their number) from a to b, 32 receives posted
/// (room for repeats), each landing before the next is sent unless `hurry`, and returns the
/// immediates b received, in order.
fn deliveries(a_env: &[(&str, &str)], hurry: bool) -> Vec<u32> {
    let p = Pair::new(a_env, &[], IBV_MTU_4096);
    let mut abuf = pattern(64, 1);
    let mut bbuf = vec![0u8; 64 * 32];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    for (i, chunk) in bbuf.chunks_mut(64).enumerate() {
        assert_eq!(post_recv(p.bqp, lkey(bmr), chunk, i as u64), 0);
    }
    let mut imms = Vec::new();
    for i in 0..16u32 {
        assert_eq!(send_buf(p.aqp, amr, &abuf, i as u64, Some(i)), 0);
        assert_eq!(poll_ok(p.acq).status, IBV_WC_SUCCESS);
        if !hurry {
            while let Some(r) = poll(p.bcq, Duration::from_millis(30)) {
                imms.push(u32::from_be(r.imm_data));
            }
        }
    }
    while let Some(r) = poll(p.bcq, Duration::from_millis(100)) {
        assert_eq!(r.status, IBV_WC_SUCCESS);
        imms.push(u32::from_be(r.imm_data));
    }
    dereg(amr);
    dereg(bmr);
    p.close();
    imms
}

/// SOFTVERBS_DUP_RATE: a one-packet message sent twice arrives twice (hardware would drop
/// the repeat by its PSN; softverbs lets it through so that the library's own sequence check
/// is what stops it).
#[test]
fn duplicated_datagrams_arrive_twice() {
    let _g = serial();
    let got = deliveries(&[("SOFTVERBS_DUP_RATE", "0.3"), ("SOFTVERBS_SEED", "3")], false);
    let repeats = got.windows(2).filter(|w| w[0] == w[1]).count();
    assert!(repeats > 1 && got.len() == 16 + repeats, "{got:?}");
    assert_no_leaks();
}

/// SOFTVERBS_REORDER_RATE: a held-back datagram arrives after the next one.
#[test]
fn reordered_datagrams_arrive_out_of_order() {
    let _g = serial();
    let got = deliveries(&[("SOFTVERBS_REORDER_RATE", "0.5"), ("SOFTVERBS_SEED", "4")], true);
    let swaps = got.windows(2).filter(|w| w[0] > w[1]).count();
    let mut sorted = got.clone();
    sorted.sort_unstable();
    assert!(swaps > 1, "no reordering: {got:?}");
    assert_eq!(sorted, (0..16).collect::<Vec<_>>(), "reordering must not lose or repeat: {got:?}");
    assert_no_leaks();
}

/// SOFTVERBS_CORRUPT_RATE: a datagram with a flipped bit fails its checksum and is dropped,
/// never delivered with the flip; the other messages arrive intact.
#[test]
fn corrupted_datagrams_are_dropped_by_the_checksum() {
    let _g = serial();
    let p = Pair::new(&[("SOFTVERBS_CORRUPT_RATE", "0.3"), ("SOFTVERBS_SEED", "5")], &[], IBV_MTU_4096);
    let mut abuf = pattern(8192, 9); // two datagrams per message
    let mut bbuf = vec![0u8; 8192 * 32];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    for (i, chunk) in bbuf.chunks_mut(8192).enumerate() {
        assert_eq!(post_recv(p.bqp, lkey(bmr), chunk, i as u64), 0);
    }
    let mut done = Vec::new();
    for i in 0..32u32 {
        assert_eq!(send_buf(p.aqp, amr, &abuf, i as u64, Some(i)), 0);
        poll_ok(p.acq);
        while let Some(r) = poll(p.bcq, Duration::from_millis(30)) {
            assert_eq!(r.status, IBV_WC_SUCCESS);
            assert_eq!(r.byte_len, 8192);
            done.push(r.wr_id as usize);
        }
    }
    assert!(done.len() < 30 && done.len() > 5, "30% of datagrams corrupted: {} of 32 messages arrived", done.len());
    for &slot in &done {
        assert_eq!(&bbuf[slot * 8192..(slot + 1) * 8192], &abuf[..], "a delivered message was corrupted");
    }
    dereg(amr);
    dereg(bmr);
    p.close();
    assert_no_leaks();
}
