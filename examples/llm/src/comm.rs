//! The collective-communication seam.
//!
//! Everything the model needs from the network goes through [`Comm`]: two `all_sum`s per layer,
//! one gather of the logit slices to rank 0 and one token broadcast per step (plus, once at the
//! end, a gather and a few pings for the timing report); expert-parallel mixture-of-experts
//! layers add one all_to_all_v each. It mirrors the subset of
//! `boltccl::Group` the example uses; tests wrap it to inject faults.

use crate::timing::{now_ns, CallLog};

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
    /// [`Comm::all_sum`] on f64 values. The quantised model's row-parallel layers send exact
    /// integer-valued partial sums this way (see [`crate::quant::dot`]), whose sum is the same
    /// in any order.
    fn all_sum_f64(&self, _x: &mut [f64]) -> anyhow::Result<()> {
        anyhow::bail!("this Comm cannot all_sum f64 values")
    }
    /// In-place broadcast of `x` from rank `root` to every rank.
    fn broadcast_u32(&self, x: &mut [u32], root: usize) -> anyhow::Result<()>;
    /// Every rank's `mine` (the same length everywhere), concatenated in rank order, the same
    /// bits on every rank: the greedy token's candidates ([`crate::model::Model::forward_greedy`])
    /// and the timing report.
    fn all_gather_u64(&self, mine: &[u64]) -> anyhow::Result<Vec<u64>>;
    /// Send `x` to rank `peer`, which calls [`Comm::recv_bytes`] with the same length (used by
    /// [`Comm::gather_f32`] and by the timing report's clock alignment).
    fn send_bytes(&self, _x: &[u8], _peer: usize) -> anyhow::Result<()> {
        anyhow::bail!("this Comm has no point-to-point send")
    }
    /// Receive `x` from rank `peer`.
    fn recv_bytes(&self, _x: &mut [u8], _peer: usize) -> anyhow::Result<()> {
        anyhow::bail!("this Comm has no point-to-point receive")
    }
    /// All-to-all with a count per peer: `send` holds `send_counts[q]` values for each rank `q`
    /// in turn, and `recv` gets `recv_counts[q]` values from each, in rank order. What rank `q`
    /// sends this rank must be what this rank expects from `q`. Used by expert-parallel
    /// mixture-of-experts layers to bring the experts' outputs back.
    fn all_to_all_v_f32(
        &self,
        _send: &[f32],
        _send_counts: &[usize],
        _recv: &mut [f32],
        _recv_counts: &[usize],
    ) -> anyhow::Result<()> {
        anyhow::bail!("this Comm has no all_to_all_v")
    }
    /// Gather with uneven parts: rank `r` passes its `counts[r]` values as `mine`; on `root`,
    /// `all` (length `counts.iter().sum()`) receives every rank's part in rank order. `all` is
    /// not touched on the other ranks (pass an empty slice). Empty parts are not sent at all.
    /// Every rank must call it, with the same `counts` and `root`.
    fn gather_f32(&self, mine: &[f32], all: &mut [f32], counts: &[usize], root: usize) -> anyhow::Result<()> {
        let (rank, size) = (self.rank(), self.size());
        anyhow::ensure!(counts.len() == size && root < size, "gather: {} counts for {size} ranks", counts.len());
        anyhow::ensure!(
            mine.len() == counts[rank],
            "gather: rank {rank} has {} values, not {}",
            mine.len(),
            counts[rank]
        );
        if rank != root {
            return if mine.is_empty() { Ok(()) } else { self.send_bytes(bytemuck::cast_slice(mine), root) };
        }
        let total: usize = counts.iter().sum();
        anyhow::ensure!(all.len() == total, "gather: output holds {} values, not {total}", all.len());
        let mut rest = all;
        for (r, &n) in counts.iter().enumerate() {
            let (part, tail) = rest.split_at_mut(n);
            rest = tail;
            if r == root {
                part.copy_from_slice(mine);
            } else if n > 0 {
                self.recv_bytes(bytemuck::cast_slice_mut(part), r)?;
            }
        }
        Ok(())
    }
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
    fn all_sum_f64(&self, _x: &mut [f64]) -> anyhow::Result<()> {
        Ok(())
    }
    fn broadcast_u32(&self, _x: &mut [u32], _root: usize) -> anyhow::Result<()> {
        Ok(())
    }
    fn all_gather_u64(&self, mine: &[u64]) -> anyhow::Result<Vec<u64>> {
        Ok(mine.to_vec())
    }
    fn all_to_all_v_f32(
        &self,
        send: &[f32],
        send_counts: &[usize],
        recv: &mut [f32],
        recv_counts: &[usize],
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            send_counts == [send.len()] && recv_counts == send_counts && recv.len() == send.len(),
            "all_to_all_v on one rank: sends {send_counts:?} of {} values, expects {recv_counts:?} in {}",
            send.len(),
            recv.len()
        );
        recv.copy_from_slice(send);
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
    fn all_sum_f64(&self, x: &mut [f64]) -> anyhow::Result<()> {
        boltccl::Group::all_sum(self, x)?;
        Ok(())
    }
    fn broadcast_u32(&self, x: &mut [u32], root: usize) -> anyhow::Result<()> {
        boltccl::Group::broadcast(self, x, root)?;
        Ok(())
    }
    fn all_gather_u64(&self, mine: &[u64]) -> anyhow::Result<Vec<u64>> {
        let mut out = vec![0u64; mine.len() * Comm::size(self)];
        boltccl::Group::all_gather(self, mine, &mut out)?;
        Ok(out)
    }
    fn all_to_all_v_f32(
        &self,
        send: &[f32],
        send_counts: &[usize],
        recv: &mut [f32],
        recv_counts: &[usize],
    ) -> anyhow::Result<()> {
        boltccl::Group::all_to_all_v(self, send, send_counts, recv, recv_counts)?;
        Ok(())
    }
    fn send_bytes(&self, x: &[u8], peer: usize) -> anyhow::Result<()> {
        boltccl::Group::send(self, x, peer)?;
        Ok(())
    }
    fn recv_bytes(&self, x: &mut [u8], peer: usize) -> anyhow::Result<()> {
        boltccl::Group::recv(self, x, peer)?;
        Ok(())
    }
}

/// Wraps a [`Comm`] and logs when each `all_sum` (f32 or f64) or `all_to_all_v` was entered and left (for the "share of
/// time in all_sum" figures the CLI prints; see [`crate::timing`]).
pub struct TimedComm<C> {
    inner: C,
    log: CallLog,
}

impl<C: Comm> TimedComm<C> {
    /// Wraps `inner`.
    pub fn new(inner: C) -> Self {
        Self { inner, log: CallLog::default() }
    }
    /// The all_sum calls so far.
    pub fn log(&self) -> &CallLog {
        &self.log
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
        let enter = now_ns();
        let r = self.inner.all_sum(x);
        self.log.push(enter, now_ns());
        r
    }
    fn all_sum_f64(&self, x: &mut [f64]) -> anyhow::Result<()> {
        let enter = now_ns();
        let r = self.inner.all_sum_f64(x);
        self.log.push(enter, now_ns());
        r
    }
    fn all_to_all_v_f32(
        &self,
        send: &[f32],
        send_counts: &[usize],
        recv: &mut [f32],
        recv_counts: &[usize],
    ) -> anyhow::Result<()> {
        // Logged with the all_sums: in an expert-parallel layer it takes the MLP all_sum's place.
        let enter = now_ns();
        let r = self.inner.all_to_all_v_f32(send, send_counts, recv, recv_counts);
        self.log.push(enter, now_ns());
        r
    }
    fn broadcast_u32(&self, x: &mut [u32], root: usize) -> anyhow::Result<()> {
        self.inner.broadcast_u32(x, root)
    }
    fn all_gather_u64(&self, mine: &[u64]) -> anyhow::Result<Vec<u64>> {
        self.inner.all_gather_u64(mine)
    }
    fn send_bytes(&self, x: &[u8], peer: usize) -> anyhow::Result<()> {
        self.inner.send_bytes(x, peer)
    }
    fn recv_bytes(&self, x: &mut [u8], peer: usize) -> anyhow::Result<()> {
        self.inner.recv_bytes(x, peer)
    }
    fn gather_f32(&self, mine: &[f32], all: &mut [f32], counts: &[usize], root: usize) -> anyhow::Result<()> {
        self.inner.gather_f32(mine, all, counts, root)
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
    fn all_sum_f64(&self, x: &mut [f64]) -> anyhow::Result<()> {
        (**self).all_sum_f64(x)
    }
    fn broadcast_u32(&self, x: &mut [u32], root: usize) -> anyhow::Result<()> {
        (**self).broadcast_u32(x, root)
    }
    fn all_to_all_v_f32(
        &self,
        send: &[f32],
        send_counts: &[usize],
        recv: &mut [f32],
        recv_counts: &[usize],
    ) -> anyhow::Result<()> {
        (**self).all_to_all_v_f32(send, send_counts, recv, recv_counts)
    }
    fn all_gather_u64(&self, mine: &[u64]) -> anyhow::Result<Vec<u64>> {
        (**self).all_gather_u64(mine)
    }
    fn send_bytes(&self, x: &[u8], peer: usize) -> anyhow::Result<()> {
        (**self).send_bytes(x, peer)
    }
    fn recv_bytes(&self, x: &mut [u8], peer: usize) -> anyhow::Result<()> {
        (**self).recv_bytes(x, peer)
    }
    fn gather_f32(&self, mine: &[f32], all: &mut [f32], counts: &[usize], root: usize) -> anyhow::Result<()> {
        (**self).gather_f32(mine, all, counts, root)
    }
}
