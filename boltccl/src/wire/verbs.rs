//! The RDMA endpoint a rank sends each peer over the TCP bootstrap (`crate::transport::verbs`):
//! everything needed to connect to one of its queue pairs, in a fixed little-endian layout.

use crate::error::{Error, Result};

/// Everything a peer needs to connect to one of our queue pairs (48 bytes on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// The queue pair's GID (IPv4-mapped).
    pub gid: [u8; 16],
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number.
    pub psn: u32,
    /// Path MTU (the verbs enum).
    pub mtu: u32,
    /// LID (unused on RoCE-like links).
    pub lid: u16,
    /// Receives the peer keeps posted: our credits.
    pub recv_depth: u32,
    /// Bytes per staging slot, link header included.
    pub slot: u32,
    /// Zero; room for a flag without changing the size (a failing rank aborts over TCP).
    pub reserved: u32,
}

/// Bytes of an encoded [`Endpoint`].
pub const ENDPOINT_LEN: usize = 48;
const ENDPOINT_MAGIC: u32 = 0xB01C_EB5E;

impl Endpoint {
    /// The 48 bytes a peer is sent.
    pub fn encode(&self) -> [u8; ENDPOINT_LEN] {
        let mut b = [0u8; ENDPOINT_LEN];
        b[0..4].copy_from_slice(&ENDPOINT_MAGIC.to_le_bytes());
        b[4..20].copy_from_slice(&self.gid);
        b[20..24].copy_from_slice(&self.qpn.to_le_bytes());
        b[24..28].copy_from_slice(&self.psn.to_le_bytes());
        b[28..32].copy_from_slice(&self.mtu.to_le_bytes());
        b[32..34].copy_from_slice(&self.lid.to_le_bytes());
        b[36..40].copy_from_slice(&self.recv_depth.to_le_bytes());
        b[40..44].copy_from_slice(&self.slot.to_le_bytes());
        b[44..48].copy_from_slice(&self.reserved.to_le_bytes());
        b
    }

    /// Decode; `None` unless exactly [`ENDPOINT_LEN`] bytes with the right magic.
    pub fn decode(b: &[u8]) -> Option<Endpoint> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        (b.len() == ENDPOINT_LEN && u32_at(0) == ENDPOINT_MAGIC).then(|| Endpoint {
            gid: b[4..20].try_into().expect("16 bytes"),
            qpn: u32_at(20),
            psn: u32_at(24),
            mtu: u32_at(28),
            lid: u16::from_le_bytes([b[32], b[33]]),
            recv_depth: u32_at(36),
            slot: u32_at(40),
            reserved: u32_at(44),
        })
    }
}

/// The `cables` endpoints `peer` sent (`blob`), each for packets of `slot` bytes as ours are;
/// anything else is an error naming the peer.
pub fn parse_endpoints(peer: usize, blob: &[u8], cables: usize, slot: usize) -> Result<Vec<Endpoint>> {
    let eps: Vec<Endpoint> = blob
        .chunks(ENDPOINT_LEN)
        .map(Endpoint::decode)
        .collect::<Option<_>>()
        .filter(|e: &Vec<Endpoint>| e.len() == cables)
        .ok_or_else(|| Error::Protocol { from: format!("rank {peer}"), detail: "malformed RDMA endpoints".into() })?;
    if let Some(ep) = eps.iter().find(|ep| ep.slot as usize != slot) {
        return Err(Error::Mismatch {
            rank: peer,
            what: format!("RDMA packet size {slot} here, {} there: set the same BOLTCCL_CHUNK_BYTES", ep.slot),
        });
    }
    Ok(eps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trips_and_rejects_garbage() {
        let e =
            Endpoint { gid: [7; 16], qpn: 9, psn: 0xabcdef, mtu: 5, lid: 3, recv_depth: 16, slot: 104, reserved: 0 };
        assert_eq!(Endpoint::decode(&e.encode()), Some(e));
        assert_eq!(Endpoint::decode(&[0u8; ENDPOINT_LEN]), None);
        assert_eq!(Endpoint::decode(&e.encode()[..40]), None);
    }
}
