//! All-to-all: every rank sends a part of its input to every rank, and receives one part from
//! every rank into its output. No reduction, so no fold order: the bytes arrive as sent.
//!
//! Two schedules over the same messages:
//!
//! - **direct**: every part to every peer at once, all links busy (one exchange per batch of
//!   pieces). The choice of `auto`.
//! - **pairwise**: P-1 rounds; in round s each rank sends to the rank s places after it and
//!   receives from the one s places before it, so each rank has one peer each way at a time
//!   (the classic exchange for links that slow down when every peer sends at once; forced with
//!   `BOLTCCL_ALGO=ring`, whose round 1 is the ring's neighbours).
//!
//! Both cut parts into `chunk` pieces, at most [`BATCH`] per peer in one exchange; data lands
//! straight in the output, so no scratch is used.
//!
//! The equal form's frames carry the call's header. The `v` form's carry each pair's own count
//! (and the receiving rank), and its first exchange adds one empty [`Phase::Counts`] frame each
//! way per pair, naming what the receiver expects: a pair whose counts disagree fails on both
//! ranks, with an error naming both ranks and both counts ([`crate::wire::check`]).

use super::plan::pieces;
use super::{pieces_mut, Comm, Small};
use crate::error::Result;
use crate::transport::{RecvOp, SendOp};
use crate::wire::{Header, Phase};
use smallvec::smallvec;
use std::ops::Range;

/// Pieces per peer in one exchange: data lands in place, so only the op lists limit it.
pub(crate) const BATCH: usize = 1024;

/// The per-pair counts of an all-to-all-v, in elements, by group rank.
pub(crate) struct Counts<'c> {
    /// Elements this rank sends to each rank.
    pub send: &'c [usize],
    /// Elements this rank receives from each rank.
    pub recv: &'c [usize],
}

/// The header of a data piece from `from` to `to` (group ranks) carrying `count` elements of
/// the pair: the call's header, or for the `v` form the pair's count and the receiver.
fn pair_hdr(
    comm: &Comm<'_>,
    phase: Phase,
    step: usize,
    piece: usize,
    len: usize,
    pair: Option<(usize, usize)>,
) -> Result<Header> {
    let h = comm.hdr(phase, step, piece, len)?;
    Ok(match pair {
        Some((count, to)) => Header { count: count as u64, aux: to as u16, ..h },
        None => h,
    })
}

/// The parts of one exchange round: what goes to which peer, what comes from which, and for
/// the `v` form each pair's count.
pub(crate) struct Round<'a, 'b> {
    /// (group rank, data, pair count for the `v` form).
    pub sends: Small<(usize, &'a [u8], Option<usize>)>,
    /// (group rank, where it lands, pair count for the `v` form).
    pub recvs: Small<(usize, &'b mut [u8], Option<usize>)>,
}

/// Send and receive `round`'s parts in `phase`, in chunk pieces, [`BATCH`] per peer per
/// exchange. `lead` is sent and received in the first exchange ahead of the data (a root check,
/// the count check).
pub(crate) fn exchange_parts(
    comm: &mut Comm<'_>,
    phase: Phase,
    round: &mut Round<'_, '_>,
    lead: (Vec<SendOp<'static>>, Vec<RecvOp<'static>>),
) -> Result<()> {
    let (me, chunk) = (comm.me, comm.chunk);
    let Round { sends, recvs } = round;
    // Pieces per part; an empty part is one empty piece (as `plan::pieces` plans).
    let count = |len: usize| len.div_ceil(chunk).max(1);
    let most = sends.iter().map(|(_, d, _)| count(d.len())).chain(recvs.iter().map(|(_, b, _)| count(b.len()))).max();
    let (mut lead_sends, mut lead_recvs) = lead;
    for b in 0..most.unwrap_or(0).div_ceil(BATCH).max(1) {
        let first = b * BATCH;
        let per_peer = |len: usize| count(len).saturating_sub(first).min(BATCH);
        let mut s: Small<SendOp<'_>> = std::mem::take(&mut lead_sends).into_iter().collect();
        s.reserve(sends.iter().map(|(_, d, _)| per_peer(d.len())).sum());
        for &(q, data, n) in sends.iter() {
            for (k, r) in pieces(0..data.len(), chunk).enumerate().skip(first).take(BATCH) {
                let header = pair_hdr(comm, phase, b, k - first, r.len(), n.map(|n| (n, q)))?;
                s.push(SendOp { peer: comm.peer(q), header, data: &data[r] });
            }
        }
        let mut r: Small<RecvOp<'_>> = std::mem::take(&mut lead_recvs).into_iter().collect();
        r.reserve(recvs.iter().map(|(_, buf, _)| per_peer(buf.len())).sum());
        for (q, buf, n) in recvs.iter_mut() {
            let (q, n) = (*q, *n);
            for (k, piece) in pieces_mut(buf, chunk).skip(first).take(BATCH).enumerate() {
                let expect = pair_hdr(comm, phase, b, k, piece.len(), n.map(|n| (n, me)))?;
                r.push(RecvOp { peer: comm.peer(q), expect, buf: piece });
            }
        }
        comm.exchange(&s, &mut r, &mut |_, _| Ok(()))?;
    }
    Ok(())
}

/// The count check of the `v` form between this rank and `to` (which it sends to) and `from`
/// (which it receives from): to `from` an empty frame carrying how many elements this rank
/// expects from it; from `to` one carrying how many `to` expects from this rank. Its step names
/// the data's sender.
fn count_frames(
    comm: &Comm<'_>,
    counts: &Counts<'_>,
    to: &[usize],
    from: &[usize],
) -> Result<(Vec<SendOp<'static>>, Vec<RecvOp<'static>>)> {
    let me = comm.me;
    let frame = |sender: usize, count: usize, receiver: usize| -> Result<Header> {
        pair_hdr(comm, Phase::Counts, sender, 0, 0, Some((count, receiver)))
    };
    let mut sends = Vec::with_capacity(from.len());
    for &q in from {
        sends.push(SendOp { peer: comm.peer(q), header: frame(q, counts.recv[q], me)?, data: &[] });
    }
    let mut recvs = Vec::with_capacity(to.len());
    for &q in to {
        recvs.push(RecvOp { peer: comm.peer(q), expect: frame(me, counts.send[q], q)?, buf: &mut [] });
    }
    Ok((sends, recvs))
}

/// All-to-all of equal parts: `input` and `output` hold one part per rank, in rank order.
pub(crate) fn all_to_all_equal(comm: &mut Comm<'_>, input: &[u8], output: &mut [u8], pairwise: bool) -> Result<()> {
    let (p, me) = (comm.size(), comm.me);
    let part = input.len() / p;
    if pairwise || part > comm.chunk {
        let parts: Small<Range<usize>> = (0..p).map(|q| q * part..(q + 1) * part).collect();
        return all_to_all(comm, input, &parts, output, &parts, None, pairwise);
    }
    // Every part one piece (every small call): one exchange, its lists made straight from the
    // parts, every frame under the one header. The frames are the ones the general path sends
    // (step 0, piece 0); only its bookkeeping is skipped.
    let header = comm.hdr(Phase::AllToAll, 0, 0, part)?;
    let mut s: Small<SendOp<'_>> = Small::new();
    let mut r: Small<RecvOp<'_>> = Small::new();
    let mut rest = output;
    for q in 0..p {
        let (buf, tail) = std::mem::take(&mut rest).split_at_mut(part);
        rest = tail;
        let data = &input[q * part..][..part];
        if q == me {
            buf.copy_from_slice(data);
        } else {
            s.push(SendOp { peer: comm.peer(q), header, data });
            r.push(RecvOp { peer: comm.peer(q), expect: header, buf });
        }
    }
    comm.exchange(&s, &mut r, &mut |_, _| Ok(()))
}

/// All-to-all: `input[send[q]]` goes to rank q, which receives it in `output[recv[me]]`
/// (byte ranges, one per group rank). `counts` is the `v` form's per-pair counts (`None`: the
/// equal form); `pairwise` picks the schedule. The caller has checked that this rank's own
/// part has one length on both sides.
pub(crate) fn all_to_all(
    comm: &mut Comm<'_>,
    input: &[u8],
    send: &[Range<usize>],
    output: &mut [u8],
    recv: &[Range<usize>],
    counts: Option<Counts<'_>>,
    pairwise: bool,
) -> Result<()> {
    let (p, me) = (comm.size(), comm.me);
    let mut parts = super::regions(output, recv)?;
    parts[me].copy_from_slice(&input[send[me].clone()]);
    let pair = |c: &Option<Counts<'_>>, q: usize, sending: bool| {
        c.as_ref().map(|c| if sending { c.send[q] } else { c.recv[q] })
    };
    if !pairwise {
        let others: Small<usize> = (0..p).filter(|&q| q != me).collect();
        let lead = match &counts {
            Some(c) => count_frames(comm, c, &others, &others)?,
            None => (Vec::new(), Vec::new()),
        };
        let sends = others.iter().map(|&q| (q, &input[send[q].clone()], pair(&counts, q, true))).collect();
        let recvs = parts
            .into_iter()
            .enumerate()
            .filter(|&(q, _)| q != me)
            .map(|(q, buf)| (q, buf, pair(&counts, q, false)))
            .collect();
        return exchange_parts(comm, Phase::AllToAll, &mut Round { sends, recvs }, lead);
    }
    let mut parts: Small<Option<&mut [u8]>> = parts.into_iter().map(Some).collect();
    for s in 1..p {
        let (to, from) = ((me + s) % p, (me + p - s) % p);
        let lead = match &counts {
            Some(c) => count_frames(comm, c, &[to], &[from])?,
            None => (Vec::new(), Vec::new()),
        };
        let buf = parts[from].take().expect("each rank is received from once");
        let mut round = Round {
            sends: smallvec![(to, &input[send[to].clone()], pair(&counts, to, true))],
            recvs: smallvec![(from, buf, pair(&counts, from, false))],
        };
        exchange_parts(comm, Phase::AllToAll, &mut round, lead)?;
    }
    Ok(())
}
