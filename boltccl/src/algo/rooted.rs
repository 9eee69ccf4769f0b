//! The rooted collectives: gather (every rank's block to the root), scatter (a block of the
//! root's to every rank) and reduce (the reduction of every rank's buffer to the root).
//!
//! Gather and scatter have one form: the root trades with every rank at once, in chunk pieces
//! ([`super::all_to_all::exchange_parts`]); the root's link carries everything whatever the
//! schedule, so no relay (ring or tree) can beat it on a full mesh. Their first exchange
//! carries the root check of broadcast ([`super::direct::roots`]), so ranks that disagree on
//! the root all fail instead of some returning.
//!
//! Reduce gives the root the bits `all_reduce` with the same reduction would give every rank:
//! its plan follows the all-reduce's ([`super::select::reduce`]). Where that all-reduce folds in
//! rank order (mesh, direct) reduce folds the same way with less traffic: small buffers go
//! whole to the root, which folds them in rank order (the mesh's fold, one step); large ones
//! are reduce-scattered (each rank folds one shard in rank order, as direct does) and the
//! shards gathered to the root. Where it folds in another order (doubling, ring, two levels)
//! reduce runs that all-reduce, and the ranks other than the root drop the result.

use super::all_to_all::{exchange_parts, Round};
use super::direct::{reduce_to_owner, roots};
use super::plan::{bytes, partition};
use super::select::{AllReducePlan, ReducePlan};
use super::{doubling, hosts, one_step, ring, Comm, Scratch, Small};
use crate::error::Result;
use crate::types::{DType, ReduceOp};
use crate::wire::Phase;
use smallvec::smallvec;
use std::ops::Range;

/// Gather: the root's `output` gets `size` blocks of `input.len()` bytes, block q from rank
/// q; other ranks' `output` is not touched (it may be empty).
pub(crate) fn gather(comm: &mut Comm<'_>, input: &[u8], output: &mut [u8], root: usize) -> Result<()> {
    let (p, me, m) = (comm.size(), comm.me, input.len());
    let lead = roots(comm)?;
    let mut round = if me == root {
        let blocks: Vec<Range<usize>> = (0..p).map(|q| q * m..(q + 1) * m).collect();
        let mut parts = super::regions(output, &blocks)?;
        parts[me].copy_from_slice(input);
        let recvs = parts.into_iter().enumerate().filter(|&(q, _)| q != me).map(|(q, b)| (q, b, None)).collect();
        Round { sends: Small::new(), recvs }
    } else {
        Round { sends: smallvec![(root, input, None)], recvs: Small::new() }
    };
    exchange_parts(comm, Phase::Gather, &mut round, lead)
}

/// Scatter: rank q's `output` gets block q of the root's `input` (`size` blocks of
/// `output.len()` bytes); other ranks' `input` is not read (it may be empty).
pub(crate) fn scatter(comm: &mut Comm<'_>, input: &[u8], output: &mut [u8], root: usize) -> Result<()> {
    let (p, me, m) = (comm.size(), comm.me, output.len());
    let lead = roots(comm)?;
    let mut round = if me == root {
        output.copy_from_slice(&input[me * m..(me + 1) * m]);
        let sends = (0..p).filter(|&q| q != me).map(|q| (q, &input[q * m..(q + 1) * m], None)).collect();
        Round { sends, recvs: Small::new() }
    } else {
        Round { sends: Small::new(), recvs: smallvec![(root, output, None)] }
    };
    exchange_parts(comm, Phase::Scatter, &mut round, lead)
}

/// Reduce: the root's `output` gets every rank's input (`input`, or `output` when `None`)
/// reduced with `op`, with the bits the same all-reduce gives; other ranks' `output` is not
/// changed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce(
    comm: &mut Comm<'_>,
    scratch: &mut Scratch,
    plan: &ReducePlan,
    op: ReduceOp,
    dtype: DType,
    input: Option<&[u8]>,
    output: &mut [u8],
    root: usize,
) -> Result<()> {
    let (p, me, len) = (comm.size(), comm.me, output.len());
    match plan {
        ReducePlan::ToRoot | ReducePlan::Direct => {
            // Shards: the whole buffer to the root (to root), or a share to every rank (direct).
            let shards: Vec<Range<usize>> = match plan {
                ReducePlan::ToRoot => (0..p).map(|q| if q == root { 0..len } else { len..len }).collect(),
                _ => partition(len / dtype.size(), p).iter().map(|r| bytes(r, dtype.size())).collect(),
            };
            let Scratch { slots, stage } = scratch;
            let mine = shards[me].clone();
            if me == root {
                // The root's output is written while its input is still read: read from a copy.
                let input: &[u8] = match input {
                    Some(i) => i,
                    None => {
                        let copy = stage.get(len);
                        copy.copy_from_slice(output);
                        copy
                    }
                };
                reduce_to_owner(comm, slots, op, dtype, &shards, input, &mut output[mine])?;
                if *plan == ReducePlan::ToRoot {
                    return Ok(());
                }
                let parts = super::regions(output, &shards)?;
                let recvs =
                    parts.into_iter().enumerate().filter(|&(q, _)| q != me).map(|(q, b)| (q, b, None)).collect();
                exchange_parts(comm, Phase::Gather, &mut Round { sends: Small::new(), recvs }, (Vec::new(), Vec::new()))
            } else {
                // This rank's reduced shard waits in scratch for the gather to the root.
                let input: &[u8] = input.unwrap_or(output);
                let shard = stage.get(mine.len());
                reduce_to_owner(comm, slots, op, dtype, &shards, input, shard)?;
                if *plan == ReducePlan::ToRoot {
                    return Ok(());
                }
                let sends = smallvec![(root, &*shard, None)];
                exchange_parts(comm, Phase::Gather, &mut Round { sends, recvs: Small::new() }, (Vec::new(), Vec::new()))
            }
        }
        ReducePlan::AllReduce(all) => {
            if me == root {
                return all_reduce(comm, scratch, all, op, dtype, input, output);
            }
            // The other ranks reduce into a spare buffer: their output stays as it was.
            let mut spare = vec![0u8; len];
            all_reduce(comm, scratch, all, op, dtype, Some(input.unwrap_or(output)), &mut spare)
        }
    }
}

/// Run the all-reduce `plan`.
#[allow(clippy::too_many_arguments)]
fn all_reduce(
    comm: &mut Comm<'_>,
    scratch: &mut Scratch,
    plan: &AllReducePlan,
    op: ReduceOp,
    dtype: DType,
    input: Option<&[u8]>,
    out: &mut [u8],
) -> Result<()> {
    match plan {
        AllReducePlan::OneStep => one_step::all_reduce(comm, scratch, op, dtype, input, out),
        AllReducePlan::Doubling => doubling::all_reduce(comm, scratch, op, dtype, input, out),
        AllReducePlan::Ring => ring::all_reduce(comm, scratch, op, dtype, input, out),
        AllReducePlan::Direct => super::direct::all_reduce(comm, scratch, op, dtype, input, out),
        AllReducePlan::Hosts(h) => hosts::all_reduce(comm, scratch, h, op, dtype, input, out),
    }
}
