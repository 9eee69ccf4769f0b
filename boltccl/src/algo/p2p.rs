//! Point-to-point send and receive: one framed message, cut into chunk pieces.
//!
//! Sequence numbers are kept per pair and direction (other ranks do not see these calls), and
//! the header carries the element type and count, so a receive that does not match its send
//! is an error on both sides, not a silent truncation.

use super::direct::{recv_pieces, send_pieces};
use super::Ctx;
use crate::error::Result;

const PHASE_P2P: u32 = 6;

/// Send `buf` to group rank `to`.
pub(crate) fn send(ctx: &mut Ctx<'_>, buf: &[u8], to: usize) -> Result<()> {
    let sends = send_pieces(ctx, to, buf, PHASE_P2P);
    ctx.exchange(&sends, &mut [], &mut |_, _| Ok(()))
}

/// Receive into `buf` from group rank `from`.
pub(crate) fn recv(ctx: &mut Ctx<'_>, buf: &mut [u8], from: usize) -> Result<()> {
    let mut recvs = recv_pieces(ctx, from, buf, PHASE_P2P);
    ctx.exchange(&[], &mut recvs, &mut |_, _| Ok(()))
}
