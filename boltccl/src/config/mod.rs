//! Configuration: one typed [`Config`], read from the environment by [`Config::from_env`].
//!
//! Every variable is declared once, in [`VARS`], with its default, its fallbacks and its
//! parser; the table in `docs/environment.md` is checked against that list by a test, so docs
//! and code cannot drift.

mod hostfile;
mod hostlist;
pub mod launchers;
mod vars;

pub use hostfile::{parse_hostfile, parse_launch_hostfile, HostEntry};
pub use hostlist::expand_hostlist;
pub use vars::*;

use crate::error::{Error, Result};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

impl Backend {
    /// Name as accepted by `BOLTCCL_BACKEND`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Tcp => "tcp",
            Backend::Shm => "shm",
            Backend::Verbs => "verbs",
            Backend::Auto => "auto",
        }
    }
}

/// Which transport to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// TCP sockets everywhere.
    Tcp,
    /// Shared memory between ranks on one host, TCP between hosts.
    Shm,
    /// RDMA verbs (UC queue pairs) for the pairs the device matrix cables, TCP for the rest.
    Verbs,
    /// Shared memory on a host, RDMA where configured and present, TCP for the rest.
    Auto,
}

/// Which collective algorithm to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Chosen from message size and topology.
    Auto,
    /// Every rank sends its whole buffer to every peer (one step; small messages).
    Mesh,
    /// Recursive doubling: log2(P) steps of one message each (small messages, four or more
    /// ranks).
    Doubling,
    /// Reduce-scatter then all-gather, all links at once (large messages on a full mesh).
    Direct,
    /// Bidirectional ring (ring topologies).
    Ring,
    /// Two levels, for a group spread over hosts with several ranks on each: inside each
    /// host over shared memory, host totals between hosts (chosen by `Auto` only).
    Hosts,
}

impl Algo {
    /// Name as accepted by `BOLTCCL_ALGO`.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Auto => "auto",
            Algo::Mesh => "mesh",
            Algo::Doubling => "doubling",
            Algo::Direct => "direct",
            Algo::Ring => "ring",
            Algo::Hosts => "hosts",
        }
    }
}

/// Everything needed to form a group. Build it by hand, or with [`Config::from_env`].
#[derive(Debug, Clone)]
pub struct Config {
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Where rank 0 listens (`host:port`). Required for more than one rank.
    pub coordinator: Option<String>,
    /// Shared job secret.
    pub job_key: Option<String>,
    /// Per-collective deadline, measured from the last progress.
    pub timeout: Duration,
    /// Deadline for forming the group.
    pub init_timeout: Duration,
    /// Transport selection.
    pub backend: Backend,
    /// Algorithm selection.
    pub algo: Algo,
    /// Bytes of each shared-memory ring.
    pub shm_ring_bytes: usize,
    /// Smallest payload pulled in one copy between ranks of one host (0: never).
    pub shm_pull_bytes: usize,
    /// Pipelining chunk size in bytes; `None` (`auto`): chosen per group from its links
    /// ([`crate::Group::chunk_bytes`] says which).
    pub chunk_bytes: Option<usize>,
    /// Auto selection: reductions up to this size use the mesh algorithm.
    pub mesh_max_bytes: usize,
    /// TCP connections per peer.
    pub tcp_streams: usize,
    /// Busy-poll budget before blocking; `None` decides from the ranks per host.
    pub spin: Option<Duration>,
    /// Local address for the data listener.
    pub bind: Option<IpAddr>,
    /// Ranks on this host, when known.
    pub local_world_size: Option<usize>,
    /// Per-rank addresses from a hostfile, when one was given.
    pub hosts: Option<Vec<Vec<String>>>,
    /// RDMA device matrix path.
    pub ibv_devices: Option<PathBuf>,
    /// Verbs library override (`BOLTCCL_IBV_LIBRARY`).
    pub ibv_library: Option<PathBuf>,
    /// Receives posted per queue pair (the peer's send credits).
    pub ibv_recv_depth: usize,
    /// Sends in flight per queue pair.
    pub ibv_send_depth: usize,
    /// Send large pieces straight from registered caller memory (`BOLTCCL_IBV_ZERO_COPY`).
    pub ibv_zero_copy: bool,
    /// Cached registrations of caller memory per queue pair.
    pub ibv_mr_cache: usize,
}

impl Default for Config {
    /// One rank, and every variable's documented default (see [`VARS`]).
    fn default() -> Self {
        let mut c = Config {
            rank: 0,
            world_size: 1,
            coordinator: None,
            job_key: None,
            timeout: Duration::ZERO,
            init_timeout: Duration::ZERO,
            backend: Backend::Auto,
            algo: Algo::Auto,
            shm_ring_bytes: 0,
            shm_pull_bytes: 0,
            chunk_bytes: None,
            mesh_max_bytes: 0,
            tcp_streams: 0,
            spin: None,
            bind: None,
            local_world_size: None,
            hosts: None,
            ibv_devices: None,
            ibv_library: None,
            ibv_recv_depth: 0,
            ibv_send_depth: 0,
            ibv_zero_copy: false,
            ibv_mr_cache: 0,
        };
        for v in VARS.iter().filter(|v| !v.default.is_empty()) {
            (v.apply)(&mut c, v.default).expect("every default parses");
        }
        c
    }
}

/// The `auto` chunk of a group with any network link (TCP, RDMA).
pub const NET_CHUNK_BYTES: usize = 1 << 20;
/// The largest `auto` chunk of a group whose every pair is shared memory.
pub const SHM_CHUNK_BYTES: usize = 8 << 20;

/// Smallest chunk allowed: small enough for tests to reach multi-chunk paths with tiny buffers.
pub const MIN_CHUNK_BYTES: usize = 64;
/// Largest chunk allowed: Apple's largest RDMA message (16,773,120 bytes).
pub const MAX_CHUNK_BYTES: usize = 16_773_120;

impl Config {
    /// Read the configuration from the process environment.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Read the configuration through `get` (a stand-in for the environment, for tests).
    ///
    /// `BOLTCCL_*` variables win; what they leave unset comes from the launcher that started
    /// the process ([`launchers::detect`]), then from the hostfile.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let get = |k: &str| get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let mut cfg = Config::default();
        let mut set: Vec<&str> = Vec::new();
        for var in VARS {
            let found = std::iter::once(&var.name).chain(var.fallbacks).find_map(|n| get(n).map(|v| (*n, v)));
            if let Some((name, value)) = found {
                (var.apply)(&mut cfg, &value).map_err(|e| Error::Config(format!("{name}={value}: {e}")))?;
                set.push(var.name);
            }
        }
        let launch = launchers::detect(&get).map_err(Error::Config)?;
        if let Some(l) = launch.launcher {
            tracing::debug!(launcher = l.name, "started by a known launcher");
        }
        if !set.contains(&RANK) {
            cfg.rank = launch.rank.unwrap_or(cfg.rank);
        }
        if !set.contains(&WORLD_SIZE) {
            cfg.world_size = launch.world_size.or(cfg.hosts.as_ref().map(Vec::len)).unwrap_or(cfg.world_size);
        }
        if !set.contains(&LOCAL_WORLD_SIZE) {
            cfg.local_world_size = launch.local_world_size.or_else(|| cfg.ranks_on_my_host());
        }
        if cfg.coordinator.is_none() && cfg.world_size > 1 {
            cfg.coordinator = match launch.coordinator {
                Some(Ok(c)) => Some(c),
                Some(Err(why)) => return Err(Error::Config(why)),
                None => cfg.hosts.as_deref().and_then(launchers::hostfile_coordinator),
            };
        }
        if cfg.job_key.is_none() {
            if let (Some(l), Some(c)) = (launch.launcher, &cfg.coordinator) {
                // Not a secret (the launcher's variables are not), but it keeps jobs apart:
                // a rank of another job on the same ports is refused.
                tracing::debug!("{JOB_KEY} is not set: using one derived from the launcher's job");
                cfg.job_key = Some(format!("derived from {} at {c}", l.name));
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Ranks whose first hostfile address is on the same host as this rank's.
    fn ranks_on_my_host(&self) -> Option<usize> {
        let hosts = self.hosts.as_ref()?;
        let host = |r: &Vec<String>| r.first().map(|e| launchers::split_host_port(e).0);
        let mine = host(hosts.get(self.rank)?)?;
        Some(hosts.iter().filter(|r| host(r).as_deref() == Some(mine.as_str())).count())
    }

    /// Check that the settings make sense together. Called by `from_env` and by `Group::new`.
    pub fn validate(&self) -> Result<()> {
        if self.world_size == 0 {
            return Err(Error::Config("world size must be at least 1".into()));
        }
        if self.rank >= self.world_size {
            return Err(Error::Config(format!(
                "rank {} is out of range for world size {} (ranks are 0..{}); check {RANK} and {WORLD_SIZE}",
                self.rank,
                self.world_size,
                self.world_size - 1
            )));
        }
        if let Some(chunk) = self.chunk_bytes.filter(|c| !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(c) || c % 8 != 0)
        {
            return Err(Error::Config(format!(
                "{CHUNK_BYTES}={chunk}: must be auto or a multiple of 8 between {MIN_CHUNK_BYTES} and {MAX_CHUNK_BYTES}"
            )));
        }
        if self.shm_ring_bytes < 4096 || self.shm_ring_bytes % 64 != 0 || self.shm_ring_bytes > 1 << 30 {
            return Err(Error::Config(format!(
                "{SHM_RING_BYTES}={}: must be a multiple of 64 between 4096 and 1 GiB",
                self.shm_ring_bytes
            )));
        }
        if !(1..=16).contains(&self.tcp_streams) {
            return Err(Error::Config(format!("{TCP_STREAMS}={}: must be between 1 and 16", self.tcp_streams)));
        }
        if self.world_size > 1 && self.coordinator.is_none() {
            return Err(Error::Config(format!(
                "{} ranks need a coordinator: set {COORDINATOR}=ip:port (rank 0's address) or use `boltccl launch`",
                self.world_size
            )));
        }
        if let Some(h) = &self.hosts {
            if h.len() != self.world_size {
                return Err(Error::Config(format!(
                    "the hostfile lists {} ranks but the world size is {}",
                    h.len(),
                    self.world_size
                )));
            }
        }
        if !(2..=32).contains(&self.ibv_recv_depth) {
            return Err(Error::Config(format!(
                "{IBV_RECV_DEPTH}={}: must be between 2 and 32 (Apple's provider rejects deeper receive queues)",
                self.ibv_recv_depth
            )));
        }
        if !(1..=64).contains(&self.ibv_mr_cache) {
            return Err(Error::Config(format!("{IBV_MR_CACHE}={}: must be between 1 and 64", self.ibv_mr_cache)));
        }
        if !(1..=32).contains(&self.ibv_send_depth) {
            return Err(Error::Config(format!("{IBV_SEND_DEPTH}={}: must be between 1 and 32", self.ibv_send_depth)));
        }
        if self.timeout.is_zero() || self.init_timeout.is_zero() {
            return Err(Error::Config("timeouts must be positive".into()));
        }
        Ok(())
    }

    /// Resolve the coordinator address.
    pub(crate) fn coordinator_addr(&self) -> Result<SocketAddr> {
        let text = self.coordinator.as_deref().ok_or_else(|| Error::Config(format!("{COORDINATOR} is not set")))?;
        text.to_socket_addrs()
            .map_err(|e| Error::Config(format!("{COORDINATOR}={text}: cannot resolve: {e}")))?
            .next()
            .ok_or_else(|| Error::Config(format!("{COORDINATOR}={text}: resolves to no address")))
    }

    /// The settings that every rank must agree on, as (name, value) pairs; `links` names the
    /// links this rank will use (after `auto` is resolved).
    pub(crate) fn agreed_settings(&self, links: &str) -> Vec<(String, String)> {
        vec![
            (ALGO.to_string(), self.algo.name().to_string()),
            (CHUNK_BYTES.to_string(), self.chunk_bytes.map_or("auto".to_string(), |c| c.to_string())),
            (MESH_MAX_BYTES.to_string(), self.mesh_max_bytes.to_string()),
            (TCP_STREAMS.to_string(), self.tcp_streams.to_string()),
            (SHM_RING_BYTES.to_string(), self.shm_ring_bytes.to_string()),
            (SHM_PULL_BYTES.to_string(), self.shm_pull_bytes.to_string()),
            ("world size".to_string(), self.world_size.to_string()),
            // The element-type numbering is wire format: a rank built with another is refused.
            ("element types".to_string(), crate::types::DType::ALL.map(|d| d.name()).join(",")),
            // After `auto` is resolved: one rank on RDMA and another on TCP must not meet.
            ("transport (BOLTCCL_BACKEND; auto uses TCP where RDMA is unavailable)".to_string(), links.to_string()),
        ]
    }
}

/// Parse an algorithm name as accepted by `BOLTCCL_ALGO`.
pub fn parse_algo(v: &str) -> Option<Algo> {
    match v.to_ascii_lowercase().as_str() {
        "auto" => Some(Algo::Auto),
        "mesh" => Some(Algo::Mesh),
        "doubling" => Some(Algo::Doubling),
        "direct" | "rsag" => Some(Algo::Direct),
        "ring" => Some(Algo::Ring),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_form_a_single_rank_group() {
        let c = cfg(&[]).unwrap();
        assert_eq!((c.rank, c.world_size), (0, 1));
        assert_eq!(c.timeout, Duration::from_secs(30));
    }

    #[test]
    fn boltccl_vars_win_over_mpi_and_slurm() {
        let c = cfg(&[
            ("BOLTCCL_RANK", "2"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("SLURM_NTASKS", "4"),
            ("BOLTCCL_COORDINATOR", "127.0.0.1:5000"),
        ])
        .unwrap();
        assert_eq!((c.rank, c.world_size), (2, 4));
        let c = cfg(&[("PMI_RANK", "1"), ("PMI_SIZE", "3"), ("MLX_JACCL_COORDINATOR", "10.0.0.1:1")]).unwrap();
        assert_eq!((c.rank, c.world_size, c.coordinator.as_deref()), (1, 3, Some("10.0.0.1:1")));
    }

    #[test]
    fn errors_say_what_to_fix() {
        let e = cfg(&[("BOLTCCL_RANK", "4"), ("BOLTCCL_WORLD_SIZE", "4"), ("BOLTCCL_COORDINATOR", "a:1")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 4 is out of range") && e.contains("BOLTCCL_RANK"), "{e}");
        let e = cfg(&[("BOLTCCL_WORLD_SIZE", "2")]).unwrap_err().to_string();
        assert!(e.contains("BOLTCCL_COORDINATOR"), "{e}");
        let e = cfg(&[("BOLTCCL_ALGO", "tree")]).unwrap_err().to_string();
        assert!(e.contains("expected auto, mesh, doubling, direct or ring"), "{e}");
        let e = cfg(&[("BOLTCCL_CHUNK_BYTES", "12")]).unwrap_err().to_string();
        assert!(e.contains("multiple of 8"), "{e}");
        let e = cfg(&[("BOLTCCL_TIMEOUT_MS", "soon")]).unwrap_err().to_string();
        assert!(e.contains("BOLTCCL_TIMEOUT_MS=soon"), "{e}");
    }

    #[test]
    fn hostfile_formats() {
        let ring = parse_hostfile(r#"[["10.0.0.1:5000","10.0.1.1:5000"],["10.0.0.2:5000"]]"#).unwrap();
        assert_eq!(ring[1], vec!["10.0.0.2:5000"]);
        let hosts =
            parse_hostfile(r#"{"backend":"jaccl","hosts":[{"ssh":"m1","ips":["1.2.3.4"]},{"ssh":"m2"}]}"#).unwrap();
        assert_eq!(hosts, vec![vec!["1.2.3.4".to_string()], vec!["m2".to_string()]]);
        assert!(parse_hostfile("[]").is_err());
        assert!(parse_hostfile("[[]]").unwrap_err().contains("rank 0"));
        assert!(parse_hostfile("{").unwrap_err().contains("expected a JSON list"));
    }

    #[test]
    fn every_variable_is_in_docs_environment() {
        let page = include_str!("../../../docs/environment.md");
        for v in VARS {
            let default = if v.default.is_empty() { "—" } else { v.default };
            let row = format!("| `{}` | {} | {} |", v.name, default, v.doc());
            assert!(page.contains(&row), "docs/environment.md's table lacks or differs on this row:\n{row}");
        }
    }

    proptest! {
        #[test]
        fn parser_never_panics(text in ".{0,200}") {
            let _ = parse_hostfile(&text);
        }

        #[test]
        fn rank_and_size_round_trip(size in 1usize..64, r in 0usize..64) {
            let rank = r % size;
            let (rs, ss) = (rank.to_string(), size.to_string());
            let c = cfg(&[("BOLTCCL_RANK", &rs), ("BOLTCCL_WORLD_SIZE", &ss), ("BOLTCCL_COORDINATOR", "127.0.0.1:1")]).unwrap();
            prop_assert_eq!((c.rank, c.world_size), (rank, size));
        }
    }
}
