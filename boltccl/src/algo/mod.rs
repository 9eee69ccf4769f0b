//! Collective algorithms, written against [`Transport`] only, so every transport reuses them.
//!
//! - [`direct`]: reduce-scatter then all-gather on a full mesh, all links at once (large
//!   messages), plus the all-gather, reduce-scatter and broadcast built from the same parts;
//! - [`one_step`]: every rank sends its whole buffer to every peer and reduces locally (one step:
//!   small messages) and the barrier;
//! - [`doubling`]: recursive doubling all-reduce (log2(P) steps of one message: small messages
//!   where each message costs system calls);
//! - [`ring`]: bidirectional ring all-reduce (both directions of every link busy), and
//!   [`ring_ops`]: ring all-gather, reduce-scatter and broadcast;
//! - [`hosts`]: two-level all-reduce for groups spread over hosts with several ranks each
//!   (shared memory inside hosts, host totals over the network);
//! - [`p2p`]: point-to-point send and receive;
//! - [`all_to_all`]: all-to-all (equal parts and per-peer counts), all peers at once or in
//!   pairwise rounds;
//! - [`rooted`]: gather, scatter and reduce to a root (reduce with the all-reduce's bits);
//! - [`select`]: which of them a call runs.
//!
//! An algorithm borrows the call's [`Comm`] (ranks, header, transport) and the group's
//! [`Scratch`] memory separately.
//!
//! Determinism: one-step and direct fold contributions in rank order 0, 1, ..., P-1, so they give
//! the same bits as each other; doubling folds a balanced tree over the ranks in order; the
//! ring folds each block in ring order, and the two-level algorithm each host's ranks in rank
//! order, then the hosts in the order of their first ranks. Either way the order depends only
//! on the world size and the agreed settings, never on timing, and every rank ends with the
//! owner's bits.

pub mod all_to_all;
pub mod direct;
pub mod doubling;
pub mod hosts;
pub mod one_step;
pub mod p2p;
pub mod plan;
pub mod ring;
pub mod ring_ops;
pub mod rooted;
pub mod select;
#[cfg(test)]
mod sim;

use crate::error::{Error, Result};
use crate::reduce::{combine, fold, Order};
use crate::topology::SCRATCH_BUDGET;
use crate::transport::{Limits, OnRecv, RecvOp, SendOp, Transport};
use crate::types::{DType, ReduceOp};
use crate::wire::{self, Header, Phase};
use std::ops::Range;

/// Most pieces per peer in one exchange (bounds the op lists).
pub const MAX_BATCH: usize = 64;

/// One call's communicator, as an algorithm sees it: the group's ranks, this rank, the call's
/// header and the pipelining unit.
pub(crate) struct Comm<'a> {
    pub t: &'a mut dyn Transport,
    /// Group rank to transport rank.
    pub members: &'a [usize],
    /// This rank, in the group.
    pub me: usize,
    /// The call's header; pieces set `part` and `len`.
    pub base: Header,
    /// Pipelining unit, bytes (a multiple of 8, so of every element size).
    pub chunk: usize,
    pub limits: Limits<'a>,
}

impl Comm<'_> {
    pub fn size(&self) -> usize {
        self.members.len()
    }

    pub fn peer(&self, q: usize) -> usize {
        self.members[q]
    }

    /// The header of piece `piece` of `len` bytes in `step` of `phase`; an error when the call
    /// is too large to number (see [`wire::part`]).
    pub fn hdr(&self, phase: Phase, step: usize, piece: usize, len: usize) -> Result<Header> {
        Ok(self.base.piece(wire::part(phase, step, piece)?, len))
    }

    /// Pieces per peer per exchange that keep `slots` in-flight pieces inside the budget.
    pub fn batch(&self, slots_per_piece: usize) -> usize {
        (SCRATCH_BUDGET / (slots_per_piece.max(1) * self.chunk)).clamp(1, MAX_BATCH)
    }

    pub fn exchange(&mut self, sends: &[SendOp<'_>], recvs: &mut [RecvOp<'_>], on_recv: &mut OnRecv<'_>) -> Result<()> {
        self.t.exchange(sends, recvs, on_recv, &self.limits)
    }
}

/// Reusable memory, kept by the group between calls: for the pieces in flight and for a copy
/// of the local input. Two pools, so an algorithm can hold both at once.
#[derive(Default)]
pub(crate) struct Scratch {
    /// Received pieces waiting to be folded.
    pub slots: Pool,
    /// A copy of the local input, when the output overwrites it while peers still read it.
    pub stage: Pool,
}

/// Reusable bytes, page-aligned (so every element type is aligned), in a mapping of their own:
/// on Linux one of 2 MiB or more is advised onto huge pages, which the shared-memory
/// transport's copies into it run faster through.
#[derive(Default)]
pub(crate) struct Pool(Option<memmap2::MmapMut>);

impl Pool {
    /// At least `len` bytes (their contents are whatever the last call left).
    ///
    /// # Panics
    /// If the memory cannot be mapped (as a `Vec` that cannot grow does).
    pub fn get(&mut self, len: usize) -> &mut [u8] {
        if self.0.as_ref().is_none_or(|m| m.len() < len) {
            self.0 = Some(map(len).unwrap_or_else(|e| panic!("cannot map {len} bytes of scratch memory: {e}")));
        }
        &mut self.0.as_mut().expect("mapped above")[..len]
    }
}

fn map(len: usize) -> std::io::Result<memmap2::MmapMut> {
    let map = memmap2::MmapOptions::new().len(len.max(1)).map_anon()?;
    #[cfg(target_os = "linux")]
    if map.len() >= 2 << 20 {
        map.advise(memmap2::Advice::HugePage)?;
    }
    Ok(map)
}

/// A per-call list (ranks, pieces, operations): on the stack for groups of up to four ranks,
/// so small calls allocate nothing.
pub(crate) type Small<T> = smallvec::SmallVec<[T; 4]>;

/// Mutable views of the non-overlapping `ranges` of `buf`, in the order given (gaps allowed).
pub(crate) fn regions<'b>(buf: &'b mut [u8], ranges: &[Range<usize>]) -> Result<Small<&'b mut [u8]>> {
    let key = |r: &Range<usize>| (r.start, r.end);
    // Ranges mostly come in address order already (the parts of an all-to-all): split at once.
    if ranges.is_sorted_by_key(key) {
        // A loop, not a `collect` into a `Result`: that one's adapter cost 20 ns of a 0.4 µs
        // all_to_all (2026-12-03).
        let mut out = Small::new();
        for view in split_in_order(buf, ranges.iter()) {
            out.push(view?);
        }
        return Ok(out);
    }
    // Else split in address order (empty ranges first at a shared start), then put back.
    let mut order: Small<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| key(&ranges[i]));
    let mut out: Small<Option<&'b mut [u8]>> = (0..ranges.len()).map(|_| None).collect();
    for (view, &i) in split_in_order(buf, order.iter().map(|&i| &ranges[i])).zip(&order) {
        out[i] = Some(view?);
    }
    Ok(out.into_iter().map(|v| v.expect("every range was split")).collect())
}

/// The views of `buf` at `ranges`, which come in address order; an error at the first range
/// that overlaps the one before or runs past the end.
fn split_in_order<'b, 'r, I: Iterator<Item = &'r Range<usize>>>(
    mut buf: &'b mut [u8],
    ranges: I,
) -> impl Iterator<Item = Result<&'b mut [u8]>> + use<'b, 'r, I> {
    let mut at = 0;
    ranges.map(move |r| {
        if r.start < at || r.end > at + buf.len() {
            return Err(Error::Internal(format!("regions overlap or overrun at {r:?}")));
        }
        let rest = std::mem::take(&mut buf);
        let (head, tail) = rest[r.start - at..].split_at_mut(r.len());
        buf = tail;
        at = r.end;
        Ok(head)
    })
}

/// Cut a region into chunk pieces; an empty region is one empty piece (as [`plan::pieces`] plans).
pub(crate) fn cut<T: AsRef<[u8]> + ?Sized>(r: &T, chunk: usize) -> Vec<&[u8]> {
    let r = r.as_ref();
    if r.is_empty() {
        vec![r]
    } else {
        r.chunks(chunk).collect()
    }
}

/// [`cut`] for a buffer that is written.
pub(crate) fn cut_mut(r: &mut [u8], chunk: usize) -> Vec<&mut [u8]> {
    pieces_mut(r, chunk).collect()
}

/// [`cut_mut`]'s pieces one at a time, for callers that take a few and keep no list.
pub(crate) fn pieces_mut(r: &mut [u8], chunk: usize) -> impl Iterator<Item = &mut [u8]> {
    // `chunks_mut` of an empty slice yields nothing: the empty head stands in for it.
    let only_if_empty = r.is_empty();
    let (empty, r) = r.split_at_mut(0);
    std::iter::once(empty).filter(move |_| only_if_empty).chain(r.chunks_mut(chunk))
}

/// Fold the contributions of ranks 0..p to one piece into `out`, in rank order.
/// `other(q)` gives rank q's contribution (q != me). `local` is this rank's, or `None` when it
/// is already in `out` (in place). `tmp` is a spare piece-sized buffer. Both forms build the
/// same left-to-right association `((t0 op t1) op t2) ...`, so the bits do not depend on
/// whether the call was in place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fold_rank_order<'s>(
    op: ReduceOp,
    dtype: DType,
    out: &mut [u8],
    me: usize,
    p: usize,
    local: Option<&'s [u8]>,
    other: impl Fn(usize) -> &'s [u8],
    tmp: &mut [u8],
) {
    match local {
        Some(local) => {
            let term = |q: usize| if q == me { local } else { other(q) };
            if p == 1 {
                out.copy_from_slice(local);
                return;
            }
            combine(op, dtype, out, term(0), term(1));
            for q in 2..p {
                fold(op, dtype, out, term(q), Order::AccFirst);
            }
        }
        None => {
            if me > 0 {
                let prefix: &[u8] = if me == 1 {
                    other(0)
                } else {
                    let tmp = &mut tmp[..out.len()];
                    combine(op, dtype, tmp, other(0), other(1));
                    for q in 2..me {
                        fold(op, dtype, tmp, other(q), Order::AccFirst);
                    }
                    tmp
                };
                fold(op, dtype, out, prefix, Order::NextFirst);
            }
            for q in me + 1..p {
                fold(op, dtype, out, other(q), Order::AccFirst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_skip_gaps_and_reject_overlaps() {
        let mut b: Vec<u8> = (0..10).collect();
        let views = |b: &mut [u8], ranges: &[Range<usize>]| -> Vec<Vec<u8>> {
            regions(b, ranges).unwrap().iter().map(|r| r.to_vec()).collect()
        };
        let got = views(&mut b, &[5..6, 1..3, 6..9, 3..3]);
        assert_eq!(got, vec![vec![5], vec![1, 2], vec![6, 7, 8], vec![]], "views come back in the order asked");
        let got = views(&mut b, &[0..2, 2..2, 4..5, 9..10]);
        assert_eq!(got, vec![vec![0, 1], vec![], vec![4], vec![9]], "ranges already in order");
        assert!(regions(&mut b, &[1..4, 3..5]).is_err());
        assert!(regions(&mut b, &[3..5, 1..4]).is_err(), "overlap out of order");
        assert!(regions(&mut b, &[2..3, 8..12]).is_err(), "past the end");
    }
}
