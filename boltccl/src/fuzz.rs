//! Every parser of bytes that come from another process, and the bootstrap steps, for the fuzz
//! harnesses (`tests/fuzz.rs`) and the hostile-peer tests (`tests/hostile.rs`) only: **not part
//! of the API** (hidden from the documentation; may change in any release).
//!
//! Nothing here is a second implementation: each item is the code the library itself runs on
//! what arrives from a socket or a file, reached without the socket.

use crate::config::Config;
use crate::error::Result;
use std::net::TcpStream;

/// The authenticated handshake and length-capped messages.
pub mod auth {
    pub use crate::auth::*;
}
pub use crate::bootstrap::sans_io::{hello, join, reject_reply, table_reply, vet_hello, vet_join, vet_reply};
pub use crate::transport::verbs::topology::DeviceMatrix;
pub use crate::wire::frame::{Control, ControlDecoder, Incoming, Outgoing};
pub use crate::wire::verbs::{parse_endpoints, Endpoint, ENDPOINT_LEN};
pub use crate::wire::{abort_frame, check, part, Header, Kind, Phase, HEADER_LEN, MAX_REASON};

/// The settings a rank with `cfg` and TCP links only sends in its `Hello`, which every rank
/// must share.
pub fn agreed_settings(cfg: &Config) -> Vec<(String, String)> {
    cfg.agreed_settings("tcp")
}

/// A group formed the way [`crate::Group::new`] forms one over TCP (coordinator, handshake,
/// agreed settings, data mesh), stopped before any transport is built: the raw, authenticated
/// connections. A hostile-peer test joins with these and then sends what it likes.
pub struct Joined {
    /// `links[peer][stream]`: the data connections (none to this rank).
    pub links: Vec<Vec<TcpStream>>,
    /// `control[peer]`: the control connection to every other rank (none to this rank).
    pub control: Vec<Option<TcpStream>>,
}

/// Join the group `cfg` describes with TCP links only (as `BOLTCCL_BACKEND=tcp` ranks do) and
/// hand back its connections (see [`Joined`]).
pub fn rendezvous(cfg: &Config) -> Result<Joined> {
    cfg.validate()?;
    let r = crate::bootstrap::connect(cfg, "tcp", None)?;
    Ok(Joined { links: r.links, control: r.control })
}
