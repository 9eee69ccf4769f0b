//! Transports move framed messages between ranks; algorithms decide which.
//!
//! The whole interface is one call, [`Transport::exchange`]: a batch of sends and receives
//! that proceed concurrently on all links, in list order per peer, with a callback as each
//! receive completes so the caller can reduce that piece while the rest is still on the wire.
//! That is enough for every algorithm boltccl has (mesh, recursive doubling, direct
//! reduce-scatter/all-gather, bidirectional ring, point-to-point).
//!
//! Every transport is a [`links::Links`]: per peer, one [`progress::Channel`] (TCP sockets, RDMA
//! queue pairs, in-process queues) chosen by [`crate::connect`], all driven by the one
//! progress engine in [`progress`], with a [`progress::Control`] plane that spreads aborts.

pub(crate) mod control;
pub(crate) mod links;
pub(crate) mod mem;
pub(crate) mod progress;
pub(crate) mod shm;
pub(crate) mod stream;
pub(crate) mod tcp;
pub(crate) mod verbs;

use crate::error::{Error, Result};
use crate::topology::Cabling;
use crate::wire::Header;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// Where a group keeps its interrupt check: read only when the check is due, so a call that
/// does not block never takes its lock.
pub(crate) type InterruptSlot = parking_lot::Mutex<Option<InterruptCheck>>;

/// Limits for one exchange.
#[derive(Clone)]
pub struct Limits<'a> {
    /// Fail if nothing moves for this long.
    pub timeout: Duration,
    /// Name of the call, for error messages.
    pub op: &'static str,
    /// Run while blocked; `true` interrupts the call.
    pub interrupt: Option<&'a InterruptSlot>,
    /// The call's size in bytes (its count of elements), for the wait policy.
    pub bytes: usize,
    /// Set from another thread (`Group::abort`): the call stops at once.
    pub abort: Option<&'a AbortSignal>,
}

impl Limits<'_> {
    /// The abort another thread raised, if any.
    pub fn aborted(&self) -> Result<()> {
        match self.abort.and_then(AbortSignal::error) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Run the interrupt check, if any.
    pub fn interrupted(&self) -> Result<()> {
        // Not called under the lock: the check may wait for a lock (Python's) whose holder
        // is setting a new check.
        let check = self.interrupt.and_then(|slot| slot.lock().clone());
        match check {
            Some(f) if f() => Err(Error::Interrupted { op: self.op.to_string() }),
            _ => Ok(()),
        }
    }
}

/// A request to stop, made from any thread while a call may be blocked on another: a flag
/// the progress engine reads on every turn, and a socket that wakes it from `poll`.
pub struct AbortSignal {
    requested: AtomicBool,
    cause: parking_lot::Mutex<Option<Error>>,
    /// Written once when the abort is requested; the engine polls the reading end.
    wake: (UnixStream, UnixStream),
}

impl AbortSignal {
    /// A signal not yet raised.
    pub fn new() -> std::io::Result<AbortSignal> {
        let (r, w) = UnixStream::pair()?;
        r.set_nonblocking(true)?;
        w.set_nonblocking(true)?;
        Ok(AbortSignal { requested: AtomicBool::new(false), cause: parking_lot::Mutex::new(None), wake: (r, w) })
    }

    /// Raise it with `cause` (the first cause stays); true the first time. Never blocks.
    pub fn raise(&self, cause: Error) -> bool {
        if self.requested.swap(true, Ordering::SeqCst) {
            return false;
        }
        *self.cause.lock() = Some(cause);
        // A full socket buffer already wakes the reader: nothing to wait for.
        let _ = (&self.wake.1).write(&[1]);
        true
    }

    /// Whether it was raised.
    pub fn raised(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// The error a call stopped by it returns.
    #[inline]
    pub fn error(&self) -> Option<Error> {
        if !self.raised() {
            return None;
        }
        Some(self.cause())
    }

    #[cold]
    fn cause(&self) -> Error {
        self.cause.lock().clone().unwrap_or_else(|| Error::Internal("abort raised without a cause".into()))
    }

    /// The descriptor that becomes readable once raised.
    pub fn fd(&self) -> rustix::fd::BorrowedFd<'_> {
        use rustix::fd::AsFd;
        self.wake.0.as_fd()
    }
}

/// What carries a pair's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// The rank itself: nothing moves.
    Local,
    /// Shared memory (both ranks on one host).
    SharedMemory,
    /// RDMA verbs queue pairs.
    Rdma,
    /// TCP sockets.
    Tcp,
}

impl LinkKind {
    /// How the kind is named in messages.
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Local => "local",
            LinkKind::SharedMemory => "shared memory",
            LinkKind::Rdma => "RDMA",
            LinkKind::Tcp => "TCP",
        }
    }
}

/// Called with all receives and the index of the one that just completed.
pub type OnRecv<'c> = dyn FnMut(&[RecvOp<'_>], usize) -> Result<()> + 'c;

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
        limits: &Limits<'_>,
    ) -> Result<()>;
    /// Best effort, never blocking for long: tell every rank that this job is failing because
    /// of `cause`, and close the data links so no one waits on this rank.
    fn abort(&mut self, cause: &Error);
    /// Which pairs of ranks have a fast direct link; algorithms are chosen from it.
    fn cabling(&self) -> Cabling;
    /// What carries the messages to `peer`.
    fn link_kind(&self, peer: usize) -> LinkKind;
    /// Agree with the other ranks of `candidates` (transport ranks, this one among them) who
    /// is still there, and bring the links among them back to a clean start, reusing them:
    /// the agreed ranks, in order. Each wait is bounded by `timeout`; a rank that does not take
    /// part within it is left out. See `Group::shrink`.
    fn shrink(&mut self, _candidates: &[usize], _timeout: Duration) -> Result<Vec<usize>> {
        Err(Error::invalid("this transport cannot shrink a group"))
    }
}
