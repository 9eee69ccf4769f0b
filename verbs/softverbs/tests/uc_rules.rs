//! UC rules, Apple limits and the state machine, checked through the C ABI.

mod common;

use std::ffi::CStr;
use std::ptr::null_mut;
use std::time::Duration;

use common::*;
use softverbs::*;
use verbs_abi::*;

const QUIET: Duration = Duration::from_millis(300);

#[test]
fn devices_gids_port_and_device_attrs() {
    let _g = serial();
    let c = Ctx::open();
    let g0 = c.gid(0);
    let g1 = c.gid(1);
    assert_eq!(&g0.bytes()[..2], &[0xfe, 0x80], "index 0 is link-local");
    assert_eq!(g0.ipv4_mapped(), None);
    assert_eq!(g1.ipv4_mapped(), Some(std::net::Ipv4Addr::LOCALHOST));
    let mut g = ibv_gid::default();
    // SAFETY: live context, valid pointers.
    unsafe {
        assert_eq!(ibv_query_gid(c.ctx, 1, 2, &mut g), -1);
        assert_eq!(errno(), libc::EINVAL);
        let mut p = ibv_port_attr::default();
        assert_eq!(ibv_query_port(c.ctx, 1, (&mut p as *mut ibv_port_attr).cast()), 0);
        assert_eq!(p.state, IBV_PORT_ACTIVE);
        assert_eq!(p.active_mtu, IBV_MTU_4096);
        assert_eq!(p.gid_tbl_len, 2);
        assert_eq!(p.max_msg_sz, 16_773_120);
        let mut d: ibv_device_attr = std::mem::zeroed();
        assert_eq!(ibv_query_device(c.ctx, &mut d), 0);
        assert_eq!(d.max_qp, 10);
        assert_eq!(d.max_mr, 100);
        assert_eq!(d.phys_port_cnt, 1);
        assert_eq!(CStr::from_ptr(ibv_get_device_name((*c.ctx).device)).to_str().unwrap(), "rdma_lo");
    }
    c.close();
    let c = Ctx::open_with(&[("SOFTVERBS_PROFILE", "rdma-core")]);
    // SAFETY: live context, valid pointer.
    unsafe {
        let mut d: ibv_device_attr = std::mem::zeroed();
        assert_eq!(ibv_query_device(c.ctx, &mut d), 0);
        assert_eq!(d.max_qp, 256);
    }
    c.close();
    assert_no_leaks();
}

#[test]
fn send_recv_fields_and_immediate() {
    let _g = serial();
    let p = Pair::default_pair();
    let mut abuf = pattern(1000, 7);
    let mut bbuf = vec![0u8; 4096];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);

    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf, 11), 0);
    assert_eq!(send_buf(p.aqp, amr, &abuf, 21, Some(0xdead_beef)), 0);
    let s = poll_ok(p.acq);
    assert_eq!((s.status, s.opcode, s.wr_id), (IBV_WC_SUCCESS, IBV_WC_SEND, 21));
    let r = poll_ok(p.bcq);
    assert_eq!(r.status, IBV_WC_SUCCESS);
    assert_eq!(r.opcode, IBV_WC_RECV);
    assert_eq!(r.wr_id, 11);
    assert_eq!(r.byte_len, 1000);
    assert_eq!(r.qp_num, qpn(p.bqp));
    assert_ne!(r.wc_flags & IBV_WC_WITH_IMM, 0);
    assert_eq!(u32::from_be(r.imm_data), 0xdead_beef);
    assert_eq!(&bbuf[..1000], &abuf[..]);

    // Without immediate: no WITH_IMM flag.
    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf, 12), 0);
    assert_eq!(send_buf(p.aqp, amr, &abuf[..10], 22, None), 0);
    poll_ok(p.acq);
    let r = poll_ok(p.bcq);
    assert_eq!((r.wr_id, r.byte_len, r.wc_flags & IBV_WC_WITH_IMM), (12, 10, 0));

    dereg(amr);
    dereg(bmr);
    p.close();
    assert_no_leaks();
}

#[test]
fn message_without_posted_receive_is_dropped() {
    let _g = serial();
    let p = Pair::default_pair();
    let mut abuf = pattern(64, 1);
    let mut bbuf = vec![0u8; 64];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    // No receive posted: the send completes locally, the message is lost.
    assert_eq!(send_buf(p.aqp, amr, &abuf[..8], 1, Some(1)), 0);
    assert_eq!(poll_ok(p.acq).status, IBV_WC_SUCCESS);
    assert!(poll(p.bcq, QUIET).is_none());
    // A receive posted afterwards gets only the next message.
    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf, 5), 0);
    assert!(poll(p.bcq, QUIET).is_none(), "the dropped message must not be delivered late");
    assert_eq!(send_buf(p.aqp, amr, &abuf[..16], 2, Some(2)), 0);
    poll_ok(p.acq);
    let r = poll_ok(p.bcq);
    assert_eq!((r.wr_id, r.byte_len, u32::from_be(r.imm_data)), (5, 16, 2));
    assert!(poll(p.bcq, QUIET).is_none());
    dereg(amr);
    dereg(bmr);
    p.close();
    assert_no_leaks();
}

#[test]
fn receive_too_small_is_loc_len_err_and_qp_errors() {
    let _g = serial();
    let p = Pair::default_pair();
    let mut abuf = pattern(200, 2);
    let mut bbuf = vec![0u8; 300];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf[..100], 1), 0);
    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf[100..], 2), 0);
    assert_eq!(send_buf(p.aqp, amr, &abuf, 9, None), 0);
    let r = poll_ok(p.bcq);
    assert_eq!((r.wr_id, r.status), (1, IBV_WC_LOC_LEN_ERR));
    // The error moves the QP to ERR: the other receive is flushed.
    let r = poll_ok(p.bcq);
    assert_eq!((r.wr_id, r.status), (2, IBV_WC_WR_FLUSH_ERR));
    dereg(amr);
    dereg(bmr);
    p.close();
    assert_no_leaks();
}

#[test]
fn bad_lkey_or_range_is_loc_prot_err() {
    let _g = serial();
    // Receive side: wrong lkey.
    let p = Pair::default_pair();
    let mut abuf = pattern(64, 3);
    let mut bbuf = vec![0u8; 64];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    assert_eq!(post_recv(p.bqp, lkey(bmr) ^ 0x100, &mut bbuf, 1), 0);
    assert_eq!(send_buf(p.aqp, amr, &abuf, 2, None), 0);
    let r = poll_ok(p.bcq);
    assert_eq!((r.wr_id, r.status), (1, IBV_WC_LOC_PROT_ERR));
    // Send side: address range beyond the MR.
    let s = poll_ok(p.acq);
    assert_eq!(s.status, IBV_WC_SUCCESS);
    let rc = post_send(p.aqp, lkey(amr), abuf.as_ptr() as u64 + 32, 64, 3, None);
    assert_eq!(rc, 0, "protection errors are reported by completion, not by post_send");
    let s = poll_ok(p.acq);
    assert_eq!((s.wr_id, s.status), (3, IBV_WC_LOC_PROT_ERR));
    dereg(amr);
    dereg(bmr);
    p.close();

    // Receive buffer registered without LOCAL_WRITE.
    let p = Pair::default_pair();
    let mut abuf = pattern(64, 3);
    let mut bbuf = vec![0u8; 64];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, 0);
    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf, 1), 0);
    assert_eq!(send_buf(p.aqp, amr, &abuf, 2, None), 0);
    assert_eq!(poll_ok(p.bcq).status, IBV_WC_LOC_PROT_ERR);
    dereg(amr);
    dereg(bmr);
    p.close();
    assert_no_leaks();
}

#[test]
fn receive_into_deregistered_mr_is_loc_prot_err() {
    let _g = serial();
    let p = Pair::default_pair();
    let mut abuf = pattern(64, 3);
    let mut bbuf = vec![0u8; 64];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf, 1), 0);
    dereg(bmr);
    assert_eq!(send_buf(p.aqp, amr, &abuf, 2, None), 0);
    assert_eq!(poll_ok(p.bcq).status, IBV_WC_LOC_PROT_ERR);
    assert!(bbuf.iter().all(|&b| b == 0), "nothing written after dereg");
    dereg(amr);
    p.close();
    assert_no_leaks();
}

#[test]
fn multi_megabyte_message_is_fragmented_and_reassembled() {
    let _g = serial();
    if !socket_buffers_hold("multi_megabyte_message_is_fragmented_and_reassembled", 4 << 20) {
        return;
    }
    let p = Pair::default_pair();
    let len = 4 << 20; // 4 MiB = 1024 fragments at path MTU 4096
    let mut abuf = pattern(len, 9);
    let mut bbuf = vec![0u8; len];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    for round in 0..2u64 {
        bbuf.iter_mut().for_each(|b| *b = 0);
        assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf, round), 0);
        assert_eq!(send_buf(p.aqp, amr, &abuf, 100 + round, Some(round as u32)), 0);
        assert_eq!(poll_ok(p.acq).status, IBV_WC_SUCCESS);
        let r = poll_ok(p.bcq);
        assert_eq!((r.status, r.byte_len, r.wr_id), (IBV_WC_SUCCESS, len as u32, round));
        assert!(bbuf == abuf, "payload differs after reassembly");
    }
    dereg(amr);
    dereg(bmr);
    p.close();
    assert_no_leaks();
}

#[test]
fn max_message_size_is_enforced() {
    let _g = serial();
    if !socket_buffers_hold("max_message_size_is_enforced", 16_773_120) {
        return;
    }
    let p = Pair::default_pair();
    let max = 16_773_120usize; // Apple's max message
    let mut abuf = pattern(max + 1, 5);
    let mut bbuf = vec![0u8; max];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    // Exactly the max: 4095 fragments at path MTU 4096.
    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf, 1), 0);
    assert_eq!(send_buf(p.aqp, amr, &abuf[..max], 2, None), 0);
    assert_eq!(poll_ok(p.acq).status, IBV_WC_SUCCESS);
    let r = poll_ok(p.bcq);
    assert_eq!((r.status, r.byte_len), (IBV_WC_SUCCESS, max as u32));
    assert!(bbuf[..] == abuf[..max]);
    // One byte more: local length error on the send.
    assert_eq!(send_buf(p.aqp, amr, &abuf, 3, None), 0);
    let s = poll_ok(p.acq);
    assert_eq!((s.wr_id, s.status), (3, IBV_WC_LOC_LEN_ERR));
    dereg(amr);
    dereg(bmr);
    p.close();
    assert_no_leaks();
}

#[test]
fn message_missing_a_fragment_is_dropped_and_receive_kept() {
    let _g = serial();
    // Only the sender drops datagrams.
    let p = Pair::new(&[("SOFTVERBS_DROP_RATE", "0.5"), ("SOFTVERBS_SEED", "42")], &[], IBV_MTU_1024);
    let mut abuf = pattern(16 * 1024, 4);
    let mut bbuf = vec![0u8; 16 * 1024];
    let amr = p.a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = p.b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    assert_eq!(post_recv(p.bqp, lkey(bmr), &mut bbuf, 77), 0);
    // 16 fragments each dropped with p = 0.5: these messages essentially never arrive whole.
    for i in 0..4 {
        assert_eq!(send_buf(p.aqp, amr, &abuf, i, None), 0);
        poll_ok(p.acq);
    }
    // Single-fragment messages get through after a few tries; the receive was not consumed
    // by the broken ones, so the first complete message lands in wr_id 77.
    let mut got = None;
    for i in 0..64 {
        assert_eq!(send_buf(p.aqp, amr, &abuf[..100], 1000 + i, Some(i as u32)), 0);
        poll_ok(p.acq);
        if let Some(r) = poll(p.bcq, Duration::from_millis(50)) {
            got = Some(r);
            break;
        }
    }
    let r = got.expect("no single-fragment message got through at 50% loss in 64 tries");
    assert_eq!((r.wr_id, r.status, r.byte_len), (77, IBV_WC_SUCCESS, 100));
    assert_eq!(&bbuf[..100], &abuf[..100]);
    dereg(amr);
    dereg(bmr);
    p.close();
    assert_no_leaks();
}

#[test]
fn eleventh_qp_fails_with_ebusy() {
    let _g = serial();
    let c = Ctx::open();
    let cq = c.cq(16);
    let mut qps: Vec<_> = (0..10).map(|_| c.try_qp(cq, IBV_QPT_UC, 8).expect("first 10 QPs")).collect();
    assert_eq!(c.try_qp(cq, IBV_QPT_UC, 8), Err(libc::EBUSY));
    // The limit is per device, not per context.
    let c2 = Ctx::open();
    let cq2 = c2.cq(16);
    assert_eq!(c2.try_qp(cq2, IBV_QPT_UC, 8), Err(libc::EBUSY));
    // SAFETY: live QP destroyed once.
    assert_eq!(unsafe { ibv_destroy_qp(qps.pop().unwrap()) }, 0);
    let again = c.try_qp(cq, IBV_QPT_UC, 8).expect("a slot is free again");
    qps.push(again);
    // SAFETY: live CQ with QPs attached.
    assert_eq!(unsafe { ibv_destroy_cq(cq) }, libc::EBUSY);
    for q in qps {
        // SAFETY: live QPs destroyed once.
        assert_eq!(unsafe { ibv_destroy_qp(q) }, 0);
    }
    // SAFETY: live CQs destroyed once.
    unsafe {
        assert_eq!(ibv_destroy_cq(cq), 0);
        assert_eq!(ibv_destroy_cq(cq2), 0);
    }
    c.close();
    c2.close();
    assert_no_leaks();
}

#[test]
fn thirty_third_outstanding_receive_fails_with_enomem() {
    let _g = serial();
    let c = Ctx::open();
    let cq = c.cq(64);
    let qp = c.try_qp(cq, IBV_QPT_UC, 64).unwrap();
    let mut buf = vec![0u8; 64];
    let mr = c.reg(&mut buf, IBV_ACCESS_LOCAL_WRITE);
    // RESET: posting a receive is invalid.
    assert_eq!(post_recv(qp, lkey(mr), &mut buf, 0), libc::EINVAL);
    assert_eq!(to_init(qp), 0);
    for i in 0..32 {
        assert_eq!(post_recv(qp, lkey(mr), &mut buf, i), 0, "receive {i}");
    }
    assert_eq!(post_recv(qp, lkey(mr), &mut buf, 32), libc::ENOMEM);
    dereg(mr);
    // SAFETY: live objects destroyed once.
    unsafe {
        assert_eq!(ibv_destroy_qp(qp), 0);
        assert_eq!(ibv_destroy_cq(cq), 0);
    }
    c.close();
    assert_no_leaks();
}

#[test]
fn hundred_and_first_mr_fails() {
    let _g = serial();
    let c = Ctx::open();
    let mut bufs: Vec<Vec<u8>> = (0..101).map(|_| vec![0u8; 16]).collect();
    let mut mrs = Vec::new();
    for b in bufs.iter_mut().take(100) {
        mrs.push(c.reg(b, IBV_ACCESS_LOCAL_WRITE));
    }
    // SAFETY: live PD; buffer outlives the attempt.
    let mr = unsafe { ibv_reg_mr(c.pd, bufs[100].as_mut_ptr().cast(), 16, 1) };
    assert!(mr.is_null());
    assert_eq!(errno(), libc::ENOMEM);
    // SAFETY: PD still has MRs.
    assert_eq!(unsafe { ibv_dealloc_pd(c.pd) }, libc::EBUSY);
    mrs.into_iter().for_each(dereg);
    c.close();
    assert_no_leaks();
}

#[test]
fn rc_and_ud_qps_are_rejected() {
    let _g = serial();
    let c = Ctx::open();
    let cq = c.cq(16);
    assert_eq!(c.try_qp(cq, IBV_QPT_RC, 8), Err(libc::EOPNOTSUPP));
    assert_eq!(c.try_qp(cq, IBV_QPT_UD, 8), Err(libc::EOPNOTSUPP));
    // SAFETY: live CQ destroyed once.
    assert_eq!(unsafe { ibv_destroy_cq(cq) }, 0);
    c.close();
    assert_no_leaks();
}

#[test]
fn state_machine_and_rtr_gid_index() {
    let _g = serial();
    let c = Ctx::open();
    let cq = c.cq(16);
    let qp = c.try_qp(cq, IBV_QPT_UC, 8).unwrap();
    let peer = c.try_qp(cq, IBV_QPT_UC, 8).unwrap();
    let gid = c.gid(1);
    // RESET -> RTR skips INIT.
    let mut a = rtr_attr(qpn(peer), gid, 1, IBV_MTU_1024);
    assert_eq!(modify(qp, &mut a, RTR_MASK), libc::EINVAL);
    // INIT without PORT.
    let mut i = ibv_qp_attr { qp_state: IBV_QPS_INIT, port_num: 1, ..Default::default() };
    assert_eq!(modify(qp, &mut i, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS), libc::EINVAL);
    // INIT with a UD-only attribute (QKEY).
    assert_eq!(
        modify(qp, &mut i, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS | IBV_QP_QKEY),
        libc::EINVAL
    );
    // INIT on port 2.
    i.port_num = 2;
    assert_eq!(modify(qp, &mut i, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), libc::EINVAL);
    assert_eq!(to_init(qp), 0);
    // SAFETY: live QP.
    assert_eq!(unsafe { (*qp).state }, IBV_QPS_INIT);
    // INIT -> RTS skips RTR.
    assert_eq!(to_rts(qp), libc::EINVAL);
    // RTR with the link-local GID index (JACCL's hard-coded-index bug): errno 22.
    let mut a = rtr_attr(qpn(peer), gid, 0, IBV_MTU_1024);
    assert_eq!(modify(qp, &mut a, RTR_MASK), 22);
    // RTR with an index outside the table.
    let mut a = rtr_attr(qpn(peer), gid, 5, IBV_MTU_1024);
    assert_eq!(modify(qp, &mut a, RTR_MASK), libc::EINVAL);
    // RTR without DEST_QPN.
    let mut a = rtr_attr(qpn(peer), gid, 1, IBV_MTU_1024);
    assert_eq!(modify(qp, &mut a, RTR_MASK & !IBV_QP_DEST_QPN), libc::EINVAL);
    // RTR to a non-IPv4-mapped destination GID.
    let mut a = rtr_attr(qpn(peer), c.gid(0), 1, IBV_MTU_1024);
    assert_eq!(modify(qp, &mut a, RTR_MASK), libc::EINVAL);
    // A good RTR; posting a send before RTS fails.
    let mut a = rtr_attr(qpn(peer), gid, 1, IBV_MTU_1024);
    assert_eq!(modify(qp, &mut a, RTR_MASK), 0);
    assert_eq!(post_send(qp, 0, 0, 0, 1, None), libc::EINVAL);
    // RTS without SQ_PSN.
    let mut r = ibv_qp_attr { qp_state: IBV_QPS_RTS, ..Default::default() };
    assert_eq!(modify(qp, &mut r, IBV_QP_STATE), libc::EINVAL);
    assert_eq!(to_rts(qp), 0);
    // SAFETY: live QP.
    assert_eq!(unsafe { (*qp).state }, IBV_QPS_RTS);
    // RDMA write is not supported (send/recv only).
    let mut wr = ibv_send_wr { opcode: IBV_WR_RDMA_WRITE, ..Default::default() };
    let mut bad = null_mut();
    // SAFETY: live QP; call through the ops table.
    let rc = unsafe { ((*(*qp).context).ops.post_send.unwrap())(qp, &mut wr, &mut bad) };
    assert_eq!(rc, libc::EINVAL);
    // Back to RESET and up again.
    let mut z = ibv_qp_attr::default();
    assert_eq!(modify(qp, &mut z, IBV_QP_STATE), 0);
    assert_eq!(to_init(qp), 0);
    // SAFETY: live objects destroyed once.
    unsafe {
        assert_eq!(ibv_destroy_qp(qp), 0);
        assert_eq!(ibv_destroy_qp(peer), 0);
        assert_eq!(ibv_destroy_cq(cq), 0);
    }
    c.close();
    assert_no_leaks();
}

#[test]
fn counters_track_objects_and_threads() {
    let _g = serial();
    assert_no_leaks();
    let p = Pair::default_pair();
    let c = live_objects();
    assert_eq!((c.contexts, c.pds, c.cqs, c.qps, c.rx_threads, c.device_lists), (2, 2, 2, 2, 2, 0));
    let mut out = softverbs_counters::default();
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { softverbs_live_objects(&mut out) }, 0);
    assert_eq!(out, c);
    p.close();
    assert_no_leaks();
}
