//! The collective-communication seam.
//!
//! Everything the model needs from the network goes through [`Comm`]: two `all_sum`s per layer
//! and one token broadcast per step. It mirrors the subset of `boltccl::Group` the example uses,
//! so swapping in the real library is one `impl Comm for boltccl::Group` (see `BoltGroup` once
//! boltccl lands on main).

use std::sync::{Arc, Condvar, Mutex};
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

/// Shared state for [`LocalThreadComm`]: one slot per rank plus a barrier.
struct LocalShared {
    slots: Vec<Mutex<Vec<f32>>>,
    tokens: Mutex<Vec<u32>>,
    barrier: PoisonableBarrier,
}

/// A barrier that fails instead of waiting forever once any rank has gone away (returned an
/// error or panicked and dropped its handle): without it, one failing rank would hang the
/// others, the classic distributed-inference failure mode.
struct PoisonableBarrier {
    n: usize,
    state: Mutex<(usize, u64, bool)>, // (arrived, generation, poisoned)
    cv: Condvar,
}

impl PoisonableBarrier {
    fn new(n: usize) -> Self {
        Self {
            n,
            state: Mutex::new((0, 0, false)),
            cv: Condvar::new(),
        }
    }

    fn wait(&self) -> anyhow::Result<()> {
        let mut st = self.state.lock().unwrap();
        anyhow::ensure!(
            !st.2,
            "a peer rank left the group (error or panic on that rank)"
        );
        let gen = st.1;
        st.0 += 1;
        if st.0 == self.n {
            st.0 = 0;
            st.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        // The generation check comes first: a barrier that completed is a success even if a
        // peer leaves right afterwards.
        while st.1 == gen {
            anyhow::ensure!(
                !st.2,
                "a peer rank left the group (error or panic on that rank)"
            );
            st = self.cv.wait(st).unwrap();
        }
        Ok(())
    }

    fn poison(&self) {
        self.state.lock().unwrap().2 = true;
        self.cv.notify_all();
    }
}

/// In-process ranks (one thread each) — a **test/demo helper**, not a transport.
///
/// Stands in for `boltccl::Group::local_world(n)` until boltccl lands. `all_sum` adds the
/// contributions in rank order 0..n on every rank, so all ranks get the bitwise same result
/// (the determinism boltccl guarantees).
pub struct LocalThreadComm {
    rank: usize,
    shared: Arc<LocalShared>,
}

impl LocalThreadComm {
    /// Creates `n` connected ranks; hand one to each thread.
    pub fn world(n: usize) -> Vec<LocalThreadComm> {
        assert!(n > 0, "world size must be at least 1");
        let shared = Arc::new(LocalShared {
            slots: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            tokens: Mutex::new(Vec::new()),
            barrier: PoisonableBarrier::new(n),
        });
        (0..n)
            .map(|rank| LocalThreadComm {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }
}

impl Drop for LocalThreadComm {
    /// A rank that drops its handle can no longer take part; wake and fail anyone waiting.
    /// (After a clean run every rank is past its last collective, so this is harmless.)
    fn drop(&mut self) {
        self.shared.barrier.poison();
    }
}

impl Comm for LocalThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.slots.len()
    }
    fn all_sum(&self, x: &mut [f32]) -> anyhow::Result<()> {
        {
            let mut slot = self.shared.slots[self.rank].lock().unwrap();
            slot.clear();
            slot.extend_from_slice(x);
        }
        self.shared.barrier.wait()?;
        // Fixed summation order (rank 0 first) => identical bits on every rank.
        x.fill(0.0);
        for s in &self.shared.slots {
            let s = s.lock().unwrap();
            anyhow::ensure!(s.len() == x.len(), "all_sum length mismatch between ranks");
            for (a, b) in x.iter_mut().zip(s.iter()) {
                *a += *b;
            }
        }
        // Nobody may overwrite its slot for the next call before everyone has read it.
        self.shared.barrier.wait()?;
        Ok(())
    }
    fn broadcast_u32(&self, x: &mut [u32], root: usize) -> anyhow::Result<()> {
        anyhow::ensure!(root < self.size(), "broadcast root {root} out of range");
        if self.rank == root {
            *self.shared.tokens.lock().unwrap() = x.to_vec();
        }
        self.shared.barrier.wait()?;
        {
            let t = self.shared.tokens.lock().unwrap();
            anyhow::ensure!(
                t.len() == x.len(),
                "broadcast length mismatch between ranks"
            );
            x.copy_from_slice(&t);
        }
        self.shared.barrier.wait()?;
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
        Self {
            inner,
            all_sum_time: Mutex::new(Duration::ZERO),
            all_sum_calls: Mutex::new(0),
        }
    }
    /// Total time spent in `all_sum` so far, and the number of calls.
    pub fn all_sum_stats(&self) -> (Duration, u64) {
        (
            *self.all_sum_time.lock().unwrap(),
            *self.all_sum_calls.lock().unwrap(),
        )
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
