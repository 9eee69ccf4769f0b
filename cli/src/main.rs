//! The `boltccl` command: launch jobs, benchmark collectives, diagnose RDMA.

mod bench;
mod doctor;
mod launch;
mod plot;

use clap::{Parser, Subcommand};

/// boltccl: collective communication that never hangs.
#[derive(Parser, Debug)]
#[command(name = "boltccl", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run N ranks of a command: `boltccl launch -n 4 -- ./prog args` (or --hostfile for ssh).
    Launch(launch::LaunchArgs),
    /// Measure the collectives (nccl-tests style): `boltccl bench -n 4`.
    Bench(bench::BenchArgs),
    /// What this node (or `--hosts`) can do for RDMA, what is wrong, and how to fix it.
    Doctor(doctor::DoctorArgs),
}

fn main() {
    // The command owns the process, so it installs the log subscriber; the library never does.
    boltccl::log_to_stderr();
    let code = match Cli::parse().cmd {
        Cmd::Launch(a) => launch::run(a),
        Cmd::Bench(a) => bench::run(&a),
        Cmd::Doctor(a) => doctor::run(a),
    };
    std::process::exit(code);
}
