//! Who runs where: this host's name and identity, and what every rank learns about every
//! other at bootstrap ([`PeerInfo`]), with the questions answered from it (which ranks share a
//! host). Depends on nothing else in the library: bootstrap, the transports and `doctor` all
//! read it.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// This host's name (what `uname -n` prints).
pub fn host_name() -> String {
    rustix::system::uname().nodename().to_string_lossy().into_owned()
}

/// Which kernel and network namespace this process runs in: ranks with the same identity can
/// share memory (the same boot, and abstract unix sockets reach each other), whatever their
/// host names say. Empty where it cannot be told (shared memory is then not offered).
pub fn host_identity() -> String {
    #[cfg(target_os = "linux")]
    {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let netns = std::fs::read_link("/proc/self/ns/net").map(|p| p.display().to_string()).unwrap_or_default();
        if boot.trim().is_empty() || netns.is_empty() {
            return String::new();
        }
        format!("{}/{netns}", boot.trim())
    }
    #[cfg(not(target_os = "linux"))]
    {
        String::new()
    }
}

/// What every rank learns about every other.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PeerInfo {
    /// Where the rank takes data connections.
    pub data_addr: SocketAddr,
    /// Host name.
    pub host: String,
    /// Host identity: ranks with equal ones share a kernel and a network namespace.
    pub host_id: String,
    /// The rank's shared-memory set-up address, when it offers shared memory.
    pub shm: Option<String>,
}

/// The ranks that share memory with `rank`: the same host identity, and both offer it.
pub(crate) fn local_peers(peers: &[PeerInfo], rank: usize) -> Vec<usize> {
    let me = &peers[rank];
    if me.shm.is_none() || me.host_id.is_empty() {
        return Vec::new();
    }
    (0..peers.len()).filter(|&q| q != rank && peers[q].shm.is_some() && peers[q].host_id == me.host_id).collect()
}

/// How many ranks run on `rank`'s host (the same host identity, or the same name where the
/// identity is unknown).
pub(crate) fn local_ranks(peers: &[PeerInfo], rank: usize) -> usize {
    let me = &peers[rank];
    peers.iter().filter(|p| if me.host_id.is_empty() { p.host == me.host } else { p.host_id == me.host_id }).count()
}
