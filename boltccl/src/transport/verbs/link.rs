//! One UC queue pair to one peer: staging slots, credits and sequence numbers.
//!
//! UC drops a message that finds no receive posted and never retransmits, so:
//! - **Credits.** The receiver keeps `depth` receives posted in its staging slots. A sender may
//!   have at most `depth` packets unconsumed at the peer: it counts packets sent, and the peer
//!   reports (cumulatively) how many slots it has freed and re-posted, in the 8-byte link header
//!   of every packet. Data never uses the last credit, which is kept for a credit-only packet,
//!   sent when half the slots are freed and unreported — so two ranks that both wait for
//!   credits can always tell each other.
//! - **Sequence numbers.** Every packet carries its number in the immediate data; a gap or a
//!   repeat fails the operation. A message is cut into packets of a size both ends derive from
//!   the agreed chunk size, so a packet of any other length is an error too. Loss becomes an
//!   error (or a timeout, when the last packet is lost), never wrong data.
//! - **Resync** (a shrink keeps the link). Each end sends a marker packet naming the shrink
//!   attempt and drops everything that arrives before the peer's marker, returning the slots
//!   as credits as usual; the queue pair keeps its state and sequence numbers, so nothing is
//!   re-created. A link whose queue pair was moved to the error state (to flush zero-copy sends
//!   after a failure) cannot be kept.
//! - **Zero-copy** (`BOLTCCL_IBV_ZERO_COPY=1`). Apple's provider takes one scatter-gather entry
//!   per send, so a header cannot be glued to caller memory: a large piece goes as a staged
//!   header-only packet followed by raw packets posted straight from the caller's registered
//!   buffer (flagged in the immediate data; they carry no link header). Receives still land in
//!   staging slots. An exchange ends only when every raw send has completed, so the caller's
//!   buffer is never read after the call returns.

use super::errors::completion_error;
use super::ffi::{CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair, UserRegion};
use super::regcache::{extent_of, RegCache};
use crate::error::{Error, Result};
use crate::transport::{OnRecv, RecvOp, SendOp};
use crate::wire::{self, Header, Kind, HEADER_LEN};
use std::collections::VecDeque;
use verbs_abi::*;

/// Bytes of link header at the start of every packet: freed count (u32), kind (u8), padding.
pub const LINK_HDR: usize = 8;
const KIND_DATA: u8 = 1;
const KIND_CREDIT: u8 = 2;
/// A frame header alone; the message's data follows in raw packets.
const KIND_HEADER: u8 = 3;
/// A shrink's marker: the attempt (u32) follows; everything before it is of the failed group.
const KIND_RESYNC: u8 = 4;
const SEND_BIT: u64 = 1 << 32;
/// Work-request id bit of a raw (zero-copy) send.
const RAW_WR: u64 = 1 << 33;
/// Immediate-data bit of a raw packet; the other 31 bits are the sequence number.
const RAW_IMM: u32 = 1 << 31;
const SEQ_MASK: u32 = RAW_IMM - 1;
/// Pieces at least this long (or a whole chunk, if smaller) go zero-copy when it is on;
/// copying shorter ones costs less than the extra header packet.
const ZERO_COPY_MIN: usize = 64 << 10;

/// What an arrived packet holds, and where in its slot the payload starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Packet {
    /// Link header, then frame header and/or data.
    Staged,
    /// Link header, then a frame header whose data follows in raw packets.
    HeaderOnly,
    /// Data only, from the sender's own memory.
    Raw,
    /// A resync marker for this attempt (only ever read by [`Link::resync_step`]).
    Resync(u32),
}

/// Sizes both ends of a link must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Bytes per staging slot, link header included (at most the max message size).
    pub slot: usize,
    /// Receives this side keeps posted.
    pub recv_depth: usize,
    /// Sends this side keeps in flight at most.
    pub send_depth: usize,
}

impl Shape {
    fn payload(&self) -> usize {
        self.slot - LINK_HDR
    }
}

/// One peer's link. Field order is drop order: the QP goes before the memory it uses.
pub struct Link {
    pub(super) peer: usize,
    pub(super) qp: QueuePair,
    send_mr: MemoryRegion,
    recv_mr: MemoryRegion,
    /// Registrations of caller memory, when zero-copy is on.
    zero_copy: Option<RegCache<UserRegion>>,
    cq: CompletionQueue,
    _pd: ProtectionDomain,
    pub(super) ctx: Context,
    pub(super) shape: Shape,
    /// The peer's receive depth: our credits.
    peer_depth: u64,
    // Transmit side.
    tx_seq: u32,
    sent: u64,
    peer_freed: u64,
    free_send: Vec<usize>,
    /// Raw sends posted and not yet completed.
    raw_inflight: usize,
    /// Raw packets sent, for the log.
    raw_sent: u64,
    // Receive side.
    rx_seq: u32,
    freed: u64,
    advertised: u64,
    /// Arrived data packets not yet copied out: (slot, kind, payload length).
    pending: VecDeque<(usize, Packet, usize)>,
    // The current exchange.
    sq: Vec<usize>,
    s_next: usize,
    s_off: usize,
    /// The message being sent goes raw (its header packet is out).
    s_raw: bool,
    /// (address, length) of this exchange's sends, for registration extents.
    s_ranges: Vec<(usize, usize)>,
    rq: Vec<usize>,
    r_next: usize,
    r_off: usize,
    /// The message being received comes raw (its header packet arrived).
    r_raw: bool,
    /// The queue pair was moved to the error state: the link cannot be resynced.
    errored: bool,
    /// A resync under way: (its attempt, marker sent, peer's marker found).
    resync: Option<(u32, bool, bool)>,
}

impl Link {
    /// Allocate the staging memory for a new QP (still in INIT or RESET).
    pub fn new(
        peer: usize,
        ctx: Context,
        pd: ProtectionDomain,
        cq: CompletionQueue,
        qp: QueuePair,
        shape: Shape,
        mr_cache: Option<usize>,
    ) -> Result<Link> {
        let send_mr = pd.alloc_registered(shape.slot * shape.send_depth)?;
        let recv_mr = pd.alloc_registered(shape.slot * shape.recv_depth)?;
        Ok(Link {
            peer,
            qp,
            send_mr,
            recv_mr,
            zero_copy: mr_cache.map(RegCache::new),
            cq,
            _pd: pd,
            ctx,
            shape,
            peer_depth: 0,
            tx_seq: 0,
            sent: 0,
            peer_freed: 0,
            free_send: (0..shape.send_depth).rev().collect(),
            raw_inflight: 0,
            raw_sent: 0,
            rx_seq: 0,
            freed: 0,
            advertised: 0,
            pending: VecDeque::new(),
            sq: Vec::new(),
            s_next: 0,
            s_off: 0,
            s_raw: false,
            s_ranges: Vec::new(),
            rq: Vec::new(),
            r_next: 0,
            r_off: 0,
            r_raw: false,
            errored: false,
            resync: None,
        })
    }

    /// Post every receive slot; called once the QP is in RTR, before telling the peer so.
    pub fn post_all_receives(&mut self, peer_depth: usize) -> Result<()> {
        self.peer_depth = peer_depth as u64;
        for s in 0..self.shape.recv_depth {
            self.repost(s)?;
        }
        Ok(())
    }

    fn repost(&self, slot: usize) -> Result<()> {
        self.qp.post_recv(&self.recv_mr, slot * self.shape.slot, self.shape.slot, slot as u64, self.peer)
    }

    /// Start an exchange: forget the previous one's queues (pending packets stay).
    pub fn begin(&mut self) {
        self.sq.clear();
        self.rq.clear();
        self.s_ranges.clear();
        self.s_next = 0;
        self.s_off = 0;
        self.s_raw = false;
        self.r_next = 0;
        self.r_off = 0;
        self.r_raw = false;
        if let Some(c) = &mut self.zero_copy {
            c.next_exchange();
        }
    }

    /// Queue send `i` (whose payload is `data`) for this exchange.
    pub fn add_send(&mut self, i: usize, data: &[u8]) {
        self.sq.push(i);
        if self.zero_copy.is_some() {
            self.s_ranges.push((data.as_ptr() as usize, data.len()));
        }
    }

    /// Queue receive `i` for this exchange.
    pub fn add_recv(&mut self, i: usize) {
        self.rq.push(i);
    }

    /// Everything of this exchange done on this link: sends posted (raw ones completed, as
    /// they read the caller's memory) and receives delivered.
    pub fn done(&self) -> bool {
        self.s_next == self.sq.len() && self.r_next == self.rq.len() && self.raw_inflight == 0
    }

    /// Send work requests in flight (the send queue holds `send_depth`).
    fn in_flight(&self) -> usize {
        self.shape.send_depth - self.free_send.len() + self.raw_inflight
    }

    fn room(&self) -> bool {
        self.in_flight() < self.shape.send_depth && !self.free_send.is_empty()
    }

    /// Which side of this link the exchange still waits on (for timeouts).
    pub fn waiting(&self) -> bool {
        !self.done()
    }

    fn credits(&self) -> u64 {
        (self.peer_depth + self.peer_freed).saturating_sub(self.sent)
    }

    fn post_packet(&mut self, kind: u8, fill: impl FnOnce(&MemoryRegion, usize) -> usize) -> Result<()> {
        let slot = self.free_send.pop().expect("caller checked for a free send slot");
        let base = slot * self.shape.slot;
        let mut hdr = [0u8; LINK_HDR];
        hdr[..4].copy_from_slice(&(self.freed as u32).to_le_bytes());
        hdr[4] = kind;
        // SAFETY: the slot was free: no send from it is in flight.
        unsafe { self.send_mr.write(base, &hdr) };
        let n = fill(&self.send_mr, base + LINK_HDR);
        let imm = self.tx_seq & SEQ_MASK;
        self.qp.post_send(&self.send_mr, base, LINK_HDR + n, SEND_BIT | slot as u64, imm, self.peer)?;
        self.tx_seq = self.tx_seq.wrapping_add(1);
        self.sent += 1;
        self.advertised = self.freed;
        Ok(())
    }

    /// Post as many packets of the queued sends as credits and send slots allow.
    pub fn pump_sends(&mut self, sends: &[SendOp<'_>]) -> Result<bool> {
        let mut moved = false;
        let cap = self.shape.payload();
        while self.s_next < self.sq.len() && self.credits() >= 2 && self.room() {
            let op = &sends[self.sq[self.s_next]];
            let total = HEADER_LEN + op.data.len();
            if self.s_off == 0 && self.raw_send_ready(op.data) {
                // Header-only packet; the data follows raw.
                self.post_packet(KIND_HEADER, |mr, at| {
                    // SAFETY: the slot is free, see post_packet.
                    unsafe { mr.write(at, &op.header.encode()) };
                    HEADER_LEN
                })?;
                self.s_off = HEADER_LEN;
                self.s_raw = true;
            } else if self.s_raw {
                self.post_raw(op.data, self.s_off - HEADER_LEN, self.shape.slot.min(total - self.s_off))?;
            } else {
                let n = cap.min(total - self.s_off);
                let off = self.s_off;
                self.post_packet(KIND_DATA, |mr, at| {
                    if off == 0 {
                        // SAFETY: the slot is free, see post_packet.
                        unsafe { mr.write(at, &op.header.encode()) };
                        // SAFETY: as above.
                        unsafe { mr.write(at + HEADER_LEN, &op.data[..n - HEADER_LEN]) };
                    } else {
                        let from = off - HEADER_LEN;
                        // SAFETY: as above.
                        unsafe { mr.write(at, &op.data[from..from + n]) };
                    }
                    n
                })?;
                self.s_off += n;
            }
            if self.s_off == total {
                self.s_off = 0;
                self.s_next += 1;
                self.s_raw = false;
            }
            moved = true;
        }
        Ok(moved)
    }

    /// Whether `data` goes zero-copy: it is on, the piece is large, and its memory is (or can
    /// now be) registered.
    fn raw_send_ready(&mut self, data: &[u8]) -> bool {
        let chunk = self.shape.slot - LINK_HDR - HEADER_LEN;
        let Some(cache) = &mut self.zero_copy else { return false };
        if data.len() < ZERO_COPY_MIN.min(chunk) {
            return false;
        }
        let (addr, len) = (data.as_ptr() as usize, data.len());
        let pd = &self._pd;
        // SAFETY: the extent is made of this exchange's send buffers, which the caller keeps
        // alive for the exchange, and the exchange waits for every raw send to complete.
        // Keeping the registration afterwards is what BOLTCCL_IBV_ZERO_COPY documents.
        let register = |start: usize, len: usize| match unsafe { pd.register_user(start as *const u8, len) } {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::debug!("zero-copy registration failed, staging instead: {e}");
                None
            }
        };
        let ranges = &self.s_ranges;
        cache.lookup(addr, len, || extent_of(ranges, addr, len), register).is_some()
    }

    /// Post `len` bytes of `data` from `offset` straight from its registration.
    fn post_raw(&mut self, data: &[u8], offset: usize, len: usize) -> Result<()> {
        let addr = data.as_ptr() as usize + offset;
        let cache = self.zero_copy.as_mut().ok_or_else(|| Error::Internal("raw send without zero-copy".into()))?;
        let region = cache
            .find(addr, len)
            .ok_or_else(|| Error::Internal("a raw send's registration was evicted mid-message".into()))?;
        let imm = (self.tx_seq & SEQ_MASK) | RAW_IMM;
        // SAFETY: `data` lives for the exchange, which does not end before this send completes.
        unsafe { self.qp.post_send_user(region, addr, len, SEND_BIT | RAW_WR, imm, self.peer)? };
        self.tx_seq = self.tx_seq.wrapping_add(1);
        self.sent += 1;
        self.raw_inflight += 1;
        self.raw_sent += 1;
        self.s_off += len;
        Ok(())
    }

    /// Tell the peer about freed slots when enough are unreported (see the module notes).
    pub fn maybe_return_credits(&mut self) -> Result<bool> {
        let unreported = self.freed - self.advertised;
        let threshold = (self.shape.recv_depth as u64 / 2).max(1);
        if unreported >= threshold && self.credits() >= 1 && self.room() {
            self.post_packet(KIND_CREDIT, |_, _| 0)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Poll this link's completions and account for them. Returns whether any arrived.
    pub fn poll(&mut self) -> Result<bool> {
        let mut wc = [ibv_wc::default(); 16];
        let n = self.cq.poll(&mut wc)?;
        for w in &wc[..n] {
            self.completion(w)?;
        }
        Ok(n > 0)
    }

    fn completion(&mut self, w: &ibv_wc) -> Result<()> {
        let sending = w.wr_id & SEND_BIT != 0;
        let slot = (w.wr_id & 0xffff_ffff) as usize;
        if w.status != IBV_WC_SUCCESS {
            return Err(completion_error(self.ctx.name(), self.peer, sending, w.status, w.vendor_err));
        }
        let bad = |what: String| Error::Verbs {
            device: self.ctx.name().to_string(),
            what: format!(
                "{what} on the link to rank {} (a provider bug or a foreign sender); restart the job",
                self.peer
            ),
        };
        if sending {
            if w.opcode != IBV_WC_SEND {
                return Err(bad(format!("unexpected send completion (opcode {}, wr_id {:#x})", w.opcode, w.wr_id)));
            }
            if w.wr_id & RAW_WR != 0 && self.raw_inflight > 0 {
                self.raw_inflight -= 1;
            } else if slot < self.shape.send_depth && !self.free_send.contains(&slot) {
                self.free_send.push(slot);
            } else {
                return Err(bad(format!("unexpected send completion (wr_id {:#x})", w.wr_id)));
            }
            return Ok(());
        }
        let len = w.byte_len as usize;
        if w.opcode != IBV_WC_RECV || w.wc_flags & IBV_WC_WITH_IMM == 0 || slot >= self.shape.recv_depth {
            return Err(bad(format!("unexpected receive completion (opcode {}, flags {:#x})", w.opcode, w.wc_flags)));
        }
        let imm = u32::from_be(w.imm_data);
        let (seq, expected) = (imm & SEQ_MASK, self.rx_seq & SEQ_MASK);
        if seq != expected {
            let gap = seq.wrapping_sub(expected) & SEQ_MASK;
            let what = if gap < SEQ_MASK / 2 {
                format!("{gap} message(s) from rank {} were lost (expected #{expected}, got #{seq})", self.peer)
            } else {
                format!("rank {} sent message #{seq} twice or out of order (expected #{expected})", self.peer)
            };
            return Err(Error::Verbs {
                device: self.ctx.name().to_string(),
                what: format!(
                    "{what}: UC does not retransmit, so this operation failed; check the cable, then restart the job"
                ),
            });
        }
        self.rx_seq = self.rx_seq.wrapping_add(1);
        if imm & RAW_IMM != 0 {
            if len == 0 || len > self.shape.slot {
                return Err(bad(format!("a {len}-byte raw packet")));
            }
            self.pending.push_back((slot, Packet::Raw, len));
            return Ok(());
        }
        if len < LINK_HDR || len > self.shape.slot {
            return Err(bad(format!("a {len}-byte packet")));
        }
        // SAFETY: this slot's receive has completed and is not re-posted yet.
        let hdr = unsafe { self.recv_mr.read(slot * self.shape.slot, LINK_HDR) };
        let freed_low = u32::from_le_bytes(hdr[..4].try_into().expect("4 bytes"));
        let kind = hdr[4];
        self.peer_freed += freed_low.wrapping_sub(self.peer_freed as u32) as u64;
        match kind {
            KIND_CREDIT if len == LINK_HDR => {
                self.repost(slot)?;
                self.freed += 1;
            }
            KIND_DATA => self.pending.push_back((slot, Packet::Staged, len - LINK_HDR)),
            KIND_HEADER if len == LINK_HDR + HEADER_LEN => {
                self.pending.push_back((slot, Packet::HeaderOnly, HEADER_LEN))
            }
            KIND_RESYNC if len == LINK_HDR + 4 => {
                // SAFETY: as above.
                let a = unsafe { self.recv_mr.read(slot * self.shape.slot + LINK_HDR, 4) };
                let attempt = u32::from_le_bytes(a.try_into().expect("4 bytes"));
                self.pending.push_back((slot, Packet::Resync(attempt), 0))
            }
            _ => return Err(bad(format!("a packet of unknown kind {kind} and {len} bytes"))),
        }
        Ok(())
    }

    /// Copy arrived packets into the current receives; run `on_recv` for each completed one.
    pub fn deliver(&mut self, recvs: &mut [RecvOp<'_>], on_recv: &mut OnRecv<'_>) -> Result<bool> {
        let mut moved = false;
        while let Some(&(slot, kind, len)) = self.pending.front() {
            let Some(&idx) = self.rq.get(self.r_next) else { break };
            let op = &mut recvs[idx];
            let total = HEADER_LEN + op.buf.len();
            let proto = |detail: String| Error::Protocol { from: format!("rank {}", self.peer), detail };
            // The length this packet must have, given where the message stands.
            let want = match (self.r_off == 0, kind, self.r_raw) {
                (true, Packet::Staged, _) | (false, Packet::Staged, false) => {
                    self.shape.payload().min(total - self.r_off)
                }
                (true, Packet::HeaderOnly, _) => HEADER_LEN,
                (false, Packet::Raw, true) => self.shape.slot.min(total - self.r_off),
                _ => return Err(proto(format!("a {kind:?} packet out of place in a message (a foreign sender?)"))),
            };
            if len != want {
                return Err(proto(format!(
                    "a {len}-byte packet where {want} bytes were due: a short or foreign message (or the ranks \
                     disagree on BOLTCCL_CHUNK_BYTES)"
                )));
            }
            let base = slot * self.shape.slot + if kind == Packet::Raw { 0 } else { LINK_HDR };
            // SAFETY: the slot's receive completed; it is re-posted only after this copy.
            let data = unsafe { self.recv_mr.read(base, len) };
            if self.r_off == 0 {
                let head: [u8; HEADER_LEN] = data[..HEADER_LEN].try_into().expect("header");
                let got = Header::decode(&head).map_err(proto)?;
                if got.kind != Kind::Data {
                    return Err(proto("not a data frame".into()));
                }
                wire::check(&op.expect, &got, self.peer)?;
                op.buf[..len - HEADER_LEN].copy_from_slice(&data[HEADER_LEN..]);
                self.r_raw = kind == Packet::HeaderOnly;
            } else {
                let from = self.r_off - HEADER_LEN;
                op.buf[from..from + len].copy_from_slice(data);
            }
            self.pending.pop_front();
            self.repost(slot)?;
            self.freed += 1;
            self.r_off += len;
            moved = true;
            if self.r_off == total {
                self.r_off = 0;
                self.r_raw = false;
                self.r_next += 1;
                on_recv(recvs, idx)?;
            }
        }
        Ok(moved)
    }

    /// After a failed exchange: stop the device reading caller memory for raw sends still in
    /// flight (the queue pair goes to the error state, which flushes them), waiting at most
    /// `limit` for their completions.
    pub fn quiesce(&mut self, limit: std::time::Duration) {
        if self.raw_inflight == 0 {
            return;
        }
        let mut attr = ibv_qp_attr { qp_state: IBV_QPS_ERR, ..Default::default() };
        let _ = self.qp.modify(&mut attr, IBV_QP_STATE, super::errors::Verb::ToErr, self.peer);
        self.errored = true;
        let until = std::time::Instant::now() + limit;
        let mut wc = [ibv_wc::default(); 16];
        while self.raw_inflight > 0 && std::time::Instant::now() < until {
            let Ok(n) = self.cq.poll(&mut wc) else { break };
            for w in &wc[..n] {
                if w.wr_id & SEND_BIT != 0 && w.wr_id & RAW_WR != 0 {
                    self.raw_inflight -= 1;
                }
            }
            if n == 0 {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
        if self.raw_inflight > 0 {
            tracing::error!(
                peer = self.peer,
                in_flight = self.raw_inflight,
                "zero-copy sends did not flush after a failure: the device may still read the caller's buffer"
            );
        }
    }

    /// Whether a shrink can keep this link (its queue pair is not in the error state).
    pub fn can_resync(&self) -> bool {
        !self.errored
    }

    /// Start a resync for shrink `attempt`: the failed exchange's queues are dropped.
    pub fn start_resync(&mut self, attempt: u32) {
        self.begin();
        self.resync = Some((attempt, false, false));
    }

    /// Whether the resync is over: the marker sent and the peer's found.
    pub fn resynced(&self) -> bool {
        matches!(self.resync, Some((_, true, true)))
    }

    /// Move the resync on: send the marker when credits allow (keeping the last one for a
    /// credit packet, as data does), drop what arrives until the peer's marker of this attempt
    /// (an older attempt's marker too), return credits. Returns whether anything moved.
    pub fn resync_step(&mut self) -> Result<bool> {
        let Some((attempt, mut sent, mut found)) = self.resync else { return Ok(false) };
        let mut moved = self.poll()?;
        if !sent && self.credits() >= 2 && self.room() {
            self.post_packet(KIND_RESYNC, |mr, at| {
                // SAFETY: the slot is free, see post_packet.
                unsafe { mr.write(at, &attempt.to_le_bytes()) };
                4
            })?;
            sent = true;
            moved = true;
        }
        while !found {
            let Some((slot, kind, _)) = self.pending.pop_front() else { break };
            self.repost(slot)?;
            self.freed += 1;
            moved = true;
            if let Packet::Resync(a) = kind {
                if a > attempt {
                    return Err(Error::Protocol {
                        from: format!("rank {}", self.peer),
                        detail: format!("a marker of shrink attempt {a} during attempt {attempt}"),
                    });
                }
                found = a == attempt;
            }
        }
        moved |= self.maybe_return_credits()?;
        self.resync = Some((attempt, sent, found));
        Ok(moved)
    }

    /// The resync is over: the link carries the new group's messages.
    pub fn end_resync(&mut self) {
        self.resync = None;
    }

    /// Zero-copy figures for the log: (raw packets sent, cache counters), when it is on.
    pub fn zero_copy_stats(&self) -> Option<(u64, super::regcache::CacheStats, usize)> {
        self.zero_copy.as_ref().map(|c| (self.raw_sent, c.stats, c.len()))
    }
}
