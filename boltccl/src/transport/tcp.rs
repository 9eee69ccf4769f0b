//! TCP transport: a full mesh of non-blocking sockets driven by one progress loop.
//!
//! Each peer has `BOLTCCL_TCP_STREAMS` connections; a message goes on stream
//! `part % streams`, so both ends agree without negotiation. An exchange keeps one queue per
//! (peer, stream) and direction, tries every queue head with non-blocking `writev`/`readv`,
//! busy-polls for a short budget when nothing moves (latency), then sleeps in `poll(2)`
//! (fairness when ranks outnumber cores). Nothing is allocated per message.
//!
//! Failure detection: a closed or reset data connection names the peer at once. Every rank
//! also keeps its bootstrap connection to rank 0 as a control channel; rank 0 relays aborts
//! and notices dead ranks, so ranks that were not talking to a failed rank learn of it too.

use super::{abort_fields, Limits, OnRecv, RecvOp, SendOp, Transport, WaitPolicy};
use crate::error::Error;
use crate::wire::{self, Header, Kind, HEADER_LEN, MAX_REASON};
use rustix::event::{poll, PollFd, PollFlags};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// How often the progress loop looks at the control channel while data is still moving.
const CONTROL_CHECK: Duration = Duration::from_millis(20);
/// How long to wait for an explanation on the control channel after a data link closes.
const EXPLAIN_WAIT: Duration = Duration::from_millis(300);

/// The control channel to one rank: frames are tiny, so they are assembled in a small buffer.
struct Control {
    stream: TcpStream,
    buf: Vec<u8>,
    /// The other side said goodbye: its silence is no longer suspicious.
    departed: bool,
}

#[derive(Default)]
struct Queue {
    ops: Vec<usize>,
    next: usize,
    /// Bytes of the head op done, header included.
    done: usize,
    hdr: [u8; HEADER_LEN],
}

impl Queue {
    fn reset(&mut self) {
        self.ops.clear();
        self.next = 0;
        self.done = 0;
    }

    fn pending(&self) -> bool {
        self.next < self.ops.len()
    }
}

/// One rank's end of a TCP mesh. Built by the bootstrap (`boltccl::init`, `Group::new`).
pub struct TcpTransport {
    rank: usize,
    size: usize,
    streams: usize,
    /// `links[peer][stream]`; empty for this rank.
    links: Vec<Vec<TcpStream>>,
    /// Rank 0: one per other rank. Others: only `control[0]`.
    control: Vec<Option<Control>>,
    wait: WaitPolicy,
    sq: Vec<Queue>,
    rq: Vec<Queue>,
    aborted: bool,
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

impl TcpTransport {
    /// Assemble a transport from connected, authenticated sockets.
    pub(crate) fn new(
        rank: usize,
        size: usize,
        links: Vec<Vec<TcpStream>>,
        control: Vec<Option<TcpStream>>,
        wait: WaitPolicy,
    ) -> io::Result<TcpTransport> {
        let streams = links.iter().map(|l| l.len()).max().unwrap_or(1).max(1);
        for s in links.iter().flatten() {
            s.set_nonblocking(true)?;
            s.set_nodelay(true)?;
        }
        let control = control
            .into_iter()
            .map(|c| {
                c.map(|stream| -> io::Result<Control> {
                    stream.set_nonblocking(true)?;
                    stream.set_nodelay(true)?;
                    Ok(Control { stream, buf: Vec::with_capacity(HEADER_LEN + MAX_REASON), departed: false })
                })
                .transpose()
            })
            .collect::<io::Result<Vec<_>>>()?;
        let queues = || (0..size * streams).map(|_| Queue::default()).collect::<Vec<_>>();
        Ok(TcpTransport { rank, size, streams, links, control, wait, sq: queues(), rq: queues(), aborted: false })
    }

    fn queue_of(&self, peer: usize, part: u32) -> usize {
        peer * self.streams + part as usize % self.streams
    }

    /// Push every send queue as far as the socket allows. Returns whether anything moved.
    fn pump_sends(&mut self, sends: &[SendOp<'_>]) -> Result<bool, Error> {
        let mut moved = false;
        for (qi, q) in self.sq.iter_mut().enumerate() {
            while q.pending() {
                let op = &sends[q.ops[q.next]];
                if q.done == 0 {
                    q.hdr = op.header.encode();
                }
                let total = HEADER_LEN + op.data.len();
                let stream = &mut self.links[qi / self.streams][qi % self.streams];
                let r = if q.done < HEADER_LEN {
                    stream.write_vectored(&[IoSlice::new(&q.hdr[q.done..]), IoSlice::new(op.data)])
                } else {
                    stream.write(&op.data[q.done - HEADER_LEN..])
                };
                match r {
                    Ok(0) => {
                        return Err(Error::PeerLost { rank: op.peer, detail: "connection closed while sending".into() })
                    }
                    Ok(n) => {
                        moved = true;
                        q.done += n;
                        if q.done == total {
                            q.done = 0;
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
    fn pump_recvs(&mut self, recvs: &mut [RecvOp<'_>], on_recv: &mut OnRecv<'_>) -> Result<bool, Error> {
        let mut moved = false;
        for qi in 0..self.rq.len() {
            loop {
                let q = &mut self.rq[qi];
                if !q.pending() {
                    break;
                }
                let idx = q.ops[q.next];
                let op = &mut recvs[idx];
                let total = HEADER_LEN + op.buf.len();
                let stream = &mut self.links[qi / self.streams][qi % self.streams];
                let had = q.done;
                let r = if q.done < HEADER_LEN {
                    stream.read_vectored(&mut [IoSliceMut::new(&mut q.hdr[had..]), IoSliceMut::new(op.buf)])
                } else {
                    stream.read(&mut op.buf[had - HEADER_LEN..])
                };
                match r {
                    Ok(0) if total > had => {
                        return Err(Error::PeerLost {
                            rank: op.peer,
                            detail: "connection closed (process exited or was killed)".into(),
                        })
                    }
                    Ok(n) => {
                        moved = true;
                        q.done += n;
                        if had < HEADER_LEN && q.done >= HEADER_LEN {
                            // The payload may already be partly in `buf`; it only counts once
                            // the header matches.
                            let got = Header::decode(&q.hdr)
                                .map_err(|d| Error::Protocol { from: format!("rank {}", op.peer), detail: d })?;
                            if got.kind != Kind::Data {
                                return Err(Error::Protocol {
                                    from: format!("rank {}", op.peer),
                                    detail: "control frame on a data connection".into(),
                                });
                            }
                            wire::check(&op.expect, &got, op.peer)?;
                        }
                        if q.done == total {
                            q.done = 0;
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

    /// Read whatever arrived on the control channels. Returns the error it announces, if any.
    pub(crate) fn check_control(&mut self) -> Option<Error> {
        let mut found = None;
        for peer in 0..self.control.len() {
            let Some(c) = self.control[peer].as_mut().filter(|c| !c.departed) else {
                continue;
            };
            let mut tmp = [0u8; 1024];
            let event = loop {
                match c.stream.read(&mut tmp) {
                    Ok(0) => {
                        break Some(Error::PeerLost {
                            rank: peer,
                            detail: "its control connection closed (process exited or was killed)".into(),
                        })
                    }
                    Ok(n) => {
                        c.buf.extend_from_slice(&tmp[..n]);
                        if c.buf.len() > HEADER_LEN + MAX_REASON {
                            break Some(Error::Protocol {
                                from: format!("rank {peer}"),
                                detail: "oversized control frame".into(),
                            });
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        break Some(Error::PeerLost { rank: peer, detail: format!("control connection lost ({e})") })
                    }
                }
            };
            // Parse complete frames before acting on end-of-file: a goodbye comes just before it.
            while c.buf.len() >= HEADER_LEN {
                let head: [u8; HEADER_LEN] = c.buf[..HEADER_LEN].try_into().expect("header");
                let h = match Header::decode(&head) {
                    Ok(h) => h,
                    Err(d) => {
                        found.get_or_insert(Error::Protocol { from: format!("rank {peer}"), detail: d });
                        break;
                    }
                };
                let end = HEADER_LEN + h.len as usize;
                if c.buf.len() < end {
                    break;
                }
                match h.kind {
                    Kind::Goodbye => c.departed = true,
                    Kind::Abort => {
                        found.get_or_insert(wire::abort_error(&h, &c.buf[HEADER_LEN..end]));
                    }
                    Kind::Data => {
                        found.get_or_insert(Error::Protocol {
                            from: format!("rank {peer}"),
                            detail: "data frame on the control connection".into(),
                        });
                    }
                }
                c.buf.drain(..end);
            }
            if let Some(e) = event {
                if !c.departed {
                    found.get_or_insert(e);
                }
                c.departed = true;
            }
        }
        if let Some(e) = &found {
            if self.rank == 0 {
                // The hub passes the news on, so every rank hears it.
                self.send_control_abort(e);
            }
        }
        found
    }

    fn send_control_abort(&mut self, cause: &Error) {
        let (culprit, lost, reason) = abort_fields(self.rank, cause);
        let reason = &reason.as_bytes()[..reason.len().min(MAX_REASON)];
        let mut frame = Header::abort(culprit, lost, reason.len()).encode().to_vec();
        frame.extend_from_slice(reason);
        for (peer, c) in self.control.iter_mut().enumerate() {
            if let Some(c) = c.as_mut().filter(|c| !c.departed && peer != culprit) {
                write_all_briefly(&mut c.stream, &frame);
            }
        }
    }

    /// A data link closed: give the control channel a moment to say why.
    pub(crate) fn explain(&mut self, err: Error) -> Error {
        let until = Instant::now() + EXPLAIN_WAIT;
        while Instant::now() < until {
            if let Some(e @ Error::Aborted { .. }) = self.check_control() {
                return e;
            }
            if self.control.iter().flatten().all(|c| c.departed) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        err
    }

    fn sleep_until_ready(&mut self, until: Instant) -> Result<(), Error> {
        let now = Instant::now();
        let ms = (until.saturating_duration_since(now).as_millis() as i32).clamp(1, 1000);
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(self.sq.len() + self.rq.len() + self.control.len());
        for (qi, q) in self.sq.iter().enumerate() {
            if q.pending() {
                fds.push(PollFd::new(&self.links[qi / self.streams][qi % self.streams], PollFlags::OUT));
            }
        }
        for (qi, q) in self.rq.iter().enumerate() {
            if q.pending() {
                fds.push(PollFd::new(&self.links[qi / self.streams][qi % self.streams], PollFlags::IN));
            }
        }
        for c in self.control.iter().flatten().filter(|c| !c.departed) {
            fds.push(PollFd::new(&c.stream, PollFlags::IN));
        }
        match poll(&mut fds, ms) {
            Ok(_) => Ok(()),
            Err(e) if e == rustix::io::Errno::INTR => Ok(()),
            Err(e) => Err(Error::io(self.rank, "poll", e.into())),
        }
    }

    fn blocked_on(&self) -> usize {
        let first = |qs: &[Queue]| qs.iter().position(|q| q.pending()).map(|qi| qi / self.streams);
        first(&self.rq).or_else(|| first(&self.sq)).unwrap_or(self.rank)
    }

    /// Queue this exchange's operations whose peer `take` accepts. The verbs transport uses
    /// it to move the pairs that have no RDMA device over TCP, in its own progress loop.
    pub(crate) fn begin_subset(&mut self, sends: &[SendOp<'_>], recvs: &[RecvOp<'_>], take: &dyn Fn(usize) -> bool) {
        for q in self.sq.iter_mut().chain(self.rq.iter_mut()) {
            q.reset();
        }
        for (i, s) in sends.iter().enumerate().filter(|(_, s)| take(s.peer)) {
            debug_assert_eq!(s.header.len as usize, s.data.len());
            let q = self.queue_of(s.peer, s.header.part);
            self.sq[q].ops.push(i);
        }
        for (i, r) in recvs.iter().enumerate().filter(|(_, r)| take(r.peer)) {
            let q = self.queue_of(r.peer, r.expect.part);
            self.rq[q].ops.push(i);
        }
    }

    /// Move what can move without blocking; returns whether anything did.
    pub(crate) fn pump(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
    ) -> Result<bool, Error> {
        Ok(self.pump_sends(sends)? | self.pump_recvs(recvs, on_recv)?)
    }

    /// How bootstrap decided this host's ranks should wait (see [`WaitPolicy`]).
    pub(crate) fn wait_policy(&self) -> WaitPolicy {
        self.wait
    }

    /// Whether queued operations remain.
    pub(crate) fn busy(&self) -> bool {
        self.sq.iter().chain(self.rq.iter()).any(Queue::pending)
    }

    /// The peer the queued operations wait on first, if any.
    pub(crate) fn waiting_on(&self) -> Option<usize> {
        self.busy().then(|| self.blocked_on())
    }

    fn run(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
        limits: &Limits,
    ) -> Result<(), Error> {
        self.begin_subset(sends, recvs, &|_| true);
        let mut last_progress = Instant::now();
        let mut last_control = last_progress;
        loop {
            let moved = self.pump(sends, recvs, on_recv)?;
            if !self.busy() {
                return Ok(());
            }
            let now = Instant::now();
            if now.duration_since(last_control) >= CONTROL_CHECK {
                last_control = now;
                if let Some(e) = self.check_control() {
                    return Err(e);
                }
            }
            if moved {
                last_progress = now;
                continue;
            }
            if !self.wait.pause(now.duration_since(last_progress)) {
                continue;
            }
            let deadline = last_progress + limits.timeout;
            if now >= deadline {
                return Err(Error::Timeout { op: limits.op.into(), rank: self.blocked_on(), after: limits.timeout });
            }
            let wake = if limits.interrupt.is_some() { deadline.min(now + super::INTERRUPT_EVERY) } else { deadline };
            self.sleep_until_ready(wake)?;
            if let Some(e) = self.check_control() {
                return Err(e);
            }
            limits.interrupted()?;
        }
    }
}

/// Write a small frame on a non-blocking socket, giving up after a moment: used only on paths
/// that are already failing, which must never wait long.
fn write_all_briefly(stream: &mut TcpStream, mut frame: &[u8]) {
    let until = Instant::now() + Duration::from_millis(200);
    while !frame.is_empty() && Instant::now() < until {
        match stream.write(frame) {
            Ok(0) => return,
            Ok(n) => frame = &frame[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(_) => return,
        }
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn exchange(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
        limits: &Limits,
    ) -> Result<(), Error> {
        if self.aborted {
            return Err(Error::Internal("exchange on an aborted transport".into()));
        }
        match self.run(sends, recvs, on_recv, limits) {
            Err(e @ Error::PeerLost { .. }) => Err(self.explain(e)),
            other => other,
        }
    }

    fn abort(&mut self, cause: &Error) {
        if self.aborted {
            return;
        }
        self.aborted = true;
        self.send_control_abort(cause);
        for s in self.links.iter().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        if !self.aborted {
            let bye = Header::goodbye().encode();
            for c in self.control.iter_mut().flatten().filter(|c| !c.departed) {
                write_all_briefly(&mut c.stream, &bye);
            }
        }
    }
}
