//! RDMA verbs links: one UC queue pair per cable to every cabled peer; pairs the device matrix
//! leaves without a device (a ring, a mixed group) stay on the TCP mesh, in the same progress
//! loop.
//!
//! Set-up rides on the TCP bootstrap: the TCP mesh forms first (authenticated, settings
//! agreed), then each rank opens its devices, creates one UC queue pair per peer, and the
//! endpoints (GID, QP number, PSN, MTU, staging shape) are exchanged over TCP. Once every QP is
//! ready to receive with its receives posted, a second TCP round says so — UC drops what
//! arrives before a receive is posted. The TCP connections to rank 0 stay open as the control
//! channel: aborts and dead peers are reported within moments, whatever the RDMA side does.
//!
//! Set-up is in `setup.rs`; the data path in [`link`] (credits, sequence numbers, staging,
//! zero-copy) with its registration cache in [`regcache`]; the owned verbs objects in [`ffi`].

pub mod errors;
pub mod ffi;
pub mod link;
pub mod loader;
pub mod regcache;
mod setup;
pub mod topology;

pub use setup::ipv4_gids;
pub(crate) use setup::{attach, plan};

use super::progress::{Channel, Wake};
use super::{LinkKind, OnRecv, RecvOp, SendOp};
use crate::error::{Error, Result};
use link::Link;
use rustix::event::PollFd;
use std::time::Duration;

/// Apple's largest message (rdma-core devices allow more, but one size keeps peers agreed):
/// the largest chunk too.
pub const MAX_MESSAGE: usize = crate::config::MAX_CHUNK_BYTES;
/// The port boltccl uses on every device (Thunderbolt RDMA devices have one).
const PORT: u8 = 1;
/// How long a failed exchange waits for zero-copy sends to flush.
const QUIESCE: Duration = Duration::from_secs(1);
/// How long a completion may trail the data it reports (the NIC, or softverbs' receive threads,
/// writes it): a peer's last messages before it exits are waited for that long.
const ARRIVAL_LAG: Duration = Duration::from_millis(50);

/// One rank's RDMA links: a UC queue pair per cable to every cabled peer.
pub(crate) struct VerbsChannel {
    rank: usize,
    /// `links[peer][cable]`, cables in the lower rank's order; empty for this rank and for
    /// peers reached over TCP. A message goes on cable `part % cables`.
    links: Vec<Vec<Link>>,
}

impl VerbsChannel {
    fn link(&mut self, peer: usize, part: u64) -> Result<&mut Link> {
        let cables = self.links.get_mut(peer).filter(|l| !l.is_empty());
        let cables = cables.ok_or_else(|| Error::Internal(format!("no RDMA link to rank {peer}")))?;
        let n = cables.len() as u64;
        Ok(&mut cables[(part % n) as usize])
    }
}

impl Channel for VerbsChannel {
    fn kind(&self) -> LinkKind {
        LinkKind::Rdma
    }

    fn start(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        _: &mut OnRecv<'_>,
        mine: &dyn Fn(usize) -> bool,
        _: u32,
    ) -> Result<bool> {
        for l in self.links.iter_mut().flatten() {
            l.begin();
        }
        for (i, s) in sends.iter().enumerate().filter(|(_, s)| mine(s.peer)) {
            self.link(s.peer, s.header.part)?.add_send(i, s.data);
        }
        for (i, r) in recvs.iter().enumerate().filter(|(_, r)| mine(r.peer)) {
            self.link(r.peer, r.expect.part)?.add_recv(i);
        }
        Ok(false)
    }

    fn pump(&mut self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>], on_recv: &mut OnRecv<'_>) -> Result<bool> {
        let mut moved = false;
        for l in self.links.iter_mut().flatten() {
            moved |= l.pump_sends(sends)?;
            moved |= l.poll()?;
            moved |= l.deliver(recvs, on_recv)?;
            moved |= l.maybe_return_credits()?;
        }
        Ok(moved)
    }

    fn waiting_on(&self) -> Option<usize> {
        self.links.iter().flatten().find(|l| l.waiting()).map(|l| l.peer)
    }

    fn wake_on<'a>(&'a self, _: &mut Vec<PollFd<'a>>) -> Wake {
        // Apple's provider has no completion channel: poll the completion queues.
        Wake::Nap
    }

    fn arrival_lag(&self) -> Duration {
        ARRIVAL_LAG
    }

    fn quiesce(&mut self) {
        // The caller may free its buffers once the exchange returns: no zero-copy send may
        // still read them.
        for l in self.links.iter_mut().flatten() {
            l.quiesce(QUIESCE);
        }
    }

    fn can_resync(&self) -> bool {
        self.links.iter().flatten().all(Link::can_resync)
    }

    fn resync(&mut self, keep: &[usize], attempt: u32, timeout: Duration) -> Result<()> {
        // Markers both ways on every kept queue pair (see `link`): the queue pairs, their
        // memory and sequence numbers stay.
        let kept = |l: &&mut Link| keep.contains(&l.peer);
        for l in self.links.iter_mut().flatten().filter(kept) {
            l.start_resync(attempt);
        }
        let mut last = std::time::Instant::now();
        loop {
            let mut open = false;
            for l in self.links.iter_mut().flatten().filter(kept) {
                if l.resync_step()? {
                    last = std::time::Instant::now();
                }
                open |= !l.resynced();
            }
            if !open {
                break;
            }
            if last.elapsed() >= timeout {
                let l = self.links.iter().flatten().find(|l| keep.contains(&l.peer) && !l.resynced());
                return Err(Error::Timeout {
                    op: "shrink (resync of the RDMA links)".into(),
                    rank: l.map_or(self.rank, |l| l.peer),
                    after: timeout,
                });
            }
            // No completion channel (see wake_on): poll.
            std::thread::sleep(Duration::from_micros(50));
        }
        for l in self.links.iter_mut().flatten().filter(kept) {
            l.end_resync();
        }
        Ok(())
    }

    fn forget(&mut self, keep: &[usize]) {
        for (peer, cables) in self.links.iter_mut().enumerate() {
            if !keep.contains(&peer) {
                cables.clear();
            }
        }
    }
}

impl Drop for VerbsChannel {
    fn drop(&mut self) {
        let (mut raw, mut regs, mut hits, mut evicted, mut fallbacks, mut any) = (0, 0, 0, 0, 0, false);
        for (raw_sent, stats, _) in self.links.iter().flatten().filter_map(|l| l.zero_copy_stats()) {
            any = true;
            raw += raw_sent;
            regs += stats.registered;
            hits += stats.hits;
            evicted += stats.evicted;
            fallbacks += stats.fallbacks;
        }
        if any {
            tracing::info!(
                rank = self.rank,
                "RDMA zero-copy: {raw} packets sent from caller memory; {regs} registrations, {hits} cache hits, \
                 {evicted} evictions, {fallbacks} pieces staged for want of a registration"
            );
        }
    }
}
