//! The datagram format: a fixed header followed by one fragment of a message, sealed by a
//! CRC-32 over both (the model of RoCE's ICRC: a datagram that fails it is dropped, as hardware
//! drops a corrupted packet).

/// Header magic, "SVB1".
pub const MAGIC: u32 = 0x5356_4231;
/// Header length in bytes, the checksum word included.
pub const HDR_LEN: usize = 44;
/// Where the checksum sits in the header.
const CRC_AT: usize = 40;
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

    /// Parse a datagram; `None` when it is not one of ours, fails its checksum, or is
    /// inconsistent.
    pub fn decode(buf: &[u8]) -> Option<(Header, &[u8])> {
        if buf.len() < HDR_LEN || !intact(buf) {
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

/// CRC-32 (IEEE, reflected) lookup table.
const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

fn crc_update(mut c: u32, bytes: &[u8]) -> u32 {
    for &b in bytes {
        c = CRC_TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    c
}

/// CRC-32 of a datagram, its checksum word read as zero (or of any shorter byte string).
fn crc(dgram: &[u8]) -> u32 {
    if dgram.len() < HDR_LEN {
        return !crc_update(!0, dgram);
    }
    let c = crc_update(!0, &dgram[..CRC_AT]);
    let c = crc_update(c, &[0; 4]);
    !crc_update(c, &dgram[CRC_AT + 4..])
}

/// Write the checksum of a complete datagram (header encoded, payload in place) into its header.
pub fn seal(dgram: &mut [u8]) {
    let c = crc(dgram);
    dgram[CRC_AT..CRC_AT + 4].copy_from_slice(&c.to_be_bytes());
}

/// Whether a datagram's checksum matches its bytes.
pub fn intact(dgram: &[u8]) -> bool {
    dgram.len() >= HDR_LEN && crc(dgram).to_be_bytes() == dgram[CRC_AT..CRC_AT + 4]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_bit_anywhere_fails_the_checksum() {
        let h = Header {
            dst_qpn: 7,
            src_qpn: 9,
            msg_seq: 1,
            frag_idx: 0,
            frag_cnt: 1,
            offset: 0,
            total: 64,
            imm: 5,
            flags: 0,
        };
        let mut d = vec![0u8; HDR_LEN + 64];
        h.encode(&mut d);
        d[HDR_LEN..].iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        seal(&mut d);
        assert!(Header::decode(&d).is_some());
        for bit in 0..d.len() * 8 {
            let mut bad = d.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(Header::decode(&bad).is_none(), "bit {bit} flipped and still accepted");
        }
        // The standard check value: CRC-32 of "123456789" is 0xCBF43926.
        assert_eq!(crc(b"123456789"), 0xCBF4_3926);
    }

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
        seal(&mut buf);
        let (d, p) = Header::decode(&buf).unwrap();
        assert_eq!(d, h);
        assert_eq!(p.len(), 4);
        buf[0] = 0;
        assert!(Header::decode(&buf).is_none());
    }
}
