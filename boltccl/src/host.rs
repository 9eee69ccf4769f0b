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

/// The CPUs this process may run on (its affinity), ascending; empty where it cannot be told.
pub fn cpus() -> Vec<u16> {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{sched_getaffinity, CpuSet};
        match sched_getaffinity(None) {
            Ok(set) => (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).map(|c| c as u16).collect(),
            Err(_) => Vec::new(),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        Vec::new()
    }
}

/// How many threads this process may run at once (its affinity and any CPU quota).
pub fn parallelism() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
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
    /// The CPUs the rank may run on ([`cpus`]); empty where unknown.
    #[serde(default)]
    pub cpus: Vec<u16>,
    /// The rank's [`parallelism`]: below `cpus.len()` when a CPU quota caps it.
    #[serde(default)]
    pub parallelism: usize,
}

impl PeerInfo {
    /// What this rank tells the others: where it takes data connections (`data_addr`) and
    /// shared-memory links (`shm`), its host and its CPUs.
    pub(crate) fn here(data_addr: SocketAddr, shm: Option<String>) -> PeerInfo {
        PeerInfo {
            data_addr,
            host: host_name(),
            host_id: host_identity(),
            shm,
            cpus: cpus(),
            parallelism: parallelism(),
        }
    }
}

/// The ranks that share memory with `rank`: the same host identity, and both offer it.
pub(crate) fn local_peers(peers: &[PeerInfo], rank: usize) -> Vec<usize> {
    let me = &peers[rank];
    if me.shm.is_none() || me.host_id.is_empty() {
        return Vec::new();
    }
    (0..peers.len()).filter(|&q| q != rank && peers[q].shm.is_some() && peers[q].host_id == me.host_id).collect()
}

/// The ranks on `rank`'s host (the same host identity, or the same name where the identity is
/// unknown), `rank` included.
fn on_host(peers: &[PeerInfo], rank: usize) -> impl Iterator<Item = &PeerInfo> {
    let me = &peers[rank];
    peers.iter().filter(|p| if me.host_id.is_empty() { p.host == me.host } else { p.host_id == me.host_id })
}

/// How many ranks run on `rank`'s host.
pub(crate) fn local_ranks(peers: &[PeerInfo], rank: usize) -> usize {
    on_host(peers, rank).count()
}

/// The ranks of `rank`'s host that may run on its CPUs (itself included), and how many CPUs
/// those ranks may use between them: what decides whether waiting for a message takes CPU
/// from a rank that needs it. Two ranks a launcher pinned to a core each do not contend;
/// four unpinned ranks on two cores do. `None` when some rank's CPUs are unknown.
pub(crate) fn cpu_contention(peers: &[PeerInfo], rank: usize) -> Option<(usize, usize)> {
    let mine = &peers[rank].cpus;
    if on_host(peers, rank).any(|p| p.cpus.is_empty()) {
        return None;
    }
    let overlapping: Vec<&PeerInfo> =
        on_host(peers, rank).filter(|p| p.cpus.iter().any(|c| mine.contains(c))).collect();
    let mut union: Vec<u16> = overlapping.iter().flat_map(|p| p.cpus.iter().copied()).collect();
    union.sort_unstable();
    union.dedup();
    // A quota (parallelism below the CPUs allowed) caps what the ranks share.
    let quota =
        overlapping.iter().filter(|p| p.parallelism > 0 && p.parallelism < p.cpus.len()).map(|p| p.parallelism).min();
    Some((overlapping.len(), quota.map_or(union.len(), |q| q.min(union.len()))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(host_id: &str, cpus: &[u16], parallelism: usize) -> PeerInfo {
        PeerInfo {
            data_addr: "127.0.0.1:1".parse().unwrap(),
            host: "h".into(),
            host_id: host_id.into(),
            shm: None,
            cpus: cpus.to_vec(),
            parallelism,
        }
    }

    #[test]
    fn ranks_pinned_to_a_core_each_do_not_contend() {
        let peers = [peer("a", &[0], 1), peer("a", &[1], 1)];
        assert_eq!(cpu_contention(&peers, 0), Some((1, 1)));
        assert_eq!(cpu_contention(&peers, 1), Some((1, 1)));
    }

    #[test]
    fn unpinned_ranks_share_the_host_cores() {
        let two = [peer("a", &[0, 1], 2), peer("a", &[0, 1], 2)];
        assert_eq!(cpu_contention(&two, 1), Some((2, 2)));
        let four: Vec<PeerInfo> = (0..4).map(|_| peer("a", &[0, 1], 2)).collect();
        assert_eq!(cpu_contention(&four, 3), Some((4, 2)));
    }

    #[test]
    fn ranks_pinned_onto_one_core_contend_and_other_hosts_do_not_count() {
        // Three ranks on two cores, pinned r % 2, and a rank of another host on core 0.
        let peers = [peer("a", &[0], 1), peer("a", &[1], 1), peer("a", &[0], 1), peer("b", &[0], 1)];
        assert_eq!(cpu_contention(&peers, 0), Some((2, 1)));
        assert_eq!(cpu_contention(&peers, 1), Some((1, 1)));
    }

    #[test]
    fn a_quota_caps_the_shared_cores_and_unknown_cpus_give_no_answer() {
        let peers = [peer("a", &[0, 1, 2, 3], 2), peer("a", &[0, 1, 2, 3], 2), peer("a", &[0, 1, 2, 3], 2)];
        assert_eq!(cpu_contention(&peers, 0), Some((3, 2)));
        let unknown = [peer("a", &[0], 1), peer("a", &[], 0)];
        assert_eq!(cpu_contention(&unknown, 0), None);
    }
}
