//! Configuration: one typed [`Config`], read from the environment by [`Config::from_env`].
//!
//! Every variable is declared exactly once, in [`ENV_VARS`], with its default and meaning; the
//! README table is checked against that list by a test, so docs and code cannot drift.

use crate::error::{Error, Result};
use serde::Deserialize;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// One documented environment variable.
#[derive(Debug, Clone, Copy)]
pub struct EnvVar {
    /// Variable name.
    pub name: &'static str,
    /// Default value as text ("" when there is none).
    pub default: &'static str,
    /// What it does.
    pub help: &'static str,
}

macro_rules! env_vars {
    ($($ident:ident = $name:literal, $default:literal, $help:literal;)*) => {
        $(#[doc = $help] pub const $ident: &str = $name;)*
        /// Every environment variable boltccl reads, with its default and meaning.
        pub const ENV_VARS: &[EnvVar] = &[$(EnvVar { name: $name, default: $default, help: $help }),*];
    };
}

env_vars! {
    RANK = "BOLTCCL_RANK", "", "This process's rank, 0-based. Falls back to JACCL_RANK, MLX_RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID.";
    WORLD_SIZE = "BOLTCCL_WORLD_SIZE", "", "Number of ranks. Falls back to MLX_WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS, or the hostfile length.";
    COORDINATOR = "BOLTCCL_COORDINATOR", "", "ip:port that rank 0 listens on and every rank dials. Falls back to MLX_JACCL_COORDINATOR, JACCL_COORDINATOR, or rank 0's first hostfile address.";
    JOB_KEY = "BOLTCCL_JOB_KEY", "", "Shared secret; every connection proves it by HMAC-SHA256 challenge-response. The launcher generates one.";
    TIMEOUT_MS = "BOLTCCL_TIMEOUT_MS", "30000", "A collective fails if no byte moves for this long (milliseconds).";
    INIT_TIMEOUT_MS = "BOLTCCL_INIT_TIMEOUT_MS", "60000", "Deadline for forming the group: dialling the coordinator (with retry) and connecting to peers.";
    BACKEND = "BOLTCCL_BACKEND", "auto", "tcp, verbs or auto (verbs where RDMA devices are configured, else TCP).";
    ALGO = "BOLTCCL_ALGO", "auto", "Force an algorithm: auto, mesh, direct (reduce-scatter + all-gather on a full mesh) or ring (bidirectional). For benchmarks.";
    CHUNK_BYTES = "BOLTCCL_CHUNK_BYTES", "1048576", "Pipelining unit: large transfers move in chunks of this many bytes. Must agree on all ranks.";
    MESH_MAX_BYTES = "BOLTCCL_MESH_MAX_BYTES", "65536", "With ALGO=auto, reductions up to this many bytes use the one-step mesh algorithm. Must agree on all ranks.";
    TCP_STREAMS = "BOLTCCL_TCP_STREAMS", "1", "TCP connections per peer; chunks are striped across them. Must agree on all ranks.";
    SPIN_US = "BOLTCCL_SPIN_US", "auto", "Microseconds to poll before sleeping. Default: 1000 when this host has a core per rank (the first quarter, at most 50, spins hard; the rest yields between checks), 0 when ranks outnumber cores (a waiting rank would take CPU from the one it waits for; a value set here then only yields).";
    BIND = "BOLTCCL_BIND", "", "Local IP for this rank's data listener. Default: the hostfile address, else the address this host uses to reach the coordinator. Never all interfaces unless you say 0.0.0.0.";
    LOCAL_WORLD_SIZE = "BOLTCCL_LOCAL_WORLD_SIZE", "", "Ranks on this host (set by the launcher; used to decide whether busy-polling is safe).";
    HOSTFILE = "BOLTCCL_HOSTFILE", "", "JSON hostfile: a list of lists of \"ip:port\" per rank (MLX ring format), or MLX launcher host entries. Falls back to MLX_HOSTFILE.";
    IBV_DEVICES = "BOLTCCL_IBV_DEVICES", "", "Path to the JSON N x N RDMA device matrix (MLX format). Falls back to MLX_IBV_DEVICES.";
    IBV_LIBRARY = "BOLTCCL_IBV_LIBRARY", "", "Verbs library to load instead of the default (librdma.dylib on macOS, libibverbs.so.1 elsewhere), e.g. the softverbs test double.";
    IBV_RECV_DEPTH = "BOLTCCL_IBV_RECV_DEPTH", "16", "Receives kept posted per RDMA queue pair (2..=32; Apple's provider fails past about 62, 32 is safe). Sets each peer's send credits.";
    IBV_SEND_DEPTH = "BOLTCCL_IBV_SEND_DEPTH", "8", "Sends in flight per RDMA queue pair (1..=32): bounds outstanding work requests and staging memory.";
    IBV_ZERO_COPY = "BOLTCCL_IBV_ZERO_COPY", "0", "1: RDMA sends of large pieces go straight from the caller's buffers (registered on first use and cached) instead of through staging copies. Only for programs that keep their buffers allocated while the group lives: a buffer freed and another allocated at the same address could be sent from stale pinned pages.";
    IBV_MR_CACHE = "BOLTCCL_IBV_MR_CACHE", "32", "With zero-copy: registrations of caller memory kept per queue pair (1..=64; Apple's provider allows about 100 per device), least recently used evicted first.";
    LOG = "BOLTCCL_LOG", "warn", "Log filter (tracing EnvFilter syntax): error, warn, info, debug, trace.";
}

impl Backend {
    /// Name as accepted by `BOLTCCL_BACKEND`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Tcp => "tcp",
            Backend::Verbs => "verbs",
            Backend::Auto => "auto",
        }
    }
}

/// Which transport to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// TCP sockets.
    Tcp,
    /// RDMA verbs (UC queue pairs).
    Verbs,
    /// Verbs where RDMA devices are configured, otherwise TCP.
    Auto,
}

/// Which collective algorithm to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Chosen from message size and topology.
    Auto,
    /// Every rank sends its whole buffer to every peer (one step; small messages).
    Mesh,
    /// Reduce-scatter then all-gather, all links at once (large messages on a full mesh).
    Direct,
    /// Bidirectional ring (ring topologies).
    Ring,
}

impl Algo {
    /// Name as accepted by `BOLTCCL_ALGO`.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Auto => "auto",
            Algo::Mesh => "mesh",
            Algo::Direct => "direct",
            Algo::Ring => "ring",
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
    /// Pipelining chunk size in bytes.
    pub chunk_bytes: usize,
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
    fn default() -> Self {
        Config {
            rank: 0,
            world_size: 1,
            coordinator: None,
            job_key: None,
            timeout: Duration::from_millis(30_000),
            init_timeout: Duration::from_millis(60_000),
            backend: Backend::Auto,
            algo: Algo::Auto,
            chunk_bytes: 1 << 20,
            mesh_max_bytes: 1 << 16,
            tcp_streams: 1,
            spin: None,
            bind: None,
            local_world_size: None,
            hosts: None,
            ibv_devices: None,
            ibv_library: None,
            ibv_recv_depth: 16,
            ibv_send_depth: 8,
            ibv_zero_copy: false,
            ibv_mr_cache: 32,
        }
    }
}

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
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let first = |names: &[&str]| -> Option<(String, String)> {
            names
                .iter()
                .find_map(|n| get(n).filter(|v| !v.trim().is_empty()).map(|v| (n.to_string(), v.trim().to_string())))
        };
        let mut cfg = Config::default();

        let hostfile = first(&[HOSTFILE, "MLX_HOSTFILE"]);
        if let Some((var, path)) = &hostfile {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::Config(format!("{var}={path}: cannot read hostfile: {e}")))?;
            cfg.hosts = Some(parse_hostfile(&text).map_err(|e| Error::Config(format!("{var}={path}: {e}")))?);
        }

        if let Some((var, v)) =
            first(&[RANK, "JACCL_RANK", "MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"])
        {
            cfg.rank = parse_num(&var, &v)?;
        }
        if let Some((var, v)) =
            first(&[WORLD_SIZE, "MLX_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"])
        {
            cfg.world_size = parse_num(&var, &v)?;
        } else if let Some(h) = &cfg.hosts {
            cfg.world_size = h.len();
        }
        cfg.coordinator = first(&[COORDINATOR, "MLX_JACCL_COORDINATOR", "JACCL_COORDINATOR"])
            .map(|(_, v)| v)
            .or_else(|| cfg.hosts.as_ref().and_then(|h| h.first()).and_then(|r| r.first()).cloned());
        cfg.job_key = first(&[JOB_KEY]).map(|(_, v)| v);
        if let Some((var, v)) = first(&[TIMEOUT_MS]) {
            cfg.timeout = Duration::from_millis(parse_num(&var, &v)?);
        }
        if let Some((var, v)) = first(&[INIT_TIMEOUT_MS]) {
            cfg.init_timeout = Duration::from_millis(parse_num(&var, &v)?);
        }
        if let Some((var, v)) = first(&[BACKEND]) {
            cfg.backend = match v.to_ascii_lowercase().as_str() {
                "tcp" => Backend::Tcp,
                "verbs" | "rdma" | "ibv" => Backend::Verbs,
                "auto" => Backend::Auto,
                _ => return Err(Error::Config(format!("{var}={v}: expected tcp, verbs or auto"))),
            };
        }
        if let Some((var, v)) = first(&[ALGO]) {
            cfg.algo = parse_algo(&v)
                .ok_or_else(|| Error::Config(format!("{var}={v}: expected auto, mesh, direct or ring")))?;
        }
        if let Some((var, v)) = first(&[CHUNK_BYTES]) {
            cfg.chunk_bytes = parse_num(&var, &v)?;
        }
        if let Some((var, v)) = first(&[MESH_MAX_BYTES]) {
            cfg.mesh_max_bytes = parse_num(&var, &v)?;
        }
        if let Some((var, v)) = first(&[TCP_STREAMS]) {
            cfg.tcp_streams = parse_num(&var, &v)?;
        }
        if let Some((var, v)) = first(&[SPIN_US]) {
            if v != "auto" {
                cfg.spin = Some(Duration::from_micros(parse_num(&var, &v)?));
            }
        }
        if let Some((var, v)) = first(&[BIND]) {
            cfg.bind = Some(v.parse().map_err(|_| Error::Config(format!("{var}={v}: not an IP address")))?);
        }
        if let Some((var, v)) = first(&[LOCAL_WORLD_SIZE, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]) {
            cfg.local_world_size = Some(parse_num(&var, &v)?);
        }
        cfg.ibv_devices = first(&[IBV_DEVICES, "MLX_IBV_DEVICES", "JACCL_IBV_DEVICES"]).map(|(_, v)| v.into());
        cfg.ibv_library = first(&[IBV_LIBRARY]).map(|(_, v)| v.into());
        if let Some((var, v)) = first(&[IBV_RECV_DEPTH]) {
            cfg.ibv_recv_depth = parse_num(&var, &v)?;
        }
        if let Some((var, v)) = first(&[IBV_SEND_DEPTH]) {
            cfg.ibv_send_depth = parse_num(&var, &v)?;
        }
        if let Some((var, v)) = first(&[IBV_ZERO_COPY]) {
            cfg.ibv_zero_copy = match v.as_str() {
                "1" | "true" | "on" => true,
                "0" | "false" | "off" => false,
                _ => return Err(Error::Config(format!("{var}={v}: expected 1 or 0"))),
            };
        }
        if let Some((var, v)) = first(&[IBV_MR_CACHE]) {
            cfg.ibv_mr_cache = parse_num(&var, &v)?;
        }
        cfg.validate()?;
        Ok(cfg)
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
        if !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&self.chunk_bytes) || self.chunk_bytes % 8 != 0 {
            return Err(Error::Config(format!(
                "{CHUNK_BYTES}={}: must be a multiple of 8 between {MIN_CHUNK_BYTES} and {MAX_CHUNK_BYTES}",
                self.chunk_bytes
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

    /// The settings that every rank must agree on, as (name, value) pairs.
    pub(crate) fn agreed_settings(&self) -> Vec<(String, String)> {
        vec![
            (ALGO.to_string(), self.algo.name().to_string()),
            (CHUNK_BYTES.to_string(), self.chunk_bytes.to_string()),
            (MESH_MAX_BYTES.to_string(), self.mesh_max_bytes.to_string()),
            (TCP_STREAMS.to_string(), self.tcp_streams.to_string()),
            ("world size".to_string(), self.world_size.to_string()),
            // The element-type numbering is wire format: a rank built with another is refused.
            ("element types".to_string(), crate::types::DType::ALL.map(|d| d.name()).join(",")),
            // After `auto` is resolved: one rank on RDMA and another on TCP must not meet.
            (
                "transport (BOLTCCL_BACKEND; auto picks tcp where RDMA is unavailable)".to_string(),
                self.backend.name().to_string(),
            ),
        ]
    }
}

fn parse_num<T: std::str::FromStr>(var: &str, v: &str) -> Result<T> {
    v.parse().map_err(|_| Error::Config(format!("{var}={v}: expected a non-negative integer")))
}

/// Parse an algorithm name as accepted by `BOLTCCL_ALGO`.
pub fn parse_algo(v: &str) -> Option<Algo> {
    match v.to_ascii_lowercase().as_str() {
        "auto" => Some(Algo::Auto),
        "mesh" => Some(Algo::Mesh),
        "direct" | "rsag" => Some(Algo::Direct),
        "ring" => Some(Algo::Ring),
        _ => None,
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum HostfileText {
    /// MLX ring format: one list of "ip:port" per rank.
    Ring(Vec<Vec<String>>),
    /// MLX launcher format: a bare list of hosts.
    Hosts(Vec<HostEntry>),
    /// MLX launcher format: `{"backend": ..., "envs": [...], "hosts": [...]}`.
    Object { hosts: Vec<HostEntry> },
}

/// One host of an MLX launcher hostfile.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct HostEntry {
    /// Host name to ssh to.
    pub ssh: String,
    /// Addresses of this host (the first one is used for boltccl traffic).
    #[serde(default)]
    pub ips: Vec<String>,
}

/// Parse a hostfile into the list of addresses of each rank. Accepts the MLX ring format
/// (list of lists of `"ip:port"`) and the MLX launcher format (host entries with `ssh`/`ips`).
pub fn parse_hostfile(text: &str) -> std::result::Result<Vec<Vec<String>>, String> {
    let parsed: HostfileText = serde_json::from_str(text).map_err(|e| {
        format!("not a hostfile ({e}); expected a JSON list of lists of \"ip:port\", or a list of {{\"ssh\": ..., \"ips\": [...]}}")
    })?;
    let ranks = match parsed {
        HostfileText::Ring(r) => r,
        HostfileText::Hosts(h) | HostfileText::Object { hosts: h } => {
            h.into_iter().map(|e| if e.ips.is_empty() { vec![e.ssh] } else { e.ips }).collect()
        }
    };
    if ranks.is_empty() {
        return Err("the hostfile lists no ranks".into());
    }
    if let Some(i) = ranks.iter().position(|r| r.is_empty()) {
        return Err(format!("rank {i} has no address in the hostfile"));
    }
    Ok(ranks)
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
        assert!(e.contains("expected auto, mesh, direct or ring"), "{e}");
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
    fn every_variable_is_documented_in_the_readme() {
        let readme = include_str!("../../README.md");
        for v in ENV_VARS {
            let default = if v.default.is_empty() { "—" } else { v.default };
            let row = format!("| `{}` | {} | {} |", v.name, default, v.help);
            assert!(readme.contains(&row), "README's environment table lacks or differs on this row:\n{row}");
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
