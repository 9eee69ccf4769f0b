//! Shared-memory links between rank processes need abstract unix sockets (Linux); elsewhere
//! ranks on one host use TCP (threads of one process still share rings).

use crate::config::Config;
use crate::error::{Error, Result};
use crate::host::PeerInfo;
use crate::transport::links::Links;

/// A rank's offer of shared memory: never made here.
pub(crate) struct Offer;

impl Offer {
    /// Always unsupported on this OS.
    pub(crate) fn bind() -> Result<Offer> {
        Err(Error::Unsupported("shared-memory links between processes are implemented for Linux only".into()))
    }

    /// Never called: no offer exists.
    pub(crate) fn name(&self) -> &str {
        ""
    }
}

/// Nothing to attach.
pub(crate) fn attach(_: &mut Links, _: Offer, _: &[PeerInfo], _: u64, _: &Config) -> Result<()> {
    Ok(())
}
