//! In-process links: ranks are threads of one process, links are queues.
//!
//! For fast tests of the algorithms and for single-process users. Frames are real encoded
//! headers followed by the payload, so header checks, aborts and timeouts behave as on TCP.
//! Sends never block (the queues are unbounded); every rank has a doorbell (an eventfd) that
//! senders ring, so a waiting rank sleeps in the same `poll` as every other channel.

use super::mesh::Mesh;
use super::progress::{Channel, Control, WaitPolicy};
use super::{OnRecv, RecvOp, SendOp};
use crate::error::{Error, Result};
use crate::wire::{self, Header, HEADER_LEN};
use crossbeam_channel::{unbounded, Receiver, Sender, TryRecvError};
use parking_lot::Mutex;
use rustix::event::{eventfd, EventfdFlags, PollFd, PollFlags};
use rustix::fd::OwnedFd;
use std::sync::Arc;

/// What the ranks of one in-process world share.
struct World {
    /// The first abort, seen by every rank.
    aborted: Mutex<Option<Error>>,
    /// Every rank's doorbell.
    bells: Vec<OwnedFd>,
}

impl World {
    fn ring(&self, rank: usize) {
        // A full counter (never, at 2^64 - 2) or an error just means the bell is already ringing.
        let _ = rustix::io::write(&self.bells[rank], &1u64.to_ne_bytes());
    }
}

/// The `n` ranks of an in-process world, each a [`Mesh`] over in-process queues, in rank order.
pub(crate) fn world(n: usize) -> Vec<Mesh> {
    let bells = (0..n)
        .map(|_| eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).expect("the kernel gives an eventfd"))
        .collect();
    let world = Arc::new(World { aborted: Mutex::new(None), bells });
    let mut to: Vec<Vec<Option<Sender<Vec<u8>>>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    let mut from: Vec<Vec<Option<Receiver<Vec<u8>>>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for a in 0..n {
        for b in (0..n).filter(|&b| b != a) {
            let (tx, rx) = unbounded();
            to[a][b] = Some(tx);
            from[b][a] = Some(rx);
        }
    }
    // Threads of one process share its cores.
    let wait = WaitPolicy::here(n, None);
    to.into_iter()
        .zip(from)
        .enumerate()
        .map(|(rank, (to, from))| {
            let channel = MemChannel { rank, world: world.clone(), to, from, sq: Vec::new(), rq: Vec::new() };
            let control = MemControl { rank, world: world.clone() };
            Mesh::new(rank, n, Box::new(channel), Box::new(control), wait)
        })
        .collect()
}

/// One rank's queues to and from every other rank.
struct MemChannel {
    rank: usize,
    world: Arc<World>,
    /// `to[p]` sends to rank `p`.
    to: Vec<Option<Sender<Vec<u8>>>>,
    /// `from[p]` receives from rank `p`.
    from: Vec<Option<Receiver<Vec<u8>>>>,
    /// This exchange's sends not yet queued.
    sq: Vec<usize>,
    /// Per peer, this exchange's receives still due from it, in order (reversed: next last).
    rq: Vec<Vec<usize>>,
}

fn lost(peer: usize) -> Error {
    Error::PeerLost { rank: peer, detail: "its in-process transport was dropped".into() }
}

impl Channel for MemChannel {
    fn begin(&mut self, sends: &[SendOp<'_>], recvs: &[RecvOp<'_>], mine: &dyn Fn(usize) -> bool) -> Result<()> {
        self.sq = (0..sends.len()).filter(|&i| mine(sends[i].peer)).collect();
        self.rq = vec![Vec::new(); self.from.len()];
        for (i, r) in recvs.iter().enumerate().rev().filter(|(_, r)| mine(r.peer)) {
            self.rq[r.peer].push(i);
        }
        Ok(())
    }

    fn pump(&mut self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>], on_recv: &mut OnRecv<'_>) -> Result<bool> {
        let mut moved = false;
        for i in self.sq.drain(..) {
            let s = &sends[i];
            debug_assert_eq!(s.header.len as usize, s.data.len());
            let mut frame = Vec::with_capacity(HEADER_LEN + s.data.len());
            frame.extend_from_slice(&s.header.encode());
            frame.extend_from_slice(s.data);
            let tx = self.to[s.peer].as_ref().ok_or_else(|| Error::Internal("send to self".into()))?;
            tx.send(frame).map_err(|_| lost(s.peer))?;
            self.world.ring(s.peer);
            moved = true;
        }
        // Clear the doorbell before looking, so a frame queued after the look rings it again.
        let mut drain = [0u8; 8];
        let _ = rustix::io::read(&self.world.bells[self.rank], &mut drain);
        for peer in 0..self.rq.len() {
            while let Some(&idx) = self.rq[peer].last() {
                let rx = self.from[peer].as_ref().ok_or_else(|| Error::Internal("receive from self".into()))?;
                let frame = match rx.try_recv() {
                    Ok(f) => f,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return Err(lost(peer)),
                };
                let op = &mut recvs[idx];
                let head: &[u8; HEADER_LEN] = frame[..HEADER_LEN].try_into().expect("frames start with a header");
                let got =
                    Header::decode(head).map_err(|d| Error::Protocol { from: format!("rank {peer}"), detail: d })?;
                wire::check(&op.expect, &got, peer)?;
                op.buf.copy_from_slice(&frame[HEADER_LEN..]);
                self.rq[peer].pop();
                moved = true;
                on_recv(recvs, idx)?;
            }
        }
        Ok(moved)
    }

    fn waiting_on(&self) -> Option<usize> {
        self.rq.iter().position(|q| !q.is_empty())
    }

    fn wake_on<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) -> bool {
        fds.push(PollFd::new(&self.world.bells[self.rank], PollFlags::IN));
        true
    }
}

/// The in-process control plane: one shared abort slot.
struct MemControl {
    rank: usize,
    world: Arc<World>,
}

impl Control for MemControl {
    fn check(&mut self) -> Option<Error> {
        self.world.aborted.lock().clone()
    }

    fn wake_on<'a>(&'a self, _: &mut Vec<PollFd<'a>>) {}

    fn abort(&mut self, cause: &Error) {
        self.world.aborted.lock().get_or_insert_with(|| wire::relayed(self.rank, cause));
        for r in 0..self.world.bells.len() {
            self.world.ring(r);
        }
    }

    fn explain(&mut self, err: Error) -> Error {
        match self.check() {
            Some(e @ Error::Aborted { .. }) => e,
            _ => err,
        }
    }
}
