//! RDMA verbs transport: one UC queue pair per cabled peer; pairs the device matrix leaves
//! without a device (a ring, a mixed group) use the TCP mesh, in the same progress loop.
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

pub(crate) use setup::connect;
pub use setup::ipv4_gids;

use crate::error::{Error, Result};
use crate::transport::tcp::TcpTransport;
use crate::transport::{Limits, OnRecv, RecvOp, SendOp, Transport, WaitPolicy};
use link::Link;
use std::time::{Duration, Instant};

/// Apple's largest message; rdma-core devices allow more, but one size keeps peers agreed.
pub const MAX_MESSAGE: usize = 16_773_120;
/// The port boltccl uses on every device (Thunderbolt RDMA devices have one).
const PORT: u8 = 1;
/// How often the progress loop reads the TCP control channel.
const CONTROL_CHECK: Duration = Duration::from_millis(20);
/// Sleep between polls once the spin budget is spent (no completion channel on Apple).
const NAP: Duration = Duration::from_micros(100);

/// One rank's end of a verbs mesh.
pub struct VerbsTransport {
    rank: usize,
    size: usize,
    /// `links[peer][cable]`, cables in the lower rank's order; empty for this rank and for
    /// peers reached over TCP. A message goes on cable `part % cables`.
    links: Vec<Vec<Link>>,
    /// Peers without an RDMA device: their messages go over the TCP mesh.
    over_tcp: Vec<bool>,
    /// The whole matrix's cabling (every rank checked it reads the same at set-up).
    cabled: Vec<Vec<bool>>,
    /// Bootstrap mesh: the control channel (aborts, dead peers) and the uncabled pairs.
    tcp: TcpTransport,
    wait: WaitPolicy,
    aborted: bool,
}

impl VerbsTransport {
    fn link(&mut self, peer: usize, part: u32) -> Result<&mut Link> {
        let cables = self.links.get_mut(peer).filter(|l| !l.is_empty());
        let cables = cables.ok_or_else(|| Error::Internal(format!("no RDMA link to rank {peer}")))?;
        let n = cables.len();
        Ok(&mut cables[part as usize % n])
    }

    fn run(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
        limits: &Limits,
    ) -> Result<()> {
        for l in self.links.iter_mut().flatten() {
            l.begin();
        }
        let over_tcp = &self.over_tcp;
        let use_tcp = over_tcp.iter().any(|&t| t);
        if use_tcp {
            self.tcp.begin_subset(sends, recvs, &|p| over_tcp[p]);
        }
        for (i, s) in sends.iter().enumerate() {
            if !self.over_tcp[s.peer] {
                self.link(s.peer, s.header.part)?.add_send(i, s.data);
            }
        }
        for (i, r) in recvs.iter().enumerate() {
            if !self.over_tcp[r.peer] {
                self.link(r.peer, r.expect.part)?.add_recv(i);
            }
        }
        let mut last_progress = Instant::now();
        let mut last_control = last_progress;
        loop {
            let mut moved = false;
            let mut busy = false;
            for l in self.links.iter_mut().flatten() {
                moved |= l.pump_sends(sends)?;
                moved |= l.poll()?;
                moved |= l.deliver(recvs, on_recv)?;
                moved |= l.maybe_return_credits()?;
                busy |= !l.done();
            }
            if use_tcp {
                moved |= self.tcp.pump(sends, recvs, on_recv)?;
                busy |= self.tcp.busy();
            }
            if !busy {
                return Ok(());
            }
            let now = Instant::now();
            if now.duration_since(last_control) >= CONTROL_CHECK {
                last_control = now;
                if let Some(e) = self.tcp.check_control() {
                    return Err(e);
                }
                limits.interrupted()?;
            }
            if moved {
                last_progress = now;
                continue;
            }
            if !self.wait.pause(now.duration_since(last_progress)) {
                continue;
            }
            if now >= last_progress + limits.timeout {
                let rank = self
                    .links
                    .iter()
                    .flatten()
                    .find(|l| l.waiting())
                    .map(|l| l.peer)
                    .or_else(|| self.tcp.waiting_on())
                    .unwrap_or(self.rank);
                return Err(Error::Timeout { op: limits.op.into(), rank, after: limits.timeout });
            }
            std::thread::sleep(NAP);
        }
    }
}

impl Drop for VerbsTransport {
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

impl Transport for VerbsTransport {
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
    ) -> Result<()> {
        if self.aborted {
            return Err(Error::Internal("exchange on an aborted transport".into()));
        }
        let r = self.run(sends, recvs, on_recv, limits);
        if r.is_err() {
            // The caller may free its buffers once we return: no zero-copy send may still read them.
            for l in self.links.iter_mut().flatten() {
                l.quiesce(Duration::from_secs(1));
            }
        }
        match r {
            // A peer's failure shows up on RDMA as silence; the control channel usually knows
            // the real cause. Errors found here (loss, bad completions) need no explaining.
            Err(e @ Error::Timeout { .. }) => Err(self.tcp.explain(e)),
            other => other,
        }
    }

    fn abort(&mut self, cause: &Error) {
        if self.aborted {
            return;
        }
        self.aborted = true;
        self.tcp.abort(cause);
    }

    fn cabling(&self) -> Option<Vec<Vec<bool>>> {
        Some(self.cabled.clone())
    }
}
