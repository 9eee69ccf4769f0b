//! The GGUF families beyond plain `llama`, cross-checked against llama.cpp (llama-cpp-python,
//! `scripts/llama-venv.sh`) on tiny synthetic checkpoints: `qwen2` (q/k/v biases, rotate-half
//! RoPE), `qwen3` (per-head q/k RMSNorms, a head width from `qwen3.attention.key_length` that
//! is not hidden / heads), and `llama` with Llama 3's `rope_freqs` factors or linear RoPE
//! scaling. Each file has seeded random weights (f32, with an f16 embedding where the head is
//! separate), the real metadata keys, and SmolLM2's tokenizer metadata so llama.cpp loads it.
//! Both programs run the same prompt ids greedily; the logits of the first [`KEEP`] positions
//! must agree within [`TOLERANCE`] and the [`STEPS`] greedy tokens must be equal, at TP = 1;
//! TP = 2 must choose the same tokens.
//!
//! Needs the SmolLM2 GGUF (for its tokenizer) and target/llama-venv (or `LLAMA_PY`): skipped
//! outside CI when either is missing, a failure in CI.

mod common;

use boltccl_llm::loader;
use boltccl_llm::loader::gguf::{gguf_name, Value};
use common::gguf_writer::{self as gw, Meta, RawTensor};
use common::{
    assert_agrees_with_llama_cpp, llama_cpp_greedy, llama_python, run_tp, smollm2_path, tokenizer_meta, Spec,
};
use std::path::PathBuf;

/// Greedy tokens compared.
const STEPS: usize = 8;
/// Positions whose logits are compared: the prompt's last and the first decode steps.
const KEEP: usize = 4;
/// Largest |logit difference| allowed. Both sides multiply f32 weights by f32 activations and
/// keep an f32 KV cache (the tool's `f32-kv`), so they differ only in the order of their sums
/// and in how the RoPE angles are rounded (llama.cpp builds them by repeated f32
/// multiplication): measured 2026-12-02, 1.3e-6 to 6.2e-6 on logits of magnitude up to 11.
/// A loader that drops the biases, the q/k norms, the `rope_freqs` factors or the linear
/// factor, or rotates Qwen heads in adjacent pairs, misses by 0.95 to 7.2 on the first
/// position. 1e-3 is a hundred times the rounding and a thousandth of those.
const TOLERANCE: f32 = 1e-3;
/// A fixed prompt of token ids (no tokenizer in the loop: the file carries SmolLM2's
/// tokenizer, and `llama_cpp_tokenizer.rs` checks the Qwen and Llama 3 pre-tokenizers).
const PROMPT: [u32; 10] = [1, 504, 3458, 314, 2114, 30, 100, 2000, 9690, 198];

/// How the synthetic file scales RoPE (Llama only).
#[derive(Clone, Copy)]
enum Scaling {
    None,
    /// A `rope_freqs.weight` tensor, computed as Meta's Llama 3.1 recipe does.
    Llama3,
    /// `llama.rope.scaling.type = linear` with this factor.
    Linear(f32),
}

fn spec(model_type: &'static str, head_dim: usize, tie: bool, seed: u64) -> Spec {
    Spec {
        vocab: 49152, // SmolLM2's tokenizer
        hidden: 64,
        ffn: 128,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim,
        tie,
        model_type,
        rope: boltccl_llm::config::RopeStyle::NeoX, // unused: the GGUF loader decides
        seed,
    }
}

/// Llama 3.1's per-pair frequency factors (`rope_type: llama3`), with an original context
/// short enough (32) that the tiny model's positions see them: pairs whose wavelength is
/// beyond it are slowed `factor` times, short ones kept, the ones between blended.
fn llama3_factors(head_dim: usize, theta: f64) -> Vec<f32> {
    let (factor, low, high, original) = (8.0f64, 1.0f64, 4.0f64, 32.0f64);
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor as f32
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

/// Writes the synthetic GGUF of architecture `arch` for `s`; returns its path.
fn write_gguf(arch: &str, s: &Spec, scaling: Scaling, tokenizer: &[(String, Value)]) -> PathBuf {
    const THETA: f32 = 10000.0;
    let u = |x: usize| Meta::U32(x as u32);
    let k = |key: &str| format!("{arch}.{key}");
    let mut meta: Vec<(String, Meta)> = vec![
        ("general.architecture".into(), Meta::Str(arch.into())),
        (k("context_length"), u(512)),
        (k("embedding_length"), u(s.hidden)),
        (k("block_count"), u(s.layers)),
        (k("feed_forward_length"), u(s.ffn)),
        (k("attention.head_count"), u(s.heads)),
        (k("attention.head_count_kv"), u(s.kv_heads)),
        (k("attention.layer_norm_rms_epsilon"), Meta::F32(1e-6)),
        (k("rope.freq_base"), Meta::F32(THETA)),
    ];
    if arch == "qwen3" {
        meta.push((k("attention.key_length"), u(s.head_dim)));
        meta.push((k("attention.value_length"), u(s.head_dim)));
    }
    if arch == "llama" {
        meta.push((k("rope.dimension_count"), u(s.head_dim)));
    }
    if let Scaling::Linear(f) = scaling {
        meta.push((k("rope.scaling.type"), Meta::Str("linear".into())));
        meta.push((k("rope.scaling.factor"), Meta::F32(f)));
    }
    meta.extend(tokenizer.iter().map(|(k, v)| (k.clone(), Meta::Value(v.clone()))));

    let mut raw = Vec::new();
    for (name, t) in common::tensors(s) {
        let g = gguf_name(&name).unwrap();
        // llama.cpp looks rows up in an f16 embedding exactly; as the tied head it would round
        // the activations to f16, so a tied embedding stays f32.
        let (ty, (bytes, _)) =
            if g == "token_embd.weight" && !s.tie { (1, gw::f16s(&t.data)) } else { (0, gw::f32s(&t.data)) };
        raw.push(RawTensor { name: g, shape: t.shape, ty, bytes });
    }
    if let Scaling::Llama3 = scaling {
        let f = llama3_factors(s.head_dim, THETA as f64);
        raw.push(RawTensor { name: "rope_freqs.weight".into(), shape: vec![f.len()], ty: 0, bytes: gw::f32s(&f).0 });
    }
    let meta: Vec<(&str, Meta)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let path = common::temp_dir("llama-cpp-archs").join(format!("{arch}.gguf"));
    std::fs::write(&path, gw::write(&meta, &raw)).unwrap();
    path
}

/// Writes the file, runs both programs and compares.
fn check(arch: &str, s: Spec, scaling: Scaling) {
    let Some(smollm2) = smollm2_path() else { return };
    let Some(py) = llama_python() else { return };
    let path = write_gguf(arch, &s, scaling, &tokenizer_meta(&smollm2));

    let ck = loader::open(&path).unwrap();
    let ours = run_tp(ck.weights.as_ref(), 1, &PROMPT, STEPS);
    let tp2 = run_tp(ck.weights.as_ref(), 2, &PROMPT, STEPS);
    let (theirs, rows) = llama_cpp_greedy(&py, &path, &PROMPT, STEPS, KEEP);
    assert_agrees_with_llama_cpp(arch, &ours, &theirs, &rows, KEEP, TOLERANCE);
    assert_eq!(tp2.tokens, ours.tokens, "{arch}: TP = 2 chose other tokens than TP = 1");
}

#[test]
fn qwen2_agrees_with_llama_cpp() {
    check("qwen2", spec("qwen2", 16, false, 21), Scaling::None);
}

#[test]
fn qwen3_agrees_with_llama_cpp() {
    // Head width 32 with 4 heads: the queries are 128 wide on a 64-wide residual.
    check("qwen3", spec("qwen3", 32, true, 22), Scaling::None);
}

#[test]
fn llama3_rope_freqs_agree_with_llama_cpp() {
    check("llama", spec("llama", 16, false, 23), Scaling::Llama3);
}

#[test]
fn linear_rope_scaling_agrees_with_llama_cpp() {
    check("llama", spec("llama", 16, true, 24), Scaling::Linear(4.0));
}
