//! The Rust examples (`boltccl/examples/allreduce.rs`, `nonblocking.rs`, `split.rs`) run as
//! ranks, as `boltccl launch` starts them: each rank is a process that forms its group from the
//! environment in the example's own `main` (`boltccl::init()`), and the test checks that every
//! rank exits successfully and prints its line. The examples assert their own results.

mod common;

use common::harness::{is_worker, results, Job};
use std::time::Duration;

// Each example, compiled into this test as a module whose `run` calls its `main`.
mod allreduce {
    include!("../examples/allreduce.rs");
    pub fn run() -> boltccl::Result<()> {
        main()
    }
}
mod nonblocking {
    include!("../examples/nonblocking.rs");
    pub fn run() -> boltccl::Result<()> {
        main()
    }
}
mod split {
    include!("../examples/split.rs");
    pub fn run() -> boltccl::Result<()> {
        main()
    }
}

/// The rank-process side: runs the example `EXAMPLE` names, as its binary would.
#[test]
fn example_worker() {
    if !is_worker() {
        return;
    }
    let run = match std::env::var("EXAMPLE").unwrap().as_str() {
        "allreduce" => allreduce::run,
        "nonblocking" => nonblocking::run,
        "split" => split::run,
        other => panic!("no example {other}"),
    };
    if let Err(e) = run() {
        // As `fn main() -> Result` reports it: the error on stderr, a failing exit status.
        eprintln!("Error: {e}");
        std::process::exit(1);
    }
}

/// Runs `example` as `n` ranks; every rank must succeed and print a line starting `rank`.
fn run_example(example: &str, n: usize) -> Vec<String> {
    let outs = Job::new(n, "example_worker").env("EXAMPLE", example).spawn().wait(Duration::from_secs(60));
    results(&outs, "rank ")
}

#[test]
fn allreduce_example_runs_at_2_and_4_ranks() {
    for n in [2, 4] {
        let lines = run_example("allreduce", n);
        assert!(lines.iter().all(|l| l.contains(&format!("of {n}: all_sum x[999] = {}", n * 999 + n * (n - 1) / 2))));
    }
}

#[test]
fn nonblocking_example_runs_at_2_and_3_ranks() {
    for n in [2, 3] {
        let lines = run_example("nonblocking", n);
        assert!(lines.iter().all(|l| l.contains(&format!("all_sum {n}, all_max {}", n - 1))), "{lines:?}");
    }
}

#[test]
fn split_example_runs_at_3_and_4_ranks() {
    for n in [3, 4] {
        let lines = run_example("split", n);
        // With the key -rank, the highest rank of each colour is rank 0 of its sub-group.
        assert!(lines[n - 1].contains("sub-group rank 0 of"), "{lines:?}");
        assert!(lines[0].contains("in the pair: true") && lines[2].contains("in the pair: false"), "{lines:?}");
    }
}
