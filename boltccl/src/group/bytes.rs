//! [`Bytes`]: a group's calls on byte buffers, the element type a value.

use super::*;

/// A group's byte-level calls (see [`Group::bytes`]): buffers are bytes, the element type a
/// value, and every length is checked against it.
pub struct Bytes<'g> {
    pub(super) g: &'g Group,
}

impl Bytes<'_> {
    /// Reduce `output` across ranks with `op`; `input = None` means `output` holds the input
    /// (in place).
    pub fn all_reduce(&self, op: ReduceOp, dtype: DType, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        self.g.call(Op::AllReduce { op, dtype, input, output })
    }

    /// `output` gets every rank's `input` in rank order.
    pub fn all_gather(&self, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.g.call(Op::AllGather { dtype, input, output })
    }

    /// `input` holds `size()` blocks of `output.len()` bytes; this rank gets block `rank()`
    /// reduced with `op` over all ranks.
    pub fn reduce_scatter(&self, op: ReduceOp, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.g.call(Op::ReduceScatter { op, dtype, input, output })
    }

    /// Every rank's `buf` gets `root`'s.
    pub fn broadcast(&self, dtype: DType, buf: &mut [u8], root: usize) -> Result<()> {
        self.g.call(Op::Broadcast { dtype, buf, root })
    }

    /// Send `buf` to `peer`, which must receive with the same type and length.
    pub fn send(&self, dtype: DType, buf: &[u8], peer: usize) -> Result<()> {
        self.g.call(Op::Send { dtype, buf, peer })
    }

    /// Receive into `buf` from `peer`, which must send with the same type and length.
    pub fn recv(&self, dtype: DType, buf: &mut [u8], peer: usize) -> Result<()> {
        self.g.call(Op::Recv { dtype, buf, peer })
    }
    /// `input` holds `size()` equal parts; part q goes to rank q, and `output` (as long as
    /// `input`) gets part `rank()` of every rank's input, in rank order.
    pub fn all_to_all(&self, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.g.call(Op::AllToAll { dtype, input, output })
    }

    /// All-to-all with a count per peer (in elements): `input` holds `send_counts[q]` elements
    /// for each rank q in turn, `output` gets `recv_counts[q]` from each.
    pub fn all_to_all_v(
        &self,
        dtype: DType,
        input: &[u8],
        send_counts: &[usize],
        output: &mut [u8],
        recv_counts: &[usize],
    ) -> Result<()> {
        self.g.call(Op::AllToAllV { dtype, input, send_counts, output, recv_counts })
    }

    /// The root's `output` gets every rank's `input`, in rank order (ignored elsewhere).
    pub fn gather(&self, dtype: DType, input: &[u8], output: &mut [u8], root: usize) -> Result<()> {
        self.g.call(Op::Gather { dtype, input, output, root })
    }

    /// Rank q's `output` gets block q of the root's `input` (ignored elsewhere).
    pub fn scatter(&self, dtype: DType, input: &[u8], output: &mut [u8], root: usize) -> Result<()> {
        self.g.call(Op::Scatter { dtype, input, output, root })
    }

    /// The root's `output` gets every rank's input (`input`, or `output` when `None`) reduced
    /// with `op`; other ranks' `output` is not changed.
    pub fn reduce(
        &self,
        op: ReduceOp,
        dtype: DType,
        input: Option<&[u8]>,
        output: &mut [u8],
        root: usize,
    ) -> Result<()> {
        self.g.call(Op::Reduce { op, dtype, input, output, root })
    }
}
