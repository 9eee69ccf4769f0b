//! Connection handshake: protocol version check and mutual HMAC-SHA256 challenge-response
//! with the job key; then small length-prefixed JSON messages with a size cap.
//!
//! Wire (client speaks first):
//! ```text
//! client -> server   MAGIC[8] version:u16 nonce_c[16]
//! server -> client   MAGIC[8] version:u16 nonce_s[16] HMAC(key, "server" | nonce_c | nonce_s)[32]
//! client -> server   HMAC(key, "client" | nonce_s | nonce_c)[32]
//! server -> client   1 byte: 1 accepted, 0 rejected
//! ```
//! Both sides prove the key without sending it, and fresh nonces stop replays.

use crate::error::{Error, Result};
use hmac::{Hmac, Mac};
use serde::{de::DeserializeOwned, Serialize};
use sha2::Sha256;
use std::io::{Read, Write};
use std::net::TcpStream;

/// Wire protocol version; bumped on any incompatible change (2: 40-byte frame headers with a
/// 64-bit part number).
pub const PROTOCOL_VERSION: u16 = 2;
const MAGIC: &[u8; 8] = b"BOLTCCL\0";
/// Largest bootstrap message accepted.
pub const MAX_MESSAGE: usize = 1 << 20;

fn mac(key: &[u8], role: &[u8], a: &[u8], b: &[u8]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(role);
    m.update(a);
    m.update(b);
    m.finalize().into_bytes().into()
}

fn verify(key: &[u8], role: &[u8], a: &[u8], b: &[u8], tag: &[u8]) -> bool {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(role);
    m.update(a);
    m.update(b);
    m.verify_slice(tag).is_ok() // constant-time comparison
}

fn nonce() -> [u8; 16] {
    let mut n = [0u8; 16];
    getrandom::getrandom(&mut n).expect("the OS random source works");
    n
}

fn peer_name(s: &TcpStream) -> String {
    s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "unknown peer".into())
}

fn io_err(peer: &str, what: &str, e: std::io::Error) -> Error {
    let detail = match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("{what}: timed out")
        }
        std::io::ErrorKind::UnexpectedEof => format!("{what}: connection closed"),
        _ => format!("{what}: {e}"),
    };
    Error::Protocol { from: peer.to_string(), detail }
}

fn check_hello(peer: &str, head: &[u8]) -> Result<()> {
    if &head[..8] != MAGIC {
        return Err(Error::Protocol { from: peer.into(), detail: "not a boltccl peer (bad handshake magic)".into() });
    }
    let version = u16::from_le_bytes([head[8], head[9]]);
    if version != PROTOCOL_VERSION {
        return Err(Error::Protocol {
            from: peer.into(),
            detail: format!(
                "protocol version {version}, this rank speaks {PROTOCOL_VERSION}: run the same boltccl version on every node"
            ),
        });
    }
    Ok(())
}

/// Run the client side of the handshake. The stream must have read/write timeouts set.
pub fn client(s: &mut TcpStream, key: &[u8]) -> Result<()> {
    let peer = peer_name(s);
    client_over(s, peer, key)
}

/// The client side of the handshake over any stream (`peer` names it in errors).
pub fn client_over(s: &mut (impl Read + Write), peer: String, key: &[u8]) -> Result<()> {
    let nc = nonce();
    let mut hello = Vec::with_capacity(26);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    hello.extend_from_slice(&nc);
    s.write_all(&hello).map_err(|e| io_err(&peer, "handshake", e))?;
    let mut reply = [0u8; 58];
    s.read_exact(&mut reply).map_err(|e| io_err(&peer, "handshake reply", e))?;
    check_hello(&peer, &reply)?;
    let ns = &reply[10..26];
    if !verify(key, b"server", &nc, ns, &reply[26..58]) {
        return Err(Error::Auth { peer, detail: "the peer does not hold this job key".into() });
    }
    s.write_all(&mac(key, b"client", ns, &nc)).map_err(|e| io_err(&peer, "handshake", e))?;
    let mut ok = [0u8; 1];
    s.read_exact(&mut ok).map_err(|e| io_err(&peer, "handshake result", e))?;
    if ok[0] != 1 {
        return Err(Error::Auth { peer, detail: "the peer rejected this rank's job key".into() });
    }
    Ok(())
}

/// Run the server side of the handshake. The stream must have read/write timeouts set.
pub fn server(s: &mut TcpStream, key: &[u8]) -> Result<()> {
    let peer = peer_name(s);
    server_over(s, peer, key)
}

/// The server side of the handshake over any stream (`peer` names it in errors).
pub fn server_over(s: &mut (impl Read + Write), peer: String, key: &[u8]) -> Result<()> {
    let mut hello = [0u8; 26];
    s.read_exact(&mut hello).map_err(|e| io_err(&peer, "handshake", e))?;
    if &hello[..8] != MAGIC {
        return Err(Error::Protocol { from: peer, detail: "not a boltccl peer (bad handshake magic)".into() });
    }
    // Answer even on a version mismatch, so the other side can say which versions differ.
    let nc = &hello[10..26];
    let ns = nonce();
    let mut reply = Vec::with_capacity(58);
    reply.extend_from_slice(MAGIC);
    reply.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    reply.extend_from_slice(&ns);
    reply.extend_from_slice(&mac(key, b"server", nc, &ns));
    s.write_all(&reply).map_err(|e| io_err(&peer, "handshake", e))?;
    check_hello(&peer, &hello)?;
    let mut tag = [0u8; 32];
    s.read_exact(&mut tag).map_err(|e| io_err(&peer, "handshake", e))?;
    let good = verify(key, b"client", &ns, nc, &tag);
    let _ = s.write_all(&[good as u8]);
    if !good {
        return Err(Error::Auth { peer, detail: "wrong job key".into() });
    }
    Ok(())
}

/// Send one length-prefixed JSON message.
pub fn send<T: Serialize>(s: &mut TcpStream, msg: &T) -> Result<()> {
    let body = serde_json::to_vec(msg).map_err(|e| Error::Internal(format!("encode: {e}")))?;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    let peer = peer_name(s);
    s.write_all(&frame).map_err(|e| io_err(&peer, "send", e))
}

/// Receive one length-prefixed JSON message, rejecting oversized or malformed ones.
pub fn recv<T: DeserializeOwned>(s: &mut TcpStream) -> Result<T> {
    let peer = peer_name(s);
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(|e| io_err(&peer, "receive", e))?;
    let len = body_len(&peer, len)?;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).map_err(|e| io_err(&peer, "receive", e))?;
    decode(&peer, &body)
}

/// The body length a message's 4-byte prefix announces, refused above [`MAX_MESSAGE`] before
/// anything is allocated for it. Sans-I/O: [`recv`] reads, this decides.
pub fn body_len(peer: &str, prefix: [u8; 4]) -> Result<usize> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_MESSAGE {
        return Err(Error::Protocol {
            from: peer.to_string(),
            detail: format!("oversized message ({len} bytes, limit {MAX_MESSAGE})"),
        });
    }
    Ok(len)
}

/// Decode a message body (JSON, at most [`MAX_MESSAGE`] bytes); anything else is a protocol
/// error naming `peer`. Sans-I/O: [`recv`] reads, this decides.
pub fn decode<T: DeserializeOwned>(peer: &str, body: &[u8]) -> Result<T> {
    if body.len() > MAX_MESSAGE {
        return Err(Error::Protocol {
            from: peer.to_string(),
            detail: format!("oversized message ({} bytes, limit {MAX_MESSAGE})", body.len()),
        });
    }
    serde_json::from_slice(body)
        .map_err(|e| Error::Protocol { from: peer.to_string(), detail: format!("malformed message: {e}") })
}

/// The handshake's opening bytes (client hello or server reply) checked: magic and protocol
/// version. Sans-I/O: [`client`] and [`server`] read, this decides (reached by the fuzz tests).
#[cfg(feature = "testing")]
pub fn check_opening(peer: &str, head: &[u8; 10]) -> Result<()> {
    check_hello(peer, head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Duration;

    fn pair(ck: &'static [u8], sk: &'static [u8]) -> (Result<()>, Result<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            server(&mut s, sk)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let cr = client(&mut c, ck);
        (cr, t.join().unwrap())
    }

    #[test]
    fn same_key_is_accepted() {
        let (c, s) = pair(b"k1", b"k1");
        c.unwrap();
        s.unwrap();
    }

    #[test]
    fn wrong_key_is_rejected_on_both_sides() {
        let (c, s) = pair(b"k1", b"k2");
        assert!(matches!(c, Err(Error::Auth { .. })), "{c:?}");
        assert!(matches!(s, Err(Error::Auth { .. }) | Err(Error::Protocol { .. })), "{s:?}");
    }

    #[test]
    fn oversized_messages_are_rejected() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        c.write_all(&(u32::MAX).to_le_bytes()).unwrap();
        let e = recv::<serde_json::Value>(&mut s).unwrap_err().to_string();
        assert!(e.contains("oversized"), "{e}");
    }
}
