//! Transports move framed messages between ranks; algorithms decide which.
//!
//! The whole interface is one call, [`Transport::exchange`]: a batch of sends and receives
//! that proceed concurrently on all links, in list order per peer, with a callback as each
//! receive completes so the caller can reduce that piece while the rest is still on the wire.
//! That is enough for every algorithm boltccl has (mesh, direct reduce-scatter/all-gather,
//! bidirectional ring, point-to-point), and small enough that TCP, the in-process transport
//! and RDMA verbs each implement it in one file.

pub mod mem;
pub mod tcp;
pub mod verbs;

use crate::error::Error;
use crate::wire::Header;
use std::time::Duration;

/// One message to send: a header (the transport sets nothing in it) and its payload.
pub struct SendOp<'a> {
    /// Destination rank (transport numbering).
    pub peer: usize,
    /// Header; `len` must equal `data.len()`.
    pub header: Header,
    /// Payload.
    pub data: &'a [u8],
}

/// One message to receive into a buffer, and the header it must carry.
pub struct RecvOp<'a> {
    /// Source rank (transport numbering).
    pub peer: usize,
    /// The header the sender must have sent; any difference is an error.
    pub expect: Header,
    /// Where the payload lands; its length must equal `expect.len`.
    pub buf: &'a mut [u8],
}

/// A check run while a call is blocked (never on the fast path): returning `true` stops the
/// call with [`Error::Interrupted`]. Python uses it to let Ctrl-C through.
pub type InterruptCheck = std::sync::Arc<dyn Fn() -> bool + Send + Sync>;

/// How often a blocked call runs the interrupt check.
pub const INTERRUPT_EVERY: Duration = Duration::from_millis(50);

/// Limits for one exchange.
#[derive(Clone)]
pub struct Limits {
    /// Fail if nothing moves for this long.
    pub timeout: Duration,
    /// Name of the call, for error messages.
    pub op: &'static str,
    /// Run while blocked; `true` interrupts the call.
    pub interrupt: Option<InterruptCheck>,
}

impl Limits {
    /// Run the interrupt check, if any.
    pub fn interrupted(&self) -> Result<(), Error> {
        match &self.interrupt {
            Some(f) if f() => Err(Error::Interrupted { op: self.op.to_string() }),
            _ => Ok(()),
        }
    }
}

/// Called with all receives and the index of the one that just completed.
pub type OnRecv<'c> = dyn FnMut(&[RecvOp<'_>], usize) -> Result<(), Error> + 'c;

/// A way to move messages between the ranks of one job.
pub trait Transport: Send {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Run `sends` and `recvs` to completion, all peers concurrently, in list order per peer.
    /// Calls `on_recv(recvs, i)` when receive `i` has arrived and its header checked.
    /// Returns the first error: a dead peer, a peer's abort, a mismatched header, a timeout.
    fn exchange(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
        limits: &Limits,
    ) -> Result<(), Error>;
    /// Best effort, never blocking for long: tell every rank that this job is failing because
    /// of `cause`, and close the data links so no one waits on this rank.
    fn abort(&mut self, cause: &Error);
    /// Which pairs of ranks have a fast direct link (`cabled[i][j]`), the same on every rank;
    /// `None` when every pair is alike (TCP, in memory). Algorithms are chosen from it.
    fn cabling(&self) -> Option<Vec<Vec<bool>>> {
        None
    }
}

/// How long a waiting rank polls before sleeping, when it has a core to itself.
pub const DEFAULT_POLL: Duration = Duration::from_millis(1);
/// Longest hard spin: on loopback a hard spinner starves the kernel's deferred network work
/// (ksoftirqd) on its core, delaying the very packet it waits for.
pub const MAX_HARD_SPIN: Duration = Duration::from_micros(50);

/// How a blocked exchange waits for progress: spin hard (lowest latency), then yield the CPU
/// between checks (lets co-located ranks and the kernel's network work run), then sleep in
/// the kernel. Hard spinning is only allowed when this host runs no more ranks than cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Spin without yielding for this long after the last progress.
    pub hard: Duration,
    /// Keep checking, yielding between checks, until this long after the last progress.
    pub soft: Duration,
}

/// What a waiting loop should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStep {
    /// Check again at once.
    Spin,
    /// Yield the CPU, then check again.
    Yield,
    /// Sleep until the transport has something to do.
    Block,
}

impl WaitPolicy {
    /// The policy for `local_ranks` ranks on a host with `cores` cores; `budget` is
    /// `BOLTCCL_SPIN_US` when set.
    ///
    /// With a core per rank, waiting costs nobody anything, and a rank that has gone to sleep
    /// wakes tens of microseconds late (longer in a VM), so poll for up to 1 ms: hard for the
    /// first quarter (at most [`MAX_HARD_SPIN`]), then yielding. With more ranks than cores,
    /// any CPU a waiting rank uses is taken from the rank it waits for: sleep at once (an
    /// explicit budget is still honoured, as yielding only). Measured with the inference
    /// example at 3 ranks on 2 cores: all_sum's communication share fell from 14% to 7%.
    pub fn for_host(local_ranks: usize, cores: usize, budget: Option<Duration>) -> WaitPolicy {
        if local_ranks > cores {
            return WaitPolicy { hard: Duration::ZERO, soft: budget.unwrap_or(Duration::ZERO) };
        }
        let soft = budget.unwrap_or(DEFAULT_POLL);
        WaitPolicy { hard: (soft / 4).min(MAX_HARD_SPIN), soft }
    }

    /// Spin or yield as the policy says for `idle` without progress, and return `false`
    /// (check again); return `true` when the caller should sleep instead. The yielding phase
    /// matters on loopback, where the kernel may hand delivery to ksoftirqd, which a hard
    /// spinner would starve until it slept.
    pub fn pause(&self, idle: Duration) -> bool {
        match self.step(idle) {
            WaitStep::Spin => std::hint::spin_loop(),
            WaitStep::Yield => std::thread::yield_now(),
            WaitStep::Block => return true,
        }
        false
    }

    /// The next step after `idle` without progress.
    pub fn step(&self, idle: Duration) -> WaitStep {
        if idle < self.hard {
            WaitStep::Spin
        } else if idle < self.soft {
            WaitStep::Yield
        } else {
            WaitStep::Block
        }
    }
}

/// The abort frame's view of an error: who is to blame, whether that rank is gone, and why.
pub(crate) fn abort_fields(me: usize, cause: &Error) -> (usize, bool, String) {
    match cause {
        Error::PeerLost { rank, detail } => (*rank, true, detail.clone()),
        Error::Aborted { rank, reason } => (*rank, false, reason.clone()),
        Error::Poisoned(inner) => abort_fields(me, inner),
        other => (me, false, other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_spins_hard_when_ranks_outnumber_cores() {
        let us = Duration::from_micros;
        let p = WaitPolicy::for_host(2, 2, None);
        assert_eq!(
            (p.step(us(1)), p.step(us(60)), p.step(us(1100))),
            (WaitStep::Spin, WaitStep::Yield, WaitStep::Block)
        );
        let p = WaitPolicy::for_host(4, 2, None);
        assert_eq!(p.step(us(0)), WaitStep::Block);
        let p = WaitPolicy::for_host(4, 2, Some(us(50)));
        assert_eq!((p.step(us(0)), p.step(us(60))), (WaitStep::Yield, WaitStep::Block));
        let p = WaitPolicy::for_host(1, 8, Some(Duration::ZERO));
        assert_eq!(p.step(us(0)), WaitStep::Block);
        let p = WaitPolicy::for_host(1, 8, Some(us(400)));
        assert_eq!(
            (p.step(us(40)), p.step(us(60)), p.step(us(400))),
            (WaitStep::Spin, WaitStep::Yield, WaitStep::Block)
        );
    }
}
