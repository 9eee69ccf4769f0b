//! Two-level all-reduce for a group spread over hosts with several ranks on each: the ranks of
//! a host reduce among themselves over shared memory, and only host totals cross the network.
//!
//! Flat algorithms send every rank's data over the network: with L ranks on each of H hosts,
//! a large all-reduce moves each host's data across hosts L times over (once per rank). Here:
//!
//! - small calls: every host's ranks sum their buffers (mesh, shared memory), then each rank
//!   exchanges its host's total with the ranks at its position on the other hosts (mesh, the
//!   network): one network message per other host instead of L;
//! - large calls: the host's ranks reduce-scatter over shared memory (local rank i owns shard
//!   i of the host total), each all-reduces its shard with the ranks at its position on the
//!   other hosts (direct, the network), and the host's ranks all-gather the shards.
//!
//! Fold order: each host's ranks in group order, then the hosts' totals in the order of their
//! first ranks. It depends only on which ranks share a host, never on timing, so every rank
//! gets the same bits and a job placed the same way gets them on every run; for floating
//! point they differ from the flat algorithms' rank order (as the ring's do).

use super::direct::{self, all_gather_ranges, reduce_to_owner};
use super::plan::{bytes, partition};
use super::select::HostsPlan;
use super::{one_step, Comm, Scratch};
use crate::error::Result;
use crate::types::{DType, ReduceOp};
use crate::wire::Phase;

/// The links among `ranks` (group ranks, `comm.me` among them) with pieces of `chunk` bytes.
fn sub<'l>(comm: &'l mut Comm<'_>, ranks: &[usize], members: &'l mut Vec<usize>, chunk: usize) -> Comm<'l> {
    members.clear();
    members.extend(ranks.iter().map(|&q| comm.members[q]));
    let me = ranks.iter().position(|&q| q == comm.me).expect("a rank is among its own levels");
    Comm { t: &mut *comm.t, members, me, base: comm.base, chunk, limits: comm.limits.clone() }
}

/// All-reduce in two levels, as `plan` says (`large`: the reduce-scatter form; see the module
/// notes). `input` is `None` when `buf` holds the input.
pub(crate) fn all_reduce(
    comm: &mut Comm<'_>,
    scratch: &mut Scratch,
    plan: &HostsPlan,
    op: ReduceOp,
    dtype: DType,
    input: Option<&[u8]>,
    buf: &mut [u8],
) -> Result<()> {
    let HostsPlan { levels, large, local_chunk } = plan;
    let (net_chunk, local_chunk, large) = (comm.chunk, *local_chunk, *large);
    let mut members = Vec::new();
    if !large {
        one_step::all_reduce(&mut sub(comm, &levels.local, &mut members, local_chunk), scratch, op, dtype, input, buf)?;
        return one_step::all_reduce(
            &mut sub(comm, &levels.across, &mut members, net_chunk),
            scratch,
            op,
            dtype,
            None,
            buf,
        );
    }
    let e = dtype.size();
    let shards: Vec<_> = partition(buf.len() / e, levels.local.len()).iter().map(|r| bytes(r, e)).collect();
    let mut local = sub(comm, &levels.local, &mut members, local_chunk);
    let mine = shards[local.me].clone();
    // 1. This rank's shard of the host total. Peers read the other shards of the input while
    //    this rank writes its own; in place, they read a copy.
    {
        let Scratch { slots, stage } = &mut *scratch;
        let source: &[u8] = match input {
            Some(i) => i,
            None => {
                let copy = stage.get(buf.len());
                copy.copy_from_slice(buf);
                copy
            }
        };
        reduce_to_owner(&mut local, slots, op, dtype, &shards, source, &mut buf[mine.clone()])?;
    }
    // 2. The shard across hosts, in place.
    let mut across = sub(comm, &levels.across, &mut members, net_chunk);
    direct::all_reduce(&mut across, scratch, op, dtype, None, &mut buf[mine])?;
    // 3. Every rank of the host gets every shard.
    all_gather_ranges(&mut sub(comm, &levels.local, &mut members, local_chunk), &shards, buf, Phase::Gather)
}
