//! The tensor-parallel Llama/Qwen decoder. Activations are f32 on the CPU; the matrix
//! products run on f32 or block-quantised weights, on the CPU or (feature `gpu`) the GPU.
//!
//! Per layer, on every rank:
//! `x += all_sum(o_proj_shard(attn(own heads)))`, then `x += all_sum(down_shard(swiglu(own
//! features)))`. The residual stream `x`, the norms and RoPE are replicated; because all_sum
//! returns identical bits on every rank, `x` stays identical everywhere.
//!
//! The output head is replicated too, but its product is split: each rank computes the logits
//! of its slice of the vocabulary ([`ShardPlan::vocab`]) from the (identical) final hidden
//! state, and rank 0 gathers the slices. Every logit is one row's dot product computed the same
//! way whatever the slicing, so the gathered logits are the bits one rank would compute alone.

use anyhow::{ensure, Context};
use rayon::prelude::*;

use crate::comm::Comm;
use crate::config::ModelConfig;
use crate::loader::{names, WeightSource};
use crate::ops::{matmul_many, rmsnorm, rmsnorm_inplace, rope, rope_inv_freq, silu, softmax, Mat};
use crate::shard::ShardPlan;

/// One decoder layer's shard.
struct Layer {
    attn_norm: Vec<f32>,
    /// `[local_q_heads * head_dim, hidden]`
    wq: Mat,
    /// `[local_kv_heads * head_dim, hidden]`
    wk: Mat,
    wv: Mat,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    /// `[hidden, local_q_heads * head_dim]` (input columns of the owned heads).
    wo: Mat,
    ffn_norm: Vec<f32>,
    /// `[local_ffn, hidden]`
    w_gate: Mat,
    w_up: Mat,
    /// `[hidden, local_ffn]`
    w_down: Mat,
}

/// Per-rank KV cache: for each layer, `[pos][local_kv_head][head_dim]` for K and for V.
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
    fingerprint: u32,
}

impl KvCache {
    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Hash of the bits of the residual stream after the last forward pass. It is replicated
    /// state, so it must be equal on every rank; comparing it detects ranks that drifted apart
    /// (e.g. a collective that did not return identical bits everywhere).
    pub fn fingerprint(&self) -> u32 {
        self.fingerprint
    }
    /// Whether no position is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The shard of the model held by one rank.
pub struct Model {
    /// Hyper-parameters (global, unsharded values).
    pub cfg: ModelConfig,
    /// What this rank owns.
    pub plan: ShardPlan,
    embed: Mat,
    final_norm: Vec<f32>,
    /// Separate output head (every rank holds all of it); `None` when tied to `embed`.
    lm_head: Option<Mat>,
    layers: Vec<Layer>,
    inv_freq: Vec<f32>,
    /// Whole layers on the GPU (two round trips per layer), after `upload_to_gpu`.
    #[cfg(feature = "gpu")]
    gpu_layers: Option<(crate::gpu::layer::LayerKernels, Vec<crate::gpu::layer::GpuLayer>)>,
    /// This rank's rows (`plan.vocab`) of the output head on the GPU, after `upload_to_gpu`;
    /// `None` for an empty slice, which the CPU path handles.
    #[cfg(feature = "gpu")]
    head_gpu: Option<crate::gpu::GpuMat>,
}

fn vector(src: &dyn WeightSource, name: &str, len: usize) -> anyhow::Result<Vec<f32>> {
    let t = src.tensor(name)?;
    ensure!(t.data.len() == len, "{name}: expected {len} elements, got {}", t.data.len());
    Ok(t.data)
}

fn optional_slice(src: &dyn WeightSource, name: &str, r: std::ops::Range<usize>) -> anyhow::Result<Option<Vec<f32>>> {
    if !src.contains(name) {
        return Ok(None);
    }
    let t = src.tensor(name)?;
    ensure!(r.end <= t.data.len(), "{name}: too short");
    Ok(Some(t.data[r].to_vec()))
}

/// How [`Model::load_with`] stores the weights (default: f32).
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Keep block-quantised GGUF weights (Q8_0/Q4_0/Q4_1) in their encoding and multiply
    /// them block by block, instead of expanding them to f32 at load. 4-8x less memory; on
    /// the 2-core x86 dev box it decodes slower than f32 (the f32 path is memory-bound, the
    /// quantised one compute-bound), so it is opt-in.
    pub keep_quantized: bool,
}

/// Loads rows `r` of a `[rows_total, cols]` weight.
fn rows(
    src: &dyn WeightSource,
    name: &str,
    r: std::ops::Range<usize>,
    cols: usize,
    opts: LoadOptions,
) -> anyhow::Result<Mat> {
    let n = r.len();
    if n == 0 {
        return Ok(Mat::new(0, cols, Vec::new()));
    }
    if opts.keep_quantized {
        if let Some(q) = src.quant_rows(name, r.clone())? {
            ensure!(q.cols == cols, "{name}: expected {cols} columns, got {}", q.cols);
            return Ok(Mat::quantized(q));
        }
    }
    let t = src.tensor_rows(name, r)?;
    ensure!(t.cols() == cols, "{name}: expected {cols} columns, got {}", t.cols());
    Ok(Mat::new(n, cols, t.data))
}

/// Loads columns `c` of a `[rows, cols_total]` weight.
fn cols(
    src: &dyn WeightSource,
    name: &str,
    c: std::ops::Range<usize>,
    nrows: usize,
    opts: LoadOptions,
) -> anyhow::Result<Mat> {
    if c.is_empty() {
        return Ok(Mat::new(nrows, 0, Vec::new()));
    }
    if opts.keep_quantized {
        if let Some(q) = src.quant_rows(name, 0..nrows)? {
            // Shards on quantisation-block boundaries stay quantised; others fall through.
            if let Some(s) = q.slice_cols(c.clone()) {
                return Ok(Mat::quantized(s));
            }
        }
    }
    let t = src.tensor(name)?;
    ensure!(t.rows() == nrows, "{name}: expected {nrows} rows, got {}", t.rows());
    ensure!(c.end <= t.cols(), "{name}: columns {c:?} out of {}", t.cols());
    let s = t.slice_cols(c.clone());
    Ok(Mat::new(nrows, c.len(), s.data))
}

impl Model {
    /// Loads the shard described by `plan` from `src`.
    ///
    /// The embedding, the norms and the output head (tied or separate) are loaded whole on
    /// every rank; the layers only in this rank's share.
    pub fn load(src: &dyn WeightSource, plan: ShardPlan) -> anyhow::Result<Self> {
        Self::load_with(src, plan, LoadOptions::default())
    }

    /// [`Model::load`] with explicit storage options.
    pub fn load_with(src: &dyn WeightSource, plan: ShardPlan, opts: LoadOptions) -> anyhow::Result<Self> {
        let cfg = src.config().clone();
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let embed = rows(src, names::EMBED, 0..cfg.vocab_size, h, opts).context("embedding (vocab x hidden)")?;
        let tied = cfg.tie_embeddings || !src.contains(names::LM_HEAD);
        let lm_head = if tied {
            None
        } else {
            Some(rows(src, names::LM_HEAD, 0..cfg.vocab_size, h, opts).context("lm_head (vocab x hidden)")?)
        };
        let q_rows = plan.q_heads.start * hd..plan.q_heads.end * hd;
        let kv_rows = plan.kv_heads.start * hd..plan.kv_heads.end * hd;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let n = |s: &str| names::layer(i, s);
            let layer = Layer {
                attn_norm: vector(src, &n("input_layernorm.weight"), h)?,
                wq: rows(src, &n("self_attn.q_proj.weight"), q_rows.clone(), h, opts)?,
                wk: rows(src, &n("self_attn.k_proj.weight"), kv_rows.clone(), h, opts)?,
                wv: rows(src, &n("self_attn.v_proj.weight"), kv_rows.clone(), h, opts)?,
                bq: optional_slice(src, &n("self_attn.q_proj.bias"), q_rows.clone())?,
                bk: optional_slice(src, &n("self_attn.k_proj.bias"), kv_rows.clone())?,
                bv: optional_slice(src, &n("self_attn.v_proj.bias"), kv_rows.clone())?,
                q_norm: optional_slice(src, &n("self_attn.q_norm.weight"), 0..hd)?,
                k_norm: optional_slice(src, &n("self_attn.k_norm.weight"), 0..hd)?,
                wo: cols(src, &n("self_attn.o_proj.weight"), q_rows.clone(), h, opts)?,
                ffn_norm: vector(src, &n("post_attention_layernorm.weight"), h)?,
                w_gate: rows(src, &n("mlp.gate_proj.weight"), plan.ffn.clone(), h, opts)?,
                w_up: rows(src, &n("mlp.up_proj.weight"), plan.ffn.clone(), h, opts)?,
                w_down: cols(src, &n("mlp.down_proj.weight"), plan.ffn.clone(), h, opts)?,
            };
            ensure!(cfg.qkv_bias == layer.bq.is_some(), "layer {i}: q/k/v bias presence does not match the config");
            ensure!(
                cfg.qk_norm == layer.q_norm.is_some() && cfg.qk_norm == layer.k_norm.is_some(),
                "layer {i}: q/k norm presence does not match the config"
            );
            layers.push(layer);
        }
        let inv_freq = rope_inv_freq(hd, cfg.rope_theta);
        Ok(Self {
            final_norm: vector(src, names::FINAL_NORM, h)?,
            cfg,
            plan,
            embed,
            lm_head,
            layers,
            inv_freq,
            #[cfg(feature = "gpu")]
            gpu_layers: None,
            #[cfg(feature = "gpu")]
            head_gpu: None,
        })
    }

    /// Moves every weight matrix this rank multiplies with onto the GPU, as f16 when `f16`.
    #[cfg(feature = "gpu")]
    pub fn upload_to_gpu(&mut self, ctx: &std::sync::Arc<crate::gpu::GpuContext>, f16: bool) -> anyhow::Result<()> {
        for l in &mut self.layers {
            for m in [&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo, &mut l.w_gate, &mut l.w_up, &mut l.w_down] {
                m.upload(ctx, f16)?;
            }
        }
        // Output head: each rank computes the logits of its vocabulary slice, so only those
        // rows go to the GPU, as a matrix of their own. The CPU copy stays whole (the embedding
        // doubles as the tied head and is looked up on the CPU).
        self.head_gpu = self.head().upload_rows(ctx, self.plan.vocab.clone(), f16)?;
        use crate::gpu::layer::{GpuLayer, LayerKernels, LayerSpec};
        let kernels = LayerKernels::new(ctx);
        let cfg = &self.cfg;
        let mut gl = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            gl.push(GpuLayer::new(
                ctx,
                &kernels,
                LayerSpec {
                    hidden: cfg.hidden_size,
                    head_dim: cfg.head_dim,
                    n_q: self.plan.q_heads.len(),
                    n_kv: self.plan.kv_heads.len(),
                    // The GPU cache is allocated up front; cap it so small GPUs cope.
                    max_seq: cfg.max_seq_len.min(4096),
                    eps: cfg.rms_eps,
                    interleaved: cfg.rope_style == crate::config::RopeStyle::Interleaved,
                    inv_freq: &self.inv_freq,
                    attn_norm: &l.attn_norm,
                    ffn_norm: &l.ffn_norm,
                    bq: l.bq.as_deref(),
                    bk: l.bk.as_deref(),
                    bv: l.bv.as_deref(),
                    q_norm: l.q_norm.as_deref(),
                    k_norm: l.k_norm.as_deref(),
                    wq: l.wq.gpu.clone(),
                    wk: l.wk.gpu.clone(),
                    wv: l.wv.gpu.clone(),
                    wo: l.wo.gpu.clone(),
                    w_gate: l.w_gate.gpu.clone().context("gate_proj not on the GPU")?,
                    w_up: l.w_up.gpu.clone().context("up_proj not on the GPU")?,
                    w_down: l.w_down.gpu.clone().context("down_proj not on the GPU")?,
                },
            )?);
        }
        self.gpu_layers = Some((kernels, gl));
        Ok(())
    }

    /// Decode on the GPU layers: token by token, two round trips and two all_sums per layer.
    #[cfg(feature = "gpu")]
    fn forward_gpu(&self, tokens: &[u32], cache: &mut KvCache, comm: &dyn Comm) -> anyhow::Result<Vec<f32>> {
        let (kernels, gl) = self.gpu_layers.as_ref().expect("checked by caller");
        let h = self.cfg.hidden_size;
        let mut x = vec![0f32; h];
        let mut part = vec![0f32; h];
        for &tok in tokens {
            ensure!((tok as usize) < self.cfg.vocab_size, "token {tok} out of vocabulary");
            self.embed.row_into(tok as usize, &mut x);
            for (li, l) in gl.iter().enumerate() {
                l.attention(kernels, &x, cache.len, &mut part)?;
                comm.all_sum(&mut part).with_context(|| format!("all_sum after attention, layer {li}"))?;
                x.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
                l.mlp(kernels, &x, &mut part)?;
                comm.all_sum(&mut part).with_context(|| format!("all_sum after MLP, layer {li}"))?;
                x.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
            }
            cache.len += 1;
        }
        Ok(x)
    }

    /// An empty KV cache for this shard.
    pub fn new_cache(&self) -> KvCache {
        KvCache {
            k: vec![Vec::new(); self.layers.len()],
            v: vec![Vec::new(); self.layers.len()],
            len: 0,
            fingerprint: 0,
        }
    }

    /// Runs one token at position `cache.len()` through the model and appends its K/V.
    /// When `want_logits`, also computes the logits (see [`Model::logits`]): every rank must
    /// pass the same `want_logits`, and rank 0 gets `Some(logits)`, the others `None`.
    pub fn forward(
        &self,
        token: u32,
        cache: &mut KvCache,
        comm: &dyn Comm,
        want_logits: bool,
    ) -> anyhow::Result<Option<Vec<f32>>> {
        self.forward_batch(&[token], cache, comm, want_logits)
    }

    /// Runs `tokens` (positions `cache.len()..`) through the model at once, with causal
    /// attention, and appends their K/V. Used for prefill: weights are read once for all tokens
    /// and each layer does its two `all_sum`s on `tokens.len() x hidden` values instead of one
    /// pair per token. Computes the logits of the last token when `want_logits`, like
    /// [`Model::forward`].
    pub fn forward_batch(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        comm: &dyn Comm,
        want_logits: bool,
    ) -> anyhow::Result<Option<Vec<f32>>> {
        let cfg = &self.cfg;
        let t = tokens.len();
        ensure!(t > 0, "forward on no tokens");
        let pos0 = cache.len;
        ensure!(pos0 + t <= cfg.max_seq_len, "context full ({} tokens)", cfg.max_seq_len);
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        #[cfg(feature = "gpu")]
        if self.gpu_layers.is_some() {
            let x = self.forward_gpu(tokens, cache, comm)?;
            return self.finish(x, 1, cache, comm, want_logits);
        }
        let n_q = self.plan.q_heads.len();
        let n_kv = self.plan.kv_heads.len();
        let group = cfg.group_size();
        let scale = 1.0 / (hd as f32).sqrt();

        let mut x = vec![0f32; t * h];
        for (&tok, xr) in tokens.iter().zip(x.chunks_exact_mut(h)) {
            ensure!((tok as usize) < cfg.vocab_size, "token {tok} out of vocabulary");
            self.embed.row_into(tok as usize, xr);
        }
        let mut xn = vec![0f32; t * h];
        let mut q = vec![0f32; t * n_q * hd];
        let mut k = vec![0f32; t * n_kv * hd];
        let mut v = vec![0f32; t * n_kv * hd];
        let mut att = vec![0f32; t * n_q * hd];
        let mut part = vec![0f32; t * h];
        let nf = self.plan.ffn.len();
        let mut gate = vec![0f32; t * nf];
        let mut up = vec![0f32; t * nf];

        for (li, l) in self.layers.iter().enumerate() {
            // ---- attention on this rank's heads ----
            for (xr, nr) in x.chunks_exact(h).zip(xn.chunks_exact_mut(h)) {
                rmsnorm(xr, &l.attn_norm, cfg.rms_eps, nr);
            }
            if n_q > 0 {
                matmul_many(&[&l.wq, &l.wk, &l.wv], &xn, t, &mut [&mut q, &mut k, &mut v])?;
                for (y, b) in [(&mut q, &l.bq), (&mut k, &l.bk), (&mut v, &l.bv)] {
                    if let Some(b) = b {
                        for row in y.chunks_exact_mut(b.len()) {
                            row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                        }
                    }
                }
                for (y, norm, heads) in [(&mut q, &l.q_norm, n_q), (&mut k, &l.k_norm, n_kv)] {
                    for (tok, row) in y.chunks_exact_mut(heads * hd).enumerate() {
                        for head in row.chunks_exact_mut(hd) {
                            if let Some(w) = norm {
                                rmsnorm_inplace(head, w, cfg.rms_eps);
                            }
                            rope(head, pos0 + tok, &self.inv_freq, cfg.rope_style);
                        }
                    }
                }
                // Cache layout [pos][kv_head][head_dim] is exactly the token-major k/v layout.
                cache.k[li].extend_from_slice(&k);
                cache.v[li].extend_from_slice(&v);
                let (kc, vc) = (&cache.k[li], &cache.v[li]);
                att.par_chunks_mut(hd).zip(q.par_chunks(hd)).enumerate().for_each(|(i, (out, qv))| {
                    let (tok, qh) = (i / n_q, i % n_q);
                    let kvh = qh / group; // local KV head serving local query head qh
                    let seq = pos0 + tok + 1; // causal: up to and including this token
                    let mut scores: Vec<f32> = (0..seq)
                        .map(|p| {
                            let kv = &kc[(p * n_kv + kvh) * hd..][..hd];
                            crate::ops::dot(qv, kv) * scale
                        })
                        .collect();
                    softmax(&mut scores);
                    out.fill(0.0);
                    for (p, &s) in scores.iter().enumerate() {
                        let vv = &vc[(p * n_kv + kvh) * hd..][..hd];
                        out.iter_mut().zip(vv).for_each(|(o, &vi)| *o += s * vi);
                    }
                });
                matmul_many(&[&l.wo], &att, t, &mut [&mut part])?;
            } else {
                // No heads here (more ranks than KV heads): contribute zeros to the sum.
                part.fill(0.0);
            }
            comm.all_sum(&mut part).with_context(|| format!("all_sum after attention, layer {li}"))?;
            x.iter_mut().zip(&part).for_each(|(a, b)| *a += b);

            // ---- SwiGLU MLP on this rank's features ----
            for (xr, nr) in x.chunks_exact(h).zip(xn.chunks_exact_mut(h)) {
                rmsnorm(xr, &l.ffn_norm, cfg.rms_eps, nr);
            }
            matmul_many(&[&l.w_gate, &l.w_up], &xn, t, &mut [&mut gate, &mut up])?;
            gate.iter_mut().zip(&up).for_each(|(g, u)| *g = silu(*g) * u);
            matmul_many(&[&l.w_down], &gate, t, &mut [&mut part])?;
            comm.all_sum(&mut part).with_context(|| format!("all_sum after MLP, layer {li}"))?;
            x.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
        }
        cache.len += t;
        self.finish(x, t, cache, comm, want_logits)
    }

    /// Records the residual fingerprint and, when asked, computes the last token's logits.
    fn finish(
        &self,
        x: Vec<f32>,
        t: usize,
        cache: &mut KvCache,
        comm: &dyn Comm,
        want_logits: bool,
    ) -> anyhow::Result<Option<Vec<f32>>> {
        let cfg = &self.cfg;
        let h = cfg.hidden_size;
        // FNV-1a over the exact bits: any 1-ulp difference between ranks changes it.
        cache.fingerprint = x[(t - 1) * h..]
            .iter()
            .chain(x[..(t - 1) * h].iter())
            .fold(0x811c_9dc5u32, |hsh, v| (hsh ^ v.to_bits()).wrapping_mul(0x0100_0193));
        if !want_logits {
            return Ok(None);
        }
        self.logits(&x[(t - 1) * h..], comm)
    }

    /// The output head: the separate `lm_head`, or the embedding when tied.
    fn head(&self) -> &Mat {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// This rank's logits, rows `plan.vocab` of the head times the normalised `xn`: on the GPU
    /// after `upload_to_gpu` (unless the slice is empty), else on the CPU.
    fn head_slice(&self, xn: &[f32], out: &mut [f32]) -> anyhow::Result<()> {
        #[cfg(feature = "gpu")]
        if let Some(g) = &self.head_gpu {
            return g.matvec(xn, out);
        }
        self.head().matvec_rows(self.plan.vocab.clone(), xn, out)
    }

    /// Logits `head · rmsnorm(hidden)` for a final hidden state `hidden` (the same on every
    /// rank), computed split across ranks: this rank computes the rows `plan.vocab`, then the
    /// slices are gathered to rank 0, which gets `Some(all logits)`; the others get `None`.
    /// A collective: every rank must call it at the same point. The result has the same bits as
    /// the whole head computed on one rank (each row's dot product does not depend on the
    /// slicing).
    pub fn logits(&self, hidden: &[f32], comm: &dyn Comm) -> anyhow::Result<Option<Vec<f32>>> {
        let cfg = &self.cfg;
        ensure!(hidden.len() == cfg.hidden_size, "hidden state has {} values, not {}", hidden.len(), cfg.hidden_size);
        ensure!(
            comm.rank() == self.plan.rank && comm.size() == self.plan.size,
            "comm is rank {} of {}, the model shard rank {} of {}",
            comm.rank(),
            comm.size(),
            self.plan.rank,
            self.plan.size
        );
        let mut xn = hidden.to_vec();
        rmsnorm_inplace(&mut xn, &self.final_norm, cfg.rms_eps);
        let mut mine = vec![0f32; self.plan.vocab.len()];
        self.head_slice(&xn, &mut mine)?;
        let counts: Vec<usize> =
            (0..self.plan.size).map(|r| crate::shard::split_range(cfg.vocab_size, self.plan.size, r).len()).collect();
        let root = self.plan.rank == 0;
        let mut all = vec![0f32; if root { cfg.vocab_size } else { 0 }];
        comm.gather_f32(&mine, &mut all, &counts, 0).context("gathering the logit slices")?;
        Ok(root.then_some(all))
    }
}
