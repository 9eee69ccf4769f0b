//! The `boltccl` command: launch jobs, benchmark collectives.

mod bench;
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
}

fn main() {
    let cli = Cli::parse();
    let code = match &cli.cmd {
        Cmd::Launch(a) => launch::run(a),
        Cmd::Bench(a) => bench::run(a),
    };
    std::process::exit(code);
}
