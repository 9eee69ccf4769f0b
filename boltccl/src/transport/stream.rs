//! Queues of frames over byte streams that never block: the part of a channel that TCP sockets
//! and shared-memory rings have in common.
//!
//! An exchange keeps one queue per (peer, stream) and direction, and tries every queue head
//! with vectored reads and writes: headers and payloads go straight between the stream and the
//! caller's buffers ([`crate::wire::frame`] says which bytes are next). Nothing is allocated
//! per message. A message goes on stream `part % streams`, so both ends agree without
//! negotiation.

use super::{OnRecv, RecvOp, SendOp};
use crate::error::{Error, Result};
use crate::wire::frame::{Incoming, Outgoing};
use crate::wire::{resync_header, Header, Kind, HEADER_LEN};
use std::io::{self, Read, Write};

/// Operations queued on one (peer, stream) in one direction, in order.
#[derive(Default)]
struct Queue {
    ops: Vec<usize>,
    next: usize,
    /// The frame being written (sends).
    out: Option<Outgoing>,
    /// The frame being read (receives).
    inc: Incoming,
}

impl Queue {
    fn reset(&mut self) {
        self.ops.clear();
        self.next = 0;
        self.out = None;
        self.inc.reset();
    }

    fn pending(&self) -> bool {
        self.next < self.ops.len()
    }
}

/// Byte-stream links to the peers a channel serves, and this exchange's queues on them.
pub(crate) struct Streams<L> {
    streams: usize,
    /// `links[peer][stream]`; empty for peers not served (this rank among them).
    pub links: Vec<Vec<L>>,
    sq: Vec<Queue>,
    rq: Vec<Queue>,
}

/// A link whose state makes no sense (a shared-memory ring a peer scribbled over).
fn corrupt(peer: usize, e: io::Error) -> Error {
    Error::Protocol { from: format!("rank {peer}"), detail: e.to_string() }
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::NotConnected
    )
}

impl<L: Read + Write> Streams<L> {
    /// Queues over `links[peer][stream]`, which must not block (reads and writes that cannot
    /// progress return `WouldBlock`).
    pub(crate) fn new(links: Vec<Vec<L>>) -> Streams<L> {
        let streams = links.iter().map(|l| l.len()).max().unwrap_or(1).max(1);
        let queues = || (0..links.len() * streams).map(|_| Queue::default()).collect::<Vec<_>>();
        Streams { streams, sq: queues(), rq: queues(), links }
    }

    fn queue_of(&self, peer: usize, h: &Header) -> usize {
        peer * self.streams + (h.part % self.streams as u64) as usize
    }

    /// Push every send queue as far as the socket allows. Returns whether anything moved.
    pub(crate) fn pump_sends(&mut self, sends: &[SendOp<'_>]) -> Result<bool> {
        let Streams { streams, links, sq, .. } = self;
        let mut moved = false;
        for (qi, q) in sq.iter_mut().enumerate().filter(|(_, q)| q.pending()) {
            let stream = &mut links[qi / *streams][qi % *streams];
            while q.pending() {
                let op = &sends[q.ops[q.next]];
                let out = q.out.get_or_insert_with(|| Outgoing::new(&op.header));
                match stream.write_vectored(&out.pending(op.data)) {
                    Ok(0) => {
                        return Err(Error::PeerLost { rank: op.peer, detail: "connection closed while sending".into() })
                    }
                    Ok(n) => {
                        moved = true;
                        if out.advance(n, op.data.len()) {
                            q.out = None;
                            q.next += 1;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if is_disconnect(&e) => {
                        return Err(Error::PeerLost {
                            rank: op.peer,
                            detail: format!("connection lost while sending ({e})"),
                        })
                    }
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => return Err(corrupt(op.peer, e)),
                    Err(e) => return Err(Error::io(op.peer, "send", e)),
                }
            }
        }
        Ok(moved)
    }

    /// Pull every receive queue as far as the data allows; run `on_recv` for completed ones.
    pub(crate) fn pump_recvs(&mut self, recvs: &mut [RecvOp<'_>], on_recv: &mut OnRecv<'_>) -> Result<bool> {
        let mut moved = false;
        let Streams { streams, links, rq, .. } = self;
        for (qi, q) in rq.iter_mut().enumerate().filter(|(_, q)| q.pending()) {
            let stream = &mut links[qi / *streams][qi % *streams];
            while q.pending() {
                let idx = q.ops[q.next];
                let op = &mut recvs[idx];
                match stream.read_vectored(&mut q.inc.pending(op.buf)) {
                    Ok(0) => {
                        return Err(Error::PeerLost {
                            rank: op.peer,
                            detail: "connection closed (process exited or was killed)".into(),
                        })
                    }
                    Ok(n) => {
                        moved = true;
                        if q.inc.advance(n, &op.expect, op.peer)? {
                            q.inc.reset();
                            q.next += 1;
                            on_recv(recvs, idx)?;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if is_disconnect(&e) => {
                        return Err(Error::PeerLost { rank: op.peer, detail: format!("connection lost ({e})") })
                    }
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => return Err(corrupt(op.peer, e)),
                    Err(e) => return Err(Error::io(op.peer, "receive", e)),
                }
            }
        }
        Ok(moved)
    }

    /// The link of every pending queue and whether it waits to read.
    pub(crate) fn pending_links(&self) -> impl Iterator<Item = (&L, bool)> + '_ {
        let s = self.streams;
        let reads = self.rq.iter().enumerate().filter(|(_, q)| q.pending()).map(move |(qi, _)| (qi, true));
        let writes = self.sq.iter().enumerate().filter(|(_, q)| q.pending()).map(move |(qi, _)| (qi, false));
        reads.chain(writes).map(move |(qi, read)| (&self.links[qi / s][qi % s], read))
    }

    /// Queue this exchange's operations whose peer `mine` accepts.
    pub(crate) fn begin(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &[RecvOp<'_>],
        mine: &dyn Fn(usize) -> bool,
    ) -> Result<()> {
        for q in self.sq.iter_mut().chain(self.rq.iter_mut()) {
            q.reset();
        }
        for (i, s) in sends.iter().enumerate().filter(|(_, s)| mine(s.peer)) {
            debug_assert_eq!(s.header.len as usize, s.data.len());
            let q = self.queue_of(s.peer, &s.header);
            self.sq[q].ops.push(i);
        }
        for (i, r) in recvs.iter().enumerate().filter(|(_, r)| mine(r.peer)) {
            let q = self.queue_of(r.peer, &r.expect);
            self.rq[q].ops.push(i);
        }
        Ok(())
    }

    /// Move what can move without blocking; returns whether anything did.
    pub(crate) fn pump(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
    ) -> Result<bool> {
        Ok(self.pump_sends(sends)? | self.pump_recvs(recvs, on_recv)?)
    }

    /// The peer the queued operations wait on first.
    pub(crate) fn waiting_on(&self) -> Option<usize> {
        let first = |qs: &[Queue]| qs.iter().position(Queue::pending).map(|qi| qi / self.streams);
        first(&self.rq).or_else(|| first(&self.sq))
    }
}

/// One (peer, stream) being brought back to a frame boundary by a shrink: this side finishes
/// the frame it was cutting short (the rest of its header, zeros for its payload) and sends a
/// [`Kind::Resync`] marker; it reads and drops everything the peer sent before the peer's.
struct Resync {
    peer: usize,
    link: usize,
    /// Bytes still to write: the frame's rest and the marker.
    out: Vec<u8>,
    sent: usize,
    /// The frame header being read, and how much of it is in.
    hdr: [u8; HEADER_LEN],
    have: usize,
    /// Payload bytes still to drop.
    skip: usize,
    /// The peer's marker came.
    found: bool,
}

impl<L: Read + Write> Streams<L> {
    /// Begin a shrink's resync of the links to `keep` (after a failed call: the queues hold
    /// whatever it cut short).
    fn resync_plan(&self, keep: &[usize], attempt: u32) -> Vec<Resync> {
        let mut plan = Vec::new();
        for &peer in keep {
            for link in 0..self.links.get(peer).map_or(0, Vec::len) {
                let q = peer * self.streams + link;
                let mut out = Vec::new();
                if let Some(o) = &self.sq[q].out {
                    let (hdr, zeros) = o.unwritten();
                    out.extend_from_slice(hdr);
                    out.resize(out.len() + zeros, 0);
                }
                out.extend_from_slice(&resync_header(attempt).encode());
                let inc = &self.rq[q].inc;
                let mut r = Resync {
                    peer,
                    link,
                    out,
                    sent: 0,
                    hdr: [0; HEADER_LEN],
                    have: inc.partial().len(),
                    skip: 0,
                    found: false,
                };
                r.hdr[..r.have].copy_from_slice(inc.partial());
                if r.have == HEADER_LEN {
                    let len = Header::encoded_len(&r.hdr);
                    r.skip = len - inc.payload_read().min(len);
                    r.have = 0;
                }
                plan.push(r);
            }
        }
        plan
    }

    /// Move one resync as far as the link allows; true when it moved.
    fn resync_step(&mut self, r: &mut Resync, attempt: u32, scratch: &mut [u8]) -> Result<bool> {
        let link = &mut self.links[r.peer][r.link];
        let lost =
            |e: io::Error| Error::PeerLost { rank: r.peer, detail: format!("connection lost during a shrink ({e})") };
        let mut moved = false;
        while r.sent < r.out.len() {
            match link.write(&r.out[r.sent..]) {
                Ok(0) => return Err(lost(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    r.sent += n;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(lost(e)),
            }
        }
        while !r.found {
            let into = if r.skip > 0 {
                let n = r.skip.min(scratch.len());
                &mut scratch[..n]
            } else {
                &mut r.hdr[r.have..]
            };
            let n = match link.read(into) {
                Ok(0) => return Err(lost(io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(lost(e)),
            };
            moved = true;
            if r.skip > 0 {
                r.skip -= n;
                continue;
            }
            r.have += n;
            if r.have < HEADER_LEN {
                continue;
            }
            r.have = 0;
            let h =
                Header::decode(&r.hdr).map_err(|d| Error::Protocol { from: format!("rank {}", r.peer), detail: d })?;
            match h.kind {
                Kind::Resync if h.group == attempt => r.found = true,
                Kind::Data => r.skip = h.len as usize,
                // A marker of an earlier, failed attempt: nothing follows it but this one's.
                Kind::Resync if h.group < attempt => {}
                k => {
                    return Err(Error::Protocol {
                        from: format!("rank {}", r.peer),
                        detail: format!("a {k:?} frame on a data link during a shrink"),
                    })
                }
            }
        }
        Ok(moved)
    }

    /// Bring the links to `keep` back to a frame boundary (see [`Resync`]), waiting with `wait`
    /// (given the links still pending and whether each waits to read, to write) until `timeout`
    /// passes without progress. Clears the queues.
    pub(crate) fn resync(
        &mut self,
        keep: &[usize],
        attempt: u32,
        timeout: std::time::Duration,
        mut wait: impl FnMut(&[(&L, bool, bool)], std::time::Duration),
    ) -> Result<()> {
        let mut plan = self.resync_plan(keep, attempt);
        let mut scratch = vec![0u8; 64 << 10];
        let mut last = std::time::Instant::now();
        loop {
            let mut open = false;
            for r in plan.iter_mut() {
                if self.resync_step(r, attempt, &mut scratch)? {
                    last = std::time::Instant::now();
                }
                open |= !r.found || r.sent < r.out.len();
            }
            if !open {
                break;
            }
            if last.elapsed() >= timeout {
                let r = plan.iter().find(|r| !r.found || r.sent < r.out.len()).expect("one is open");
                return Err(Error::Timeout {
                    op: "shrink (resync of the data links)".into(),
                    rank: r.peer,
                    after: timeout,
                });
            }
            let pending: Vec<(&L, bool, bool)> = plan
                .iter()
                .filter(|r| !r.found || r.sent < r.out.len())
                .map(|r| (&self.links[r.peer][r.link], !r.found, r.sent < r.out.len()))
                .collect();
            wait(&pending, timeout.saturating_sub(last.elapsed()));
        }
        self.forget_queues();
        Ok(())
    }

    /// Forget whatever the failed exchange left in the queues.
    pub(crate) fn forget_queues(&mut self) {
        for q in self.sq.iter_mut().chain(self.rq.iter_mut()) {
            q.reset();
        }
    }

    /// Drop the links to every peer not in `keep`.
    pub(crate) fn forget(&mut self, keep: &[usize]) {
        for (peer, l) in self.links.iter_mut().enumerate() {
            if !keep.contains(&peer) {
                l.clear();
            }
        }
    }
}
