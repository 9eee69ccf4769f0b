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
use crate::wire::Header;
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
