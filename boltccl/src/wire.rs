//! The frame header every message carries, and how a received header is checked.
//!
//! A header names the collective (group, sequence number, operation, element type, count,
//! root) and the piece (part number and length). The receiver knows what it expects; any
//! difference becomes an error naming the other rank and both values, so ranks that call
//! different collectives, or the same one with different arguments, fail instead of hanging
//! or computing garbage.

use crate::dtype::{DType, ReduceOp};
use crate::error::Error;

/// Size of an encoded header.
pub const HEADER_LEN: usize = 32;
const MAGIC: u16 = 0xB0C1;

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
}

/// Which call a frame belongs to. Numbers are wire format: never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Coll {
    /// all_sum / all_max / all_min
    AllReduce = 1,
    /// all_gather
    AllGather = 2,
    /// reduce_scatter
    ReduceScatter = 3,
    /// broadcast
    Broadcast = 4,
    /// barrier
    Barrier = 5,
    /// send / recv
    SendRecv = 6,
}

impl Coll {
    fn from_u8(v: u8) -> Option<Coll> {
        [Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::Broadcast, Coll::Barrier, Coll::SendRecv]
            .into_iter()
            .find(|c| *c as u8 == v)
    }

    /// Human name, including the reduction for all-reduce.
    pub fn describe(self, op: u8) -> String {
        let red = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min].into_iter().find(|r| *r as u8 == op);
        match (self, red) {
            (Coll::AllReduce, Some(r)) => format!("all_{}", r.name()),
            (Coll::ReduceScatter, Some(r)) => format!("reduce_scatter({})", r.name()),
            (Coll::AllReduce, None) => "all_reduce".into(),
            (Coll::ReduceScatter, None) => "reduce_scatter".into(),
            (Coll::AllGather, _) => "all_gather".into(),
            (Coll::Broadcast, _) => "broadcast".into(),
            (Coll::Barrier, _) => "barrier".into(),
            (Coll::SendRecv, _) => "send/recv".into(),
        }
    }
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
    /// Index of this piece within the call.
    pub part: u32,
    /// Payload length in bytes.
    pub len: u32,
}

impl Header {
    /// A data header for a call; `part` and `len` are set per piece with [`Header::piece`].
    pub fn data(coll: Coll, group: u32, seq: u32, dtype: DType, op: ReduceOp, count: u64, aux: u16) -> Header {
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

    /// This header for piece `part` of `len` bytes.
    pub fn piece(mut self, part: u32, len: usize) -> Header {
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
        b[24..28].copy_from_slice(&self.part.to_le_bytes());
        b[28..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decode, rejecting bad magic or kind.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, String> {
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(format!("bad frame magic {magic:#06x} (not a boltccl peer, or the stream is out of sync)"));
        }
        let kind = match b[2] {
            1 => Kind::Data,
            2 => Kind::Abort,
            3 => Kind::Goodbye,
            k => return Err(format!("unknown frame kind {k}")),
        };
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Ok(Header {
            kind,
            coll: b[3],
            dtype: b[4],
            op: b[5],
            aux: u16::from_le_bytes([b[6], b[7]]),
            group: u32_at(8),
            seq: u32_at(12),
            count: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            part: u32_at(24),
            len: u32_at(28),
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

    /// A goodbye frame header.
    pub fn goodbye() -> Header {
        Header { kind: Kind::Goodbye, ..Header::abort(0, false, 0) }
    }

    fn describe(&self) -> String {
        let what = Coll::from_u8(self.coll).map(|c| c.describe(self.op)).unwrap_or_else(|| format!("op#{}", self.coll));
        let dt =
            DType::from_u8(self.dtype).map(|d| d.name().to_string()).unwrap_or_else(|| format!("dtype#{}", self.dtype));
        format!("{what} of {} {dt} elements", self.count)
    }
}

/// Longest abort reason carried on the wire.
pub const MAX_REASON: usize = 4096;

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

/// Check a received data header against the expected one. `peer` is the sender's rank in the
/// group, for the message.
pub fn check(expected: &Header, got: &Header, peer: usize) -> Result<(), Error> {
    let mismatch = |what: String| Err(Error::Mismatch { rank: peer, what });
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
    if got.dtype != expected.dtype || got.count != expected.count {
        return mismatch(format!(
            "rank {peer} called {} but this rank called {} (counts and element types must match on every rank)",
            got.describe(),
            expected.describe()
        ));
    }
    if got.aux != expected.aux {
        return mismatch(format!("rank {peer} used root/peer {} but this rank used {}", got.aux, expected.aux));
    }
    if got.part != expected.part || got.len != expected.len {
        return mismatch(format!(
            "rank {peer} sent piece {} of {} bytes where piece {} of {} bytes was expected \
             (settings differ between ranks?)",
            got.part, got.len, expected.part, expected.len
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn mismatched_counts_are_named() {
        let mine = Header::data(Coll::AllReduce, 7, 3, DType::F32, ReduceOp::Sum, 1000, 0).piece(0, 4000);
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

    proptest! {
        #[test]
        fn encode_decode_round_trip(coll in 1u8..7, dtype in 0u8..12, op in 0u8..3, aux: u16, group: u32, seq: u32, count: u64, part: u32, len: u32) {
            let h = Header { kind: Kind::Data, coll, dtype, op, aux, group, seq, count, part, len };
            prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::array::uniform32(any::<u8>())) {
            let _ = Header::decode(&bytes);
        }
    }
}
