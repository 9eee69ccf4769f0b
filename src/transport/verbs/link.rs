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

use super::errors::completion_error;
use super::ffi::{CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair};
use crate::error::{Error, Result};
use crate::transport::{OnRecv, RecvOp, SendOp};
use crate::wire::{self, Header, Kind, HEADER_LEN};
use std::collections::VecDeque;
use verbs_abi::*;

/// Bytes of link header at the start of every packet: freed count (u32), kind (u8), padding.
pub const LINK_HDR: usize = 8;
const KIND_DATA: u8 = 1;
const KIND_CREDIT: u8 = 2;
const SEND_BIT: u64 = 1 << 32;

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
    // Receive side.
    rx_seq: u32,
    freed: u64,
    advertised: u64,
    /// Arrived data packets not yet copied out: (slot, payload length).
    pending: VecDeque<(usize, usize)>,
    // The current exchange.
    sq: Vec<usize>,
    s_next: usize,
    s_off: usize,
    rq: Vec<usize>,
    r_next: usize,
    r_off: usize,
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
    ) -> Result<Link> {
        let send_mr = pd.alloc_registered(shape.slot * shape.send_depth)?;
        let recv_mr = pd.alloc_registered(shape.slot * shape.recv_depth)?;
        Ok(Link {
            peer,
            qp,
            send_mr,
            recv_mr,
            cq,
            _pd: pd,
            ctx,
            shape,
            peer_depth: 0,
            tx_seq: 0,
            sent: 0,
            peer_freed: 0,
            free_send: (0..shape.send_depth).rev().collect(),
            rx_seq: 0,
            freed: 0,
            advertised: 0,
            pending: VecDeque::new(),
            sq: Vec::new(),
            s_next: 0,
            s_off: 0,
            rq: Vec::new(),
            r_next: 0,
            r_off: 0,
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
        self.s_next = 0;
        self.s_off = 0;
        self.r_next = 0;
        self.r_off = 0;
    }

    /// Queue send `i` for this exchange.
    pub fn add_send(&mut self, i: usize) {
        self.sq.push(i);
    }

    /// Queue receive `i` for this exchange.
    pub fn add_recv(&mut self, i: usize) {
        self.rq.push(i);
    }

    /// Everything of this exchange done on this link (sends posted, receives delivered).
    pub fn done(&self) -> bool {
        self.s_next == self.sq.len() && self.r_next == self.rq.len()
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
        self.qp.post_send(&self.send_mr, base, LINK_HDR + n, SEND_BIT | slot as u64, self.tx_seq, self.peer)?;
        self.tx_seq = self.tx_seq.wrapping_add(1);
        self.sent += 1;
        self.advertised = self.freed;
        Ok(())
    }

    /// Post as many packets of the queued sends as credits and send slots allow.
    pub fn pump_sends(&mut self, sends: &[SendOp<'_>]) -> Result<bool> {
        let mut moved = false;
        let cap = self.shape.payload();
        while self.s_next < self.sq.len() && self.credits() >= 2 && !self.free_send.is_empty() {
            let op = &sends[self.sq[self.s_next]];
            let total = HEADER_LEN + op.data.len();
            let n = cap.min(total - self.s_off);
            let off = self.s_off;
            self.post_packet(KIND_DATA, |mr, at| {
                // SAFETY (both writes): the slot is free, see post_packet.
                if off == 0 {
                    unsafe { mr.write(at, &op.header.encode()) };
                    unsafe { mr.write(at + HEADER_LEN, &op.data[..n - HEADER_LEN]) };
                } else {
                    let from = off - HEADER_LEN;
                    unsafe { mr.write(at, &op.data[from..from + n]) };
                }
                n
            })?;
            self.s_off += n;
            if self.s_off == total {
                self.s_off = 0;
                self.s_next += 1;
            }
            moved = true;
        }
        Ok(moved)
    }

    /// Tell the peer about freed slots when enough are unreported (see the module notes).
    pub fn maybe_return_credits(&mut self) -> Result<bool> {
        let unreported = self.freed - self.advertised;
        let threshold = (self.shape.recv_depth as u64 / 2).max(1);
        if unreported >= threshold && self.credits() >= 1 && !self.free_send.is_empty() {
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
            if w.opcode != IBV_WC_SEND || slot >= self.shape.send_depth {
                return Err(bad(format!("unexpected send completion (opcode {}, wr_id {:#x})", w.opcode, w.wr_id)));
            }
            self.free_send.push(slot);
            return Ok(());
        }
        let len = w.byte_len as usize;
        if w.opcode != IBV_WC_RECV || w.wc_flags & IBV_WC_WITH_IMM == 0 || slot >= self.shape.recv_depth {
            return Err(bad(format!("unexpected receive completion (opcode {}, flags {:#x})", w.opcode, w.wc_flags)));
        }
        let seq = u32::from_be(w.imm_data);
        if seq != self.rx_seq {
            let what = if seq.wrapping_sub(self.rx_seq) < u32::MAX / 2 {
                format!(
                    "{} message(s) from rank {} were lost (expected #{}, got #{seq})",
                    seq.wrapping_sub(self.rx_seq),
                    self.peer,
                    self.rx_seq
                )
            } else {
                format!("rank {} sent message #{seq} twice or out of order (expected #{})", self.peer, self.rx_seq)
            };
            return Err(Error::Verbs {
                device: self.ctx.name().to_string(),
                what: format!(
                    "{what}: UC does not retransmit, so this operation failed; check the cable, then restart the job"
                ),
            });
        }
        self.rx_seq = self.rx_seq.wrapping_add(1);
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
            KIND_DATA => self.pending.push_back((slot, len - LINK_HDR)),
            _ => return Err(bad(format!("a packet of unknown kind {kind} and {len} bytes"))),
        }
        Ok(())
    }

    /// Copy arrived packets into the current receives; run `on_recv` for each completed one.
    pub fn deliver(&mut self, recvs: &mut [RecvOp<'_>], on_recv: &mut OnRecv<'_>) -> Result<bool> {
        let mut moved = false;
        let cap = self.shape.payload();
        while let Some(&(slot, len)) = self.pending.front() {
            let Some(&idx) = self.rq.get(self.r_next) else { break };
            let op = &mut recvs[idx];
            let total = HEADER_LEN + op.buf.len();
            let want = cap.min(total - self.r_off);
            if len != want {
                return Err(Error::Protocol {
                    from: format!("rank {}", self.peer),
                    detail: format!(
                        "a {len}-byte packet where {want} bytes were due: a short or foreign message (or the ranks \
                         disagree on BOLTCCL_CHUNK_BYTES)"
                    ),
                });
            }
            let base = slot * self.shape.slot + LINK_HDR;
            // SAFETY: the slot's receive completed; it is re-posted only after this copy.
            let data = unsafe { self.recv_mr.read(base, len) };
            if self.r_off == 0 {
                let head: [u8; HEADER_LEN] = data[..HEADER_LEN].try_into().expect("header");
                let got = Header::decode(&head)
                    .map_err(|d| Error::Protocol { from: format!("rank {}", self.peer), detail: d })?;
                if got.kind != Kind::Data {
                    return Err(Error::Protocol {
                        from: format!("rank {}", self.peer),
                        detail: "not a data frame".into(),
                    });
                }
                wire::check(&op.expect, &got, self.peer)?;
                op.buf[..len - HEADER_LEN].copy_from_slice(&data[HEADER_LEN..]);
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
                self.r_next += 1;
                on_recv(recvs, idx)?;
            }
        }
        Ok(moved)
    }
}
