//! The datagram format: a fixed header followed by one fragment of a message.

/// Header magic, "SVB1".
pub const MAGIC: u32 = 0x5356_4231;
/// Header length in bytes.
pub const HDR_LEN: usize = 40;
/// Flag: the message carries immediate data.
pub const FLAG_IMM: u32 = 1;

/// Per-datagram header (big-endian on the wire).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Destination QP number.
    pub dst_qpn: u32,
    /// Source QP number.
    pub src_qpn: u32,
    /// Message sequence number (the PSN of the message, 24 bits).
    pub msg_seq: u32,
    /// Index of this fragment.
    pub frag_idx: u32,
    /// Number of fragments of the message.
    pub frag_cnt: u32,
    /// Byte offset of this fragment in the message.
    pub offset: u32,
    /// Total message length.
    pub total: u32,
    /// Immediate data, network byte order as the user gave it.
    pub imm: u32,
    /// `FLAG_*` bits.
    pub flags: u32,
}

impl Header {
    /// Write the header into the first `HDR_LEN` bytes of `out`.
    pub fn encode(&self, out: &mut [u8]) {
        let words = [
            MAGIC,
            self.dst_qpn,
            self.src_qpn,
            self.msg_seq,
            self.frag_idx,
            self.frag_cnt,
            self.offset,
            self.total,
            self.imm,
            self.flags,
        ];
        for (i, w) in words.iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
        }
    }

    /// Parse a datagram; `None` when it is not one of ours or is inconsistent.
    pub fn decode(buf: &[u8]) -> Option<(Header, &[u8])> {
        if buf.len() < HDR_LEN {
            return None;
        }
        let w = |i: usize| u32::from_be_bytes(buf[i * 4..i * 4 + 4].try_into().unwrap());
        if w(0) != MAGIC {
            return None;
        }
        let h = Header {
            dst_qpn: w(1),
            src_qpn: w(2),
            msg_seq: w(3),
            frag_idx: w(4),
            frag_cnt: w(5),
            offset: w(6),
            total: w(7),
            imm: w(8),
            flags: w(9),
        };
        let payload = &buf[HDR_LEN..];
        let end = h.offset as u64 + payload.len() as u64;
        if h.frag_cnt == 0 || h.frag_idx >= h.frag_cnt || end > h.total as u64 {
            return None;
        }
        Some((h, payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let h = Header {
            dst_qpn: 1,
            src_qpn: 2,
            msg_seq: 3,
            frag_idx: 1,
            frag_cnt: 2,
            offset: 4,
            total: 8,
            imm: 0xdead_beef,
            flags: FLAG_IMM,
        };
        let mut buf = vec![0u8; HDR_LEN + 4];
        h.encode(&mut buf);
        let (d, p) = Header::decode(&buf).unwrap();
        assert_eq!(d, h);
        assert_eq!(p.len(), 4);
        buf[0] = 0;
        assert!(Header::decode(&buf).is_none());
    }
}
