//! `boltccl launch`: the command-line front end of [`boltccl_launch`].

use boltccl_launch::{load_hostfile, parse_env, Job, Placement};
use std::path::PathBuf;
use std::time::Duration;

/// Options of `boltccl launch`.
#[derive(clap::Args, Debug, Clone)]
pub struct LaunchArgs {
    /// Number of local ranks (on 127.0.0.1).
    #[arg(short = 'n', long, conflicts_with = "hostfile")]
    pub ranks: Option<usize>,
    /// JSON hostfile (MLX launcher format: [{"ssh": "host", "ips": ["10.0.0.1"]}, ...], or a
    /// list of host names): one rank per entry, started over ssh.
    #[arg(long)]
    pub hostfile: Option<PathBuf>,
    /// Coordinator port (default: a free port for local runs, 32323 for hostfiles).
    #[arg(long)]
    pub port: Option<u16>,
    /// Extra environment for every rank (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Do not pin local ranks to cores. By default, when there are at least as many local ranks
    /// as cores, rank r is pinned to core r % cores, as mpirun does: it keeps the scheduler
    /// from shuffling busy-polling ranks between cores (about 20% lower small-message latency
    /// at 4 ranks on 2 cores) and a rank's threads on its core.
    #[arg(long)]
    pub no_bind: bool,
    /// Kill everything if the job runs longer than this many seconds (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub timeout_s: u64,
    /// When a rank fails, let the others run on (for programs whose survivors shrink the group
    /// and go on, like `boltccl-llm serve`); the exit code is still the first failure's.
    #[arg(long)]
    pub keep_going: bool,
    /// Command and arguments to run on every rank.
    ///
    /// MLX programs: unless MLX_MPI_LIBNAME is set, every rank gets MLX_MPI_LIBNAME pointing at
    /// libboltccl_mpi when it is found beside this program (or in ../lib), so that
    /// `mx.distributed.init()` runs over boltccl.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Run `boltccl launch`; returns the process exit code.
pub fn run(a: LaunchArgs) -> i32 {
    let placement = match (&a.hostfile, a.ranks) {
        (Some(path), _) => match load_hostfile(path) {
            Ok(h) => Placement::Hosts(h),
            Err(e) => {
                eprintln!("boltccl launch: {e}");
                return 2;
            }
        },
        (None, Some(n)) => Placement::Local(n),
        (None, None) => Placement::Local(0),
    };
    let job = Job {
        placement,
        port: a.port,
        env: a.env,
        pin: !a.no_bind,
        timeout: (a.timeout_s > 0).then(|| Duration::from_secs(a.timeout_s)),
        keep_going: a.keep_going,
        command: a.command,
    };
    boltccl_launch::run(&job.with_mlx_mpi_library(mpi_library()))
}

/// libboltccl_mpi beside this program (a cargo build's target dir) or in `../lib` (an
/// installed prefix: scripts/install-c.sh).
fn mpi_library() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let name = boltccl_launch::mpi_library_name();
    [dir.join(&name), dir.join("../lib").join(&name)].into_iter().find(|p| p.is_file())
}
