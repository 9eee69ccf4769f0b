//! The bootstrap's messages (`crate::bootstrap`): length-capped JSON over the authenticated
//! TCP connections (see [`crate::auth`]). Field names are wire format: renaming one breaks
//! groups that mix versions (which the version check in `Hello` refuses anyway).

use crate::host::PeerInfo;
use serde::{Deserialize, Serialize};

/// What every rank tells rank 0 when it joins.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Hello {
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) version: String,
    pub(crate) settings: Vec<(String, String)>,
    /// Where this rank takes data connections, its host, shared-memory offer and CPUs: what
    /// every rank learns of it (the same JSON fields, inline).
    #[serde(flatten)]
    pub(crate) peer: PeerInfo,
}

/// Rank 0's answer to every `Hello`: the table of all ranks, or why the group cannot form.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Reply {
    Table {
        job: u64,
        peers: Vec<PeerInfo>,
    },
    /// `timed_out`: the coordinator gave up at the init deadline (else the settings or ranks
    /// are wrong).
    Reject {
        rank: Option<usize>,
        what: String,
        #[serde(default)]
        timed_out: bool,
    },
}

/// What a rank dialling a lower one says first: whose connection this is. Streams
/// `0..BOLTCCL_TCP_STREAMS` carry data; stream `BOLTCCL_TCP_STREAMS` (one past them) is the
/// pair's control connection, between ranks other than 0.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Join {
    pub(crate) job: u64,
    pub(crate) rank: usize,
    pub(crate) stream: usize,
}
