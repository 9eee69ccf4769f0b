//! Tensor-parallel decode must match single-rank decode: identical greedy tokens, logits within
//! 1e-4, and single-rank logits must match an independent naive reference.

mod common;

use boltccl_llm::config::RopeStyle;
use boltccl_llm::loader::safetensors::StoreDtype;
use boltccl_llm::loader::WeightSource;
use common::{max_diff, open, reference, run_tp, tensors, write_checkpoint, Spec};

const PROMPT: [u32; 5] = [3, 17, 42, 5, 11];
const STEPS: usize = 12;
const TOL: f32 = 1e-4;

fn check_tp(spec: &Spec, tps: &[usize]) {
    let dir = write_checkpoint(spec, &tensors(spec), StoreDtype::F32);
    let src = open(&dir);
    let base = run_tp(src.as_ref(), 1, &PROMPT, STEPS);
    assert_eq!(base.tokens.len(), STEPS);
    // Greedy on random weights must not collapse to one token, or the test proves little.
    let distinct: std::collections::HashSet<_> = base.tokens.iter().collect();
    assert!(distinct.len() > 2, "degenerate fixture: {:?}", base.tokens);
    for &tp in tps {
        let out = run_tp(src.as_ref(), tp, &PROMPT, STEPS);
        assert_eq!(out.tokens, base.tokens, "{spec:?}: TP={tp} tokens differ");
        let d = max_diff(&out.logits, &base.logits);
        eprintln!("{} TP={tp}: max |logit diff| vs TP=1 = {d:.2e}", spec.model_type);
        assert!(d <= TOL, "TP={tp}: logits differ by {d}");
    }
    check_reference(src.as_ref(), &base);
    let _ = std::fs::remove_dir_all(dir);
}

/// TP=1 logits at every step against the cache-free reference.
fn check_reference(src: &dyn WeightSource, base: &boltccl_llm::generate::GenOutput) {
    let mut seq = PROMPT.to_vec();
    for (step, l) in base.logits.iter().enumerate() {
        let r = reference::logits(src, &seq);
        let d = max_diff(std::slice::from_ref(l), &[r]);
        assert!(d <= TOL, "step {step}: model vs reference differ by {d}");
        seq.push(base.tokens[step]);
    }
}

#[test]
fn even_heads_tp_1_2_3_4() {
    check_tp(&Spec::even(), &[2, 3, 4]);
}

#[test]
fn three_kv_heads_tp_1_2_3_4_10() {
    // TP=2 splits 5 + 4 query heads (both ranks compute KV head 1), TP=4 3 + 2 + 2 + 2 (ranks
    // 2 and 3 start inside a KV group), TP=10 leaves rank 9 with no heads (MLP only).
    check_tp(&Spec::odd(), &[2, 3, 4, 10]);
}

#[test]
fn qwen2_bias_tp() {
    let s = Spec { model_type: "qwen2", seed: 3, ..Spec::odd() };
    check_tp(&s, &[2, 3]);
}

#[test]
fn qwen3_qk_norm_tp() {
    // Qwen3 style also decouples head_dim from hidden / heads (16 here, hidden 64, 8 heads).
    let s = Spec { model_type: "qwen3", rope: RopeStyle::NeoX, tie: false, head_dim: 16, seed: 4, ..Spec::even() };
    check_tp(&s, &[2, 4]);
}

/// The GGUF converter's within-head Q/K row permutation turns rotate-half weights into
/// interleaved-RoPE weights. Applying it and switching convention must not change the logits,
/// which tests both RoPE implementations against each other.
#[test]
fn rope_conventions_agree_under_permutation() {
    let spec = Spec::even();
    let ts = tensors(&spec);
    let hd = spec.head_dim;
    let permuted: Vec<_> = ts
        .iter()
        .map(|(n, t)| {
            let mut t = t.clone();
            if n.ends_with("q_proj.weight") || n.ends_with("k_proj.weight") {
                let cols = t.cols();
                let src = t.data.clone();
                for (hidx, head) in t.data.chunks_mut(hd * cols).enumerate() {
                    for i in 0..hd / 2 {
                        for (slot, from) in [(2 * i, i), (2 * i + 1, i + hd / 2)] {
                            let s = &src[(hidx * hd + from) * cols..][..cols];
                            head[slot * cols..(slot + 1) * cols].copy_from_slice(s);
                        }
                    }
                }
            }
            (n.clone(), t)
        })
        .collect();
    let a_dir = write_checkpoint(&spec, &ts, StoreDtype::F32);
    let il = Spec { rope: RopeStyle::Interleaved, ..spec.clone() };
    let b_dir = write_checkpoint(&il, &permuted, StoreDtype::F32);
    let a = run_tp(open(&a_dir).as_ref(), 1, &PROMPT, STEPS);
    let b = run_tp(open(&b_dir).as_ref(), 2, &PROMPT, STEPS);
    assert_eq!(a.tokens, b.tokens);
    let d = max_diff(&a.logits, &b.logits);
    assert!(d <= TOL, "conventions differ by {d}");
    // And without the permutation the conventions must disagree (the test can fail).
    let c_dir = write_checkpoint(&il, &ts, StoreDtype::F32);
    let c = run_tp(open(&c_dir).as_ref(), 1, &PROMPT, STEPS);
    assert!(max_diff(&a.logits, &c.logits) > 1e-2);
    for d in [a_dir, b_dir, c_dir] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Prefill in one batch (causal attention inside the batch) must equal feeding the prompt one
/// token at a time, and leave the same KV cache behind.
#[test]
fn batched_prefill_matches_token_by_token() {
    use boltccl_llm::comm::SingleRank;
    use boltccl_llm::model::Model;
    use boltccl_llm::shard::ShardPlan;
    let spec = Spec::odd();
    let dir = write_checkpoint(&spec, &tensors(&spec), StoreDtype::F32);
    let src = open(&dir);
    let model = Model::load(src.as_ref(), ShardPlan::new(src.config(), 0, 1).unwrap()).unwrap();
    let mut a = model.new_cache();
    let mut b = model.new_cache();
    let la = model.forward_batch(&PROMPT, &mut a, &SingleRank, true).unwrap().unwrap();
    let mut lb = None;
    for &t in &PROMPT {
        lb = model.forward(t, &mut b, &SingleRank, true).unwrap();
    }
    let lb = lb.unwrap();
    assert!(max_diff(&[la], &[lb]) <= 1e-5);
    assert_eq!(a.len(), b.len());
    // A second batch on top of a filled cache, against single steps.
    let more = [9, 1, 7];
    let la = model.forward_batch(&more, &mut a, &SingleRank, true).unwrap().unwrap();
    let mut lb = None;
    for &t in &more {
        lb = model.forward(t, &mut b, &SingleRank, true).unwrap();
    }
    assert!(max_diff(&[la], &[lb.unwrap()]) <= 1e-5);
    let _ = std::fs::remove_dir_all(dir);
}
