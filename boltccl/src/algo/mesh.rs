//! One-step mesh: every rank sends its whole buffer to every peer and folds all of them in
//! rank order. P-1 times the traffic of the direct algorithm, but one round trip: the right
//! choice for the small all_sums of tensor-parallel decode.

use super::direct::reduce_to_owner;
use super::{bytes_of, Ctx};
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::transport::{RecvOp, SendOp};

/// Mesh all-reduce. `input` is `None` when `buf` holds the input.
pub(crate) fn all_reduce(
    ctx: &mut Ctx<'_>,
    op: ReduceOp,
    dtype: DType,
    input: Option<&[u8]>,
    buf: &mut [u8],
) -> Result<()> {
    let shards = vec![0..buf.len(); ctx.size()];
    match input {
        Some(input) => reduce_to_owner(ctx, op, dtype, &shards, input, buf),
        None => {
            // Every peer reads the whole buffer while this rank writes it: reduce from a copy.
            let mut stage = std::mem::take(ctx.stage);
            let copy = bytes_of(&mut stage, buf.len());
            copy.copy_from_slice(buf);
            let r = reduce_to_owner(ctx, op, dtype, &shards, copy, buf);
            *ctx.stage = stage;
            r
        }
    }
}

/// Barrier: an empty message to and from every peer. Nobody leaves before everybody came.
pub(crate) fn barrier(ctx: &mut Ctx<'_>) -> Result<()> {
    let (p, me) = (ctx.size(), ctx.me);
    let sends: Vec<SendOp<'_>> = (0..p)
        .filter(|&q| q != me)
        .map(|q| SendOp { peer: ctx.peer(q), header: ctx.hdr(0, 0, 0, 0), data: &[] })
        .collect();
    let mut empties: Vec<[u8; 0]> = vec![[]; p];
    let mut recvs: Vec<RecvOp<'_>> = empties
        .iter_mut()
        .enumerate()
        .filter(|(q, _)| *q != me)
        .map(|(q, e)| RecvOp { peer: ctx.peer(q), expect: ctx.hdr(0, 0, 0, 0), buf: &mut e[..] })
        .collect();
    ctx.exchange(&sends, &mut recvs, &mut |_, _| Ok(()))
}
