//! The launchers boltccl starts under without configuration: which one started this process
//! (from its own markers), and the rank, size, ranks per host and coordinator its variables
//! give. Each launcher is declared once, in [`LAUNCHERS`]; the table in `docs/launchers.md` is
//! checked against it by a test.
//!
//! Explicit `BOLTCCL_*` variables always win. A launcher is *detected* only when all its
//! markers are set (so a stray `RANK` in someone's shell is not read as torchrun's); its
//! variables then come first. The rank, size and ranks-per-host variables of the other
//! launchers (never the generic ones) are read after it, as a fallback, so a partial
//! environment keeps working.
//!
//! A coordinator the launcher does not give is derived: rank 0's host (from the launcher)
//! and a port computed from the job's identity, so every rank computes the same address with
//! no exchange. Derived ports lie in [`DERIVED_PORTS`], below the ephemeral ranges of Linux
//! (32768–60999) and macOS (49152–65535), so they never collide with a data listener (which
//! takes an ephemeral port), and never equal a port the launcher gave to someone else (torch's
//! store on `MASTER_PORT`, MLX's ring ports in its hostfile).

use super::hostlist::{expand_hostlist, expand_tasks_per_node};
use sha2::{Digest, Sha256};
use std::ops::Range;

/// The environment, as a lookup (trimmed, empty values unset).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Computes what plain variables cannot say: (world size, ranks on this host).
type Derive = fn(Env) -> Result<(Option<usize>, Option<usize>), String>;
/// Rank 0's address, given this rank (`Err`: why it cannot be known, and what to set).
type Coordinator = fn(Env, usize) -> Result<String, String>;

/// Ports a derived coordinator may get.
pub const DERIVED_PORTS: Range<u16> = 20000..32768;

/// One launcher boltccl understands.
pub struct Launcher {
    /// How it is usually invoked.
    pub name: &'static str,
    /// Variables that must all be set for this launcher to be the one that started us.
    pub markers: &'static [&'static str],
    /// What boltccl reads from it (the table in `docs/launchers.md`).
    pub reads: &'static str,
    /// What the user must add (the table in `docs/launchers.md`).
    pub user_adds: &'static str,
    /// Its names are generic (`RANK`): read only when it is detected, never as a fallback.
    generic: bool,
    rank: &'static [&'static str],
    size: &'static [&'static str],
    local_size: &'static [&'static str],
    derive: Option<Derive>,
    coordinator: Option<Coordinator>,
}

impl std::fmt::Debug for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launcher").field("name", &self.name).finish()
    }
}

/// Every launcher, in the order they are tried: the innermost first (torchrun or mlx.launch
/// run inside a Slurm allocation, and mpirun inside an `sbatch` script, see Slurm's variables
/// too).
pub const LAUNCHERS: &[Launcher] = &[
    Launcher {
        name: "`torchrun --nproc-per-node N` (`python -m torch.distributed.run`)",
        markers: &["TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"],
        reads: "`RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`; coordinator: `MASTER_ADDR` and a port derived from `TORCHELASTIC_RUN_ID`, `MASTER_PORT` and the restart count (never `MASTER_PORT` itself, torch's store)",
        user_adds: "nothing",
        generic: true,
        rank: &["RANK"],
        size: &["WORLD_SIZE"],
        local_size: &["LOCAL_WORLD_SIZE"],
        derive: None,
        coordinator: Some(torchrun_coordinator),
    },
    Launcher {
        name: "`mlx.launch -n N` (ring backend)",
        markers: &["MLX_RANK", "MLX_HOSTFILE"],
        reads: "`MLX_RANK`, `MLX_HOSTFILE` (ranks, their IPs); coordinator: rank 0's IP and a port derived from the hostfile (never one of its ports: MLX's ring listens there)",
        user_adds: "nothing",
        generic: false,
        rank: &["MLX_RANK"],
        size: &["MLX_WORLD_SIZE"],
        local_size: &[],
        derive: None,
        // Derived from the hostfile, as for any hostfile.
        coordinator: None,
    },
    Launcher {
        name: "`mlx.launch --backend jaccl`",
        markers: &["MLX_RANK", "MLX_JACCL_COORDINATOR"],
        reads: "`MLX_RANK`, `MLX_JACCL_COORDINATOR` (the coordinator), `MLX_IBV_DEVICES` (size, RDMA devices)",
        user_adds: "nothing",
        generic: false,
        rank: &["MLX_RANK"],
        size: &["MLX_WORLD_SIZE"],
        local_size: &[],
        derive: Some(jaccl_size),
        // MLX_JACCL_COORDINATOR is read as BOLTCCL_COORDINATOR's alias.
        coordinator: None,
    },
    Launcher {
        name: "JACCL's own variables",
        markers: &["JACCL_RANK", "JACCL_COORDINATOR"],
        reads: "`JACCL_RANK`, `JACCL_COORDINATOR`, `JACCL_IBV_DEVICES`",
        user_adds: "nothing",
        generic: false,
        rank: &["JACCL_RANK"],
        size: &[],
        local_size: &[],
        derive: Some(jaccl_size),
        coordinator: None,
    },
    Launcher {
        name: "`mpirun -np N` (Open MPI)",
        markers: &["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"],
        reads: "`OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_SIZE`; coordinator on one host: 127.0.0.1 and a port derived from the job id (`PMIX_NAMESPACE`)",
        user_adds: "nothing on one host; across hosts `-x BOLTCCL_COORDINATOR=<rank 0's IP>:<free port>` (Open MPI does not tell a process where rank 0 runs)",
        generic: false,
        rank: &["OMPI_COMM_WORLD_RANK"],
        size: &["OMPI_COMM_WORLD_SIZE"],
        local_size: &["OMPI_COMM_WORLD_LOCAL_SIZE"],
        derive: None,
        coordinator: Some(ompi_coordinator),
    },
    Launcher {
        name: "`mpiexec` (MPICH / Hydra, PMI)",
        markers: &["PMI_RANK", "PMI_SIZE"],
        reads: "`PMI_RANK`, `PMI_SIZE`, `MPI_LOCALNRANKS`",
        user_adds: "`-genv BOLTCCL_COORDINATOR <rank 0's IP>:<free port>`",
        generic: false,
        rank: &["PMI_RANK"],
        size: &["PMI_SIZE"],
        local_size: &["MPI_LOCALNRANKS"],
        derive: None,
        coordinator: Some(|_, _| {
            Err("Hydra (mpiexec) does not say where rank 0 runs: add `-genv BOLTCCL_COORDINATOR <rank 0's IP>:<free port>`".into())
        }),
    },
    Launcher {
        name: "`srun` (Slurm)",
        markers: &["SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_JOB_ID"],
        reads: "`SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`, `SLURM_STEP_TASKS_PER_NODE` with `SLURM_NODEID`; coordinator: the first host of `SLURM_STEP_NODELIST` (host lists such as `node[01-04,07]` expanded) and a port derived from `SLURM_JOB_ID` and `SLURM_STEP_ID`",
        user_adds: "nothing (with Slurm's default block or cyclic distribution, which puts task 0 on the first node)",
        generic: false,
        rank: &["SLURM_PROCID"],
        size: &["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"],
        local_size: &[],
        derive: Some(slurm_local_size),
        coordinator: Some(slurm_coordinator),
    },
];

/// What the environment says about this process.
#[derive(Debug, Default)]
pub struct Detected {
    /// The launcher whose markers are all present, if any.
    pub launcher: Option<&'static Launcher>,
    /// This process's rank.
    pub rank: Option<usize>,
    /// Number of ranks.
    pub world_size: Option<usize>,
    /// Ranks on this host.
    pub local_world_size: Option<usize>,
    /// The launcher's coordinator (`Err`: why it cannot give one; `None`: it says nothing).
    pub coordinator: Option<Result<String, String>>,
}

fn number(env: Env, names: &[&str]) -> Result<Option<usize>, String> {
    for &n in names {
        if let Some(v) = env(n) {
            return v.parse().map(Some).map_err(|_| format!("{n}={v}: expected a non-negative integer"));
        }
    }
    Ok(None)
}

/// Read what the launcher that started this process says (see the module documentation).
pub fn detect(env: Env) -> Result<Detected, String> {
    let launcher = LAUNCHERS.iter().find(|l| l.markers.iter().all(|m| env(m).is_some()));
    let mut d = Detected { launcher, ..Detected::default() };
    // The detected launcher first, then the others' own (non-generic) variables.
    let order = launcher.into_iter().chain(LAUNCHERS.iter().filter(|l| !l.generic));
    for l in order {
        d.rank = d.rank.or(number(env, l.rank)?);
        d.world_size = d.world_size.or(number(env, l.size)?);
        d.local_world_size = d.local_world_size.or(number(env, l.local_size)?);
    }
    if let Some(l) = launcher {
        if let Some(derive) = l.derive {
            let (size, local) = derive(env)?;
            d.world_size = d.world_size.or(size);
            d.local_world_size = d.local_world_size.or(local);
        }
        if let Some(coordinator) = l.coordinator {
            d.coordinator = Some(coordinator(env, d.rank.unwrap_or(0)));
        }
    }
    Ok(d)
}

/// A port in [`DERIVED_PORTS`] computed from `seed`, never one of `avoid`.
pub fn derived_port(seed: &str, avoid: &[u16]) -> u16 {
    let h = Sha256::digest(seed.as_bytes());
    let span = u64::from(DERIVED_PORTS.end - DERIVED_PORTS.start);
    let mut offset = u64::from_le_bytes(h[..8].try_into().expect("8 bytes")) % span;
    loop {
        let port = DERIVED_PORTS.start + offset as u16;
        if !avoid.contains(&port) {
            return port;
        }
        offset = (offset + 1) % span;
    }
}

/// `host:port`, bracketing IPv6 addresses.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Split a hostfile entry (`ip:port`, `[v6]:port`, `host:port`, `ip` or `host`) into the host
/// and the port, if any.
pub fn split_host_port(entry: &str) -> (String, Option<u16>) {
    if let Ok(a) = entry.parse::<std::net::SocketAddr>() {
        return (a.ip().to_string(), Some(a.port()));
    }
    if entry.parse::<std::net::IpAddr>().is_ok() {
        return (entry.to_string(), None);
    }
    match entry.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && !h.contains(':') => match p.parse() {
            Ok(port) => (h.to_string(), Some(port)),
            Err(_) => (entry.to_string(), None),
        },
        _ => (entry.to_string(), None),
    }
}

/// The coordinator of a job described by a hostfile: rank 0's first host, on a port derived
/// from the hostfile and different from every port in it (MLX's ring backend listens there,
/// and so may this job's other ranks).
pub fn hostfile_coordinator(hosts: &[Vec<String>]) -> Option<String> {
    let first = hosts.first()?.first()?;
    let avoid: Vec<u16> = hosts.iter().flatten().filter_map(|e| split_host_port(e).1).collect();
    let seed = format!("hostfile:{}", hosts.iter().map(|r| r.join(",")).collect::<Vec<_>>().join(";"));
    Some(join_host_port(&split_host_port(first).0, derived_port(&seed, &avoid)))
}

fn var(env: Env, name: &str) -> Result<String, String> {
    env(name).ok_or_else(|| format!("{name} is not set"))
}

fn torchrun_coordinator(env: Env, _rank: usize) -> Result<String, String> {
    let addr = var(env, "MASTER_ADDR")?;
    let port_text = var(env, "MASTER_PORT")?;
    let master_port: u16 = port_text.parse().map_err(|_| format!("MASTER_PORT={port_text}: not a port"))?;
    let seed = format!(
        "torchrun:{}:{master_port}:{}",
        var(env, "TORCHELASTIC_RUN_ID")?,
        env("TORCHELASTIC_RESTART_COUNT").unwrap_or_default()
    );
    Ok(join_host_port(&addr, derived_port(&seed, &[master_port])))
}

fn ompi_coordinator(env: Env, _rank: usize) -> Result<String, String> {
    let size = number(env, &["OMPI_COMM_WORLD_SIZE"])?;
    let local = number(env, &["OMPI_COMM_WORLD_LOCAL_SIZE"])?;
    if size.is_none() || size != local {
        return Err(format!(
            "mpirun spread the {} ranks over several hosts, and Open MPI does not tell a process where \
             rank 0 runs: add `-x BOLTCCL_COORDINATOR=<rank 0's IP>:<free port>` to the mpirun command",
            size.unwrap_or(0)
        ));
    }
    let job = env("PMIX_NAMESPACE").or_else(|| env("OMPI_MCA_ess_base_jobid")).ok_or_else(|| {
        "mpirun gave no job id (PMIX_NAMESPACE or OMPI_MCA_ess_base_jobid): add \
         `-x BOLTCCL_COORDINATOR=127.0.0.1:<free port>` to the mpirun command"
            .to_string()
    })?;
    Ok(join_host_port("127.0.0.1", derived_port(&format!("ompi:{job}"), &[])))
}

/// The ranks of a JACCL job: the side of its N x N device matrix.
fn jaccl_size(env: Env) -> Result<(Option<usize>, Option<usize>), String> {
    let Some(path) = env("MLX_IBV_DEVICES").or_else(|| env("JACCL_IBV_DEVICES")) else { return Ok((None, None)) };
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read the RDMA device matrix {path}: {e}"))?;
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text)
        .map_err(|e| format!("the RDMA device matrix {path} is not a JSON list of rows: {e}"))?;
    Ok((Some(rows.len()), None))
}

fn slurm_nodes(env: Env) -> Result<Vec<String>, String> {
    let list =
        env("SLURM_STEP_NODELIST").or_else(|| env("SLURM_JOB_NODELIST")).ok_or("SLURM_STEP_NODELIST is not set")?;
    expand_hostlist(&list).map_err(|e| format!("SLURM_STEP_NODELIST={list}: {e}"))
}

fn slurm_local_size(env: Env) -> Result<(Option<usize>, Option<usize>), String> {
    let (Some(per_node), Some(node)) = (env("SLURM_STEP_TASKS_PER_NODE"), number(env, &["SLURM_NODEID"])?) else {
        return Ok((None, None));
    };
    let counts = expand_tasks_per_node(&per_node).map_err(|e| format!("SLURM_STEP_TASKS_PER_NODE={per_node}: {e}"))?;
    let local = counts.get(node).copied().ok_or_else(|| {
        format!("SLURM_NODEID={node} but SLURM_STEP_TASKS_PER_NODE={per_node} lists {} nodes", counts.len())
    })?;
    Ok((Some(counts.iter().sum()), Some(local)))
}

fn slurm_coordinator(env: Env, rank: usize) -> Result<String, String> {
    let nodes = slurm_nodes(env)?;
    let first = &nodes[0];
    if rank == 0 {
        if let Some(me) = env("SLURMD_NODENAME") {
            if &me != first {
                return Err(format!(
                    "task 0 runs on {me}, not on the step's first node {first} (a custom task distribution?): \
                     set BOLTCCL_COORDINATOR=<{me}'s IP>:<free port> for every task"
                ));
            }
        }
    }
    let seed = format!("slurm:{}.{}", var(env, "SLURM_JOB_ID")?, var(env, "SLURM_STEP_ID")?);
    Ok(join_host_port(first, derived_port(&seed, &[])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn detect_in(vars: &[(&str, &str)]) -> Detected {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        detect(&|k: &str| m.get(k).cloned()).unwrap()
    }

    #[test]
    fn every_launcher_is_in_docs_launchers() {
        let page = include_str!("../../../docs/launchers.md");
        for l in LAUNCHERS {
            let markers = l.markers.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ");
            let row = format!("| {} | {markers} | {} | {} |", l.name, l.reads, l.user_adds);
            assert!(page.contains(&row), "docs/launchers.md's table lacks or differs on this row:\n{row}");
        }
    }

    #[test]
    fn a_stray_rank_is_not_torchrun() {
        let d = detect_in(&[("RANK", "3"), ("WORLD_SIZE", "8")]);
        assert!(d.launcher.is_none());
        assert_eq!((d.rank, d.world_size), (None, None));
    }

    #[test]
    fn torchrun_coordinator_avoids_the_store_port() {
        let torchrun = [
            ("TORCHELASTIC_RUN_ID", "none"),
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29500"),
            // An outer Slurm step must not win over torchrun, which runs inside it.
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ];
        let d = detect_in(&torchrun);
        assert_eq!((d.rank, d.world_size, d.local_world_size), (Some(1), Some(4), Some(4)));
        let c = d.coordinator.unwrap().unwrap();
        let port: u16 = c.strip_prefix("10.1.2.3:").unwrap().parse().unwrap();
        assert!(DERIVED_PORTS.contains(&port) && port != 29500);
    }

    #[test]
    fn derived_ports_skip_what_they_must_avoid() {
        let p = derived_port("x", &[]);
        assert_ne!(derived_port("x", &[p]), p);
        assert!(DERIVED_PORTS.contains(&derived_port("x", &[p])));
        assert_ne!(derived_port("job 1", &[]), derived_port("job 2", &[]));
    }

    #[test]
    fn mlx_ring_hostfile_coordinator_is_never_a_hostfile_port() {
        // What mlx.launch -n 2 writes: the ports MLX's ring backend listens on.
        let hosts = vec![vec!["127.0.0.1:32323".to_string()], vec!["127.0.0.1:32324".to_string()]];
        let c = hostfile_coordinator(&hosts).unwrap();
        let (host, port) = split_host_port(&c);
        assert_eq!(host, "127.0.0.1");
        assert!(![32323, 32324].contains(&port.unwrap()));
        let v6 = hostfile_coordinator(&[vec!["[fe80::1]:5000".into()]]).unwrap();
        assert!(v6.starts_with("[fe80::1]:"), "{v6}");
    }

    #[test]
    fn open_mpi_on_one_host_and_across_hosts() {
        let one = detect_in(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("PMIX_NAMESPACE", "772603905"),
        ]);
        assert!(one.coordinator.unwrap().unwrap().starts_with("127.0.0.1:"));
        let two = detect_in(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("PMIX_NAMESPACE", "772603905"),
        ]);
        let e = two.coordinator.unwrap().unwrap_err();
        assert!(e.contains("-x BOLTCCL_COORDINATOR="), "{e}");
    }

    #[test]
    fn slurm_step() {
        // The variables srun sets for task 5 of `srun -N 3 -n 6` on node[01-02,07].
        let env = [
            ("SLURM_PROCID", "5"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_NODELIST", "node[01-02,07]"),
            ("SLURM_STEP_NUM_TASKS", "6"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x3)"),
            ("SLURM_NODEID", "2"),
            ("SLURMD_NODENAME", "node07"),
        ];
        let d = detect_in(&env);
        assert_eq!((d.rank, d.world_size, d.local_world_size), (Some(5), Some(6), Some(2)));
        assert!(d.coordinator.unwrap().unwrap().starts_with("node01:"));
        // Task 0 not on the first node: say so rather than bind an address it does not have.
        let mut odd = env.to_vec();
        odd[0] = ("SLURM_PROCID", "0");
        let e = detect_in(&odd).coordinator.unwrap().unwrap_err();
        assert!(e.contains("BOLTCCL_COORDINATOR") && e.contains("node07"), "{e}");
    }
}
