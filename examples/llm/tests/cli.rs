//! The binary end to end on a synthetic safetensors checkpoint: token ids in, token ids out,
//! identical at TP = 1 and 3, with the rate and all_sum lines on stderr; and on a synthetic
//! Llama 3 GGUF, the chat prompt it builds.

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

/// Meta's Llama 3 chat template (tokenizer_config.json of Llama 3 8B Instruct).
const LLAMA3_TEMPLATE: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}\
{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}\
{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/// A tiny llama GGUF with a byte-level vocabulary (the 256 byte tokens, no merges) plus Llama
/// 3's control tokens, `tokenizer.ggml.pre = llama-bpe` and `template`.
fn llama3_gguf(template: &str) -> std::path::PathBuf {
    use boltccl_llm::loader::gguf::Value;
    use common::gguf_writer::{self as gw, Meta};
    let mut tokens: Vec<String> = common::gpt2_byte_chars().iter().map(char::to_string).collect();
    let specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"];
    let mut types = vec![Value::I64(1); tokens.len()];
    tokens.extend(specials.iter().map(|s| s.to_string()));
    types.resize(tokens.len(), Value::I64(3));
    let spec = Spec { vocab: tokens.len(), layers: 1, ..Spec::odd() };
    let mut meta = gw::arch_meta(&spec);
    meta.extend([
        ("tokenizer.ggml.model".to_string(), Meta::Str("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Meta::Str("llama-bpe".into())),
        ("tokenizer.ggml.tokens".to_string(), Meta::Value(Value::Array(tokens.into_iter().map(Value::Str).collect()))),
        ("tokenizer.ggml.merges".to_string(), Meta::Value(Value::Array(Vec::new()))),
        ("tokenizer.ggml.token_type".to_string(), Meta::Value(Value::Array(types))),
        ("tokenizer.ggml.bos_token_id".to_string(), Meta::U32(256)),
        ("tokenizer.ggml.eos_token_id".to_string(), Meta::U32(257)),
        ("tokenizer.chat_template".to_string(), Meta::Str(template.into())),
    ]);
    let path = common::temp_dir("llama3-cli").join("llama3.gguf");
    gw::write_f32_model(&spec, &meta, &path);
    path
}

/// The CLI on a Llama 3 GGUF: the prompt is Llama 3's chat format with one BOS (the
/// template's; the tokenizer adds none of its own), `--raw` gives BOS + the bytes, and a
/// template it does not know is an error naming `--raw`.
#[test]
fn cli_writes_llama3_chat_prompts() {
    let prompt_tokens = |path: &std::path::Path, extra: &[&str]| -> Result<usize, String> {
        let out = Command::new(env!("CARGO_BIN_EXE_boltccl-llm"))
            .arg("--model")
            .arg(path)
            .args(["--prompt", "Hi", "--max-tokens", "1"])
            .args(extra)
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            return Err(e);
        }
        let n = e.split("prompt: ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok());
        Ok(n.unwrap_or_else(|| panic!("no prompt line in: {e}")))
    };
    let path = llama3_gguf(LLAMA3_TEMPLATE);
    // BOS, <|start_header_id|>, "user" (4 bytes), <|end_header_id|>, "\n\n", "Hi", <|eot_id|>,
    // <|start_header_id|>, "assistant" (9), <|end_header_id|>, "\n\n".
    let want = 1 + 1 + 4 + 1 + 2 + 2 + 1 + 1 + 9 + 1 + 2;
    assert_eq!(prompt_tokens(&path, &[]).unwrap(), want);
    assert_eq!(prompt_tokens(&path, &["--system", "S"]).unwrap(), want + 1 + 6 + 1 + 2 + 1 + 1);
    assert_eq!(prompt_tokens(&path, &["--raw"]).unwrap(), 1 + 2);
    let other = llama3_gguf("{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}");
    let err = prompt_tokens(&other, &[]).unwrap_err();
    assert!(err.contains("--raw") && err.trim().lines().count() == 1, "{err}");
}
