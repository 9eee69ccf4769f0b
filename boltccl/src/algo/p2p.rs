//! Point-to-point send and receive: one framed message, cut into chunk pieces.
//!
//! Sequence numbers are kept per pair and direction (other ranks do not see these calls), and
//! the header carries the element type and count, so a receive that does not match its send
//! is an error on both sides, not a silent truncation.

use super::direct::{recv_pieces, send_pieces};
use super::Comm;
use crate::error::Result;
use crate::wire::Phase;

/// Send `buf` to group rank `to`.
pub(crate) fn send(comm: &mut Comm<'_>, buf: &[u8], to: usize) -> Result<()> {
    let sends = send_pieces(comm, to, buf, Phase::PointToPoint)?;
    comm.exchange(&sends, &mut [], &mut |_, _| Ok(()))
}

/// Receive into `buf` from group rank `from`.
pub(crate) fn recv(comm: &mut Comm<'_>, buf: &mut [u8], from: usize) -> Result<()> {
    let mut recvs = recv_pieces(comm, from, buf, Phase::PointToPoint)?;
    comm.exchange(&[], &mut recvs, &mut |_, _| Ok(()))
}
