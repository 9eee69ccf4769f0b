//! GGUF loader on synthetic files: a tiny llama model quantised with every supported type must
//! give the same logits as the same (dequantised) weights in safetensors, at TP = 1, 2, 3.

mod common;

use boltccl_llm::config::RopeStyle;
use boltccl_llm::loader;
use boltccl_llm::loader::gguf::GgufModel;
use boltccl_llm::model::{LoadOptions, WeightMode};
use common::gguf_writer::build_with;
use common::{max_diff, run_tp, Spec};

fn spec() -> Spec {
    Spec {
        vocab: 64,
        hidden: 96,
        ffn: 96,
        layers: 2,
        heads: 12,
        kv_heads: 3,
        head_dim: 8,
        tie: false,
        model_type: "llama",
        rope: RopeStyle::Interleaved,
        seed: 11,
    }
}

fn build() -> (std::path::PathBuf, std::path::PathBuf) {
    build_with(&spec())
}

#[test]
fn quantised_gguf_matches_dense_safetensors_at_tp_1_2_3() {
    let (gguf, st) = build();
    let g = loader::open(&gguf).unwrap().weights;
    let d = loader::open(&st).unwrap().weights;
    assert_eq!(g.config(), d.config(), "GGUF metadata -> config");
    // Every tensor decodes to exactly the encoder's values.
    for name in [
        "model.embed_tokens.weight",
        "model.layers.1.self_attn.k_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "lm_head.weight",
        "model.norm.weight",
    ] {
        assert_eq!(g.tensor(name).unwrap(), d.tensor(name).unwrap(), "{name}");
    }
    // Row slices decode only the requested rows, at block boundaries inside the file.
    let full = d.tensor("model.layers.0.mlp.gate_proj.weight").unwrap();
    let rows = g.tensor_rows("model.layers.0.mlp.gate_proj.weight", 5..37).unwrap();
    assert_eq!(rows, full.slice_rows(5..37));

    let prompt = [1, 2, 3, 60, 7];
    let base = run_tp(d.as_ref(), 1, &prompt, 10);
    // Both f32-arithmetic storage modes: f32 expansion, and quantised blocks with f32 inputs
    // (whose row-parallel shards are sliced on block boundaries).
    for weights in [WeightMode::F32, WeightMode::Quant] {
        for tp in [1, 2, 3] {
            let opts = LoadOptions { weights };
            let out = common::run_tp_with(g.as_ref(), tp, &prompt, 10, opts);
            assert_eq!(out.tokens, base.tokens, "TP={tp} {weights:?}");
            let diff = max_diff(&out.logits, &base.logits);
            assert!(diff <= 1e-4, "TP={tp} {weights:?}: {diff}");
        }
    }
    let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
    let _ = std::fs::remove_dir_all(st);
}

/// The default arithmetic (weights in their blocks, inputs quantised to Q8), on three fixtures:
/// - head_dim 32, a 1536-wide MLP: every product takes Q8 inputs and both row-parallel layers
///   use the exact sums (o_proj in units of two query heads, 128-feature MLP units), so
///   TP = 2, 3, 4 (TP = 3 has a rank without heads) give TP = 1's logits bit for bit;
/// - head_dim 64, 6 query heads on 3 KV heads: o_proj's unit is one query head, and TP = 2
///   (3 + 3) and TP = 4 (2 + 2 + 1 + 1) cut KV groups between ranks, which then both compute
///   the shared KV head: still TP = 1's bits;
/// - head_dim 8, a 96-wide MLP: o_proj's unit would be 8 query heads, which 12 heads do not
///   divide into, and the MLP is not a multiple of 128, so those layers keep f32 inputs / f32
///   all_sums: same tokens, logits within 1e-4 (TP <= 3: three 32-feature blocks).
///
/// Both stay near the f32 model.
#[test]
fn q8_arithmetic_same_tokens_at_every_tp() {
    let wide = Spec { hidden: 128, ffn: 1536, heads: 4, kv_heads: 2, head_dim: 32, seed: 12, ..spec() };
    let cut = Spec { hidden: 384, ffn: 1536, heads: 6, kv_heads: 3, head_dim: 64, seed: 14, ..spec() };
    for (s, tps, exact) in [(wide, &[2, 3, 4][..], true), (cut, &[2, 4][..], true), (spec(), &[2, 3][..], false)] {
        let (gguf, st) = build_with(&s);
        let g = loader::open(&gguf).unwrap().weights;
        let d = loader::open(&st).unwrap().weights;
        let prompt = [1, 2, 3, 60, 7];
        let dense = run_tp(d.as_ref(), 1, &prompt, 10);
        let opts = LoadOptions { weights: WeightMode::Q8 };
        let base = common::run_tp_with(g.as_ref(), 1, &prompt, 10, opts);
        let off = max_diff(&base.logits, &dense.logits);
        let span = dense.logits.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
        eprintln!("head_dim {}: Q8 vs f32 max |logit diff| {off:.2e} (logits up to {span:.2})", s.head_dim);
        assert!(off > 0.0 && off < 0.03 * span, "Q8 inputs should move the logits a little, not {off}");
        for &tp in tps {
            let out = common::run_tp_with(g.as_ref(), tp, &prompt, 10, opts);
            assert_eq!(out.tokens, base.tokens, "head_dim {} TP={tp}", s.head_dim);
            if exact {
                for (step, (a, b)) in out.logits.iter().zip(&base.logits).enumerate() {
                    assert!(common::bits(a) == common::bits(b), "TP={tp} step {step}: logits differ from TP=1");
                }
            } else {
                let diff = max_diff(&out.logits, &base.logits);
                assert!(diff <= 1e-4, "head_dim {} TP={tp}: {diff}", s.head_dim);
            }
        }
        let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
        let _ = std::fs::remove_dir_all(st);
    }
}

#[test]
fn quantized_storage_matches_f32_expansion() {
    use boltccl_llm::comm::SingleRank;
    use boltccl_llm::model::Model;
    use boltccl_llm::shard::ShardPlan;
    let (gguf, st) = build();
    let g = loader::open(&gguf).unwrap().weights;
    // The GGUF path really keeps quantised tensors (this is what the option switches).
    assert!(g.quant_rows("model.layers.0.mlp.up_proj.weight", 0..4).unwrap().is_some());
    assert!(g.quant_rows("model.norm.weight", 0..1).unwrap().is_none());
    let plan = ShardPlan::new(g.config(), 0, 1).unwrap();
    let q = Model::load_with(g.as_ref(), plan.clone(), LoadOptions { weights: WeightMode::Quant }).unwrap();
    let f = Model::load_with(g.as_ref(), plan, LoadOptions { weights: WeightMode::F32 }).unwrap();
    assert!(q.weight_bytes() * 3 < f.weight_bytes(), "blocks not kept: {} vs {}", q.weight_bytes(), f.weight_bytes());
    let (mut cq, mut cf) = (q.new_cache(), f.new_cache());
    for toks in [&[5u32, 6, 7][..], &[8], &[9]] {
        let lq = q.forward_batch(toks, &mut cq, &SingleRank, true).unwrap().unwrap();
        let lf = f.forward_batch(toks, &mut cf, &SingleRank, true).unwrap().unwrap();
        assert!(max_diff(&[lq], &[lf]) <= 1e-5);
    }
    let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
    let _ = std::fs::remove_dir_all(st);
}

/// The split output head on quantised weights: with a tied head (the Q8_0 embedding) kept
/// quantised, and expanded to f32, every TP's gathered logits are one rank's bits.
#[test]
fn split_quantized_head_gives_the_one_rank_bits() {
    let (gguf, st) = build_with(&Spec { tie: true, ..spec() });
    let g = loader::open(&gguf).unwrap().weights;
    assert!(g.config().tie_embeddings);
    assert!(g.quant_rows("model.embed_tokens.weight", 0..1).unwrap().is_some(), "head must be quantised");
    for weights in [WeightMode::Q8, WeightMode::Quant, WeightMode::F32] {
        common::check_split_head_bits(g.as_ref(), &[2, 3, 4], LoadOptions { weights }, &|_| {});
    }
    let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
    let _ = std::fs::remove_dir_all(st);
}

#[test]
fn malformed_files_are_errors() {
    let (gguf, st) = build();
    let bytes = std::fs::read(&gguf).unwrap();
    let dir = gguf.parent().unwrap();
    let bad = dir.join("bad.gguf");
    // Truncated data section.
    std::fs::write(&bad, &bytes[..bytes.len() - 40]).unwrap();
    let e = GgufModel::open(&bad).err().expect("truncated file accepted");
    assert!(format!("{e:#}").contains("past end"), "{e:#}");
    // Wrong magic.
    let mut m = bytes.clone();
    m[0] = b'X';
    std::fs::write(&bad, &m).unwrap();
    assert!(GgufModel::open(&bad).is_err());
    // Unsupported version.
    let mut v = bytes.clone();
    v[4] = 9;
    std::fs::write(&bad, &v).unwrap();
    assert!(format!("{:#}", GgufModel::open(&bad).err().unwrap()).contains("version"));
    // Truncated header.
    std::fs::write(&bad, &bytes[..100]).unwrap();
    assert!(GgufModel::open(&bad).is_err());
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(st);
}

/// The formats of llama.cpp's Q4_K_M files: Q5_0 / Q5_1 where a row is not whole 256-element
/// super-blocks (SmolLM2's 576-wide rows), Q4_K / Q5_K / Q6_K where it is. The row-parallel
/// layers' shards then fall on 256-element boundaries (the plan splits in those units), so the
/// exact sums still hold: TP = 2, 3, 4 give TP = 1's logits bit for bit; the f32 modes match
/// the dequantised weights, and the Q8 arithmetic stays near them.
#[test]
fn k_quant_files_same_bits_at_every_tp() {
    // SmolLM2-like: 192-wide rows (Q5_0, Q5_1 for v), a 1024-wide MLP whose down_proj is Q4_K
    // in one layer and Q6_K in the other (as Q4_K_M alternates), a Q8_0 embedding.
    let narrow = Spec { hidden: 192, ffn: 1024, heads: 6, kv_heads: 2, head_dim: 32, seed: 21, ..spec() };
    let narrow_types = |hf: &str| {
        if hf.contains("down_proj") {
            if hf.contains("layers.0.") {
                12
            } else {
                14
            }
        } else if hf.contains("v_proj") {
            7
        } else if hf.contains("embed") {
            8
        } else {
            6
        }
    };
    // 256-wide rows everywhere: every K-quant type, o_proj included (a unit of four 64-wide
    // heads), and a Q6_K embedding and Q4_K head.
    let wide = Spec { hidden: 256, ffn: 1024, heads: 8, kv_heads: 2, head_dim: 64, seed: 22, ..spec() };
    let wide_types = |hf: &str| {
        if hf.contains("embed") || hf.contains("down_proj") {
            14
        } else if hf.contains("lm_head") || hf.contains("gate_proj") || hf.contains("q_proj") {
            12
        } else {
            13
        }
    };
    type Types<'a> = &'a dyn Fn(&str) -> u32;
    let fixtures: [(Spec, Types); 2] = [(narrow, &narrow_types), (wide, &wide_types)];
    for (s, types) in fixtures {
        let (gguf, st) = common::gguf_writer::build_typed_by(&s, types);
        let g = loader::open(&gguf).unwrap().weights;
        let d = loader::open(&st).unwrap().weights;
        assert_eq!(g.config().down_proj_block, 256);
        let prompt = [1, 2, 3, 60, 7];
        let dense = run_tp(d.as_ref(), 1, &prompt, 10);
        for weights in [WeightMode::F32, WeightMode::Quant] {
            for tp in [1, 2, 3] {
                let out = common::run_tp_with(g.as_ref(), tp, &prompt, 10, LoadOptions { weights });
                assert_eq!(out.tokens, dense.tokens, "hidden {} TP={tp} {weights:?}", s.hidden);
                let diff = max_diff(&out.logits, &dense.logits);
                assert!(diff <= 1e-4, "hidden {} TP={tp} {weights:?}: {diff}", s.hidden);
            }
        }
        let opts = LoadOptions { weights: WeightMode::Q8 };
        let base = common::run_tp_with(g.as_ref(), 1, &prompt, 10, opts);
        let off = max_diff(&base.logits, &dense.logits);
        let span = dense.logits.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
        eprintln!("hidden {}: Q8 vs f32 max |logit diff| {off:.2e} (logits up to {span:.2})", s.hidden);
        assert!(off > 0.0 && off < 0.03 * span, "Q8 inputs should move the logits a little, not {off}");
        for tp in [2, 3, 4] {
            let out = common::run_tp_with(g.as_ref(), tp, &prompt, 10, opts);
            assert_eq!(out.tokens, base.tokens, "hidden {} TP={tp}", s.hidden);
            for (step, (a, b)) in out.logits.iter().zip(&base.logits).enumerate() {
                assert!(common::bits(a) == common::bits(b), "hidden {} TP={tp} step {step}: logits differ", s.hidden);
            }
        }
        let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
        let _ = std::fs::remove_dir_all(st);
    }
}

/// A tensor type the example cannot run stops the load with the tensor's name, the type's name
/// and the supported list.
#[test]
fn unsupported_types_are_named() {
    let (gguf, st) = build();
    let dir = gguf.parent().unwrap();
    let raw = common::gguf_writer::RawTensor {
        name: "blk.0.attn_q.weight".into(),
        shape: vec![2, 256],
        ty: 10, // Q2_K
        bytes: vec![0; 2 * 84],
    };
    let bad = dir.join("q2k.gguf");
    std::fs::write(&bad, common::gguf_writer::write(&common::gguf_writer::llama_meta(&spec()), &[raw])).unwrap();
    let e = format!("{:#}", GgufModel::open(&bad).err().expect("Q2_K accepted"));
    for want in ["blk.0.attn_q.weight", "Q2_K", "Q4_K, Q5_K, Q6_K"] {
        assert!(e.contains(want), "{want:?} missing from: {e}");
    }
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(st);
}

/// GGUF `qwen2` (q/k/v biases) and `qwen3` (q/k norms, a head width that is not hidden /
/// heads) files give their safetensors twins' logits: the loader finds the extra tensors and
/// uses rotate-half RoPE, as llama.cpp does for these families (`llama_cpp_archs` checks the
/// same against llama.cpp itself).
#[test]
fn qwen_families_match_their_safetensors_twins() {
    for (model_type, head_dim) in [("qwen2", 8), ("qwen3", 16)] {
        let s = Spec { model_type, head_dim, rope: RopeStyle::NeoX, seed: 31, ..spec() };
        let (gguf, st) = common::gguf_writer::build_typed_by(&s, &|_| 0);
        let g = loader::open(&gguf).unwrap().weights;
        let d = loader::open(&st).unwrap().weights;
        let c = g.config();
        assert_eq!((c.qkv_bias, c.qk_norm, c.head_dim), (model_type == "qwen2", model_type == "qwen3", head_dim));
        assert_eq!(c.rope_style, RopeStyle::NeoX);
        let prompt = [1, 2, 3, 60, 7];
        let dense = run_tp(d.as_ref(), 1, &prompt, 10);
        for tp in [1, 2, 3] {
            let out = run_tp(g.as_ref(), tp, &prompt, 10);
            assert_eq!(out.tokens, dense.tokens, "{model_type} TP={tp}");
            let diff = max_diff(&out.logits, &dense.logits);
            assert!(diff <= 1e-5, "{model_type} TP={tp}: {diff}");
        }
        let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
        let _ = std::fs::remove_dir_all(st);
    }
}

/// Metadata keys and values, as `arch_meta` gives them.
type MetaList = Vec<(String, common::gguf_writer::Meta)>;

/// An architecture or RoPE scaling the example cannot run stops the load, naming what the file
/// has and what is supported; so does a `rope_freqs` tensor of the wrong length. Factors of one
/// change nothing; a linear factor of 2 halves every frequency.
#[test]
fn unsupported_architectures_and_rope_scaling_are_named() {
    use boltccl_llm::loader::WeightSource;
    use common::gguf_writer::{arch_meta, f32s, write, Meta, RawTensor};
    let s = spec();
    let dir = common::temp_dir("gguf-refused");
    // Writes `s`'s f32 weights with the metadata `edit` makes of the llama keys, and
    // `rope_freqs` when given; opens the file.
    let open = |tag: &str, edit: &dyn Fn(&mut MetaList), freqs: Option<Vec<f32>>| {
        let mut raw: Vec<RawTensor> = common::tensors(&s)
            .into_iter()
            .map(|(n, t)| RawTensor {
                name: loader::gguf::gguf_name(&n).unwrap(),
                shape: t.shape,
                ty: 0,
                bytes: f32s(&t.data).0,
            })
            .collect();
        if let Some(f) = freqs {
            raw.push(RawTensor { name: "rope_freqs.weight".into(), shape: vec![f.len()], ty: 0, bytes: f32s(&f).0 });
        }
        let mut meta = arch_meta(&s);
        edit(&mut meta);
        let meta: Vec<(&str, Meta)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let path = dir.join(format!("{tag}.gguf"));
        std::fs::write(&path, write(&meta, &raw)).unwrap();
        GgufModel::open(&path)
    };
    let refused = |tag: &str, r: anyhow::Result<GgufModel>, wants: &[&str]| {
        let e = format!("{:#}", r.err().unwrap_or_else(|| panic!("{tag} accepted")));
        for want in wants {
            assert!(e.contains(want), "{tag}: {want:?} missing from: {e}");
        }
    };
    let gemma = open("arch", &|m| m[0].1 = Meta::Str("gemma2".into()), None);
    refused("arch", gemma, &["\"gemma2\"", "llama, qwen2, qwen3"]);
    let yarn = open("yarn", &|m| m.push(("llama.rope.scaling.type".into(), Meta::Str("yarn".into()))), None);
    refused("yarn", yarn, &["\"yarn\"", "linear", "rope_freqs"]);
    let short = open("freqs", &|_| {}, Some(vec![1.0; 3]));
    refused("freqs", short, &["rope_freqs.weight", "3 factors", "need 4"]);

    let plain = boltccl_llm::ops::rope_inv_freq(s.head_dim, 10000.0);
    let ones = open("ones", &|_| {}, Some(vec![1.0; 4])).unwrap();
    assert_eq!(ones.config().rope_inv_freq(), plain);
    let linear = open("linear", &|m| m.push(("llama.rope.scaling.factor".into(), Meta::F32(2.0))), None).unwrap();
    assert_eq!(linear.config().rope_inv_freq(), plain.iter().map(|f| f / 2.0).collect::<Vec<f32>>());
    let _ = std::fs::remove_dir_all(dir);
}
