//! Every environment variable boltccl reads, declared once: its name, default, meaning, the
//! other launchers' variables it falls back to, and how its text sets the [`Config`]. The
//! defaults of [`Config::default`] are these texts parsed, and the table in
//! `docs/environment.md` is checked against [`VARS`] by a test, so code, defaults and docs
//! cannot drift.

use super::{parse_algo, Backend, Config};
use std::time::Duration;

/// This process's rank.
pub const RANK: &str = "BOLTCCL_RANK";
/// Number of ranks.
pub const WORLD_SIZE: &str = "BOLTCCL_WORLD_SIZE";
/// Where rank 0 listens.
pub const COORDINATOR: &str = "BOLTCCL_COORDINATOR";
/// The job's shared secret.
pub const JOB_KEY: &str = "BOLTCCL_JOB_KEY";
/// Per-call deadline.
pub const TIMEOUT_MS: &str = "BOLTCCL_TIMEOUT_MS";
/// Deadline for forming the group.
pub const INIT_TIMEOUT_MS: &str = "BOLTCCL_INIT_TIMEOUT_MS";
/// Transport choice.
pub const BACKEND: &str = "BOLTCCL_BACKEND";
/// Algorithm choice.
pub const ALGO: &str = "BOLTCCL_ALGO";
/// Bytes of each shared-memory ring.
pub const SHM_RING_BYTES: &str = "BOLTCCL_SHM_RING_BYTES";
/// Smallest payload pulled in one copy.
pub const SHM_PULL_BYTES: &str = "BOLTCCL_SHM_PULL_BYTES";
/// Pipelining unit.
pub const CHUNK_BYTES: &str = "BOLTCCL_CHUNK_BYTES";
/// Largest mesh all-reduce.
pub const MESH_MAX_BYTES: &str = "BOLTCCL_MESH_MAX_BYTES";
/// TCP connections per peer.
pub const TCP_STREAMS: &str = "BOLTCCL_TCP_STREAMS";
/// Busy-poll budget.
pub const SPIN_US: &str = "BOLTCCL_SPIN_US";
/// Data listener address.
pub const BIND: &str = "BOLTCCL_BIND";
/// Ranks on this host.
pub const LOCAL_WORLD_SIZE: &str = "BOLTCCL_LOCAL_WORLD_SIZE";
/// Per-rank addresses.
pub const HOSTFILE: &str = "BOLTCCL_HOSTFILE";
/// RDMA device matrix.
pub const IBV_DEVICES: &str = "BOLTCCL_IBV_DEVICES";
/// Verbs library override.
pub const IBV_LIBRARY: &str = "BOLTCCL_IBV_LIBRARY";
/// Receives posted per queue pair.
pub const IBV_RECV_DEPTH: &str = "BOLTCCL_IBV_RECV_DEPTH";
/// Sends in flight per queue pair.
pub const IBV_SEND_DEPTH: &str = "BOLTCCL_IBV_SEND_DEPTH";
/// Zero-copy RDMA sends.
pub const IBV_ZERO_COPY: &str = "BOLTCCL_IBV_ZERO_COPY";
/// Cached registrations per queue pair.
pub const IBV_MR_CACHE: &str = "BOLTCCL_IBV_MR_CACHE";
/// Log filter (read by the hosts' log output, not by [`Config`]).
pub const LOG: &str = "BOLTCCL_LOG";

/// One environment variable.
#[derive(Clone, Copy)]
pub struct Var {
    /// Variable name.
    pub name: &'static str,
    /// Default value as text ("" when there is none).
    pub default: &'static str,
    /// What it does.
    pub help: &'static str,
    /// Other launchers' variables read, in order, when this one is not set.
    pub fallbacks: &'static [&'static str],
    /// Set the configuration from the variable's text (trimmed, not empty).
    pub(crate) apply: fn(&mut Config, &str) -> Result<(), String>,
}

impl Var {
    /// The documentation of the variable: its meaning and what it falls back to.
    pub fn doc(&self) -> String {
        match self.fallbacks {
            [] => self.help.to_string(),
            f => format!("{} Falls back to {}.", self.help, f.join(", ")),
        }
    }
}

impl std::fmt::Debug for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Var").field("name", &self.name).field("default", &self.default).finish()
    }
}

fn num<T: std::str::FromStr>(v: &str) -> Result<T, String> {
    v.parse().map_err(|_| "expected a non-negative integer".to_string())
}

fn ms(v: &str) -> Result<Duration, String> {
    num(v).map(Duration::from_millis)
}

fn flag(v: &str) -> Result<bool, String> {
    match v {
        "1" | "true" | "on" => Ok(true),
        "0" | "false" | "off" => Ok(false),
        _ => Err("expected 1 or 0".into()),
    }
}

/// Every environment variable boltccl reads.
pub const VARS: &[Var] = &[
    Var {
        name: RANK,
        default: "",
        help: "This process's rank, 0-based. Else from the launcher that started the process (see Launchers).",
        fallbacks: &[],
        apply: |c, v| {
            c.rank = num(v)?;
            Ok(())
        },
    },
    Var {
        name: WORLD_SIZE,
        default: "",
        help: "Number of ranks. Else from the launcher, else the hostfile's length.",
        fallbacks: &[],
        apply: |c, v| {
            c.world_size = num(v)?;
            Ok(())
        },
    },
    Var {
        name: COORDINATOR,
        default: "",
        help: "ip:port that rank 0 listens on and every rank dials. Else derived from the launcher's variables or the hostfile: rank 0's host and a port computed from the job's identity, never a port the launcher or the hostfile gives to another program (see Launchers).",
        fallbacks: &["MLX_JACCL_COORDINATOR", "JACCL_COORDINATOR"],
        apply: |c, v| {
            c.coordinator = Some(v.into());
            Ok(())
        },
    },
    Var {
        name: JOB_KEY,
        default: "",
        help: "Shared secret; every connection proves it by HMAC-SHA256 challenge-response. `boltccl launch` generates one; under other launchers a key derived from the job keeps jobs apart (not a secret: set one to authenticate).",
        fallbacks: &[],
        apply: |c, v| {
            c.job_key = Some(v.into());
            Ok(())
        },
    },
    Var {
        name: TIMEOUT_MS,
        default: "30000",
        help: "A collective fails if no byte moves for this long (milliseconds).",
        fallbacks: &[],
        apply: |c, v| {
            c.timeout = ms(v)?;
            Ok(())
        },
    },
    Var {
        name: INIT_TIMEOUT_MS,
        default: "60000",
        help: "Deadline for forming the group: dialling the coordinator (with retry) and connecting to peers.",
        fallbacks: &[],
        apply: |c, v| {
            c.init_timeout = ms(v)?;
            Ok(())
        },
    },
    Var {
        name: BACKEND,
        default: "auto",
        help: "Which links carry the data. auto: shared memory between ranks on one host, RDMA where a device matrix cables a pair and the verbs library lists devices, TCP for the rest. shm: shared memory on a host, TCP between hosts. verbs: RDMA for cabled pairs, TCP for the rest. tcp: TCP everywhere.",
        fallbacks: &[],
        apply: |c, v| {
            c.backend = match v.to_ascii_lowercase().as_str() {
                "tcp" => Backend::Tcp,
                "shm" => Backend::Shm,
                "verbs" | "rdma" | "ibv" => Backend::Verbs,
                "auto" => Backend::Auto,
                _ => return Err("expected auto, shm, verbs or tcp".into()),
            };
            Ok(())
        },
    },
    Var {
        name: ALGO,
        default: "auto",
        help: "Force an algorithm: auto, mesh, doubling (recursive doubling; all-reduce only), direct (reduce-scatter + all-gather on a full mesh) or ring (bidirectional). For benchmarks.",
        fallbacks: &[],
        apply: |c, v| {
            c.algo = parse_algo(v).ok_or("expected auto, mesh, doubling, direct or ring")?;
            Ok(())
        },
    },
    Var {
        name: SHM_RING_BYTES,
        default: "1048576",
        help: "Bytes of each shared-memory ring (one per pair of ranks on a host, in the receiver's memory): a multiple of 64, at least 4096. Must agree on all ranks.",
        fallbacks: &[],
        apply: |c, v| {
            c.shm_ring_bytes = num(v)?;
            Ok(())
        },
    },
    Var {
        name: SHM_PULL_BYTES,
        default: "65536",
        help: "Between ranks of one host, payloads at least this long are copied once, straight from the sender's memory (process_vm_readv, on Linux where the system allows it), instead of twice through the ring; 0 turns that off. Must agree on all ranks.",
        fallbacks: &[],
        apply: |c, v| {
            c.shm_pull_bytes = num(v)?;
            Ok(())
        },
    },
    Var {
        name: CHUNK_BYTES,
        default: "auto",
        help: "Pipelining unit: large transfers move in chunks of this many bytes. auto: 1 MiB, or where every pair of a group is shared memory up to 8 MiB (16 MiB of scratch / (ranks - 1)). Must agree on all ranks.",
        fallbacks: &[],
        apply: |c, v| {
            c.chunk_bytes = if v.eq_ignore_ascii_case("auto") { None } else { Some(num(v)?) };
            Ok(())
        },
    },
    Var {
        name: MESH_MAX_BYTES,
        default: "32768",
        help: "With ALGO=auto, reductions up to this many bytes use the one-step mesh algorithm. Must agree on all ranks.",
        fallbacks: &[],
        apply: |c, v| {
            c.mesh_max_bytes = num(v)?;
            Ok(())
        },
    },
    Var {
        name: TCP_STREAMS,
        default: "1",
        help: "TCP connections per peer; chunks are striped across them. Must agree on all ranks.",
        fallbacks: &[],
        apply: |c, v| {
            c.tcp_streams = num(v)?;
            Ok(())
        },
    },
    Var {
        name: SPIN_US,
        default: "auto",
        help: "Microseconds to poll before sleeping. Default: 1000 when this rank has a core to itself - the ranks that may run on its CPUs (their affinity, which launchers that pin ranks set) are no more than those CPUs - (the first quarter, at most 50, spins hard; the rest yields between checks). When ranks outnumber the cores they share: 50, yielding, for calls up to 2 MiB while this rank's recent waits were short (ranks trading messages), else 0 (a waiting rank would take CPU from the one it waits for, computing or copying); a value set here is used as is, yielding only.",
        fallbacks: &[],
        apply: |c, v| {
            c.spin = if v == "auto" { None } else { Some(Duration::from_micros(num(v)?)) };
            Ok(())
        },
    },
    Var {
        name: BIND,
        default: "",
        help: "Local IP for this rank's data listener. Default: the rank's hostfile IP, else the address this host uses to reach the coordinator. Never all interfaces unless you say 0.0.0.0.",
        fallbacks: &[],
        apply: |c, v| {
            c.bind = Some(v.parse().map_err(|_| "not an IP address")?);
            Ok(())
        },
    },
    Var {
        name: LOCAL_WORLD_SIZE,
        default: "",
        help: "Ranks on this host (used to decide whether busy-polling is safe). Else from the launcher, else counted in the hostfile.",
        fallbacks: &[],
        apply: |c, v| {
            c.local_world_size = Some(num(v)?);
            Ok(())
        },
    },
    Var {
        name: HOSTFILE,
        default: "",
        help: "JSON hostfile: a list of lists of \"ip:port\" per rank (MLX ring format), or MLX launcher host entries. Its addresses choose each rank's interface; its ports are never bound (MLX's ring backend listens there).",
        fallbacks: &["MLX_HOSTFILE"],
        apply: |c, path| {
            let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read hostfile: {e}"))?;
            // `mlx.launch -n 1` writes an empty hostfile: one rank, no peers.
            c.hosts = if text.trim().is_empty() { None } else { Some(super::hostfile::parse_hostfile(&text)?) };
            Ok(())
        },
    },
    Var {
        name: IBV_DEVICES,
        default: "",
        help: "Path to the JSON N x N RDMA device matrix (MLX format).",
        fallbacks: &["MLX_IBV_DEVICES", "JACCL_IBV_DEVICES"],
        apply: |c, v| {
            c.ibv_devices = Some(v.into());
            Ok(())
        },
    },
    Var {
        name: IBV_LIBRARY,
        default: "",
        help: "Verbs library to load instead of the default (librdma.dylib on macOS, libibverbs.so.1 elsewhere), e.g. the softverbs test double.",
        fallbacks: &[],
        apply: |c, v| {
            c.ibv_library = Some(v.into());
            Ok(())
        },
    },
    Var {
        name: IBV_RECV_DEPTH,
        default: "16",
        help: "Receives kept posted per RDMA queue pair (2..=32; Apple's provider fails past about 62, 32 is safe). Sets each peer's send credits.",
        fallbacks: &[],
        apply: |c, v| {
            c.ibv_recv_depth = num(v)?;
            Ok(())
        },
    },
    Var {
        name: IBV_SEND_DEPTH,
        default: "8",
        help: "Sends in flight per RDMA queue pair (1..=32): bounds outstanding work requests and staging memory.",
        fallbacks: &[],
        apply: |c, v| {
            c.ibv_send_depth = num(v)?;
            Ok(())
        },
    },
    Var {
        name: IBV_ZERO_COPY,
        default: "0",
        help: "1: RDMA sends of large pieces go straight from the caller's buffers (registered on first use and cached) instead of through staging copies. Only for programs that keep their buffers allocated while the group lives: a buffer freed and another allocated at the same address could be sent from stale pinned pages.",
        fallbacks: &[],
        apply: |c, v| {
            c.ibv_zero_copy = flag(v)?;
            Ok(())
        },
    },
    Var {
        name: IBV_MR_CACHE,
        default: "32",
        help: "With zero-copy: registrations of caller memory kept per queue pair (1..=64; Apple's provider allows about 100 per device), least recently used evicted first.",
        fallbacks: &[],
        apply: |c, v| {
            c.ibv_mr_cache = num(v)?;
            Ok(())
        },
    },
    Var {
        name: LOG,
        default: "warn",
        help: "Log filter for programs that print boltccl's log with `log_to_stderr` (the boltccl command, C and Python): a level (error, warn, info, debug, trace) or per target (`boltccl=debug,warn`).",
        fallbacks: &[],
        apply: |_, _| Ok(()),
    },
];
