//! UC queue pairs over UDP: state machine, send path, receive thread and reassembly.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use verbs_abi::*;

use crate::counters::{self, Kind};
use crate::error::Error;
use crate::objects::{sges_valid, CqInner, CtxInner};
use crate::wire::{self, Header, FLAG_IMM, HDR_LEN};

/// Kernel receive buffer asked for each QP socket (large messages arrive as bursts).
const RCVBUF_BYTES: usize = 16 << 20;
/// How long the receive thread blocks before re-checking its stop flag.
const IDLE_POLL: Duration = Duration::from_millis(20);
/// Bound on datagrams held back by `SOFTVERBS_DELAY_US`.
const MAX_DELAYED: usize = 16_384;

/// A posted receive.
pub(crate) struct RecvWqe {
    wr_id: u64,
    sges: Vec<ibv_sge>,
}

/// A message being reassembled into a receive buffer.
struct Assembly {
    msg_seq: u32,
    next_frag: u32,
    frag_cnt: u32,
    total: u32,
    imm: Option<u32>,
    wqe: RecvWqe,
}

#[derive(Default)]
struct RecvSide {
    wqes: VecDeque<RecvWqe>,
    cur: Option<Assembly>,
    /// Message sequence being discarded (no receive was posted when it started).
    discarding: Option<u32>,
}

/// Mutable QP attributes.
pub(crate) struct QpState {
    pub state: ibv_qp_state,
    pub mtu_bytes: usize,
    pub peer: Option<SocketAddrV4>,
    pub dest_qpn: u32,
    pub sq_psn: u32,
    pub rq_psn: u32,
    pub access: u32,
}

/// Shared state of a QP (the receive thread holds a reference).
pub(crate) struct QpInner {
    pub ctx: Arc<CtxInner>,
    pub qpn: u32,
    pub pd_handle: u32,
    pub sock: UdpSocket,
    pub send_cq: Arc<CqInner>,
    pub recv_cq: Arc<CqInner>,
    pub sq_sig_all: bool,
    pub cap: ibv_qp_cap,
    pub st: Mutex<QpState>,
    rq: Mutex<RecvSide>,
    pub stop: AtomicBool,
    /// A datagram held back by `SOFTVERBS_REORDER_RATE`: sent after the next one, or by the
    /// receive thread once it is [`HOLD_AT_MOST`] old.
    held: Mutex<Option<(Instant, Vec<u8>, SocketAddrV4)>>,
}

/// Longest a reordered datagram waits for another to overtake it.
const HOLD_AT_MOST: Duration = Duration::from_millis(5);

fn wc(wr_id: u64, status: ibv_wc_status, opcode: ibv_wc_opcode, qpn: u32) -> ibv_wc {
    ibv_wc { wr_id, status, opcode, qp_num: qpn, ..Default::default() }
}

/// Required and optional `attr_mask` bits of a UC transition (IB spec, QP state table).
fn transition_masks(cur: ibv_qp_state, new: ibv_qp_state) -> Option<(i32, i32)> {
    let any = IBV_QP_STATE | IBV_QP_CUR_STATE;
    Some(match (cur, new) {
        (_, IBV_QPS_RESET) | (_, IBV_QPS_ERR) => (IBV_QP_STATE, any),
        (IBV_QPS_RESET, IBV_QPS_INIT) => (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0),
        (IBV_QPS_INIT, IBV_QPS_INIT) => (0, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
        (IBV_QPS_INIT, IBV_QPS_RTR) => (
            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
            IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX,
        ),
        (IBV_QPS_RTR, IBV_QPS_RTS) => {
            (IBV_QP_STATE | IBV_QP_SQ_PSN, any | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE)
        }
        (IBV_QPS_RTS, IBV_QPS_RTS) => (0, any | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE),
        _ => return None,
    })
}

impl QpInner {
    /// Bind the QP's socket on the device address; the QP number is the UDP port.
    pub fn bind(ctx: &CtxInner) -> Result<(UdpSocket, u32), Error> {
        let sock = UdpSocket::bind(SocketAddrV4::new(ctx.dev.ipv4, 0))?;
        set_rcvbuf(&sock, RCVBUF_BYTES);
        // Hardware post_send never blocks. A blocking send_to on a full socket buffer would
        // (behind a rate-limited link), stalling the caller's other queue pairs: give sends
        // the same room as receives.
        set_buf(&sock, RCVBUF_BYTES, SNDBUF_OPTS);
        let port = match sock.local_addr()? {
            SocketAddr::V4(a) => a.port(),
            SocketAddr::V6(_) => return Err(Error::Invalid("bound an IPv6 socket")),
        };
        sock.set_read_timeout(Some(IDLE_POLL))?;
        Ok((sock, port as u32))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: Arc<CtxInner>,
        sock: UdpSocket,
        qpn: u32,
        pd_handle: u32,
        send_cq: Arc<CqInner>,
        recv_cq: Arc<CqInner>,
        sq_sig_all: bool,
        cap: ibv_qp_cap,
    ) -> QpInner {
        QpInner {
            ctx,
            qpn,
            pd_handle,
            sock,
            send_cq,
            recv_cq,
            sq_sig_all,
            cap,
            st: Mutex::new(QpState {
                state: IBV_QPS_RESET,
                mtu_bytes: 4096,
                peer: None,
                dest_qpn: 0,
                sq_psn: 0,
                rq_psn: 0,
                access: 0,
            }),
            rq: Mutex::new(RecvSide::default()),
            stop: AtomicBool::new(false),
            held: Mutex::new(None),
        }
    }

    /// Move to the error state and flush every posted receive with `IBV_WC_WR_FLUSH_ERR`.
    pub fn enter_error(&self) {
        self.st.lock().state = IBV_QPS_ERR;
        self.flush_receives(true);
    }

    fn flush_receives(&self, complete: bool) {
        let flushed: Vec<u64> = {
            let mut rq = self.rq.lock();
            let mut ids: Vec<u64> = rq.cur.take().map(|a| a.wqe.wr_id).into_iter().collect();
            ids.extend(rq.wqes.drain(..).map(|w| w.wr_id));
            rq.discarding = None;
            ids
        };
        if complete {
            for id in flushed {
                self.recv_cq.push(wc(id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, self.qpn));
            }
        }
    }

    /// `ibv_modify_qp`: validate the transition and mask, apply attributes. Returns the new state.
    pub fn modify(&self, attr: &ibv_qp_attr, mask: i32) -> Result<ibv_qp_state, Error> {
        self.ctx.tick()?;
        let mut st = self.st.lock();
        let cur = st.state;
        if mask & IBV_QP_CUR_STATE != 0 && attr.cur_qp_state != cur {
            return Err(Error::Invalid("cur_qp_state does not match the QP state"));
        }
        let new = if mask & IBV_QP_STATE != 0 { attr.qp_state } else { cur };
        let (required, optional) = transition_masks(cur, new).ok_or(Error::Invalid("invalid QP state transition"))?;
        if mask & required != required {
            return Err(Error::Invalid("attr_mask lacks a required attribute"));
        }
        if mask & !(required | optional) != 0 {
            return Err(Error::Invalid("attr_mask has an attribute not allowed here"));
        }
        if mask & IBV_QP_PORT != 0 && attr.port_num != 1 {
            return Err(Error::Invalid("port_num must be 1"));
        }
        if mask & IBV_QP_PKEY_INDEX != 0 && attr.pkey_index != 0 {
            return Err(Error::Invalid("pkey_index must be 0"));
        }
        let mut rtr = None;
        if new == IBV_QPS_RTR && cur == IBV_QPS_INIT {
            let mtu = mtu_bytes(attr.path_mtu)
                .filter(|_| attr.path_mtu <= self.ctx.cfg.limits.mtu)
                .ok_or(Error::Invalid("path_mtu invalid or above the port MTU"))?;
            let ah = &attr.ah_attr;
            if ah.is_global == 0 {
                return Err(Error::Invalid("ah_attr.is_global must be 1 (GID addressing)"));
            }
            if ah.port_num > 1 {
                return Err(Error::Invalid("ah_attr.port_num must be 1"));
            }
            let gids = self.ctx.dev.gids();
            let sgid = gids.get(ah.grh.sgid_index as usize).ok_or(Error::Invalid("sgid_index out of the GID table"))?;
            if sgid.ipv4_mapped().is_none() {
                return Err(Error::Invalid("sgid_index is not an IPv4-mapped GID"));
            }
            let dip = ah.grh.dgid.ipv4_mapped().ok_or(Error::Invalid("dgid is not an IPv4-mapped GID"))?;
            if attr.dest_qp_num == 0 || attr.dest_qp_num > 0xffff {
                return Err(Error::Invalid("dest_qp_num is not a softverbs QP number"));
            }
            rtr = Some((mtu, SocketAddrV4::new(dip, attr.dest_qp_num as u16), attr.dest_qp_num));
        }
        // All checks passed: apply.
        if mask & IBV_QP_ACCESS_FLAGS != 0 {
            st.access = attr.qp_access_flags;
        }
        if let Some((mtu, peer, dqpn)) = rtr {
            st.mtu_bytes = mtu;
            st.peer = Some(peer);
            st.dest_qpn = dqpn;
            st.rq_psn = attr.rq_psn & 0xff_ffff;
        }
        if mask & IBV_QP_SQ_PSN != 0 {
            st.sq_psn = attr.sq_psn & 0xff_ffff;
        }
        st.state = new;
        drop(st);
        match new {
            IBV_QPS_RESET => {
                let mut st = self.st.lock();
                st.peer = None;
                st.dest_qpn = 0;
                drop(st);
                self.flush_receives(false);
            }
            IBV_QPS_ERR => self.flush_receives(true),
            _ => {}
        }
        Ok(new)
    }

    /// `post_recv` of one work request.
    pub fn post_recv_one(&self, wr: &ibv_recv_wr) -> Result<(), Error> {
        self.ctx.tick()?;
        let state = self.st.lock().state;
        if state == IBV_QPS_RESET {
            return Err(Error::Invalid("post_recv on a QP in RESET"));
        }
        if wr.num_sge < 0 || wr.num_sge as u32 > self.cap.max_recv_sge {
            return Err(Error::Invalid("num_sge above max_recv_sge"));
        }
        let sges = read_sges(wr.sg_list, wr.num_sge);
        if state == IBV_QPS_ERR {
            self.recv_cq.push(wc(wr.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, self.qpn));
            return Ok(());
        }
        // SOFTVERBS_RECV_DELAY_US: the rank posts its receive late (the call itself is slow).
        let delay = self.ctx.cfg.faults.recv_delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let limit = match self.ctx.cfg.limits.max_outstanding_recv {
            Some(hard) => hard,
            None => self.cap.max_recv_wr as usize,
        };
        let mut rq = self.rq.lock();
        let outstanding = rq.wqes.len() + usize::from(rq.cur.is_some());
        if outstanding >= limit {
            return Err(Error::NoMem("too many outstanding receives"));
        }
        rq.wqes.push_back(RecvWqe { wr_id: wr.wr_id, sges });
        Ok(())
    }

    /// `post_send` of one work request: validate, fragment, hand datagrams to the kernel.
    pub fn post_send_one(&self, wr: &ibv_send_wr) -> Result<(), Error> {
        self.ctx.tick()?;
        let (state, mtu, peer, dest_qpn, psn) = {
            let mut st = self.st.lock();
            let psn = st.sq_psn;
            if st.state == IBV_QPS_RTS {
                st.sq_psn = (st.sq_psn + 1) & 0xff_ffff;
            }
            (st.state, st.mtu_bytes, st.peer, st.dest_qpn, psn)
        };
        let signaled = self.sq_sig_all || wr.send_flags & IBV_SEND_SIGNALED != 0;
        if state == IBV_QPS_ERR {
            self.send_cq.push(wc(wr.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, self.qpn));
            return Ok(());
        }
        if state != IBV_QPS_RTS {
            return Err(Error::Invalid("post_send on a QP that is not in RTS"));
        }
        let peer = peer.ok_or(Error::Invalid("no peer address"))?;
        let imm = match wr.opcode {
            IBV_WR_SEND => None,
            IBV_WR_SEND_WITH_IMM => Some(wr.imm_data),
            _ => return Err(Error::Invalid("only SEND and SEND_WITH_IMM are supported")),
        };
        if wr.num_sge < 0 || wr.num_sge as u32 > self.cap.max_send_sge {
            return Err(Error::Invalid("num_sge above max_send_sge"));
        }
        let sges = read_sges(wr.sg_list, wr.num_sge);
        let total: u64 = sges.iter().map(|s| s.length as u64).sum();
        let inline = wr.send_flags & IBV_SEND_INLINE != 0;
        if inline && total > self.cap.max_inline_data as u64 {
            return Err(Error::Invalid("inline send above max_inline_data"));
        }
        let fail = |status| {
            self.send_cq.push(wc(wr.wr_id, status, IBV_WC_SEND, self.qpn));
            self.enter_error();
            Ok(())
        };
        if !inline && !sges_valid(&self.ctx.mrs(), self.pd_handle, &sges, 0) {
            return fail(IBV_WC_LOC_PROT_ERR);
        }
        if total > self.ctx.cfg.limits.max_msg as u64 {
            return fail(IBV_WC_LOC_LEN_ERR);
        }
        let total = total as u32;
        let frag_cnt = (total as usize).div_ceil(mtu).max(1) as u32;
        let mut dgram = vec![0u8; HDR_LEN + mtu.min(total as usize)];
        let mut hdr = Header {
            dst_qpn: dest_qpn,
            src_qpn: self.qpn,
            msg_seq: psn,
            frag_idx: 0,
            frag_cnt,
            offset: 0,
            total,
            imm: imm.unwrap_or(0),
            flags: if imm.is_some() { FLAG_IMM } else { 0 },
        };
        for idx in 0..frag_cnt {
            let off = idx as usize * mtu;
            let len = mtu.min(total as usize - off);
            hdr.frag_idx = idx;
            hdr.offset = off as u32;
            hdr.encode(&mut dgram);
            {
                // Re-check under the MR lock so a concurrent dereg cannot free the buffer
                // while it is read.
                let mrs = self.ctx.mrs();
                if !inline && !sges_valid(&mrs, self.pd_handle, &sges, 0) {
                    drop(mrs);
                    return fail(IBV_WC_LOC_PROT_ERR);
                }
                gather(&sges, off, &mut dgram[HDR_LEN..HDR_LEN + len]);
            }
            wire::seal(&mut dgram[..HDR_LEN + len]);
            self.emit(&mut dgram[..HDR_LEN + len], peer, psn, idx);
        }
        if signaled {
            let mut c = wc(wr.wr_id, IBV_WC_SUCCESS, IBV_WC_SEND, self.qpn);
            c.byte_len = total;
            self.send_cq.push(c);
        }
        Ok(())
    }

    /// Hand one sealed datagram to the network, through the injected faults: dropped
    /// (`SOFTVERBS_DROP_RATE`), one bit flipped after sealing (`SOFTVERBS_CORRUPT_RATE`: the
    /// receiver's checksum drops it), held back behind the next datagram
    /// (`SOFTVERBS_REORDER_RATE`), sent twice (`SOFTVERBS_DUP_RATE`).
    fn emit(&self, dgram: &mut [u8], peer: SocketAddrV4, psn: u32, idx: u32) {
        let f = &self.ctx.cfg.faults;
        if self.ctx.roll_drop() {
            tracing::debug!(qpn = self.qpn, psn, idx, "softverbs: dropped datagram (fault)");
            return;
        }
        if self.ctx.roll(f.corrupt_rate) {
            let bit = self.ctx.random() as usize % (dgram.len() * 8);
            dgram[bit / 8] ^= 1 << (bit % 8);
            tracing::debug!(qpn = self.qpn, psn, idx, bit, "softverbs: flipped a bit (fault)");
        }
        if self.ctx.roll(f.reorder_rate) {
            let mut held = self.held.lock();
            if held.is_none() {
                tracing::debug!(qpn = self.qpn, psn, idx, "softverbs: held back a datagram (fault)");
                *held = Some((Instant::now(), dgram.to_vec(), peer));
                return;
            }
        }
        let copies = if self.ctx.roll(f.dup_rate) { 2 } else { 1 };
        for _ in 0..copies {
            self.send_datagram(dgram, peer);
        }
        // Overtaken: the held datagram goes now.
        if let Some((_, d, to)) = self.held.lock().take() {
            self.send_datagram(&d, to);
        }
    }

    fn send_datagram(&self, d: &[u8], peer: SocketAddrV4) {
        if let Err(e) = self.sock.send_to(d, peer) {
            // UC: a datagram the kernel refuses is simply lost.
            tracing::debug!(qpn = self.qpn, error = %e, "softverbs: send_to failed");
        }
    }

    /// A held datagram that nothing overtook within [`HOLD_AT_MOST`] goes anyway (late).
    fn release_held(&self) {
        let mut held = self.held.lock();
        if held.as_ref().is_some_and(|(at, ..)| at.elapsed() >= HOLD_AT_MOST) {
            let (_, d, to) = held.take().expect("checked");
            drop(held);
            self.send_datagram(&d, to);
        }
    }

    /// Handle one datagram from `src`.
    fn on_datagram(&self, buf: &[u8], src: SocketAddr) {
        let Some((h, payload)) = Header::decode(buf) else {
            return;
        };
        {
            let st = self.st.lock();
            if !(st.state == IBV_QPS_RTR || st.state == IBV_QPS_RTS)
                || h.dst_qpn != self.qpn
                || st.peer.map(SocketAddr::V4) != Some(src)
                || h.src_qpn != st.dest_qpn
            {
                return;
            }
        }
        if self.ctx.is_failed() {
            return;
        }
        let mut error: Option<(u64, ibv_wc_status)> = None;
        let mut done: Option<ibv_wc> = None;
        {
            let mut rq = self.rq.lock();
            if h.frag_idx == 0 {
                if let Some(old) = rq.cur.take() {
                    // The previous message lost a fragment: drop it, keep its receive.
                    tracing::debug!(qpn = self.qpn, seq = old.msg_seq, "softverbs: incomplete message dropped");
                    rq.wqes.push_front(old.wqe);
                }
                rq.discarding = None;
                if rq.wqes.is_empty() {
                    tracing::debug!(qpn = self.qpn, seq = h.msg_seq, "softverbs: no receive posted, message dropped");
                    rq.discarding = Some(h.msg_seq);
                    return;
                }
                let wqe = rq.wqes.pop_front().expect("checked non-empty");
                let ok = sges_valid(&self.ctx.mrs(), self.pd_handle, &wqe.sges, IBV_ACCESS_LOCAL_WRITE);
                let cap: u64 = wqe.sges.iter().map(|s| s.length as u64).sum();
                if !ok {
                    error = Some((wqe.wr_id, IBV_WC_LOC_PROT_ERR));
                } else if h.total as u64 > cap {
                    error = Some((wqe.wr_id, IBV_WC_LOC_LEN_ERR));
                } else {
                    rq.cur = Some(Assembly {
                        msg_seq: h.msg_seq,
                        next_frag: 0,
                        frag_cnt: h.frag_cnt,
                        total: h.total,
                        imm: (h.flags & FLAG_IMM != 0).then_some(h.imm),
                        wqe,
                    });
                }
            } else if rq.discarding == Some(h.msg_seq) {
                return;
            }
            if error.is_none() {
                let cur_matches = rq.cur.as_ref().is_some_and(|a| {
                    a.msg_seq == h.msg_seq
                        && a.next_frag == h.frag_idx
                        && a.frag_cnt == h.frag_cnt
                        && a.total == h.total
                });
                if !cur_matches {
                    if let Some(old) = rq.cur.take() {
                        tracing::debug!(
                            qpn = self.qpn,
                            seq = old.msg_seq,
                            "softverbs: missing fragment, message dropped"
                        );
                        rq.wqes.push_front(old.wqe);
                    }
                    return;
                }
                let a = rq.cur.as_mut().expect("checked");
                {
                    // Write under the MR lock: a concurrent dereg waits, and an MR
                    // deregistered mid-message is a protection error, not a use-after-free.
                    let mrs = self.ctx.mrs();
                    if !sges_valid(&mrs, self.pd_handle, &a.wqe.sges, IBV_ACCESS_LOCAL_WRITE) {
                        drop(mrs);
                        let a = rq.cur.take().expect("checked");
                        drop(rq);
                        self.recv_cq.push(wc(a.wqe.wr_id, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, self.qpn));
                        self.enter_error();
                        return;
                    }
                    scatter(&a.wqe.sges, h.offset as usize, payload);
                }
                a.next_frag += 1;
                if a.next_frag == a.frag_cnt {
                    let a = rq.cur.take().expect("checked");
                    let mut c = wc(a.wqe.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, self.qpn);
                    c.byte_len = a.total;
                    if let Some(imm) = a.imm {
                        c.imm_data = imm;
                        c.wc_flags = IBV_WC_WITH_IMM;
                    }
                    c.src_qp = h.src_qpn;
                    done = Some(c);
                }
            }
        }
        if let Some(c) = done {
            self.recv_cq.push(c);
        }
        if let Some((id, status)) = error {
            self.recv_cq.push(wc(id, status, IBV_WC_RECV, self.qpn));
            self.enter_error();
        }
    }
}

/// The receive thread of one QP: runs until `stop` is set.
/// The caller counted the thread (`Kind::RxThreads`) before spawning it; it is uncounted here.
pub(crate) fn rx_loop(qp: Arc<QpInner>) {
    let delay = qp.ctx.cfg.faults.delay;
    let mut buf = vec![0u8; 65_536];
    let mut held: VecDeque<(Instant, Vec<u8>, SocketAddr)> = VecDeque::new();
    let mut timeout = IDLE_POLL;
    while !qp.stop.load(Ordering::SeqCst) {
        let want = match held.front() {
            Some((due, ..)) => {
                due.saturating_duration_since(Instant::now()).clamp(Duration::from_micros(100), IDLE_POLL)
            }
            None => IDLE_POLL,
        };
        if want != timeout {
            let _ = qp.sock.set_read_timeout(Some(want));
            timeout = want;
        }
        match qp.sock.recv_from(&mut buf) {
            Ok((n, src)) => {
                if delay.is_zero() {
                    qp.on_datagram(&buf[..n], src);
                } else if held.len() < MAX_DELAYED {
                    held.push_back((Instant::now() + delay, buf[..n].to_vec(), src));
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(qpn = qp.qpn, error = %e, "softverbs: recv_from failed");
                std::thread::sleep(IDLE_POLL);
            }
        }
        let now = Instant::now();
        while held.front().is_some_and(|(due, ..)| *due <= now) {
            let (_, data, src) = held.pop_front().expect("checked");
            qp.on_datagram(&data, src);
        }
        qp.release_held();
    }
    counters::dec(Kind::RxThreads);
}

fn set_rcvbuf(sock: &UdpSocket, bytes: usize) {
    set_buf(sock, bytes, RCVBUF_OPTS)
}

/// (forced option, plain option) for the receive and send buffer sizes.
#[cfg(target_os = "linux")]
const RCVBUF_OPTS: (libc::c_int, libc::c_int) = (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF);
#[cfg(target_os = "linux")]
const SNDBUF_OPTS: (libc::c_int, libc::c_int) = (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF);
#[cfg(not(target_os = "linux"))]
const RCVBUF_OPTS: (libc::c_int, libc::c_int) = (libc::SO_RCVBUF, libc::SO_RCVBUF);
#[cfg(not(target_os = "linux"))]
const SNDBUF_OPTS: (libc::c_int, libc::c_int) = (libc::SO_SNDBUF, libc::SO_SNDBUF);

/// Ask for `bytes` of socket buffer: the forced option (needs CAP_NET_ADMIN) or the plain one
/// (capped by the system maximum).
fn set_buf(sock: &UdpSocket, bytes: usize, (forced, plain): (libc::c_int, libc::c_int)) {
    use std::os::fd::AsRawFd;
    let v = bytes as libc::c_int;
    let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    let p = &v as *const libc::c_int as *const libc::c_void;
    // SAFETY: valid fd, pointer to a c_int of the given length.
    let r = unsafe { libc::setsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, forced, p, len) };
    if r == 0 {
        return;
    }
    // SAFETY: valid fd, pointer to a c_int of the given length.
    unsafe { libc::setsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, plain, p, len) };
}

/// Copy the user's SGE array.
fn read_sges(list: *const ibv_sge, n: i32) -> Vec<ibv_sge> {
    if n <= 0 || list.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller of post_send/post_recv guarantees `sg_list` holds `num_sge` entries.
    unsafe { std::slice::from_raw_parts(list, n as usize) }.to_vec()
}

/// The pieces of bytes `[off, off + len)` of the message described by `sges`, in order:
/// `(address, offset within those bytes, length)`.
fn spans(sges: &[ibv_sge], mut off: usize, len: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let mut done = 0;
    sges.iter().filter_map(move |s| {
        let sge_len = s.length as usize;
        if off >= sge_len || done == len {
            off = off.saturating_sub(sge_len);
            return None;
        }
        let n = (sge_len - off).min(len - done);
        let span = (s.addr as usize + off, done, n);
        done += n;
        off = 0;
        Some(span)
    })
}

/// Copy bytes `[off, off + out.len())` of the message described by `sges` into `out`.
fn gather(sges: &[ibv_sge], off: usize, out: &mut [u8]) {
    for (addr, at, n) in spans(sges, off, out.len()) {
        // SAFETY: the range was checked against a registered MR (or is the caller's inline
        // buffer) and lies inside this SGE; the user keeps it valid until the send completes.
        let src = unsafe { std::slice::from_raw_parts(addr as *const u8, n) };
        out[at..at + n].copy_from_slice(src);
    }
}

/// Write `data` at byte offset `off` of the receive buffer described by `sges`.
fn scatter(sges: &[ibv_sge], off: usize, data: &[u8]) {
    for (addr, at, n) in spans(sges, off, data.len()) {
        // SAFETY: the SGE was checked against a registered MR with local write access and the
        // message length against the buffer capacity; the buffer belongs to the posted receive.
        unsafe { std::ptr::copy_nonoverlapping(data[at..].as_ptr(), addr as *mut u8, n) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_walk_several_sges_from_an_offset() {
        let sge = |addr: u64, length: u32| ibv_sge { addr, length, lkey: 0 };
        let sges = [sge(1000, 4), sge(2000, 3), sge(3000, 5)];
        // Bytes 2..9 of the 12-byte message: the end of the first SGE, all of the second,
        // the start of the third.
        let got: Vec<_> = spans(&sges, 2, 7).collect();
        assert_eq!(got, vec![(1002, 0, 2), (2000, 2, 3), (3000, 5, 2)]);
        assert_eq!(spans(&sges, 7, 5).collect::<Vec<_>>(), vec![(3000, 0, 5)]);
        assert_eq!(spans(&sges, 0, 0).count(), 0);
        // gather and scatter round-trip through real memory.
        let (mut a, mut b) = ([0u8; 4], [0u8; 3]);
        let mem = [sge(a.as_mut_ptr() as u64, 4), sge(b.as_mut_ptr() as u64, 3)];
        scatter(&mem, 1, &[9, 8, 7, 6, 5]);
        assert_eq!((a, b), ([0, 9, 8, 7], [6, 5, 0]));
        let mut out = [0u8; 6];
        gather(&mem, 1, &mut out);
        assert_eq!(out, [9, 8, 7, 6, 5, 0]);
    }
}
