//! Queues of frames over byte streams that never block: the part of a channel that TCP sockets
//! and shared-memory rings have in common.
//!
//! An exchange keeps one queue per (peer, stream) and direction, and tries every queue head
//! with vectored reads and writes: headers and payloads go straight between the stream and the
//! caller's buffers ([`crate::wire::frame`] says which bytes are next). Nothing is allocated
//! per message. A message goes on stream `part % streams`, so both ends agree without
//! negotiation.
//!
//! Links that can move a small frame whole in one step ([`WholeFrames`]: shared-memory rings)
//! start an exchange without its queues ([`Streams::start`]): a small call is then a copy in
//! and a copy out per peer, and the queues take over only for what did not move at once.

use super::{OnRecv, RecvOp, SendOp};
use crate::error::{Error, Result};
use crate::wire::frame::{check_encoded, Incoming, Outgoing};
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

/// Payloads up to this size are tried whole by [`Streams::start`]: the small calls whose time
/// is the bookkeeping's, not the copies'.
const WHOLE_MAX: usize = 4096;
/// Exchanges of at most this many operations each way are tried whole (their completions fit
/// a mask).
const WHOLE_OPS: usize = 64;

/// A link that can move a small frame whole, in one step, or not at all: a frame is never
/// left half written or half read by these, so the queues can take over from any of them.
pub(crate) trait WholeFrames {
    /// Write a frame, `header` then `payload`, if it can go all at once: false if not
    /// (nothing written).
    fn put_frame(&mut self, header: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<bool>;
    /// The next frame's header, once all of it is in (nothing read).
    fn peek_header(&self) -> io::Result<Option<[u8; HEADER_LEN]>>;
    /// Read the next frame, header and payload (into `buf`), if all of it is in: false if
    /// not (nothing read).
    fn take_frame(&mut self, buf: &mut [u8]) -> io::Result<bool>;
}

/// Byte-stream links to the peers a channel serves, and this exchange's queues on them.
pub(crate) struct Streams<L> {
    streams: usize,
    /// `links[peer][stream]`; empty for peers not served (this rank among them).
    pub links: Vec<Vec<L>>,
    sq: Vec<Queue>,
    rq: Vec<Queue>,
    /// Something was queued since the queues were last cleared (an exchange that moved all
    /// of its frames whole has nothing to clear).
    queued: bool,
}

/// A link whose state makes no sense (a shared-memory ring a peer scribbled over).
fn corrupt(peer: usize, e: io::Error) -> Error {
    Error::Protocol { from: format!("rank {peer}"), detail: e.to_string() }
}

/// A link to `peer` that failed while `doing` ("send", "receive") with an error that is neither
/// `WouldBlock` nor `Interrupted`.
fn failed(peer: usize, doing: &str, e: io::Error) -> Error {
    if is_disconnect(&e) {
        let detail = match doing {
            "send" => format!("connection lost while sending ({e})"),
            _ => format!("connection lost ({e})"),
        };
        return Error::PeerLost { rank: peer, detail };
    }
    if e.kind() == io::ErrorKind::InvalidData {
        return corrupt(peer, e);
    }
    Error::io(peer, doing, e)
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
        Streams { streams, sq: queues(), rq: queues(), links, queued: false }
    }

    fn queue_of(&self, peer: usize, h: &Header) -> usize {
        peer * self.streams + self.stream_of(h)
    }

    /// The stream a frame goes on.
    fn stream_of(&self, h: &Header) -> usize {
        // Most channels have one stream: no division on the fast path.
        if self.streams == 1 {
            0
        } else {
            (h.part % self.streams as u64) as usize
        }
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
                    Err(e) => return Err(failed(op.peer, "send", e)),
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
                    Err(e) => return Err(failed(op.peer, "receive", e)),
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
        self.forget_queues();
        self.queue(sends, recvs, mine, 0, 0);
        Ok(())
    }

    /// Queue the operations whose peer `mine` accepts, counting as done the first `sent`
    /// sends and the receives in the mask `received` (each queue's done operations come
    /// first in it).
    fn queue(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &[RecvOp<'_>],
        mine: &dyn Fn(usize) -> bool,
        sent: usize,
        received: u64,
    ) {
        self.queued = true;
        for (i, s) in sends.iter().enumerate().filter(|(_, s)| mine(s.peer)) {
            debug_assert_eq!(s.header.len as usize, s.data.len());
            let qi = self.queue_of(s.peer, &s.header);
            let q = &mut self.sq[qi];
            q.ops.push(i);
            q.next += usize::from(i < sent);
        }
        for (i, r) in recvs.iter().enumerate().filter(|(_, r)| mine(r.peer)) {
            let qi = self.queue_of(r.peer, &r.expect);
            let q = &mut self.rq[qi];
            q.ops.push(i);
            q.next += usize::from(i < WHOLE_OPS && received >> i & 1 == 1);
        }
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

impl<L: Read + Write + WholeFrames> Streams<L> {
    /// Begin an exchange (as [`Streams::begin`]), moving small frames whole first: every send
    /// that fits at once, in list order, then every receive that is all in, each polled up to
    /// `polls` times. True when nothing is left; else the queues hold the rest. Each queue's
    /// frames stay in order: a send waits for the sends before it, a receive for the
    /// receives before it on its queue.
    pub(crate) fn start(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
        mine: &dyn Fn(usize) -> bool,
        polls: u32,
    ) -> Result<bool> {
        self.forget_queues();
        let small = sends.len() <= WHOLE_OPS
            && recvs.len() <= WHOLE_OPS
            && sends.iter().all(|s| s.data.len() <= WHOLE_MAX)
            && recvs.iter().all(|r| r.buf.len() <= WHOLE_MAX);
        if !small {
            self.queue(sends, recvs, mine, 0, 0);
            return Ok(false);
        }
        let mut sent = 0;
        for s in sends {
            if mine(s.peer) {
                let stream = self.stream_of(&s.header);
                let put = self.links[s.peer][stream].put_frame(&s.header.encode(), s.data);
                if !put.map_err(|e| failed(s.peer, "send", e))? {
                    break;
                }
            }
            sent += 1;
        }
        let ours = recvs.iter().enumerate().filter(|(_, r)| mine(r.peer)).fold(0u64, |m, (i, _)| m | 1 << i);
        let mut received = 0u64;
        for _ in 0..polls.max(1) {
            // Queues (as bits, modulo 64: a false hit only defers a receive) with a receive
            // still to come: the receives behind it on its queue wait.
            let mut blocked = 0u64;
            for i in 0..recvs.len() {
                let r = &mut recvs[i];
                let q = self.queue_of(r.peer, &r.expect) % 64;
                if ours >> i & 1 == 0 || received >> i & 1 == 1 || blocked >> q & 1 == 1 {
                    continue;
                }
                if self.take_whole(r)? {
                    received |= 1 << i;
                    on_recv(recvs, i)?;
                } else {
                    blocked |= 1 << q;
                }
            }
            if received == ours {
                break;
            }
            std::hint::spin_loop();
        }
        if sent == sends.len() && received == ours {
            return Ok(true);
        }
        self.queue(sends, recvs, mine, sent, received);
        Ok(false)
    }

    /// Receive `r`'s frame if all of it is in; its header is checked as soon as that is in.
    fn take_whole(&mut self, r: &mut RecvOp<'_>) -> Result<bool> {
        let stream = self.stream_of(&r.expect);
        let link = &mut self.links[r.peer][stream];
        let Some(got) = link.peek_header().map_err(|e| failed(r.peer, "receive", e))? else { return Ok(false) };
        // Equal bytes are a match; else the check says what differs.
        if got != r.expect.encode() {
            check_encoded(&got, &r.expect, r.peer)?;
        }
        link.take_frame(r.buf).map_err(|e| failed(r.peer, "receive", e))
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
        if std::mem::take(&mut self.queued) {
            for q in self.sq.iter_mut().chain(self.rq.iter_mut()) {
                q.reset();
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::ring::{Inbox, RingPair};
    use crate::types::{Collective, DType, ReduceOp};
    use std::sync::Arc;

    /// Rank 0's and rank 1's streams over one pair of 4 KiB rings.
    fn two_ranks() -> (Streams<RingPair>, Streams<RingPair>) {
        let (a, b) = (Arc::new(Inbox::create(0, 1, 4096).unwrap()), Arc::new(Inbox::create(1, 1, 4096).unwrap()));
        let ab = RingPair::new(1, a.clone(), 0, b.as_peer(), 0).unwrap();
        let ba = RingPair::new(0, b, 0, a.as_peer(), 0).unwrap();
        (Streams::new(vec![vec![], vec![ab]]), Streams::new(vec![vec![ba], vec![]]))
    }

    fn header(seq: u32, piece: u64, len: usize) -> Header {
        Header::data(Collective::AllToAll, 7, seq, DType::U8, ReduceOp::Sum, 0, 0).piece(piece, len)
    }

    /// What `start` could not move whole, the queues move, in order, after what it did: the
    /// second frame does not fit beside the first, so the sender's queue takes over from it,
    /// and the receiver's from the first frame not yet all in.
    #[test]
    fn the_queues_go_on_from_where_a_start_stopped() {
        let (mut s0, mut s1) = two_ranks();
        let payloads = [vec![1u8; 3000], vec![2u8; 2000], vec![3u8; 8]];
        let sends: Vec<SendOp<'_>> = payloads
            .iter()
            .enumerate()
            .map(|(k, p)| SendOp { peer: 1, header: header(1, k as u64, p.len()), data: p })
            .collect();
        let mut bufs: Vec<Vec<u8>> = payloads.iter().map(|p| vec![0u8; p.len()]).collect();
        let mut recvs: Vec<RecvOp<'_>> = bufs
            .iter_mut()
            .enumerate()
            .map(|(k, b)| RecvOp { peer: 0, expect: header(1, k as u64, b.len()), buf: b })
            .collect();
        let all = |_: usize| true;
        let mut order = Vec::new();
        assert!(!s0.start(&sends, &mut [], &mut |_, _| Ok(()), &all, 1).unwrap(), "the second frame waits for room");
        let mut arrived = |_: &[RecvOp<'_>], i: usize| {
            order.push(i);
            Ok(())
        };
        assert!(!s1.start(&[], &mut recvs, &mut arrived, &all, 4).unwrap());
        for _ in 0..1000 {
            if s0.waiting_on().is_none() && s1.waiting_on().is_none() {
                break;
            }
            s0.pump(&sends, &mut [], &mut |_, _| Ok(())).unwrap();
            s1.pump(&[], &mut recvs, &mut arrived).unwrap();
        }
        assert_eq!((s0.waiting_on(), s1.waiting_on()), (None, None), "the exchange finished");
        drop(recvs);
        assert_eq!(order, [0, 1, 2], "each receive completed once, in order");
        assert_eq!(bufs, payloads);
        // Small frames both ways go whole, with no queue left behind.
        let sends = [SendOp { peer: 1, header: header(2, 0, 1), data: &[42] }];
        let mut one = [0u8; 1];
        let mut recvs = [RecvOp { peer: 0, expect: header(2, 0, 1), buf: &mut one }];
        assert!(s0.start(&sends, &mut [], &mut |_, _| Ok(()), &all, 1).unwrap());
        assert!(s1.start(&[], &mut recvs, &mut |_, _| Ok(()), &all, 1).unwrap());
        assert_eq!((s0.waiting_on(), s1.waiting_on(), one), (None, None, [42]));
        // A receive waits for the one before it on its queue: the next frame's header is in,
        // its payload only half, and the receive after it must not take that header for its own.
        let (a, b) = (header(3, 0, 8), header(3, 1, 1));
        s0.links[1][0].write_all(&a.encode()).unwrap();
        s0.links[1][0].write_all(&[5; 4]).unwrap();
        let (mut first, mut second) = ([0u8; 8], [0u8; 1]);
        let mut recvs =
            [RecvOp { peer: 0, expect: a, buf: &mut first }, RecvOp { peer: 0, expect: b, buf: &mut second }];
        assert!(!s1.start(&[], &mut recvs, &mut |_, _| Ok(()), &all, 3).unwrap());
        s0.links[1][0].write_all(&[5; 4]).unwrap();
        let sends = [SendOp { peer: 1, header: b, data: &[6] }];
        assert!(s0.start(&sends, &mut [], &mut |_, _| Ok(()), &all, 1).unwrap());
        while s1.waiting_on().is_some() {
            s1.pump(&[], &mut recvs, &mut |_, _| Ok(())).unwrap();
        }
        assert_eq!((first, second), ([5; 8], [6]));
    }

    /// A whole frame is checked before it is taken: a mismatch is an error naming the sender,
    /// and the frame stays in the ring, where a shrink's resync will find it.
    #[test]
    fn a_whole_frame_with_the_wrong_header_is_an_error_and_stays_unread() {
        let (mut s0, mut s1) = two_ranks();
        let sends = [SendOp { peer: 1, header: header(1, 0, 4), data: &[1, 2, 3, 4] }];
        assert!(s0.start(&sends, &mut [], &mut |_, _| Ok(()), &|_| true, 1).unwrap());
        let mut buf = [0u8; 4];
        let mut recvs = [RecvOp { peer: 0, expect: header(2, 0, 4), buf: &mut buf }];
        let e = s1.start(&[], &mut recvs, &mut |_, _| Ok(()), &|_| true, 1).unwrap_err();
        assert!(matches!(e, Error::Mismatch { rank: 0, .. }), "{e}");
        assert!(e.to_string().contains("call #1") && e.to_string().contains("#2"), "{e}");
        assert_eq!(s1.links[0][0].peek_header().unwrap(), Some(header(1, 0, 4).encode()), "the frame is still there");
        assert_eq!(buf, [0; 4]);
    }
}
