//! One-step all-reduce (`BOLTCCL_ALGO=mesh`): every rank sends its whole buffer to every peer and folds all of them in
//! rank order. P-1 times the traffic of the direct algorithm, but one round trip: the right
//! choice for the small all_sums of tensor-parallel decode.

use super::direct::reduce_to_owner;
use super::{Comm, Scratch, Small};
use crate::error::Result;
use crate::transport::{RecvOp, SendOp};
use crate::types::{DType, ReduceOp};
use crate::wire::Phase;

/// Mesh all-reduce. `input` is `None` when `buf` holds the input.
pub(crate) fn all_reduce(
    comm: &mut Comm<'_>,
    scratch: &mut Scratch,
    op: ReduceOp,
    dtype: DType,
    input: Option<&[u8]>,
    buf: &mut [u8],
) -> Result<()> {
    let shards: Small<_> = smallvec::smallvec![0..buf.len(); comm.size()];
    let Scratch { slots, stage } = scratch;
    match input {
        Some(input) => reduce_to_owner(comm, slots, op, dtype, &shards, input, buf),
        None => {
            // Every peer reads the whole buffer while this rank writes it: reduce from a copy.
            let copy = stage.get(buf.len());
            copy.copy_from_slice(buf);
            reduce_to_owner(comm, slots, op, dtype, &shards, copy, buf)
        }
    }
}

/// Barrier: an empty message to and from every peer. Nobody leaves before everybody came.
pub(crate) fn barrier(comm: &mut Comm<'_>) -> Result<()> {
    let (p, me) = (comm.size(), comm.me);
    let hdr = comm.hdr(Phase::Barrier, 0, 0, 0)?;
    let sends: Vec<SendOp<'_>> =
        (0..p).filter(|&q| q != me).map(|q| SendOp { peer: comm.peer(q), header: hdr, data: &[] }).collect();
    let mut empties: Vec<[u8; 0]> = vec![[]; p];
    let mut recvs: Vec<RecvOp<'_>> = empties
        .iter_mut()
        .enumerate()
        .filter(|(q, _)| *q != me)
        .map(|(q, e)| RecvOp { peer: comm.peer(q), expect: hdr, buf: &mut e[..] })
        .collect();
    comm.exchange(&sends, &mut recvs, &mut |_, _| Ok(()))
}
