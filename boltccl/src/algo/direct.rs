//! Direct algorithms on a full mesh: every pair of ranks talks at once.
//!
//! All-reduce = reduce-scatter (rank q receives everyone's contribution to shard q and folds
//! them in rank order, piece by piece as they arrive) + all-gather (every rank sends its
//! reduced shard to every other). Each rank sends and receives (P-1)/P of the buffer twice,
//! the minimum for an all-reduce, over all P-1 links in parallel.

use super::plan::{bytes, partition, piece_count, pieces};
use super::{cut, cut_mut, fold_rank_order, regions, Comm, Pool, Scratch, Small};
use crate::error::Result;
use crate::transport::{RecvOp, SendOp};
use crate::types::{DType, ReduceOp};
use crate::wire::Phase;
use std::ops::Range;

/// Every rank sends its contribution to `shards[q]` (byte ranges of `input`) to rank q; this
/// rank folds all contributions to its own shard, in rank order, into `output`. A small call
/// (the one-step all_sum of tensor-parallel decode) allocates nothing: its lists fit inline.
pub(crate) fn reduce_to_owner(
    comm: &mut Comm<'_>,
    slots: &mut Pool,
    op: ReduceOp,
    dtype: DType,
    shards: &[Range<usize>],
    input: &[u8],
    output: &mut [u8],
) -> Result<()> {
    let (p, me, chunk) = (comm.size(), comm.me, comm.chunk);
    let others = p - 1;
    let sources: Small<&[u8]> = shards.iter().map(|r| &input[r.clone()]).collect();
    let (local, out) = (sources[me], output);
    if others == 0 {
        out.copy_from_slice(local);
        return Ok(());
    }
    let most = shards.iter().map(|r| piece_count(r.len(), chunk)).max().unwrap_or(1);
    let batch = comm.batch(others);
    let batches = most.div_ceil(batch);
    let slot_bytes = batch * others * chunk;
    let mut out_pieces: Small<&mut [u8]> = out.chunks_mut(chunk).collect();
    let (slot_area, tmp) = slots.get(slot_bytes + chunk).split_at_mut(slot_bytes);
    for b in 0..batches {
        let first = b * batch;
        let mut sends: Small<SendOp<'_>> = Small::with_capacity(others * batch.min(most - first));
        for q in (0..p).filter(|&q| q != me) {
            for (k, r) in pieces(0..sources[q].len(), chunk).enumerate().skip(first).take(batch) {
                sends.push(SendOp {
                    peer: comm.peer(q),
                    header: comm.hdr(Phase::Reduce, b, k - first, r.len())?,
                    data: &sources[q][r],
                });
            }
        }
        let mine: Small<Range<usize>> = pieces(0..shards[me].len(), chunk).skip(first).take(batch).collect();
        let mut recvs: Small<RecvOp<'_>> = Small::with_capacity(others * mine.len());
        let mut slots = slot_area.chunks_mut(chunk);
        for (k, r) in mine.iter().enumerate() {
            for q in (0..p).filter(|&q| q != me) {
                let slot = slots.next().expect("batch fits the slot area");
                recvs.push(RecvOp {
                    peer: comm.peer(q),
                    expect: comm.hdr(Phase::Reduce, b, k, r.len())?,
                    buf: &mut slot[..r.len()],
                });
            }
        }
        let mut arrived: Small<usize> = smallvec::smallvec![0; mine.len()];
        let mut on_recv = |recvs: &[RecvOp<'_>], i: usize| {
            let k = i / others;
            arrived[k] += 1;
            if arrived[k] == others {
                if let Some(out) = out_pieces.get_mut(first + k) {
                    let r = &mine[k];
                    let slot = |q: usize| -> &[u8] { &*recvs[k * others + if q < me { q } else { q - 1 }].buf };
                    fold_rank_order(op, dtype, out, me, p, Some(&local[r.clone()]), slot, tmp);
                }
            }
            Ok(())
        };
        comm.exchange(&sends, &mut recvs, &mut on_recv)?;
    }
    Ok(())
}

/// Every rank holds `buf[shards[me]]`; afterwards every rank holds all of `buf`.
pub(crate) fn all_gather_ranges(
    comm: &mut Comm<'_>,
    shards: &[Range<usize>],
    buf: &mut [u8],
    phase: Phase,
) -> Result<()> {
    let (p, me, chunk) = (comm.size(), comm.me, comm.chunk);
    let mut shard_views = regions(buf, shards)?;
    let mine: &mut [u8] = std::mem::take(&mut shard_views[me]);
    let mine: &[u8] = mine;
    let batch = MAX_BATCH_GATHER;
    let npieces = shards.iter().map(|r| piece_count(r.len(), chunk)).max().unwrap_or(1);
    let mut region_pieces: Vec<Vec<&mut [u8]>> = shard_views.into_iter().map(|r| cut_mut(r, chunk)).collect();
    for b in 0..npieces.div_ceil(batch) {
        let first = b * batch;
        let mut sends = Vec::new();
        for q in (0..p).filter(|&q| q != me) {
            for (k, r) in pieces(0..mine.len(), chunk).enumerate().skip(first).take(batch) {
                sends.push(SendOp {
                    peer: comm.peer(q),
                    header: comm.hdr(phase, b, k - first, r.len())?,
                    data: &mine[r],
                });
            }
        }
        let mut recvs = Vec::new();
        for (q, region) in region_pieces.iter_mut().enumerate() {
            if q == me {
                continue;
            }
            for (k, piece) in region.iter_mut().enumerate().skip(first).take(batch) {
                let len = piece.len();
                recvs.push(RecvOp {
                    peer: comm.peer(q),
                    expect: comm.hdr(phase, b, k - first, len)?,
                    buf: &mut piece[..],
                });
            }
        }
        comm.exchange(&sends, &mut recvs, &mut |_, _| Ok(()))?;
    }
    Ok(())
}

/// Pieces per peer per all-gather exchange (no scratch is involved, so only the length of the
/// op lists limits it).
const MAX_BATCH_GATHER: usize = 1024;

/// All-reduce by reduce-scatter + all-gather, overlapped: exchange `b` carries batch `b` of
/// the reduce-scatter and batch `b - 1` of the all-gather (pieces reduced during exchange
/// `b - 1`), so neither phase leaves the links idle while the other drains. `input` is `None`
/// when `buf` holds the input.
pub(crate) fn all_reduce(
    comm: &mut Comm<'_>,
    scratch: &mut Scratch,
    op: ReduceOp,
    dtype: DType,
    input: Option<&[u8]>,
    buf: &mut [u8],
) -> Result<()> {
    let (p, me, chunk, e) = (comm.size(), comm.me, comm.chunk, dtype.size());
    let others = p - 1;
    let shards: Vec<Range<usize>> = partition(buf.len() / e, p).iter().map(|r| bytes(r, e)).collect();
    let inputs: Option<Vec<Vec<&[u8]>>> = input.map(|i| shards.iter().map(|r| cut(&i[r.clone()], chunk)).collect());
    let mut pieces: Vec<Vec<&mut [u8]>> = regions(buf, &shards)?.into_iter().map(|r| cut_mut(r, chunk)).collect();
    let batch = comm.batch(others);
    let batches = pieces.iter().map(Vec::len).max().unwrap_or(1).div_ceil(batch);
    let (slot_area, tmp) = scratch.slots.get(batch * others * chunk + chunk).split_at_mut(batch * others * chunk);
    for b in 0..=batches {
        // Pieces before `b * batch` are reduced (all-gather side), the rest are not yet.
        let (mut my_done, mut my_rest): (&[&mut [u8]], &mut [&mut [u8]]) = (&[], &mut []);
        let (mut peer_done, mut peer_rest): Peers<'_, '_> = (Vec::with_capacity(others), Vec::with_capacity(others));
        for (q, v) in pieces.iter_mut().enumerate() {
            let at = (b * batch).min(v.len());
            let (done, rest) = v.split_at_mut(at);
            if q == me {
                (my_done, my_rest) = (done, rest);
            } else {
                peer_done.push((q, done));
                peer_rest.push((q, &*rest));
            }
        }
        let sends = batch_sends(comm, inputs.as_deref(), &peer_rest, my_done, b, batch)?;
        let mine: Vec<usize> = my_rest.iter().take(batch).map(|piece| piece.len()).collect();
        let (mut recvs, reduce_recvs) = batch_recvs(comm, &mine, &mut peer_done, slot_area, b, batch)?;
        let mut arrived = vec![0usize; mine.len()];
        let mut on_recv = |recvs: &[RecvOp<'_>], i: usize| {
            if i >= reduce_recvs {
                return Ok(());
            }
            let k = i / others;
            arrived[k] += 1;
            if arrived[k] == others {
                let local = inputs.as_ref().map(|inp| inp[me][b * batch + k]);
                let slot = |q: usize| -> &[u8] { recvs[k * others + if q < me { q } else { q - 1 }].buf };
                fold_rank_order(op, dtype, my_rest[k], me, p, local, slot, tmp);
            }
            Ok(())
        };
        comm.exchange(&sends, &mut recvs, &mut on_recv)?;
    }
    Ok(())
}

/// Every peer's pieces of one batch, split at the batch: `(peer, reduced pieces)` and
/// `(peer, pieces not yet reduced)`.
type Peers<'p, 'b> = (Vec<(usize, &'p mut [&'b mut [u8]])>, Vec<(usize, &'p [&'b mut [u8]])>);

/// The sends of exchange `b` of [`all_reduce`]: batch `b` of every peer's contributions (from
/// `inputs`, or the buffer's pieces not yet reduced), then batch `b - 1` of this rank's reduced
/// shard to every peer.
fn batch_sends<'d>(
    comm: &Comm<'_>,
    inputs: Option<&'d [Vec<&'d [u8]>]>,
    peer_rest: &[(usize, &'d [&'d mut [u8]])],
    my_done: &'d [&'d mut [u8]],
    b: usize,
    batch: usize,
) -> Result<Vec<SendOp<'d>>> {
    let gather = b.checked_sub(1).map(|g| g * batch);
    let mut sends = Vec::new();
    for &(q, rest) in peer_rest {
        for k in 0..rest.len().min(batch) {
            let data: &[u8] = match inputs {
                Some(i) => i[q][b * batch + k],
                None => &*rest[k],
            };
            sends.push(SendOp { peer: comm.peer(q), header: comm.hdr(Phase::Reduce, b, k, data.len())?, data });
        }
        if let Some(g) = gather {
            for (k, piece) in my_done.iter().enumerate().skip(g) {
                sends.push(SendOp {
                    peer: comm.peer(q),
                    header: comm.hdr(Phase::Gather, b - 1, k - g, piece.len())?,
                    data: &piece[..],
                });
            }
        }
    }
    Ok(sends)
}

/// The receives of exchange `b` of [`all_reduce`]: this batch of contributions to this rank's
/// pieces `mine` (their lengths) into slot `k * others + qi`, then batch `b - 1` of every
/// peer's reduced shard straight into place. Also returns how many are contributions.
fn batch_recvs<'d>(
    comm: &Comm<'_>,
    mine: &[usize],
    peer_done: &'d mut [(usize, &mut [&mut [u8]])],
    slot_area: &'d mut [u8],
    b: usize,
    batch: usize,
) -> Result<(Vec<RecvOp<'d>>, usize)> {
    let mut recvs = Vec::new();
    let mut slots = slot_area.chunks_mut(comm.chunk);
    for (k, &len) in mine.iter().enumerate() {
        for &(q, _) in peer_done.iter() {
            let slot = slots.next().expect("batch fits the slot area");
            recvs.push(RecvOp {
                peer: comm.peer(q),
                expect: comm.hdr(Phase::Reduce, b, k, len)?,
                buf: &mut slot[..len],
            });
        }
    }
    let contributions = recvs.len();
    if let Some(g) = b.checked_sub(1).map(|g| g * batch) {
        for (q, done) in peer_done.iter_mut() {
            for (k, piece) in done.iter_mut().enumerate().skip(g) {
                let len = piece.len();
                recvs.push(RecvOp {
                    peer: comm.peer(*q),
                    expect: comm.hdr(Phase::Gather, b - 1, k - g, len)?,
                    buf: &mut piece[..],
                });
            }
        }
    }
    Ok((recvs, contributions))
}

/// Reduce-scatter: `input` holds P blocks of `output.len()` bytes; rank q gets block q reduced.
pub(crate) fn reduce_scatter(
    comm: &mut Comm<'_>,
    scratch: &mut Scratch,
    op: ReduceOp,
    dtype: DType,
    input: &[u8],
    output: &mut [u8],
) -> Result<()> {
    let m = output.len();
    let shards: Vec<Range<usize>> = (0..comm.size()).map(|q| q * m..(q + 1) * m).collect();
    reduce_to_owner(comm, &mut scratch.slots, op, dtype, &shards, input, output)
}

/// All-gather: `output` is P blocks of `input.len()` bytes; block q comes from rank q.
pub(crate) fn all_gather(comm: &mut Comm<'_>, input: &[u8], output: &mut [u8]) -> Result<()> {
    let m = input.len();
    let me = comm.me;
    output[me * m..(me + 1) * m].copy_from_slice(input);
    let shards: Vec<Range<usize>> = (0..comm.size()).map(|q| q * m..(q + 1) * m).collect();
    all_gather_ranges(comm, &shards, output, Phase::Gather)
}

/// Broadcast from `root`, large: the root scatters one shard to each rank, then every rank
/// all-gathers, so the root's link is not the bottleneck.
pub(crate) fn broadcast(comm: &mut Comm<'_>, buf: &mut [u8], root: usize, elem: usize) -> Result<()> {
    let (p, me) = (comm.size(), comm.me);
    let shards: Vec<Range<usize>> = partition(buf.len() / elem, p).iter().map(|r| bytes(r, elem)).collect();
    let (mut sends, mut recvs) = roots(comm)?;
    if me == root {
        for q in (0..p).filter(|&q| q != root) {
            sends.extend(send_pieces(comm, q, &buf[shards[q].clone()], Phase::Scatter)?);
        }
        comm.exchange(&sends, &mut recvs, &mut |_, _| Ok(()))?;
    } else {
        recvs.extend(recv_pieces(comm, root, &mut buf[shards[me].clone()], Phase::Scatter)?);
        comm.exchange(&sends, &mut recvs, &mut |_, _| Ok(()))?;
    }
    all_gather_ranges(comm, &shards, buf, Phase::Gather)
}

/// Broadcast from `root`, small: the root sends the whole buffer to every rank (one step).
pub(crate) fn broadcast_from_root(comm: &mut Comm<'_>, buf: &mut [u8], root: usize) -> Result<()> {
    let (p, me) = (comm.size(), comm.me);
    let (mut sends, mut recvs) = roots(comm)?;
    if me == root {
        for q in (0..p).filter(|&q| q != root) {
            sends.extend(send_pieces(comm, q, buf, Phase::Scatter)?);
        }
        comm.exchange(&sends, &mut recvs, &mut |_, _| Ok(()))
    } else {
        recvs.extend(recv_pieces(comm, root, buf, Phase::Scatter)?);
        comm.exchange(&sends, &mut recvs, &mut |_, _| Ok(()))
    }
}

/// The root check every broadcast's first exchange carries, ahead of its data: an empty frame
/// from this rank to every other, and one expected from every other. Each names its sender's
/// root in the header, so ranks that disagree on the root fail on that header, every one of
/// them, instead of each "root" sending its data and returning with its own (the root of a
/// broadcast otherwise receives nothing, so nothing else would tell it). Every pair is checked,
/// not only the pairs that carry data: a root whose receivers agree with it must still hear
/// from a rank that names another root. No round trip is added: these frames travel at the
/// same time as the data, and the root's only extra wait is for the others to have entered the
/// call.
pub(crate) fn roots(comm: &Comm<'_>) -> Result<(Vec<SendOp<'static>>, Vec<RecvOp<'static>>)> {
    let hdr = comm.hdr(Phase::Roots, 0, 0, 0)?;
    let others = (0..comm.size()).filter(|&q| q != comm.me);
    let sends = others.clone().map(|q| SendOp { peer: comm.peer(q), header: hdr, data: &[] }).collect();
    let recvs = others.map(|q| RecvOp { peer: comm.peer(q), expect: hdr, buf: &mut [] }).collect();
    Ok((sends, recvs))
}

/// Receive ops for `buf` in chunk pieces from group rank `from`.
pub(crate) fn recv_pieces<'b>(
    comm: &Comm<'_>,
    from: usize,
    buf: &'b mut [u8],
    phase: Phase,
) -> Result<Vec<RecvOp<'b>>> {
    cut_mut(buf, comm.chunk)
        .into_iter()
        .enumerate()
        .map(|(k, piece)| Ok(RecvOp { peer: comm.peer(from), expect: comm.hdr(phase, 0, k, piece.len())?, buf: piece }))
        .collect()
}

/// Send ops for `buf` in chunk pieces to group rank `to`.
pub(crate) fn send_pieces<'b>(comm: &Comm<'_>, to: usize, buf: &'b [u8], phase: Phase) -> Result<Vec<SendOp<'b>>> {
    pieces(0..buf.len(), comm.chunk)
        .enumerate()
        .map(|(k, r)| Ok(SendOp { peer: comm.peer(to), header: comm.hdr(phase, 0, k, r.len())?, data: &buf[r] }))
        .collect()
}
