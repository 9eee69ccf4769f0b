//! The collective-communication seam.
//!
//! Everything the model needs from the network goes through [`Comm`]: two `all_sum`s per layer
//! and one token broadcast per step. It mirrors the subset of `boltccl::Group` the example uses,
//! so swapping in the real library is one `impl Comm for boltccl::Group` (see `BoltGroup` once
//! boltccl lands on main).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Minimal collective interface used by the tensor-parallel model.
///
/// Contract (same as boltccl's): every rank calls the same collectives in the same order, and
/// `all_sum` returns the *bitwise identical* result on every rank, otherwise the replicated
/// parts of the model (residual stream, norms) could drift apart between ranks.
pub trait Comm: Send + Sync {
    /// This rank's index in `0..size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn size(&self) -> usize;
    /// In-place element-wise sum of `x` over all ranks.
    fn all_sum(&self, x: &mut [f32]) -> anyhow::Result<()>;
    /// In-place broadcast of `x` from rank `root` to every rank.
    fn broadcast_u32(&self, x: &mut [u32], root: usize) -> anyhow::Result<()>;
}

/// A group of one: the TP=1 baseline. Collectives are no-ops.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleRank;

impl Comm for SingleRank {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_sum(&self, _x: &mut [f32]) -> anyhow::Result<()> {
        Ok(())
    }
    fn broadcast_u32(&self, _x: &mut [u32], _root: usize) -> anyhow::Result<()> {
        Ok(())
    }
}

/// The real thing: a boltccl group, over TCP or RDMA between processes, or in memory between
/// threads (`boltccl::Group::local_world`). boltccl guarantees the same bits on every rank,
/// which keeps the replicated residual stream identical across ranks.
impl Comm for boltccl::Group {
    fn rank(&self) -> usize {
        boltccl::Group::rank(self)
    }
    fn size(&self) -> usize {
        boltccl::Group::size(self)
    }
    fn all_sum(&self, x: &mut [f32]) -> anyhow::Result<()> {
        boltccl::Group::all_sum(self, x)?;
        Ok(())
    }
    fn broadcast_u32(&self, x: &mut [u32], root: usize) -> anyhow::Result<()> {
        boltccl::Group::broadcast(self, x, root)?;
        Ok(())
    }
}

/// Wraps a [`Comm`] and measures time spent inside `all_sum` (for the "share of time in
/// all_sum" figure the CLI prints).
pub struct TimedComm<C> {
    inner: C,
    all_sum_time: Mutex<Duration>,
    all_sum_calls: Mutex<u64>,
}

impl<C: Comm> TimedComm<C> {
    /// Wraps `inner`.
    pub fn new(inner: C) -> Self {
        Self { inner, all_sum_time: Mutex::new(Duration::ZERO), all_sum_calls: Mutex::new(0) }
    }
    /// Total time spent in `all_sum` so far, and the number of calls.
    pub fn all_sum_stats(&self) -> (Duration, u64) {
        (*self.all_sum_time.lock().unwrap(), *self.all_sum_calls.lock().unwrap())
    }
}

impl<C: Comm> Comm for TimedComm<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_sum(&self, x: &mut [f32]) -> anyhow::Result<()> {
        let t = Instant::now();
        let r = self.inner.all_sum(x);
        *self.all_sum_time.lock().unwrap() += t.elapsed();
        *self.all_sum_calls.lock().unwrap() += 1;
        r
    }
    fn broadcast_u32(&self, x: &mut [u32], root: usize) -> anyhow::Result<()> {
        self.inner.broadcast_u32(x, root)
    }
}

impl<C: Comm + ?Sized> Comm for &C {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn all_sum(&self, x: &mut [f32]) -> anyhow::Result<()> {
        (**self).all_sum(x)
    }
    fn broadcast_u32(&self, x: &mut [u32], root: usize) -> anyhow::Result<()> {
        (**self).broadcast_u32(x, root)
    }
}
