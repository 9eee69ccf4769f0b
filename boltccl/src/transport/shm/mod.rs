//! Shared-memory links between ranks on one host.
//!
//! Each rank owns an inbox (see [`ring`]): an anonymous shared-memory file with one byte ring
//! per local peer, and a doorbell. Frames travel through the rings exactly as they travel
//! through TCP sockets ([`super::stream`]: the same queues, the same header checks), with no
//! system call on the data path: copies in and out of memory both processes map. A waiting
//! rank spins and yields as [`super::progress::WaitPolicy`] says, then sleeps on its doorbell
//! in the same `poll` as every other channel.
//!
//! Ranks that are threads of one process ([`super::mem`]) and ranks that are processes
//! ([`setup`]) use the same rings; processes pass their inboxes over authenticated unix
//! sockets, which also tell when a peer dies.

pub(crate) mod ring;
mod segment;
#[cfg_attr(not(target_os = "linux"), path = "unsupported.rs")]
pub(crate) mod setup;

use super::progress::{Channel, Wake};
use super::stream::Streams;
use super::{LinkKind, OnRecv, RecvOp, SendOp};
use crate::error::{Error, Result};
use ring::{Inbox, RingPair};
use rustix::event::{PollFd, PollFlags};
use rustix::net::RecvFlags;
use std::cell::Cell;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// One rank's shared-memory links to its local peers.
pub(crate) struct ShmChannel {
    inbox: Arc<Inbox>,
    /// This rank said it sleeps (the shared word is set): clear it when it wakes. Kept here so
    /// the busy loop never writes the shared word, which peers read on every send.
    asleep: Cell<bool>,
    streams: Streams<RingPair>,
    /// Per local peer (by rank): the unix socket from set-up, whose end of file says the peer
    /// process is gone (none for ranks that are threads of this process).
    sockets: Vec<Option<UnixStream>>,
}

impl ShmChannel {
    /// Links over `pairs[peer]` (one for each local peer, none for the others).
    pub(crate) fn new(inbox: Arc<Inbox>, pairs: Vec<Option<RingPair>>, sockets: Vec<Option<UnixStream>>) -> ShmChannel {
        let links = pairs.into_iter().map(|p| p.into_iter().collect()).collect();
        ShmChannel { inbox, asleep: Cell::new(false), streams: Streams::new(links), sockets }
    }
}

/// A unix socket whose peer has closed it (the process died or left).
fn hung_up(s: &UnixStream) -> bool {
    let mut b = [0u8; 1];
    matches!(rustix::net::recv(s, &mut b, RecvFlags::PEEK | RecvFlags::DONTWAIT), Ok(0))
}

impl Channel for ShmChannel {
    fn kind(&self) -> LinkKind {
        LinkKind::SharedMemory
    }

    fn start(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
        mine: &dyn Fn(usize) -> bool,
        polls: u32,
    ) -> Result<bool> {
        self.awake();
        self.streams.start(sends, recvs, on_recv, mine, polls)
    }

    fn pump(&mut self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>], on_recv: &mut OnRecv<'_>) -> Result<bool> {
        self.awake();
        self.streams.pump(sends, recvs, on_recv)
    }

    fn waiting_on(&self) -> Option<usize> {
        self.streams.waiting_on()
    }

    fn wake_on<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) -> Wake {
        self.inbox.set_sleeping(true);
        self.asleep.set(true);
        // Look once more after saying so: a peer that moved bytes before seeing the word did
        // not ring, and its bytes are visible now.
        if self.streams.pending_links().any(|(pair, read)| pair.ready(read)) {
            return Wake::Ready;
        }
        fds.push(PollFd::from_borrowed_fd(self.inbox.bell(), PollFlags::IN));
        for s in self.sockets.iter().flatten() {
            fds.push(PollFd::new(s, PollFlags::IN));
        }
        Wake::Poll
    }

    fn check(&mut self) -> Result<()> {
        for (pair, read) in self.streams.pending_links() {
            let p = pair.peer();
            let departed = pair.peer_inbox().departed();
            let dead = self.sockets.get(p).and_then(Option::as_ref).is_some_and(hung_up);
            // What a peer wrote before it went is still in the ring: only an end that can no
            // longer move means it is gone for this exchange.
            if (departed || dead) && !pair.ready(read) {
                let detail = if dead {
                    "its process exited or was killed (shared-memory link closed)"
                } else {
                    "it left the group while this rank waited for it"
                };
                return Err(Error::PeerLost { rank: p, detail: detail.into() });
            }
        }
        Ok(())
    }

    fn gone(&self) -> Option<usize> {
        self.sockets.iter().position(|s| s.as_ref().is_some_and(hung_up))
    }

    fn quiesce(&mut self) {
        // The caller may reuse its buffers once the exchange returns: take back what is lent.
        for pair in self.streams.links.iter_mut().flatten() {
            pair.withdraw();
        }
    }

    fn can_resync(&self) -> bool {
        true
    }

    fn prepare_resync(&mut self) {
        for pair in self.streams.links.iter_mut().flatten() {
            pair.stop_writing();
        }
    }

    fn resync(&mut self, keep: &[usize], _attempt: u32, _timeout: std::time::Duration) -> Result<()> {
        // Every peer in `keep` stopped writing before it voted, and writes again only after
        // this rank's commit: what is in the rings now is all of the failed group's.
        for pair in self.streams.links.iter_mut().flatten().filter(|p| keep.contains(&p.peer())) {
            pair.skip_all();
        }
        self.streams.forget_queues();
        Ok(())
    }

    fn forget(&mut self, keep: &[usize]) {
        self.streams.forget(keep);
        for (peer, s) in self.sockets.iter_mut().enumerate() {
            if !keep.contains(&peer) {
                *s = None;
            }
        }
    }
}

impl ShmChannel {
    /// Back from a sleep on the doorbell: say so, and empty it.
    fn awake(&self) {
        if self.asleep.replace(false) {
            self.inbox.set_sleeping(false);
            self.inbox.drain();
        }
    }

    /// Tell the local peers this rank has left, and wake them to notice.
    fn depart(&self) {
        self.inbox.depart();
        for pair in self.streams.links.iter().flatten() {
            pair.peer_inbox().wake();
        }
    }
}

impl Drop for ShmChannel {
    fn drop(&mut self) {
        self.depart();
    }
}
