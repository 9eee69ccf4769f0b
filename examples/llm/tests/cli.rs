//! The binary end to end on a synthetic safetensors checkpoint: token ids in, token ids out,
//! identical at TP = 1 and 3, with the rate and all_sum lines on stderr.

mod common;

use std::process::Command;

use boltccl_llm::loader::safetensors::StoreDtype;
use common::{tensors, write_checkpoint, Spec};

fn run(dir: &std::path::Path, extra: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_boltccl-llm"))
        .arg("--model")
        .arg(dir)
        .args(["--prompt-ids", "3,1,4,1,5", "--max-tokens", "6"])
        .args(extra)
        .output()
        .unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "stdout: {o}\nstderr: {e}");
    (o, e)
}

#[test]
fn cli_generates_same_ids_at_tp_1_and_3() {
    let spec = Spec::odd();
    let dir = write_checkpoint(&spec, &tensors(&spec), StoreDtype::BF16);
    let (o1, e1) = run(&dir, &[]);
    let ids: Vec<u32> = o1.split_whitespace().map(|t| t.parse().unwrap()).collect();
    assert_eq!(ids.len(), 6, "{o1}");
    assert!(e1.contains("decode:") && e1.contains("tok/s") && e1.contains("all_sum:"), "{e1}");
    let (o3, e3) = run(&dir, &["--local-ranks", "3", "--check-sync"]);
    assert_eq!(o3.trim(), o1.trim());
    assert!(e3.contains("world size 3"), "{e3}");
    // Without ids or a tokenizer the CLI explains what to do instead of failing obscurely.
    let out = Command::new(env!("CARGO_BIN_EXE_boltccl-llm")).arg("--model").arg(&dir).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--prompt-ids"));
    let _ = std::fs::remove_dir_all(dir);
}
