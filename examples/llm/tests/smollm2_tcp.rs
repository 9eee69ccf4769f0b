//! End to end over the real network path: SmolLM2-135M-Instruct answers a prompt at TP = 1
//! and at TP = 3 with three separate processes joined by boltccl over TCP, and the 24 greedy
//! tokens are identical. Skipped, with a message, when the model file has not been fetched
//! (`examples/llm/fetch-model.sh`, which `scripts/test.sh` runs); under CI that fails instead.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

// Asked for one sentence: on the bare question the default Q8 arithmetic (like llama.cpp's)
// answers "L'Étoile, la ..." (see tests/smollm2.rs).
const PROMPT: &str = "What is the capital of France? Answer in one sentence.";

fn llm(model: &PathBuf) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_boltccl-llm"));
    c.arg("--model").arg(model).args(["--prompt", PROMPT, "--max-tokens", "24"]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Wait for `child` at most `limit`, killing it after; returns (success, stdout, stderr).
fn finish(mut child: Child, limit: Duration) -> (bool, String, String) {
    let until = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn smollm2_same_answer_at_tp1_and_tp3_over_tcp() {
    let Some(model) = common::smollm2_path() else { return };
    let (ok, tp1, err) = finish(llm(&model).spawn().unwrap(), Duration::from_secs(300));
    assert!(ok, "TP=1 failed:\n{err}");
    assert!(tp1.contains("Paris"), "TP=1 should answer in coherent English; it said: {tp1:?}");

    let port = boltccl::free_coordinator_port(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
    let ranks: Vec<Child> = (0..3)
        .map(|r| {
            llm(&model)
                .env("BOLTCCL_RANK", r.to_string())
                .env("BOLTCCL_WORLD_SIZE", "3")
                .env("BOLTCCL_COORDINATOR", format!("127.0.0.1:{port}"))
                .env("BOLTCCL_JOB_KEY", "smollm2-test")
                .env("BOLTCCL_BACKEND", "tcp")
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = ranks.into_iter().map(|c| finish(c, Duration::from_secs(300))).collect();
    for (r, (ok, _, err)) in outs.iter().enumerate() {
        assert!(ok, "rank {r} of TP=3 failed:\n{err}");
    }
    // The group formed and decoded over it: rank 0's closing line counts the all_sums of the
    // decode in a world of 3 (the "world size 3" printed before the group forms proves nothing).
    let err = &outs[0].2;
    let calls: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("all_sum: ")?.split_once(" calls in decode")?.0.parse().ok())
        .unwrap_or_else(|| panic!("rank 0 reported no all_sum calls:\n{err}"));
    assert!(calls > 0, "rank 0 decoded without an all_sum:\n{err}");
    assert!(err.contains("(world size 3)"), "rank 0's all_sums were not in a world of 3:\n{err}");
    assert_eq!(outs[0].1, tp1, "TP=3 over TCP generated different text from TP=1");
    println!("TP=1 and TP=3 (TCP) both said: {tp1}");
}
