//! Recursive doubling: in step s, every rank trades its running total with the rank whose
//! number differs from its own in bit s and folds the two, so after log2(P) steps every rank
//! holds the sum. Each rank sends and receives one message per step: log2(P) messages where the
//! mesh sends P-1, which matters where each message costs a system call and a wake-up on a
//! shared core (measured 2026-12-01, 4 ranks on 2 cores, 1 KiB all_sum: 29-36 µs over TCP
//! against the mesh's 50-60, and 5.9 µs over shared memory against 7.2-7.6).
//!
//! Groups that are not a power of two first fold pairs of their lowest ranks: of ranks 2i and
//! 2i+1 below 2·(P - 2^k), the even one hands its buffer to the odd one, sits out the doubling
//! and receives the total at the end.
//!
//! Determinism: a pair folds lower rank first, so both ends compute the same bits, and the
//! whole is a balanced tree over the ranks in order, `(x0 + x1) + (x2 + x3)` for four (for
//! three, `(x0 + x1) + x2`). It depends only on the world size.

use super::plan::{piece_count, pieces};
use super::{Link, Pool, Scratch};
use crate::error::Result;
use crate::reduce::{fold, Order};
use crate::transport::{RecvOp, SendOp};
use crate::types::{DType, ReduceOp};
use crate::wire::{Header, Phase};
use std::ops::Range;

/// Pieces per exchange when nothing is folded (no scratch involved: only the op lists grow).
const COPY_BATCH: usize = 1024;

/// Doubling all-reduce. `input` is `None` when `buf` holds the input.
pub(crate) fn all_reduce(
    link: &mut Link<'_>,
    scratch: &mut Scratch,
    op: ReduceOp,
    dtype: DType,
    input: Option<&[u8]>,
    buf: &mut [u8],
) -> Result<()> {
    if let Some(input) = input {
        buf.copy_from_slice(input);
    }
    let (p, me) = (link.size(), link.me);
    let active = 1usize << p.ilog2();
    let paired = 2 * (p - active);
    let slots = &mut scratch.slots;
    let fold_with = |order: Order| Recv::Fold { op, dtype, order };
    if me < paired && me % 2 == 0 {
        step(link, slots, Phase::Reduce, 0, me + 1, true, Recv::Nothing, buf)?;
        return step(link, slots, Phase::Gather, 0, me + 1, false, Recv::Into, buf);
    }
    if me < paired {
        step(link, slots, Phase::Reduce, 0, me - 1, false, fold_with(Order::NextFirst), buf)?;
    }
    // Position among the ranks that take part in the doubling, and back.
    let v = if me < paired { me / 2 } else { me - paired / 2 };
    let rank_of = |v: usize| if 2 * v < paired { 2 * v + 1 } else { v + paired / 2 };
    for s in 0..active.trailing_zeros() as usize {
        let partner = v ^ (1 << s);
        let order = if v < partner { Order::AccFirst } else { Order::NextFirst };
        step(link, slots, Phase::Reduce, s + 1, rank_of(partner), true, fold_with(order), buf)?;
    }
    if me < paired {
        step(link, slots, Phase::Gather, 0, me - 1, true, Recv::Nothing, buf)?;
    }
    Ok(())
}

/// The sends of `pieces` of `buf` to `peer` (none unless `send`).
fn send_ops<'b>(
    send: bool,
    peer: usize,
    pieces: &[Range<usize>],
    headers: &[Header],
    buf: &'b [u8],
) -> Vec<SendOp<'b>> {
    if !send {
        return Vec::new();
    }
    pieces.iter().zip(headers).map(|(r, &header)| SendOp { peer, header, data: &buf[r.clone()] }).collect()
}

/// What a step does with the peer's buffer.
#[derive(Clone, Copy)]
enum Recv {
    /// Nothing comes.
    Nothing,
    /// It replaces `buf`.
    Into,
    /// It is folded into `buf`.
    Fold { op: ReduceOp, dtype: DType, order: Order },
}

/// One step with `peer`: send `buf` to it (when `send`) and take its buffer as `recv` says,
/// in batches of pieces (folded after each batch has arrived, as the sends read `buf`).
#[allow(clippy::too_many_arguments)]
fn step(
    link: &mut Link<'_>,
    slots: &mut Pool,
    phase: Phase,
    at: usize,
    peer: usize,
    send: bool,
    recv: Recv,
    buf: &mut [u8],
) -> Result<()> {
    let chunk = link.chunk;
    let batch = if matches!(recv, Recv::Fold { .. }) { link.batch(1) } else { COPY_BATCH };
    let all: Vec<Range<usize>> = pieces(0..buf.len(), chunk).collect();
    let area = match recv {
        Recv::Fold { .. } => slots.get(batch.min(piece_count(buf.len(), chunk)) * chunk),
        _ => &mut [][..],
    };
    for (b, these) in all.chunks(batch).enumerate() {
        let to = link.peer(peer);
        let headers = these
            .iter()
            .enumerate()
            .map(|(k, r)| link.hdr(phase, at, b * batch + k, r.len()))
            .collect::<Result<Vec<_>>>()?;
        match recv {
            Recv::Nothing => link.exchange(&send_ops(send, to, these, &headers, buf), &mut [], &mut |_, _| Ok(()))?,
            Recv::Into => {
                let (start, end) = (these[0].start, these[these.len() - 1].end);
                let mut rest = &mut buf[start..end];
                let mut recvs = Vec::with_capacity(these.len());
                for (r, &expect) in these.iter().zip(&headers) {
                    let (piece, tail) = std::mem::take(&mut rest).split_at_mut(r.len());
                    recvs.push(RecvOp { peer: to, expect, buf: piece });
                    rest = tail;
                }
                link.exchange(&[], &mut recvs, &mut |_, _| Ok(()))?;
            }
            Recv::Fold { op, dtype, order } => {
                let mut recvs: Vec<RecvOp<'_>> = these
                    .iter()
                    .zip(&headers)
                    .zip(area.chunks_mut(chunk))
                    .map(|((r, &expect), slot)| RecvOp { peer: to, expect, buf: &mut slot[..r.len()] })
                    .collect();
                link.exchange(&send_ops(send, to, these, &headers, buf), &mut recvs, &mut |_, _| Ok(()))?;
                for (r, slot) in these.iter().zip(area.chunks(chunk)) {
                    fold(op, dtype, &mut buf[r.clone()], &slot[..r.len()], order);
                }
            }
        }
    }
    Ok(())
}
