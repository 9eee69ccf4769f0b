//! Bidirectional ring all-reduce: half the buffer travels clockwise, half counter-clockwise,
//! so both directions of every link carry data. Each half is a classic ring: P-1
//! reduce-scatter steps then P-1 all-gather steps, each step sending one block to a
//! neighbour. Within a step the block moves in chunk pieces, each reduced as it lands.
//! Large buffers are cut into segments so that scratch stays inside the budget.

use super::plan::{bytes, partition, pieces, ring_all_gather_step, ring_neighbors, ring_reduce_scatter_step, Dir};
use super::{cut, cut_mut, regions, Comm, Scratch};
use crate::error::{Error, Result};
use crate::reduce::{combine, fold, Order};
use crate::transport::{RecvOp, SendOp};
use crate::types::{DType, ReduceOp};
use crate::wire::Phase;
use std::ops::Range;

/// Clockwise, then counter-clockwise: piece `k` of direction `d` is numbered `2k + d`.
pub(super) const DIRS: [Dir; 2] = [1, -1];

/// Ring all-reduce. `input` is `None` when `buf` holds the input.
pub(crate) fn all_reduce(
    comm: &mut Comm<'_>,
    scratch: &mut Scratch,
    op: ReduceOp,
    dtype: DType,
    input: Option<&[u8]>,
    buf: &mut [u8],
) -> Result<()> {
    // A group of one never gets here: `Group` copies the input itself.
    let (p, e) = (comm.size(), dtype.size());
    let block_pieces = comm.batch(2);
    let block_max = block_pieces * comm.chunk / e;
    let segment = block_max * p * 2;
    let n = buf.len() / e;
    let slots = scratch.slots.get(2 * block_max * e);
    for (s, seg) in pieces(0..n, segment).enumerate() {
        let seg = bytes(&seg, e);
        let local = input.map(|i| &i[seg.clone()]);
        segment_all_reduce(comm, op, dtype, local, &mut buf[seg], slots, s)?;
    }
    Ok(())
}

/// The 2P blocks of a segment: half 0 (clockwise) blocks 0..P, then half 1 blocks 0..P.
fn blocks(n: usize, p: usize, e: usize) -> Vec<Range<usize>> {
    partition(n, 2)
        .into_iter()
        .flat_map(|h| partition(h.len(), p).into_iter().map(move |b| bytes(&(b.start + h.start..b.end + h.start), e)))
        .collect()
}

/// The four disjoint `ranges` of `buf`, in the order given.
fn four(buf: &mut [u8], ranges: [Range<usize>; 4]) -> Result<[&mut [u8]; 4]> {
    regions(buf, &ranges)?.into_vec().try_into().map_err(|_| Error::Internal("four ring regions".into()))
}

/// One step of a bidirectional ring all-gather: in direction `DIRS[d]`, send `buf[moves[d].0]`
/// to the next rank and receive `buf[moves[d].1]` from the previous one, in chunk pieces.
pub(super) fn forward_step(
    comm: &mut Comm<'_>,
    buf: &mut [u8],
    moves: [(Range<usize>, Range<usize>); 2],
    phase: Phase,
    segment: usize,
) -> Result<()> {
    let (p, me, chunk) = (comm.size(), comm.me, comm.chunk);
    let [(s0, r0), (s1, r1)] = moves;
    let [send0, recv0, send1, recv1] = four(buf, [s0, r0, s1, r1])?;
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for (di, (data, into)) in [(&*send0, recv0), (&*send1, recv1)].into_iter().enumerate() {
        let (to, from) = ring_neighbors(me, p, DIRS[di]);
        for (k, piece) in cut(data, chunk).into_iter().enumerate() {
            sends.push(SendOp {
                peer: comm.peer(to),
                header: comm.hdr(phase, segment, 2 * k + di, piece.len())?,
                data: piece,
            });
        }
        for (k, piece) in cut_mut(into, chunk).into_iter().enumerate() {
            let n = piece.len();
            recvs.push(RecvOp { peer: comm.peer(from), expect: comm.hdr(phase, segment, 2 * k + di, n)?, buf: piece });
        }
    }
    comm.exchange(&sends, &mut recvs, &mut |_, _| Ok(()))
}

#[allow(clippy::too_many_arguments)]
fn segment_all_reduce(
    comm: &mut Comm<'_>,
    op: ReduceOp,
    dtype: DType,
    local: Option<&[u8]>,
    buf: &mut [u8],
    slots: &mut [u8],
    segment: usize,
) -> Result<()> {
    let (p, me, chunk, e) = (comm.size(), comm.me, comm.chunk, dtype.size());
    let blocks = blocks(buf.len() / e, p, e);
    let idx = |d: usize, b: usize| d * p + b;
    let (slot0, slot1) = slots.split_at_mut(slots.len() / 2);
    let mut slot_store = [slot0, slot1];
    // Reduce-scatter.
    for step in 0..p - 1 {
        let plan: Vec<(usize, usize, usize, usize)> = DIRS
            .iter()
            .map(|&d| {
                let (to, from) = ring_neighbors(me, p, d);
                let (sb, rb) = ring_reduce_scatter_step(me, p, d, step);
                (to, from, sb, rb)
            })
            .collect();
        let block = |d: usize, b: usize| blocks[idx(d, b)].clone();
        let [s0, r0, s1, r1] =
            four(buf, [block(0, plan[0].2), block(0, plan[0].3), block(1, plan[1].2), block(1, plan[1].3)])?;
        let send_blocks: [&[u8]; 2] = match local {
            Some(l) if step == 0 => [&l[blocks[idx(0, plan[0].2)].clone()], &l[blocks[idx(1, plan[1].2)].clone()]],
            _ => [s0, s1],
        };
        let recv_local: [Option<&[u8]>; 2] = match local {
            Some(l) => [Some(&l[blocks[idx(0, plan[0].3)].clone()]), Some(&l[blocks[idx(1, plan[1].3)].clone()])],
            None => [None, None],
        };
        let mut outs: [Vec<&mut [u8]>; 2] = [r0.chunks_mut(chunk).collect(), r1.chunks_mut(chunk).collect()];
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        let mut owner = Vec::new();
        for (di, slot) in slot_store.iter_mut().enumerate() {
            let (to, from, _, _) = plan[di];
            for (k, r) in pieces(0..send_blocks[di].len(), chunk).enumerate() {
                sends.push(SendOp {
                    peer: comm.peer(to),
                    header: comm.hdr(Phase::RingReduce, segment, k * 2 + di, r.len())?,
                    data: &send_blocks[di][r],
                });
            }
            let rlen = outs[di].iter().map(|o| o.len()).sum::<usize>();
            for (k, (r, piece)) in pieces(0..rlen, chunk).zip(slot.chunks_mut(chunk)).enumerate() {
                recvs.push(RecvOp {
                    peer: comm.peer(from),
                    expect: comm.hdr(Phase::RingReduce, segment, k * 2 + di, r.len())?,
                    buf: &mut piece[..r.len()],
                });
                owner.push((di, k, r));
            }
        }
        let mut on_recv = |recvs: &[RecvOp<'_>], i: usize| {
            let (di, k, ref r) = owner[i];
            if let Some(out) = outs[di].get_mut(k) {
                match recv_local[di] {
                    // received op mine: the block's running sum comes first, in ring order.
                    Some(l) => combine(op, dtype, out, recvs[i].buf, &l[r.clone()]),
                    None => fold(op, dtype, out, recvs[i].buf, Order::NextFirst),
                }
            }
            Ok(())
        };
        comm.exchange(&sends, &mut recvs, &mut on_recv)?;
    }
    // All-gather of the reduced blocks.
    for step in 0..p - 1 {
        let moves = [0, 1].map(|d| {
            let (sb, rb) = ring_all_gather_step(me, p, DIRS[d], step, 1);
            (blocks[idx(d, sb)].clone(), blocks[idx(d, rb)].clone())
        });
        forward_step(comm, buf, moves, Phase::RingGather, segment)?;
    }
    Ok(())
}
