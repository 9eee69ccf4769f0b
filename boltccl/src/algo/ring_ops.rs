//! Ring all-gather, reduce-scatter and broadcast: every byte moves only between ring
//! neighbours, so a cluster cabled as a ring (more Macs than a full mesh of cables allows)
//! runs every large collective over its RDMA links, each block forwarded rank to rank.
//!
//! Like the ring all-reduce, each uses both directions of every link: half of every block
//! travels clockwise, half counter-clockwise. Large calls are cut into segments so the part
//! numbering and the scratch memory stay bounded.

use super::direct::roots;
use super::plan::{bytes, partition, pieces, ring_all_gather_step, ring_neighbors, ring_reduce_scatter_step, Dir};
use super::ring::{forward_step, DIRS};
use super::{cut, cut_mut, regions, Comm, Scratch, MAX_BATCH};
use crate::error::{Error, Result};
use crate::reduce::combine;
use crate::transport::{RecvOp, SendOp};
use crate::types::{DType, ReduceOp};
use crate::wire::Phase;
use std::ops::Range;

/// The two halves (clockwise, counter-clockwise) of element range `seg`, in bytes.
fn halves(seg: &Range<usize>, e: usize) -> [Range<usize>; 2] {
    let h = partition(seg.len(), 2);
    [0, 1].map(|i| bytes(&(h[i].start + seg.start..h[i].end + seg.start), e))
}

/// Elements per segment: each half at most `pieces_per_half` chunk pieces.
fn segment_elems(comm: &Comm<'_>, pieces_per_half: usize, e: usize) -> usize {
    (2 * pieces_per_half * comm.chunk / e).max(2)
}

/// Ring all-gather: `output` is P blocks of `input.len()` bytes; block q comes from rank q.
/// Each step forwards the block received in the step before.
pub(crate) fn all_gather(comm: &mut Comm<'_>, input: &[u8], output: &mut [u8], e: usize) -> Result<()> {
    let (p, me, len) = (comm.size(), comm.me, input.len());
    output[me * len..(me + 1) * len].copy_from_slice(input);
    for (s, seg) in pieces(0..len / e, segment_elems(comm, MAX_BATCH, e)).enumerate() {
        let hs = halves(&seg, e);
        for step in 0..p - 1 {
            let moves = [0, 1].map(|d| {
                let (sb, rb) = ring_all_gather_step(me, p, DIRS[d], step, 0);
                (sb * len + hs[d].start..sb * len + hs[d].end, rb * len + hs[d].start..rb * len + hs[d].end)
            });
            forward_step(comm, output, moves, Phase::RingAllGather, s)?;
        }
    }
    Ok(())
}

/// Ring reduce-scatter: `input` is P blocks of `output.len()` bytes; this rank gets block
/// `me` reduced over all ranks. Each block's running result travels around the ring, each rank
/// adding its own contribution (received op mine), and ends at its owner.
pub(crate) fn reduce_scatter(
    comm: &mut Comm<'_>,
    scratch: &mut Scratch,
    op: ReduceOp,
    dtype: DType,
    input: &[u8],
    output: &mut [u8],
) -> Result<()> {
    let (p, me, e, chunk) = (comm.size(), comm.me, dtype.size(), comm.chunk);
    let len = output.len();
    if p == 1 {
        output.copy_from_slice(input);
        return Ok(());
    }
    // Logical block x is actual block x - d: the block a rank ends up owning in direction d
    // (its rank + d, see `ring_reduce_scatter_step`) is then its own.
    let actual = |x: usize, d: Dir| (x as isize - d).rem_euclid(p as isize) as usize * len;
    // Per direction: the received pieces, the running result being sent, the one being built.
    let per_half = comm.batch(6);
    let half_max = per_half * chunk;
    let store = scratch.slots.get(6 * half_max);
    let parts: Vec<&mut [u8]> = store.chunks_mut(half_max).collect();
    let [r0, a0, b0, r1, a1, b1]: [&mut [u8]; 6] =
        parts.try_into().map_err(|_| Error::Internal("ring scratch is not six halves".into()))?;
    let mut received = [r0, r1];
    let mut running = [[a0, b0], [a1, b1]];
    for (s, seg) in pieces(0..len / e, segment_elems(comm, per_half, e)).enumerate() {
        let hs = halves(&seg, e);
        for step in 0..p - 1 {
            let last = step == p - 2;
            let [run0, run1] = &mut running;
            let [(sent0, build0), (sent1, build1)] = [run0, run1].map(|[x, y]| {
                let (x, y) = (&mut **x, &mut **y);
                if step % 2 == 0 {
                    (&*x, y)
                } else {
                    (&*y, x)
                }
            });
            let sent = [sent0, sent1];
            let mut build = [build0, build1];
            let mut sends = Vec::new();
            for (di, &d) in DIRS.iter().enumerate() {
                let (to, _) = ring_neighbors(me, p, d);
                let (sb, _) = ring_reduce_scatter_step(me, p, d, step);
                let n = hs[di].len();
                let data: &[u8] = if step == 0 {
                    let b = actual(sb, d);
                    &input[b + hs[di].start..b + hs[di].end]
                } else {
                    &sent[di][..n]
                };
                for (k, piece) in cut(data, chunk).into_iter().enumerate() {
                    sends.push(SendOp {
                        peer: comm.peer(to),
                        header: comm.hdr(Phase::RingReduceScatter, s, 2 * k + di, piece.len())?,
                        data: piece,
                    });
                }
            }
            let mut recvs = Vec::new();
            // (direction, offset of this piece's local contribution in `input`, range in the half)
            let mut targets: Vec<(usize, usize, Range<usize>)> = Vec::new();
            for ((di, &d), rbuf) in DIRS.iter().enumerate().zip(received.iter_mut()) {
                let (_, from) = ring_neighbors(me, p, d);
                let (_, rb) = ring_reduce_scatter_step(me, p, d, step);
                let local = actual(rb, d) + hs[di].start;
                let n = hs[di].len();
                for (k, piece) in cut_mut(&mut rbuf[..n], chunk).into_iter().enumerate() {
                    let r = k * chunk..k * chunk + piece.len();
                    recvs.push(RecvOp {
                        peer: comm.peer(from),
                        expect: comm.hdr(Phase::RingReduceScatter, s, 2 * k + di, piece.len())?,
                        buf: piece,
                    });
                    targets.push((di, local + r.start, r));
                }
            }
            let (lo, hi) = output.split_at_mut(hs[1].start);
            let mut outs: [&mut [u8]; 2] = [&mut lo[hs[0].clone()], &mut hi[..hs[1].len()]];
            let mut on_recv = |recvs: &[RecvOp<'_>], i: usize| {
                let (di, at, ref r) = targets[i];
                let dst: &mut [u8] = if last { &mut outs[di][r.clone()] } else { &mut build[di][r.clone()] };
                combine(op, dtype, dst, recvs[i].buf, &input[at..at + r.len()]);
                Ok(())
            };
            comm.exchange(&sends, &mut recvs, &mut on_recv)?;
        }
    }
    Ok(())
}

/// Ring broadcast: half the buffer flows clockwise from `root`, half counter-clockwise, each
/// rank forwarding a piece to its next neighbour one step after receiving it (a pipeline of
/// chunk pieces, P - 2 + pieces steps).
pub(crate) fn broadcast(comm: &mut Comm<'_>, buf: &mut [u8], root: usize, e: usize) -> Result<()> {
    let (p, me, chunk) = (comm.size(), comm.me, comm.chunk);
    if p == 1 {
        return Ok(());
    }
    let hs = halves(&(0..buf.len() / e), e);
    // Piece boundaries of each half, and this rank's distance from the root in each direction.
    let cuts: [Vec<Range<usize>>; 2] = [0, 1].map(|di| pieces(hs[di].clone(), chunk).collect());
    let pos: [usize; 2] = [0, 1].map(|di| ((me as isize - root as isize) * DIRS[di]).rem_euclid(p as isize) as usize);
    let steps = cuts.iter().map(|c| c.len()).max().unwrap_or(1) + p - 2;
    for t in 0..steps {
        let mut ranges = Vec::new();
        let mut plan = Vec::new(); // (di, send?, piece index)
        for di in 0..2 {
            let n = cuts[di].len();
            if pos[di] < p - 1 && t >= pos[di] && t - pos[di] < n {
                plan.push((di, true, t - pos[di]));
                ranges.push(cuts[di][t - pos[di]].clone());
            }
            if pos[di] >= 1 && t + 1 >= pos[di] && t + 1 - pos[di] < n {
                plan.push((di, false, t + 1 - pos[di]));
                ranges.push(cuts[di][t + 1 - pos[di]].clone());
            }
        }
        // The first step also checks that every rank names the same root (see `roots`): empty
        // frames, the only ones of a ring call that go beyond the neighbours.
        let (mut sends, mut recvs) = if t == 0 {
            roots(comm)?
        } else if plan.is_empty() {
            continue;
        } else {
            (Vec::new(), Vec::new())
        };
        for (view, &(di, send, k)) in regions(buf, &ranges)?.into_iter().zip(&plan) {
            let (to, from) = ring_neighbors(me, p, DIRS[di]);
            let header = comm.hdr(Phase::RingBroadcast, di, k, view.len())?;
            if send {
                sends.push(SendOp { peer: comm.peer(to), header, data: view });
            } else {
                recvs.push(RecvOp { peer: comm.peer(from), expect: header, buf: view });
            }
        }
        comm.exchange(&sends, &mut recvs, &mut |_, _| Ok(()))?;
    }
    Ok(())
}
