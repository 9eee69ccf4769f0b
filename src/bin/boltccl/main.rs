//! The `boltccl` command.

mod doctor;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "boltccl", version, about = "boltccl collective communication tools")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// What this node (or `--hosts`) can do for RDMA, what is wrong, and how to fix it.
    Doctor(doctor::DoctorArgs),
}

fn main() {
    let code = match Cli::parse().cmd {
        Cmd::Doctor(a) => doctor::run(a),
    };
    std::process::exit(code);
}
