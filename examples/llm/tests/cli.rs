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

/// A GGUF with a tensor type the example cannot run: one line naming the tensor, its type and
/// the supported ones, a failure status, and no backtrace even when backtraces are asked for.
#[test]
fn cli_names_an_unsupported_tensor_type() {
    let raw = common::gguf_writer::RawTensor {
        name: "blk.0.ffn_down.weight".into(),
        shape: vec![1, 256],
        ty: 11, // Q3_K
        bytes: vec![0; 110],
    };
    let dir = common::temp_dir("q3k");
    let path = dir.join("q3k.gguf");
    std::fs::write(&path, common::gguf_writer::write(&common::gguf_writer::llama_meta(&Spec::odd()), &[raw])).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_boltccl-llm"))
        .arg("--model")
        .arg(&path)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for want in ["blk.0.ffn_down.weight", "Q3_K", "Q4_K, Q5_K, Q6_K"] {
        assert!(e.contains(want), "{want:?} missing from: {e}");
    }
    assert!(!e.contains("backtrace") && e.trim().lines().count() == 1, "{e}");
    let _ = std::fs::remove_dir_all(dir);
}
