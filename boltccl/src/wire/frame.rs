//! Frames on a byte stream, without the I/O: what to write or read next, and what the bytes
//! that moved complete. The TCP transport drives these with non-blocking sockets; tests drive
//! them with byte slices cut anywhere.
//!
//! A data frame is a [`HEADER_LEN`]-byte header followed by the payload. The payload goes
//! straight from and to the caller's buffers (vectored I/O: no copy); the header is checked
//! against the expected one the moment its last byte arrives, before the payload counts.

use super::{abort_error, check, Header, Kind, HEADER_LEN, MAX_REASON};
use crate::error::{Error, Result};
use std::io::{IoSlice, IoSliceMut};

/// One frame being written: the encoded header, then the payload.
#[derive(Debug)]
pub struct Outgoing {
    hdr: [u8; HEADER_LEN],
    done: usize,
}

impl Outgoing {
    /// Start writing the frame with header `h`.
    pub fn new(h: &Header) -> Outgoing {
        Outgoing { hdr: h.encode(), done: 0 }
    }

    /// The bytes still to write: the rest of the header and of `payload`.
    pub fn pending<'d>(&'d self, payload: &'d [u8]) -> [IoSlice<'d>; 2] {
        let hdr = &self.hdr[self.done.min(HEADER_LEN)..];
        let data = &payload[self.done.saturating_sub(HEADER_LEN)..];
        [IoSlice::new(hdr), IoSlice::new(data)]
    }

    /// The part of this frame not yet written: the rest of its header, and how many payload
    /// bytes (a shrink writes those as zeros to reach the next frame boundary). Nothing when
    /// no byte went out yet.
    pub fn unwritten(&self) -> (&[u8], usize) {
        if self.done == 0 {
            return (&[], 0);
        }
        let len = Header::encoded_len(&self.hdr);
        (&self.hdr[self.done.min(HEADER_LEN)..], (HEADER_LEN + len).saturating_sub(self.done.max(HEADER_LEN)))
    }

    /// `n` more bytes went out; true once the whole frame (header and `len` payload bytes) has.
    pub fn advance(&mut self, n: usize, len: usize) -> bool {
        self.done += n;
        debug_assert!(self.done <= HEADER_LEN + len);
        self.done == HEADER_LEN + len
    }
}

/// One frame being read into the caller's buffer.
#[derive(Debug)]
pub struct Incoming {
    hdr: [u8; HEADER_LEN],
    done: usize,
}

impl Default for Incoming {
    fn default() -> Incoming {
        Incoming { hdr: [0; HEADER_LEN], done: 0 }
    }
}

impl Incoming {
    /// Forget any partial frame (the next bytes start a new one).
    pub fn reset(&mut self) {
        self.done = 0;
    }

    /// The header bytes read so far of a frame cut short (a shrink reads on from there).
    pub fn partial(&self) -> &[u8] {
        &self.hdr[..self.done.min(HEADER_LEN)]
    }

    /// Payload bytes of the frame cut short already read.
    pub fn payload_read(&self) -> usize {
        self.done.saturating_sub(HEADER_LEN)
    }

    /// Where the next bytes go: the rest of the header, then the rest of `buf`. Never more
    /// than this frame, so a read cannot take the next frame's bytes.
    pub fn pending<'b>(&'b mut self, buf: &'b mut [u8]) -> [IoSliceMut<'b>; 2] {
        let at = self.done;
        let hdr = &mut self.hdr[at.min(HEADER_LEN)..];
        let data = &mut buf[at.saturating_sub(HEADER_LEN)..];
        [IoSliceMut::new(hdr), IoSliceMut::new(data)]
    }

    /// `n` more bytes arrived for a frame that must match `expect` and whose payload is
    /// `expect.len` bytes. Checks the header once complete (a mismatch or a foreign frame is
    /// an error naming `peer`); returns true when the whole frame is in.
    pub fn advance(&mut self, n: usize, expect: &Header, peer: usize) -> Result<bool> {
        let had = self.done;
        self.done += n;
        if had < HEADER_LEN && self.done >= HEADER_LEN {
            // The payload may already be partly in the buffer; it only counts once the header matches.
            check_encoded(&self.hdr, expect, peer)?;
        }
        Ok(self.done == HEADER_LEN + expect.len as usize)
    }
}

/// Check the encoded header of a data frame from `peer` against `expect`: an error naming the
/// peer when it is no header, or not the one due.
pub fn check_encoded(hdr: &[u8; HEADER_LEN], expect: &Header, peer: usize) -> Result<()> {
    let got = Header::decode(hdr).map_err(|d| Error::Protocol { from: format!("rank {peer}"), detail: d })?;
    check(expect, &got, peer)
}

/// What arrives on a control connection.
#[derive(Debug)]
pub enum Control {
    /// The peer is leaving cleanly: its connection closing next is not a failure.
    Goodbye,
    /// The job is failing; the error every rank reports.
    Abort(Error),
    /// The sender timed out waiting on rank `on`. Not an abort: with these notes a rank that
    /// timed out waiting on a live rank can follow the waits to the rank they lead to (in a
    /// ring, only a stalled rank's neighbours wait on it directly).
    Waiting {
        /// The rank the sender waited on.
        on: usize,
    },
    /// A shrink's vote or commit (see [`super::shrink_frame`]).
    Shrink(Vote),
}

/// One rank's say in a shrink: in `round` of shrink `attempt`, the ranks it takes to be in the
/// new group; a commit once every one agreed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vote {
    /// Whether this is the commit, not a vote.
    pub commit: bool,
    /// Which shrink (counted per transport, across attempts).
    pub attempt: u32,
    /// Which round of voting.
    pub round: u32,
    /// Transport ranks, in order.
    pub members: Vec<usize>,
}

/// Control frames (abort, goodbye) assembled from a byte stream. Bounded: a frame longer than
/// an abort reason, or anything that is not a control frame, is a protocol error.
#[derive(Debug, Default)]
pub struct ControlDecoder {
    buf: Vec<u8>,
}

impl ControlDecoder {
    /// Most bytes held at once (one header and the longest reason).
    pub const CAPACITY: usize = HEADER_LEN + MAX_REASON;

    /// Take bytes that arrived. Errors when they overflow [`ControlDecoder::CAPACITY`]
    /// without completing a frame.
    pub fn push(&mut self, bytes: &[u8]) -> std::result::Result<(), String> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > Self::CAPACITY {
            return Err(format!("oversized control frame ({} bytes buffered)", self.buf.len()));
        }
        Ok(())
    }

    /// The next complete frame, if one is in.
    // Not an iterator: it fails, and "none yet" is not the end.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> std::result::Result<Option<Control>, String> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let head: [u8; HEADER_LEN] = self.buf[..HEADER_LEN].try_into().expect("header");
        let h = Header::decode(&head)?;
        // Judged on the header alone: a data header is an error at once, not once its payload
        // (which may never come) is in.
        if matches!(h.kind, Kind::Data | Kind::Resync) {
            return Err("data frame on the control connection".into());
        }
        if h.len as usize > MAX_REASON {
            return Err(format!("oversized control frame ({} bytes)", h.len));
        }
        let end = HEADER_LEN + h.len as usize;
        if self.buf.len() < end {
            return Ok(None);
        }
        let frame = match h.kind {
            Kind::Goodbye => Control::Goodbye,
            // Data was refused above.
            Kind::Abort if h.coll == super::WAITING => Control::Waiting { on: h.aux as usize },
            Kind::Shrink => Control::Shrink(Vote {
                commit: h.coll == 1,
                attempt: h.group,
                round: h.seq,
                members: super::shrink_members(&self.buf[HEADER_LEN..end]),
            }),
            Kind::Abort | Kind::Data | Kind::Resync => Control::Abort(abort_error(&h, &self.buf[HEADER_LEN..end])),
        };
        self.buf.drain(..end);
        Ok(Some(frame))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Collective, DType, ReduceOp};
    use crate::wire::{abort_frame, part, Phase};
    use proptest::prelude::*;

    fn header(len: usize) -> Header {
        Header::data(Collective::AllGather, 5, 9, DType::U8, ReduceOp::Sum, 77, 0)
            .piece(part(Phase::Gather, 1, 2).unwrap(), len)
    }

    /// Write `frames` through `Outgoing` in writes of at most `w` bytes; read them back
    /// through `Incoming` in reads of at most `r` bytes.
    fn round_trip(payloads: &[Vec<u8>], w: usize, r: usize) -> Result<Vec<Vec<u8>>> {
        let mut stream = Vec::new();
        for p in payloads {
            let mut out = Outgoing::new(&header(p.len()));
            loop {
                let [a, b] = out.pending(p);
                let chunk: Vec<u8> = a.iter().chain(b.iter()).copied().take(w).collect();
                stream.extend_from_slice(&chunk);
                if out.advance(chunk.len(), p.len()) {
                    break;
                }
            }
        }
        let mut got = Vec::new();
        let mut at = 0;
        for p in payloads {
            let mut buf = vec![0u8; p.len()];
            let mut inc = Incoming::default();
            loop {
                let [mut a, mut b] = inc.pending(&mut buf);
                let room = (a.len() + b.len()).min(r);
                let take = room.min(stream.len() - at);
                let (na, nb) = (take.min(a.len()), take - take.min(a.len()));
                a[..na].copy_from_slice(&stream[at..at + na]);
                b[..nb].copy_from_slice(&stream[at + na..at + na + nb]);
                at += take;
                if inc.advance(take, &header(p.len()), 3)? {
                    break;
                }
            }
            got.push(buf);
        }
        assert_eq!(at, stream.len(), "every byte consumed, none borrowed from the next frame");
        Ok(got)
    }

    proptest! {
        #[test]
        fn frames_survive_any_split(lens in proptest::collection::vec(0usize..300, 1..5), w in 1usize..400, r in 1usize..400) {
            let payloads: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect()).collect();
            prop_assert_eq!(round_trip(&payloads, w, r).unwrap(), payloads);
        }

        #[test]
        fn any_mutated_header_byte_is_caught(byte in 0usize..HEADER_LEN, flip in 1u8..=255) {
            let mut bytes = header(4).encode();
            bytes[byte] ^= flip;
            let mut inc = Incoming::default();
            let mut buf = [0u8; 4];
            let [mut a, _] = inc.pending(&mut buf);
            a.copy_from_slice(&bytes);
            // Every field of a data header is either checked against what is expected or
            // decoded strictly, so no single corrupted byte passes.
            prop_assert!(inc.advance(HEADER_LEN, &header(4), 3).is_err());
        }

        #[test]
        fn control_decoder_never_panics(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..10)) {
            let mut d = ControlDecoder::default();
            for c in chunks {
                if d.push(&c).is_err() { break; }
                while let Ok(Some(_)) = d.next() {}
            }
        }
    }

    #[test]
    fn a_wrong_header_is_an_error_naming_the_peer() {
        let e = round_trip(&[vec![1, 2, 3]], 100, 100).map(|_| ());
        assert!(e.is_ok());
        let mut inc = Incoming::default();
        let mut buf = [0u8; 3];
        let [mut a, _] = inc.pending(&mut buf);
        a.copy_from_slice(&Header { count: 78, ..header(3) }.encode());
        let e = inc.advance(HEADER_LEN, &header(3), 3).unwrap_err().to_string();
        assert!(e.contains("rank 3") && e.contains("78"), "{e}");
        let mut inc = Incoming::default();
        let [mut a, _] = inc.pending(&mut buf);
        a.copy_from_slice(&[0xAA; HEADER_LEN]);
        let e = inc.advance(HEADER_LEN, &header(3), 3).unwrap_err().to_string();
        assert!(e.contains("bad frame magic"), "{e}");
    }

    #[test]
    fn control_frames() {
        let mut d = ControlDecoder::default();
        let cause = Error::Timeout { op: "all_sum".into(), rank: 2, after: std::time::Duration::from_secs(1) };
        let mut bytes = Header::goodbye().encode().to_vec();
        bytes.extend(abort_frame(1, &cause).1);
        bytes.extend(Header::waiting(3).encode());
        // Byte by byte: frames complete only when their last byte is in.
        let mut seen = Vec::new();
        for b in bytes {
            d.push(&[b]).unwrap();
            while let Some(c) = d.next().unwrap() {
                seen.push(c);
            }
        }
        assert!(matches!(seen[0], Control::Goodbye));
        match &seen[1] {
            Control::Abort(Error::Aborted { rank: 1, reason }) => assert!(reason.contains("rank 2")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(seen[2], Control::Waiting { on: 3 }), "{:?}", seen[2]);
        let mut d = ControlDecoder::default();
        d.push(&header(0).encode()).unwrap();
        assert_eq!(d.next().unwrap_err(), "data frame on the control connection");
        // Refused on its header, before a payload that may never come.
        let mut d = ControlDecoder::default();
        d.push(&header(4096).encode()).unwrap();
        assert_eq!(d.next().unwrap_err(), "data frame on the control connection");
        let mut d = ControlDecoder::default();
        assert!(d.push(&vec![0u8; ControlDecoder::CAPACITY + 1]).unwrap_err().contains("oversized"));
        let mut d = ControlDecoder::default();
        let mut h = Header::abort(0, false, 0);
        h.len = u32::MAX;
        d.push(&h.encode()).unwrap();
        assert!(d.next().unwrap_err().contains("oversized"));
    }
}
