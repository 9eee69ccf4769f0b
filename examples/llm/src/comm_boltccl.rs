//! [`Comm`] on a real `boltccl::Group` (feature `boltccl`): one process per rank, TCP or RDMA,
//! configured from `BOLTCCL_*` environment variables.

use crate::comm::Comm;

impl Comm for boltccl::Group {
    fn rank(&self) -> usize {
        boltccl::Group::rank(self)
    }
    fn size(&self) -> usize {
        boltccl::Group::size(self)
    }
    fn all_sum(&self, x: &mut [f32]) -> anyhow::Result<()> {
        // boltccl guarantees the same bits on every rank, which keeps the replicated residual
        // stream identical across ranks.
        boltccl::Group::all_sum(self, x)?;
        Ok(())
    }
    fn broadcast_u32(&self, x: &mut [u32], root: usize) -> anyhow::Result<()> {
        boltccl::Group::broadcast(self, x, root)?;
        Ok(())
    }
}
