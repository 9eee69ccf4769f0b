//! The frame header every message carries, and how a received header is checked.
//!
//! A header names the collective (group, sequence number, operation, element type, count,
//! root) and the piece (phase, step and piece number, and length). The receiver knows what it
//! expects; any difference becomes an error naming the other rank and both values, so ranks
//! that call different collectives, or the same one with different arguments, fail instead of
//! hanging or computing garbage.
//!
//! [`frame`] turns headers and payloads into byte streams and back, without any I/O. The other
//! formats that cross processes live here too: the bootstrap's messages ([`bootstrap`]), the
//! shared-memory hello (`shm`, Linux) and the RDMA endpoint ([`verbs`]).

pub(crate) mod bootstrap;
pub mod frame;
#[cfg(target_os = "linux")]
pub(crate) mod shm;
pub mod verbs;

use crate::error::{Error, Result};
use crate::types::{Collective, DType, ReduceOp};

/// The library version (also checked between ranks at start-up: every bootstrap hello
/// carries it).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Size of an encoded header.
pub const HEADER_LEN: usize = 40;
const MAGIC: u16 = 0xB0C2;
/// Longest abort reason carried on the wire.
pub const MAX_REASON: usize = 4096;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Part of a collective or a point-to-point message.
    Data = 1,
    /// The sender's group failed; the payload is the reason (UTF-8).
    Abort = 2,
    /// The sender is shutting down cleanly.
    Goodbye = 3,
    /// Control connections: a shrink's vote or commit; the payload is the member set (see
    /// [`shrink_frame`]).
    Shrink = 4,
    /// Data links: everything before this frame belongs to a failed group; a shrink reads up
    /// to it (`group` is the shrink attempt).
    Resync = 5,
}

/// Which stage of an algorithm a piece belongs to. Numbers are wire format: never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// The barrier's empty messages.
    Barrier = 0,
    /// Contributions sent to the rank that folds them (mesh and direct all-reduce,
    /// reduce-scatter).
    Reduce = 1,
    /// Reduced or gathered blocks sent to every rank (direct all-gather).
    Gather = 2,
    /// A root's data sent out (broadcast).
    Scatter = 3,
    /// Ring all-reduce, reduce-scatter steps.
    RingReduce = 4,
    /// Ring all-reduce, all-gather steps.
    RingGather = 5,
    /// Point-to-point send and receive.
    PointToPoint = 6,
    /// Ring all-gather.
    RingAllGather = 7,
    /// Ring reduce-scatter.
    RingReduceScatter = 8,
    /// Ring broadcast.
    RingBroadcast = 9,
    /// Broadcast's root check: one empty frame from every rank to every other, carrying the
    /// sender's root in its header.
    Roots = 10,
    /// All-to-all data: each rank's part for each peer.
    AllToAll = 11,
    /// All-to-all-v's count check: one empty frame from every rank to every other, carrying
    /// in its header how many elements the sender expects from the receiver.
    Counts = 12,
}

/// Bits of the part number for the step; the phase takes the 8 above, the piece the 32 below.
const STEP_BITS: u32 = 24;

/// Where a piece sits in its call: phase, step and piece number, packed into the header's
/// 64-bit part field. Packing is checked (in every build): a call too large to number is an
/// error, never two pieces with the same number.
pub fn part(phase: Phase, step: usize, piece: usize) -> Result<u64> {
    if step >= 1 << STEP_BITS || piece > u32::MAX as usize {
        return Err(Error::invalid(format!(
            "this call needs {} steps of {} pieces, more than a message header can number: \
             raise BOLTCCL_CHUNK_BYTES or split the buffer",
            step + 1,
            piece + 1
        )));
    }
    Ok((phase as u64) << 56 | (step as u64) << 32 | piece as u64)
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Frame kind.
    pub kind: Kind,
    /// Collective (for data frames) or abort class (for abort frames).
    pub coll: u8,
    /// Element type number.
    pub dtype: u8,
    /// Reduction operator number.
    pub op: u8,
    /// Root rank for broadcast; culprit rank for abort frames.
    pub aux: u16,
    /// Group id (sub-groups from `split` get their own).
    pub group: u32,
    /// Sequence number of the call within its group (or within the pair for send/recv).
    pub seq: u32,
    /// Element count of the call.
    pub count: u64,
    /// Where this piece sits in the call (see [`part`]).
    pub part: u64,
    /// Payload length in bytes.
    pub len: u32,
}

impl Header {
    /// A data header for a call; `part` and `len` are set per piece with [`Header::piece`].
    pub fn data(coll: Collective, group: u32, seq: u32, dtype: DType, op: ReduceOp, count: u64, aux: u16) -> Header {
        Header {
            kind: Kind::Data,
            coll: coll as u8,
            dtype: dtype as u8,
            op: op as u8,
            aux,
            group,
            seq,
            count,
            part: 0,
            len: 0,
        }
    }

    /// This header for the piece numbered `part` (see [`part`]) of `len` bytes; `len` is at most
    /// one chunk.
    pub fn piece(mut self, part: u64, len: usize) -> Header {
        self.part = part;
        self.len = u32::try_from(len).expect("pieces are at most one chunk");
        self
    }

    /// Encode little-endian.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = self.kind as u8;
        b[3] = self.coll;
        b[4] = self.dtype;
        b[5] = self.op;
        b[6..8].copy_from_slice(&self.aux.to_le_bytes());
        b[8..12].copy_from_slice(&self.group.to_le_bytes());
        b[12..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..32].copy_from_slice(&self.part.to_le_bytes());
        b[32..36].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// The payload length an encoded header announces, read without checking the rest (a
    /// shrink skips frames it cut short by it).
    pub fn encoded_len(b: &[u8; HEADER_LEN]) -> usize {
        u32::from_le_bytes(b[32..36].try_into().expect("4 bytes")) as usize
    }

    /// Decode, rejecting bad magic, kind or padding.
    pub fn decode(b: &[u8; HEADER_LEN]) -> std::result::Result<Header, String> {
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(format!("bad frame magic {magic:#06x} (not a boltccl peer, or the stream is out of sync)"));
        }
        let kind = match b[2] {
            1 => Kind::Data,
            2 => Kind::Abort,
            3 => Kind::Goodbye,
            4 => Kind::Shrink,
            5 => Kind::Resync,
            k => return Err(format!("unknown frame kind {k}")),
        };
        if b[36..40] != [0; 4] {
            return Err("nonzero padding in a frame header (the stream is out of sync)".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(Header {
            kind,
            coll: b[3],
            dtype: b[4],
            op: b[5],
            aux: u16::from_le_bytes([b[6], b[7]]),
            group: u32_at(8),
            seq: u32_at(12),
            count: u64_at(16),
            part: u64_at(24),
            len: u32_at(32),
        })
    }

    /// An abort frame header carrying `reason_len` bytes of reason; `lost` marks the culprit as
    /// a lost process rather than one that reported an error.
    pub fn abort(culprit: usize, lost: bool, reason_len: usize) -> Header {
        Header {
            kind: Kind::Abort,
            coll: lost as u8,
            dtype: 0,
            op: 0,
            aux: culprit as u16,
            group: 0,
            seq: 0,
            count: 0,
            part: 0,
            len: reason_len.min(MAX_REASON) as u32,
        }
    }

    /// The header of a waiting note: this rank timed out waiting on rank `on` (see
    /// [`crate::wire::frame::Control::Waiting`]). An abort header with `coll` 2, no reason.
    pub fn waiting(on: usize) -> Header {
        Header { coll: WAITING, ..Header::abort(on, false, 0) }
    }

    /// A goodbye frame header.
    pub fn goodbye() -> Header {
        Header { kind: Kind::Goodbye, ..Header::abort(0, false, 0) }
    }

    fn describe(&self) -> String {
        let what = Collective::from_u8(self.coll)
            .map(|c| c.describe(ReduceOp::from_u8(self.op)))
            .unwrap_or_else(|| format!("op#{}", self.coll));
        let dt =
            DType::from_u8(self.dtype).map(|d| d.name().to_string()).unwrap_or_else(|| format!("dtype#{}", self.dtype));
        format!("{what} of {} {dt} elements", self.count)
    }
}

/// A shrink's control frame: a vote (`commit` false) in `round` of shrink `attempt`, or the
/// commit, for the transport ranks `members` (a bitmap payload, bit r for rank r).
pub fn shrink_frame(commit: bool, attempt: u32, round: u32, members: &[usize]) -> Vec<u8> {
    let bits = members.iter().max().map_or(0, |m| m / 8 + 1);
    let mut map = vec![0u8; bits];
    for &m in members {
        map[m / 8] |= 1 << (m % 8);
    }
    let h = Header {
        kind: Kind::Shrink,
        coll: commit as u8,
        group: attempt,
        seq: round,
        len: map.len() as u32,
        ..Header::abort(0, false, 0)
    };
    let mut frame = h.encode().to_vec();
    frame.extend_from_slice(&map);
    frame
}

/// The ranks a shrink frame's bitmap names, in order.
pub fn shrink_members(map: &[u8]) -> Vec<usize> {
    (0..map.len() * 8).filter(|r| map[r / 8] & (1 << (r % 8)) != 0).collect()
}

/// The marker a shrink sends on every data link it keeps (see [`Kind::Resync`]).
pub fn resync_header(attempt: u32) -> Header {
    Header { kind: Kind::Resync, group: attempt, ..Header::abort(0, false, 0) }
}

/// `coll` of an abort header that is a waiting note, not an abort.
pub(crate) const WAITING: u8 = 2;

/// Turn an abort frame's fields into the error every rank reports.
pub fn abort_error(h: &Header, reason: &[u8]) -> Error {
    let reason = String::from_utf8_lossy(reason).into_owned();
    let culprit = h.aux as usize;
    if h.coll == 1 {
        Error::PeerLost { rank: culprit, detail: reason }
    } else {
        Error::Aborted { rank: culprit, reason }
    }
}

/// What every other rank reports when rank `me` aborts the group because of `cause`: the
/// rank to blame (a lost one, or the one that failed) and why.
pub fn relayed(me: usize, cause: &Error) -> Error {
    match cause {
        Error::PeerLost { .. } | Error::Aborted { .. } => cause.clone(),
        Error::Poisoned(inner) => relayed(me, inner),
        other => Error::Aborted { rank: me, reason: other.to_string() },
    }
}

/// The abort frame telling every rank what `relayed` says, and the rank it blames.
pub fn abort_frame(me: usize, cause: &Error) -> (usize, Vec<u8>) {
    let (culprit, lost, reason) = match relayed(me, cause) {
        Error::PeerLost { rank, detail } => (rank, true, detail),
        Error::Aborted { rank, reason } => (rank, false, reason),
        _ => unreachable!("relayed gives PeerLost or Aborted"),
    };
    let reason = &reason.as_bytes()[..reason.len().min(MAX_REASON)];
    let mut frame = Header::abort(culprit, lost, reason.len()).encode().to_vec();
    frame.extend_from_slice(reason);
    (culprit, frame)
}

/// Check a received data header against the expected one. `peer` is the sender's rank in the
/// group, for the message.
pub fn check(expected: &Header, got: &Header, peer: usize) -> Result<()> {
    let mismatch = |what: String| Err(Error::Mismatch { rank: peer, what });
    if got.kind != Kind::Data {
        return Err(Error::Protocol {
            from: format!("rank {peer}"),
            detail: format!("a {:?} frame where data was due", got.kind),
        });
    }
    if got.group != expected.group {
        return mismatch(format!(
            "rank {peer} sent a message for another group (id {:#x}, this call is on group {:#x}): \
             calls on different groups were made in different orders",
            got.group, expected.group
        ));
    }
    if got.coll != expected.coll || got.op != expected.op {
        return mismatch(format!("rank {peer} called {} but this rank called {}", got.describe(), expected.describe()));
    }
    if got.seq != expected.seq {
        return mismatch(format!(
            "rank {peer} is at call #{} of this group but this rank is at #{} (a rank skipped or added a call)",
            got.seq, expected.seq
        ));
    }
    if got.dtype == expected.dtype
        && got.count != expected.count
        && Collective::from_u8(expected.coll) == Some(Collective::AllToAllV)
    {
        return mismatch(split_mismatch(expected, got, peer));
    }
    if got.dtype != expected.dtype || got.count != expected.count {
        return mismatch(format!(
            "rank {peer} called {} but this rank called {} (counts and element types must match on every rank)",
            got.describe(),
            expected.describe()
        ));
    }
    if got.aux != expected.aux {
        let rooted = [Collective::Broadcast, Collective::Gather, Collective::Scatter, Collective::Reduce];
        let what =
            if Collective::from_u8(expected.coll).is_some_and(|c| rooted.contains(&c)) { "root" } else { "root/peer" };
        return mismatch(format!("rank {peer} used {what} {} but this rank used {}", got.aux, expected.aux));
    }
    if got.part != expected.part || got.len != expected.len {
        return mismatch(format!(
            "rank {peer} sent piece {:#x} of {} bytes where piece {:#x} of {} bytes was expected \
             (settings differ between ranks?)",
            got.part, got.len, expected.part, expected.len
        ));
    }
    Ok(())
}

/// The message for an all-to-all-v pair whose counts disagree, naming both ranks and both
/// counts. Its frames carry a pair's count, not the call's: a data frame from `peer` (the
/// sender) to rank `aux` carries the count sent; a count frame ([`Phase::Counts`]) from `peer`
/// (the receiver) carries the count it expects, and names the data's sender in its step.
fn split_mismatch(expected: &Header, got: &Header, peer: usize) -> String {
    let dt = DType::from_u8(expected.dtype).map_or("?", DType::name);
    let (sender, receiver, sent, wanted) = if got.part >> 56 == Phase::Counts as u64 {
        ((got.part >> 32) & ((1 << STEP_BITS) - 1), peer as u64, expected.count, got.count)
    } else {
        (peer as u64, u64::from(expected.aux), got.count, expected.count)
    };
    format!(
        "all_to_all_v: rank {sender} sends {sent} {dt} elements to rank {receiver} but rank {receiver} expects \
         {wanted} from rank {sender}: rank {sender}'s send counts and rank {receiver}'s receive counts must agree \
         (the splits differ between ranks)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn mismatched_counts_are_named() {
        let mine = Header::data(Collective::AllReduce, 7, 3, DType::F32, ReduceOp::Sum, 1000, 0).piece(0, 4000);
        let theirs = Header { count: 999, len: 3996, ..mine };
        let e = check(&mine, &theirs, 2).unwrap_err().to_string();
        assert!(
            e.contains("rank 2 called all_sum of 999 float32 elements but this rank called all_sum of 1000"),
            "{e}"
        );
        let other_op = Header { op: ReduceOp::Max as u8, ..mine };
        let e = check(&mine, &other_op, 1).unwrap_err().to_string();
        assert!(e.contains("rank 1 called all_max"), "{e}");
    }

    #[test]
    fn split_mismatches_name_both_ranks_and_both_counts() {
        // Rank 3 sends 5 elements to rank 1, which expects 7 from it.
        let base = Header::data(Collective::AllToAllV, 7, 3, DType::F32, ReduceOp::Sum, 0, 0);
        let expected = Header { count: 7, aux: 1, ..base.piece(part(Phase::AllToAll, 0, 0).unwrap(), 0) };
        let e = check(&expected, &Header { count: 5, ..expected }, 3).unwrap_err().to_string();
        assert!(e.contains("rank 3 sends 5 float32 elements to rank 1 but rank 1 expects 7 from rank 3"), "{e}");
        // Rank 3 hears from rank 1, through its count frame, that rank 1 expects 7.
        let counts = |count| Header { count, aux: 1, ..base.piece(part(Phase::Counts, 3, 0).unwrap(), 0) };
        let e = check(&counts(5), &counts(7), 1).unwrap_err().to_string();
        assert!(e.contains("rank 3 sends 5 float32 elements to rank 1 but rank 1 expects 7 from rank 3"), "{e}");
    }

    #[test]
    fn parts_are_checked_not_wrapped() {
        assert_eq!(part(Phase::Gather, 3, 5).unwrap(), 2 << 56 | 3 << 32 | 5);
        assert_ne!(part(Phase::Reduce, 4096, 0).unwrap(), part(Phase::Reduce, 0, 0).unwrap(), "no 12-bit wrap");
        assert!(part(Phase::Reduce, (1 << 24) - 1, u32::MAX as usize).is_ok());
        let e = part(Phase::Reduce, 1 << 24, 0).unwrap_err().to_string();
        assert!(e.contains("BOLTCCL_CHUNK_BYTES"), "{e}");
        assert!(part(Phase::PointToPoint, 0, 1 << 32).is_err());
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(coll in 1u8..12, dtype in 0u8..12, op in 0u8..3, aux: u16, group: u32, seq: u32, count: u64, part: u64, len: u32) {
            let h = Header { kind: Kind::Data, coll, dtype, op, aux, group, seq, count, part, len };
            prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN)) {
            let _ = Header::decode(&bytes.try_into().unwrap());
        }

        #[test]
        fn distinct_pieces_have_distinct_parts(a in 0usize..(1 << 24), b in 0usize..(1 << 24), x: u32, y: u32) {
            prop_assume!((a, x) != (b, y));
            prop_assert_ne!(part(Phase::Reduce, a, x as usize).unwrap(), part(Phase::Reduce, b, y as usize).unwrap());
        }
    }
}
