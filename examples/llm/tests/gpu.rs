//! GPU backend (`--features gpu`): WGSL kernels translate to Metal Shading Language, and the
//! wgpu backend matches the CPU backend. Skips visibly when no GPU adapter exists (fails in
//! CI, where lavapipe is installed).
#![cfg(feature = "gpu")]

mod common;

use std::sync::Arc;

use boltccl_llm::generate::{generate, GenOptions, GenOutput};
use boltccl_llm::gpu::{wgsl_to_msl, GpuContext, GpuMat, MATMUL_TILE, MATVEC_F16_WGSL, MATVEC_Q_WGSL, MATVEC_WGSL};
use boltccl_llm::loader::safetensors::StoreDtype;
use boltccl_llm::loader::WeightSource;
use boltccl_llm::model::Model;
use boltccl_llm::sample::{Rng, Sampler};
use boltccl_llm::shard::ShardPlan;
use common::{check_split_head_bits, max_diff, on_ranks, open, run_tp, tensors, write_checkpoint, Spec};

use boltccl_llm::model::{LoadOptions, WeightMode};
use boltccl_llm::quant::{GgmlType, QuantRows};
use common::gguf_writer as gw;

fn gpu() -> Option<Arc<GpuContext>> {
    match GpuContext::new().expect("GPU init failed") {
        Some(g) => {
            eprintln!("GPU adapter: {}", g.adapter);
            Some(g)
        }
        None => {
            common::prerequisite_missing("no GPU adapter (install mesa-vulkan-drivers for lavapipe)");
            None
        }
    }
}

#[test]
fn wgsl_translates_to_metal() {
    let msl = wgsl_to_msl(MATVEC_WGSL).unwrap();
    assert!(msl.contains("kernel void matvec"), "{msl}");
    assert!(msl.contains("threadgroup_barrier"), "workgroup barriers must map to Metal's");
    let layer = wgsl_to_msl(boltccl_llm::gpu::layer::LAYER_WGSL).unwrap();
    for k in ["rmsnorm", "qk_prep", "attention", "silu_mul"] {
        assert!(layer.contains(&format!("kernel void {k}")), "{k} missing from MSL");
    }
    let msl16 = wgsl_to_msl(MATVEC_F16_WGSL).unwrap();
    assert!(msl16.contains("half"), "f16 weights must become Metal `half`: {msl16}");
    let msl_q = wgsl_to_msl(MATVEC_Q_WGSL).unwrap();
    for k in ["matvec_q4_0", "matvec_q4_1", "matvec_q8_0", "matmul_q4_0", "matmul_q4_1", "matmul_q8_0"] {
        assert!(msl_q.contains(&format!("kernel void {k}")), "{k} missing from MSL");
    }
    // The batched prefill products of f32 and f16 weights.
    assert!(msl.contains("kernel void matmul"), "f32 matmul missing from MSL");
    assert!(msl16.contains("kernel void matmul"), "f16 matmul missing from MSL");
    // A broken shader must be rejected, so this test can fail.
    assert!(wgsl_to_msl("@compute @workgroup_size(64) fn f() { let x: u32 = 1.5; }").is_err());
}

#[test]
fn gpu_matvec_matches_cpu() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(5);
    // Odd sizes: not multiples of the workgroup; more rows than one grid row for the y-dim path
    // would need > 32768 rows, covered by the SmolLM2 head in the CLI check instead.
    for (rows, cols) in [(1, 1), (7, 65), (130, 576), (1000, 33)] {
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.next_f32() - 0.5).collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.next_f32() - 0.5).collect();
        let m = boltccl_llm::ops::Mat::new(rows, cols, w.clone());
        let mut cpu = vec![0f32; rows];
        m.matvec(&x, &mut cpu).unwrap();
        let g = GpuMat::upload(&ctx, rows, cols, &w);
        let mut out = vec![f32::NAN; rows];
        g.matvec(&x, &mut out).unwrap();
        let d = cpu.iter().zip(&out).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(d < 1e-5, "{rows}x{cols}: {d}");
    }
}

fn run_gpu(src: &dyn WeightSource, ctx: &Arc<GpuContext>, tp: usize, prompt: &[u32]) -> GenOutput {
    on_ranks(tp, |c| {
        let plan = ShardPlan::new(src.config(), c.rank(), c.size()).unwrap();
        let mut model = Model::load(src, plan).unwrap();
        model.upload_to_gpu(ctx, false).unwrap();
        let opts = GenOptions { max_tokens: 8, stop_tokens: Vec::new(), record_logits: true, check_sync: true };
        generate(&model, &c, prompt, &mut Sampler::greedy(), &opts, |_| {}).unwrap()
    })
    .swap_remove(0)
}

/// Whole layers on the GPU (norms, RoPE, q/k norm, biases, KV cache, attention, SwiGLU)
/// against the CPU, across the model variants and uneven / zero-head shards.
#[test]
fn gpu_decode_matches_cpu() {
    let Some(ctx) = gpu() else { return };
    let qwen2 = Spec { model_type: "qwen2", seed: 3, ..Spec::odd() };
    let qwen3 = Spec {
        model_type: "qwen3",
        rope: boltccl_llm::config::RopeStyle::NeoX,
        tie: false,
        head_dim: 16,
        seed: 4,
        ..Spec::even()
    };
    // Spec::odd has 9 query heads on 3 KV heads: TP=2 and 4 start shards inside a KV group,
    // TP=10 leaves a rank without heads.
    for (spec, tps) in [(Spec::odd(), &[1, 2, 4, 10][..]), (qwen2, &[3][..]), (qwen3, &[1, 4][..])] {
        let dir = write_checkpoint(&spec, &tensors(&spec), StoreDtype::F32);
        let src = open(&dir);
        let prompt = [4, 8, 15, 16, 23];
        let cpu = run_tp(src.as_ref(), 1, &prompt, 8);
        for &tp in tps {
            let g = run_gpu(src.as_ref(), &ctx, tp, &prompt);
            assert_eq!(g.tokens, cpu.tokens, "{} GPU TP={tp}", spec.model_type);
            let d = max_diff(&g.logits, &cpu.logits);
            eprintln!("{} GPU TP={tp}: max |logit diff| vs CPU = {d:.2e}", spec.model_type);
            assert!(d < 1e-4, "{} GPU TP={tp}: {d}", spec.model_type);
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The output head split on the GPU: each rank uploads only its rows of the head (tied or
/// separate) and the gathered logits are the bits of the whole head on one rank's GPU (one
/// workgroup per row, whatever the slice), including a rank with an empty slice (CPU path).
#[test]
fn gpu_split_head_gives_the_one_rank_bits() {
    let Some(ctx) = gpu() else { return };
    let f16s: &[bool] = if ctx.supports_f16() { &[false, true] } else { &[false] };
    for spec in [Spec::odd(), Spec { vocab: 3, tie: true, ..Spec::odd() }] {
        let dir = write_checkpoint(&spec, &tensors(&spec), StoreDtype::F32);
        let src = open(&dir);
        for &f16 in f16s {
            let upload = |m: &mut Model| m.upload_to_gpu(&ctx, f16).unwrap();
            check_split_head_bits(src.as_ref(), &[3, 4], Default::default(), &upload);
        }
        if ctx.supports_f16() {
            // The head really runs on the GPU: its f16 copy gives other logits than the CPU's.
            let plan = ShardPlan::new(src.config(), 0, 1).unwrap();
            let mut m = Model::load(src.as_ref(), plan).unwrap();
            let x = vec![0.5f32; spec.hidden];
            let cpu = m.logits(&x, &boltccl_llm::comm::SingleRank).unwrap().unwrap();
            m.upload_to_gpu(&ctx, true).unwrap();
            let g = m.logits(&x, &boltccl_llm::comm::SingleRank).unwrap().unwrap();
            assert_ne!(cpu, g, "vocab {}: head not computed on the GPU", spec.vocab);
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn gpu_f16_weights_match_cpu_on_rounded_weights() {
    let Some(ctx) = gpu() else { return };
    if !ctx.supports_f16() {
        eprintln!("SKIPPED: adapter has no shader-f16");
        return;
    }
    let mut rng = Rng::new(6);
    for (rows, cols) in [(3, 7), (130, 576), (64, 33)] {
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.next_f32() - 0.5).collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.next_f32() - 0.5).collect();
        // The CPU oracle multiplies the same f16-rounded weights.
        let rounded: Vec<f32> = w.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect();
        let mut cpu = vec![0f32; rows];
        boltccl_llm::ops::Mat::new(rows, cols, rounded).matvec(&x, &mut cpu).unwrap();
        let g = GpuMat::upload_as(&ctx, rows, cols, &w, true).unwrap();
        let mut out = vec![f32::NAN; rows];
        g.matvec(&x, &mut out).unwrap();
        let d = cpu.iter().zip(&out).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(d < 1e-5, "{rows}x{cols}: {d}");
    }
}

/// Matrices kept in GGML blocks on the GPU (decoded in the shader) against the CPU's products
/// on the same blocks with f32 inputs (`--weights quant`), for every block type.
#[test]
fn gpu_quantized_matvec_matches_cpu() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(8);
    type Enc = fn(&[f32]) -> (Vec<u8>, Vec<f32>);
    for (ty, enc) in
        [(GgmlType::Q4_0, gw::q4_0 as Enc), (GgmlType::Q4_1, gw::q4_1 as Enc), (GgmlType::Q8_0, gw::q8_0 as Enc)]
    {
        for (rows, cols) in [(1, 32), (7, 96), (130, 576), (65, 1536)] {
            let w: Vec<f32> = (0..rows * cols).map(|_| rng.next_f32() - 0.5).collect();
            let x: Vec<f32> = (0..cols).map(|_| rng.next_f32() - 0.5).collect();
            let q = QuantRows::new(ty, cols, enc(&w).0).unwrap();
            let mut cpu = vec![0f32; rows];
            boltccl_llm::ops::Mat::quantized(q.clone()).matvec(&x, &mut cpu).unwrap();
            // A slice of rows too, as each rank uploads its part of the output head.
            for r in [0..rows, rows / 2..rows] {
                let g = GpuMat::upload_quant(&ctx, &q, r.clone()).unwrap();
                let mut out = vec![f32::NAN; r.len()];
                g.matvec(&x, &mut out).unwrap();
                let d = cpu[r].iter().zip(&out).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                assert!(d < 1e-5, "{ty:?} {rows}x{cols}: {d}");
            }
        }
    }
    // Scales the shader decodes by hand: f16 subnormal, negative, zero and the largest finite.
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let mut bytes = Vec::new();
        for bits in [0x0001u16, 0x83ffu16, 0x0000u16, 0xbc00u16, 0x7bffu16, 0x3555u16] {
            bytes.extend(bits.to_le_bytes());
            if ty == GgmlType::Q4_1 {
                bytes.extend((bits ^ 0x8000).to_le_bytes()); // minimum: the scale negated
            }
            let n = if ty == GgmlType::Q8_0 { 32 } else { 16 };
            bytes.extend((0..n).map(|_| (rng.next_u64() >> 56) as u8));
        }
        let q = QuantRows::new(ty, 64, bytes).unwrap();
        let x: Vec<f32> = (0..64).map(|_| rng.next_f32() - 0.5).collect();
        let mut cpu = vec![0f32; 3];
        boltccl_llm::ops::Mat::quantized(q.clone()).matvec(&x, &mut cpu).unwrap();
        let mut out = vec![f32::NAN; 3];
        GpuMat::upload_quant(&ctx, &q, 0..3).unwrap().matvec(&x, &mut out).unwrap();
        for (a, b) in cpu.iter().zip(&out) {
            assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{ty:?} special scales: CPU {cpu:?} GPU {out:?}");
        }
    }
}

/// A quantised GGUF model (Q8_0 embedding/head, Q4_1 attention, Q4_0 MLP) decoded on the GPU
/// from its blocks: the CPU's tokens with f32 inputs on the same blocks, at TP = 1 and 2, and
/// logits within 1e-4.
#[test]
fn gpu_decode_on_quantized_weights_matches_cpu() {
    let Some(ctx) = gpu() else { return };
    let spec = Spec { hidden: 128, ffn: 256, heads: 4, kv_heads: 2, head_dim: 32, seed: 13, ..Spec::odd() };
    let (gguf, st) = gw::build_with(&spec);
    let src = boltccl_llm::loader::open(&gguf).unwrap().weights;
    let prompt = [4, 8, 15, 16, 23];
    let cpu = common::run_tp_with(src.as_ref(), 1, &prompt, 8, LoadOptions { weights: WeightMode::Quant });
    for tp in [1, 2] {
        let g = run_gpu(src.as_ref(), &ctx, tp, &prompt);
        assert_eq!(g.tokens, cpu.tokens, "GPU TP={tp} on blocks");
        let d = max_diff(&g.logits, &cpu.logits);
        eprintln!("quantised GGUF GPU TP={tp}: max |logit diff| vs CPU = {d:.2e}");
        assert!(d < 1e-4, "GPU TP={tp}: {d}");
    }
    let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
    let _ = std::fs::remove_dir_all(st);
}

/// A GGUF in the 5-bit and K-quant types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), whose matrices go up
/// to the GPU decoded: the tokens of the CPU with the weights expanded to f32, at TP = 1 and 2,
/// and logits within 1e-4.
#[test]
fn gpu_decode_on_k_quant_weights_matches_cpu() {
    let Some(ctx) = gpu() else { return };
    let spec = Spec { hidden: 256, ffn: 512, heads: 4, kv_heads: 2, head_dim: 64, seed: 31, ..Spec::odd() };
    let types = |hf: &str| match hf {
        h if h.contains("q_proj") || h.contains("lm_head") => 12,
        h if h.contains("k_proj") || h.contains("up_proj") => 13,
        h if h.contains("down_proj") || h.contains("embed") => 14,
        h if h.contains("v_proj") => 7,
        _ => 6,
    };
    let (gguf, st) = gw::build_typed_by(&spec, &types);
    let src = boltccl_llm::loader::open(&gguf).unwrap().weights;
    let prompt = [4, 8, 15, 16, 23];
    let cpu = common::run_tp_with(src.as_ref(), 1, &prompt, 8, LoadOptions { weights: WeightMode::F32 });
    for tp in [1, 2] {
        let g = run_gpu(src.as_ref(), &ctx, tp, &prompt);
        assert_eq!(g.tokens, cpu.tokens, "GPU TP={tp} on K-quants");
        let d = max_diff(&g.logits, &cpu.logits);
        eprintln!("K-quant GGUF GPU TP={tp}: max |logit diff| vs CPU = {d:.2e}");
        assert!(d < 1e-4, "GPU TP={tp}: {d}");
    }
    let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
    let _ = std::fs::remove_dir_all(st);
}

/// SmolLM2 on the GPU (weights uploaded in their Q4_1/Q8_0 blocks) says what the CPU says with
/// f32 inputs on the same blocks: the same greedy tokens. Skips without the model file.
#[test]
fn gpu_smollm2_same_tokens_as_cpu() {
    let Some(ctx) = gpu() else { return };
    let Some(path) = common::smollm2_path() else { return };
    let ck = boltccl_llm::loader::open(&path).unwrap();
    let tok = ck.tokenizer.as_ref().unwrap();
    let chat = boltccl_llm::tokenizer::Tokenizer::chatml_prompt(
        ck.chat_template.as_deref().unwrap(),
        None,
        "What is the capital of France? Answer in one sentence.",
    )
    .unwrap();
    let prompt = tok.encode(&chat, true).unwrap();
    let src = ck.weights.as_ref();
    let n = 8;
    let cpu = common::run_tp_with(src, 1, &prompt, n, LoadOptions { weights: WeightMode::Quant });
    let plan = ShardPlan::new(src.config(), 0, 1).unwrap();
    let mut model = Model::load(src, plan).unwrap();
    model.upload_to_gpu(&ctx, false).unwrap();
    let opts = GenOptions { max_tokens: n, stop_tokens: Vec::new(), record_logits: true, check_sync: false };
    let g = generate(&model, &boltccl_llm::comm::SingleRank, &prompt, &mut Sampler::greedy(), &opts, |_| {}).unwrap();
    eprintln!("GPU: {:?}", tok.decode(&g.tokens, false));
    assert_eq!(
        g.tokens,
        cpu.tokens,
        "GPU {:?} vs CPU {:?}",
        tok.decode(&g.tokens, false),
        tok.decode(&cpu.tokens, false)
    );
    let d = max_diff(&g.logits, &cpu.logits);
    eprintln!("SmolLM2 GPU vs CPU: same {n} tokens, max |logit diff| {d:.2e}");
    assert!(d < 1e-2, "logits differ by {d}");
}

/// The batched (matrix-matrix) product of every weight kind against the matvec of each input
/// row: row counts below, at and past one tile of [`MATMUL_TILE`] input rows (so a tile's tail
/// rows count), weight shapes not multiples of the workgroup.
#[test]
fn gpu_matmul_matches_matvec_per_row() {
    let Some(ctx) = gpu() else { return };
    let mut rng = Rng::new(21);
    let (rows, cols) = (67, 96);
    let w: Vec<f32> = (0..rows * cols).map(|_| rng.next_f32() - 0.5).collect();
    let mut mats: Vec<(&str, GpuMat)> = vec![("f32", GpuMat::upload(&ctx, rows, cols, &w))];
    if ctx.supports_f16() {
        mats.push(("f16", GpuMat::upload_as(&ctx, rows, cols, &w, true).unwrap()));
    }
    type Enc = fn(&[f32]) -> (Vec<u8>, Vec<f32>);
    for (name, ty, enc) in [
        ("Q4_0", GgmlType::Q4_0, gw::q4_0 as Enc),
        ("Q4_1", GgmlType::Q4_1, gw::q4_1 as Enc),
        ("Q8_0", GgmlType::Q8_0, gw::q8_0 as Enc),
    ] {
        let q = QuantRows::new(ty, cols, enc(&w).0).unwrap();
        mats.push((name, GpuMat::upload_quant(&ctx, &q, 0..rows).unwrap()));
    }
    for (name, m) in &mats {
        for t in [1, 2, MATMUL_TILE - 1, MATMUL_TILE, MATMUL_TILE + 5, 3 * MATMUL_TILE + 1] {
            let x: Vec<f32> = (0..t * cols).map(|_| rng.next_f32() - 0.5).collect();
            let mut batched = vec![f32::NAN; t * rows];
            m.matmul(&x, t, &mut batched).unwrap();
            let mut worst = 0f32;
            for (i, (xr, br)) in x.chunks(cols).zip(batched.chunks(rows)).enumerate() {
                let mut one = vec![f32::NAN; rows];
                m.matvec(xr, &mut one).unwrap();
                let d = one.iter().zip(br).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                // NaN (a row never written) fails too.
                assert!(d <= 1e-5, "{name} T={t}: input row {i} differs from its matvec by {d}");
                worst = worst.max(d);
            }
            if t == MATMUL_TILE + 5 {
                eprintln!("{name} matmul T={t}: max |diff| vs matvec per row = {worst:.1e}");
            }
        }
    }
    // Bad shapes are errors, not panics.
    assert!(mats[0].1.matmul(&[0.0; 5], 1, &mut [0.0; 67]).is_err());
}

/// Rank 0's logits of every step and the greedy tokens of a prefill in two calls (`a`, then
/// `b` at pos0 = `a.len()`) followed by `n` decode steps, on `tp` in-process ranks. On the GPU
/// (`gpu`: device, f16 weights, prefill batch rows; rows 1 = token by token) or on the CPU.
fn two_part_prefill(
    src: &dyn WeightSource,
    tp: usize,
    gpu: Option<(&Arc<GpuContext>, bool, usize)>,
    load: LoadOptions,
    a: &[u32],
    b: &[u32],
    n: usize,
) -> GenOutput {
    use boltccl_llm::comm::Comm;
    on_ranks(tp, |c| {
        let plan = ShardPlan::new(src.config(), c.rank(), c.size()).unwrap();
        let mut model = Model::load_with(src, plan, load).unwrap();
        if let Some((ctx, f16, rows)) = gpu {
            model.upload_to_gpu(ctx, f16).unwrap();
            model.set_gpu_prefill_rows(rows);
        }
        let mut cache = model.new_cache();
        let mut out = GenOutput::default();
        let mut step = |tokens: &[u32], out: &mut GenOutput| {
            let logits = model.forward_batch(tokens, &mut cache, &c, true).unwrap();
            // Rank 0 holds the logits and picks; the others learn its choice.
            let mine = logits.as_deref().map_or(0, |l| boltccl_llm::sample::argmax(l) as u64);
            let tok = c.all_gather_u64(&[mine]).unwrap()[0] as u32;
            out.logits.extend(logits);
            out.tokens.push(tok);
            tok
        };
        step(a, &mut out);
        let mut tok = step(b, &mut out);
        for _ in 0..n {
            tok = step(&[tok], &mut out);
        }
        out
    })
    .swap_remove(0)
}

/// Batched GPU prefill (matmul kernels, one round trip per segment per batch) against the
/// token-by-token GPU path and the CPU backend on `src`, at TP = 1 and 2: the same tokens. The
/// prompt is 21 tokens (a tile of 16 and a tail of 5), then 6 more at pos0 = 21; prefill
/// batches of 64 (each call in one batch) and of 7 (batches starting inside the prompt), then
/// 4 decode steps. Logits of every step: within 1e-5 of token by token (the batched kernels
/// form each token's sums in the matvec's order: on lavapipe the bits are equal, and 1e-5 is
/// the matvec tests' bound for a compiler that contracts differently) and within 1e-4 of the
/// CPU (other summation order; the decode tests' bound, measured ~3e-6 here).
fn check_batched_prefill(name: &str, src: &dyn WeightSource, ctx: &Arc<GpuContext>, f16: bool, load: LoadOptions) {
    let a: Vec<u32> = (0..21).map(|i| (i * 37 + 5) % 64).collect();
    let b = [3, 1, 4, 1, 5, 9];
    for tp in [1, 2] {
        let run = |g| two_part_prefill(src, tp, g, load, &a, &b, 4);
        let cpu = run(None);
        let by_token = run(Some((ctx, f16, 1)));
        assert_eq!(by_token.tokens, cpu.tokens, "{name} TP={tp}: token-by-token GPU vs CPU");
        for rows in [64, 7] {
            let g = run(Some((ctx, f16, rows)));
            assert_eq!(g.tokens, by_token.tokens, "{name} TP={tp} batch {rows}: vs token by token");
            assert_eq!(g.tokens, cpu.tokens, "{name} TP={tp} batch {rows}: vs CPU");
            let (dt, dc) = (max_diff(&g.logits, &by_token.logits), max_diff(&g.logits, &cpu.logits));
            eprintln!("{name} TP={tp} batch {rows}: max |logit diff| {dt:.1e} vs token by token, {dc:.1e} vs CPU");
            assert!(dt <= 1e-5, "{name} TP={tp} batch {rows}: {dt} from token by token");
            assert!(dc <= 1e-4, "{name} TP={tp} batch {rows}: {dc} from the CPU");
        }
    }
}

/// [`check_batched_prefill`] on an f32 checkpoint of `spec`.
fn check_batched_prefill_f32(spec: Spec) {
    let Some(ctx) = gpu() else { return };
    let dir = write_checkpoint(&spec, &tensors(&spec), StoreDtype::F32);
    check_batched_prefill(&format!("f32 {}", spec.model_type), open(&dir).as_ref(), &ctx, false, Default::default());
    let _ = std::fs::remove_dir_all(dir);
}

/// f32 weights, interleaved RoPE, 9 query heads on 3 KV heads (TP = 2 starts a shard inside a
/// KV group).
#[test]
fn gpu_batched_prefill_f32_llama() {
    check_batched_prefill_f32(Spec::odd());
}

/// q/k/v biases added per row.
#[test]
fn gpu_batched_prefill_f32_qwen2_biases() {
    check_batched_prefill_f32(Spec { model_type: "qwen2", seed: 3, ..Spec::odd() });
}

/// Per-head q/k norms and rotate-half RoPE.
#[test]
fn gpu_batched_prefill_f32_qwen3_norms() {
    check_batched_prefill_f32(Spec {
        model_type: "qwen3",
        rope: boltccl_llm::config::RopeStyle::NeoX,
        tie: false,
        head_dim: 16,
        seed: 4,
        ..Spec::even()
    });
}

/// f16 weights: the checkpoint is stored as f16, so the CPU multiplies the very values the
/// GPU holds.
#[test]
fn gpu_batched_prefill_f16() {
    let Some(ctx) = gpu() else { return };
    if !ctx.supports_f16() {
        eprintln!("SKIPPED: adapter has no shader-f16");
        return;
    }
    let dir = write_checkpoint(&Spec::odd(), &tensors(&Spec::odd()), StoreDtype::F16);
    check_batched_prefill("f16", open(&dir).as_ref(), &ctx, true, Default::default());
    let _ = std::fs::remove_dir_all(dir);
}

/// GGML blocks: a GGUF with Q8_0 embedding/head, Q4_1 attention and Q4_0 MLP matrices, against
/// the CPU with f32 inputs on the same blocks.
#[test]
fn gpu_batched_prefill_quant_blocks() {
    let Some(ctx) = gpu() else { return };
    let spec = Spec { hidden: 128, ffn: 256, heads: 4, kv_heads: 2, head_dim: 32, seed: 13, ..Spec::odd() };
    let (gguf, st) = gw::build_with(&spec);
    let src = boltccl_llm::loader::open(&gguf).unwrap().weights;
    check_batched_prefill("GGUF Q8_0/Q4_1/Q4_0", src.as_ref(), &ctx, false, LoadOptions { weights: WeightMode::Quant });
    let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
    let _ = std::fs::remove_dir_all(st);
}
