//! TCP links: a full mesh of non-blocking sockets.
//!
//! Each peer has `BOLTCCL_TCP_STREAMS` connections; a message goes on stream
//! `piece % streams`, so both ends agree without negotiation. An exchange keeps one queue per
//! (peer, stream) and direction, and tries every queue head with non-blocking
//! `writev`/`readv`: headers and payloads go straight between the socket and the caller's
//! buffers ([`crate::wire::frame`] says which bytes are next). Nothing is allocated per
//! message. A closed or reset connection names the peer at once.

use super::progress::Channel;
use super::{OnRecv, RecvOp, SendOp};
use crate::error::{Error, Result};
use crate::wire::frame::{Incoming, Outgoing};
use crate::wire::Header;
use rustix::event::{PollFd, PollFlags};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};

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

/// One rank's TCP links to every peer it reaches over TCP.
pub(crate) struct TcpChannel {
    streams: usize,
    /// `links[peer][stream]`; empty for this rank.
    links: Vec<Vec<TcpStream>>,
    sq: Vec<Queue>,
    rq: Vec<Queue>,
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

impl TcpChannel {
    /// Links from connected, authenticated sockets (`links[peer][stream]`).
    pub(crate) fn new(links: Vec<Vec<TcpStream>>) -> io::Result<TcpChannel> {
        let streams = links.iter().map(|l| l.len()).max().unwrap_or(1).max(1);
        for s in links.iter().flatten() {
            s.set_nonblocking(true)?;
            s.set_nodelay(true)?;
        }
        let queues = || (0..links.len() * streams).map(|_| Queue::default()).collect::<Vec<_>>();
        Ok(TcpChannel { streams, sq: queues(), rq: queues(), links })
    }

    fn queue_of(&self, peer: usize, h: &Header) -> usize {
        peer * self.streams + (h.part % self.streams as u64) as usize
    }

    /// Push every send queue as far as the socket allows. Returns whether anything moved.
    fn pump_sends(&mut self, sends: &[SendOp<'_>]) -> Result<bool> {
        let TcpChannel { streams, links, sq, .. } = self;
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
                    Err(e) => return Err(Error::io(op.peer, "send", e)),
                }
            }
        }
        Ok(moved)
    }

    /// Pull every receive queue as far as the data allows; run `on_recv` for completed ones.
    fn pump_recvs(&mut self, recvs: &mut [RecvOp<'_>], on_recv: &mut OnRecv<'_>) -> Result<bool> {
        let mut moved = false;
        let TcpChannel { streams, links, rq, .. } = self;
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
                    Err(e) => return Err(Error::io(op.peer, "receive", e)),
                }
            }
        }
        Ok(moved)
    }
}

impl Channel for TcpChannel {
    fn begin(&mut self, sends: &[SendOp<'_>], recvs: &[RecvOp<'_>], mine: &dyn Fn(usize) -> bool) -> Result<()> {
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

    fn pump(&mut self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>], on_recv: &mut OnRecv<'_>) -> Result<bool> {
        Ok(self.pump_sends(sends)? | self.pump_recvs(recvs, on_recv)?)
    }

    fn waiting_on(&self) -> Option<usize> {
        let first = |qs: &[Queue]| qs.iter().position(Queue::pending).map(|qi| qi / self.streams);
        first(&self.rq).or_else(|| first(&self.sq))
    }

    fn wake_on<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) -> bool {
        for (qi, _) in self.sq.iter().enumerate().filter(|(_, q)| q.pending()) {
            fds.push(PollFd::new(&self.links[qi / self.streams][qi % self.streams], PollFlags::OUT));
        }
        for (qi, _) in self.rq.iter().enumerate().filter(|(_, q)| q.pending()) {
            fds.push(PollFd::new(&self.links[qi / self.streams][qi % self.streams], PollFlags::IN));
        }
        true
    }

    fn close(&mut self) {
        for s in self.links.iter().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}
