//! Transports move framed messages between ranks; algorithms decide which.
//!
//! The whole interface is one call, [`Transport::exchange`]: a batch of sends and receives
//! that proceed concurrently on all links, in list order per peer, with a callback as each
//! receive completes so the caller can reduce that piece while the rest is still on the wire.
//! That is enough for every algorithm boltccl has (mesh, recursive doubling, direct
//! reduce-scatter/all-gather, bidirectional ring, point-to-point).
//!
//! Every transport is a [`mesh::Mesh`]: per peer, one [`progress::Channel`] (TCP sockets, RDMA
//! queue pairs, in-process queues) chosen by [`connect`], all driven by the one progress
//! engine in [`progress`], with a [`progress::Control`] plane that spreads aborts.

pub(crate) mod control;
pub(crate) mod mem;
pub(crate) mod mesh;
pub(crate) mod progress;
pub(crate) mod shm;
pub(crate) mod stream;
pub(crate) mod tcp;
pub(crate) mod verbs;

use crate::algo::select::Cabling;
use crate::config::{Backend, Config};
use crate::error::{Error, Result};
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

/// Limits for one exchange.
#[derive(Clone)]
pub struct Limits {
    /// Fail if nothing moves for this long.
    pub timeout: Duration,
    /// Name of the call, for error messages.
    pub op: &'static str,
    /// Run while blocked; `true` interrupts the call.
    pub interrupt: Option<InterruptCheck>,
    /// The call's size in bytes (its count of elements), for the wait policy.
    pub bytes: usize,
}

impl Limits {
    /// Run the interrupt check, if any.
    pub fn interrupted(&self) -> Result<()> {
        match &self.interrupt {
            Some(f) if f() => Err(Error::Interrupted { op: self.op.to_string() }),
            _ => Ok(()),
        }
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
        limits: &Limits,
    ) -> Result<()>;
    /// Best effort, never blocking for long: tell every rank that this job is failing because
    /// of `cause`, and close the data links so no one waits on this rank.
    fn abort(&mut self, cause: &Error);
    /// Which pairs of ranks have a fast direct link; algorithms are chosen from it.
    fn cabling(&self) -> Cabling;
    /// What carries the messages to `peer`.
    fn link_kind(&self, peer: usize) -> LinkKind;
}

/// Form the links `cfg` describes: the policy of which transport serves which pair.
///
/// One rank: nothing to connect. Otherwise the TCP bootstrap forms the group (authenticated,
/// settings agreed) and its mesh carries every pair at first. Then, as `BOLTCCL_BACKEND`
/// allows: ranks on one host (the same kernel and network namespace) move to shared memory,
/// and the pairs the device matrix cables move to RDMA queue pairs (where the verbs library
/// lists devices); the rest stay on TCP, all in one progress loop.
pub(crate) fn connect(cfg: &Config) -> Result<Box<dyn Transport>> {
    if cfg.world_size == 1 {
        return Ok(Box::new(mem::world(1, cfg.shm_ring_bytes, cfg.shm_pull_bytes).pop().expect("one rank")));
    }
    let shm = matches!(cfg.backend, Backend::Shm | Backend::Auto);
    let rdma = cfg.backend == Backend::Verbs || (cfg.backend == Backend::Auto && rdma_available(cfg));
    // What this rank can check alone fails before it waits for the others.
    let rdma = rdma.then(|| verbs::plan(cfg)).transpose()?;
    let offer = if shm { shm_offer() } else { None };
    let links = ["tcp", if offer.is_some() { "+shm" } else { "" }, if rdma.is_some() { "+rdma" } else { "" }].concat();
    let boot = crate::bootstrap::connect(cfg, &links, offer.as_ref().map(|o| o.name()))?;
    let (peers, job) = (boot.peers.clone(), boot.job);
    let mut mesh = mesh::Mesh::over_tcp(cfg, boot)?;
    let local = shm::setup::local_peers(&peers, cfg.rank);
    if let Some(plan) = rdma {
        verbs::attach(&mut mesh, plan, cfg, &local)?;
    }
    if let Some(offer) = offer {
        shm::setup::attach(&mut mesh, offer, &peers, job, cfg)?;
        // Every rank's host, labelled by its lowest rank: what every rank's shared-memory
        // links are, known alike everywhere from bootstrap, so algorithms can use two levels.
        let hosts = (0..peers.len()).map(|r| shm::setup::local_peers(&peers, r).into_iter().fold(r, usize::min));
        mesh.set_hosts(hosts.collect());
    }
    Ok(Box::new(mesh))
}

/// This rank's offer of shared memory, or none (saying why) when it cannot listen for it.
fn shm_offer() -> Option<shm::setup::Offer> {
    match shm::setup::Offer::bind() {
        Ok(o) => Some(o),
        Err(e) => {
            tracing::warn!("shared memory unavailable ({e}); ranks on this host use TCP");
            None
        }
    }
}

/// For `BOLTCCL_BACKEND=auto`: whether a device matrix is configured and the verbs library
/// lists devices — saying why not in the log. Decided before any rank connects, from what
/// this node has; bootstrap then checks the choice like any agreed setting, so a node without
/// RDMA is named at start-up instead of failing on the first collective.
fn rdma_available(cfg: &Config) -> bool {
    if cfg.ibv_devices.is_none() {
        tracing::debug!("BOLTCCL_BACKEND=auto: no RDMA device matrix configured (BOLTCCL_IBV_DEVICES)");
        return false;
    }
    match crate::probe::RdmaProbe::load(cfg.ibv_library.as_deref()).device_names() {
        Ok(names) if !names.is_empty() => true,
        Ok(_) => {
            tracing::warn!("BOLTCCL_BACKEND=auto: the verbs library lists no RDMA device; using TCP");
            false
        }
        Err(e) => {
            tracing::warn!("BOLTCCL_BACKEND=auto: RDMA unavailable ({e}); using TCP");
            false
        }
    }
}
