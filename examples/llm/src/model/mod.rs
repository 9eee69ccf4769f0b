//! The tensor-parallel Llama/Qwen decoder. Activations are f32 on the CPU; the matrix
//! products run on f32 or block-quantised weights, on the CPU or (feature `gpu`) the GPU.
//!
//! Per layer, on every rank (a mixture-of-experts MLP, Qwen3-MoE, ends differently: see
//! `moe.rs`):
//! `x += all_sum(o_proj_shard(attn(own heads)))`, then `x += all_sum(down_shard(swiglu(own
//! features)))`. The residual stream `x`, the norms and RoPE are replicated; because all_sum
//! returns identical bits on every rank, `x` stays identical everywhere.
//!
//! The output head is replicated too, but its product is split: each rank computes the logits
//! of its slice of the vocabulary ([`ShardPlan::vocab`]) from the (identical) final hidden
//! state, and rank 0 gathers the slices (or, decoding greedily, the ranks exchange their
//! slices' largest logits: [`Model::forward_greedy`]). Every logit is one row's dot product
//! computed the same way whatever the slicing, so the gathered logits are the bits one rank
//! would compute alone.

mod cpu;
mod load;
mod moe;

use anyhow::{ensure, Context};

use crate::comm::Comm;
use crate::config::ModelConfig;
use crate::ops::{rmsnorm_inplace, Mat};
use crate::quant::Q8Act;
use crate::sample::{argmax_of, Best};
use crate::shard::ShardPlan;

pub use load::{LoadOptions, WeightMode};
pub use moe::route;

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
    /// o_proj and down_proj partial sums go through the exact f64 all_sum (quantised model;
    /// see [`crate::quant::dot`], step 6). Decided from the file and the plan alone, so every
    /// rank, including one whose shard of o_proj is empty, calls the same collective.
    o_exact: bool,
    down_exact: bool,
    /// Qwen3-MoE: the routed experts, in place of the dense MLP (whose matrices are then
    /// empty).
    moe: Option<moe::MoeLayer>,
}

/// Per-rank decoding state of one sequence: the KV cache (for each layer,
/// `[pos][local_kv_head][head_dim]` for K and for V) and the CPU's working buffers.
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
    fingerprint: u32,
    scratch: cpu::Scratch,
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
    /// Most tokens per batch of GPU prefill (at most what the batch buffers hold).
    #[cfg(feature = "gpu")]
    gpu_prefill_rows: usize,
}

impl Model {
    /// Moves every weight matrix this rank multiplies with onto the GPU, as f16 when `f16`.
    #[cfg(feature = "gpu")]
    pub fn upload_to_gpu(&mut self, ctx: &std::sync::Arc<crate::gpu::GpuContext>, f16: bool) -> anyhow::Result<()> {
        ensure!(
            self.cfg.moe.is_none(),
            "the GPU backend does not run mixture-of-experts models (qwen3moe): use the CPU"
        );
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
        // The GPU cache is allocated up front; cap it so small GPUs cope.
        let max_seq = cfg.max_seq_len.min(4096);
        let (n_q, n_kv) = (self.plan.q_heads.len(), self.plan.kv_heads.len());
        let ffn = self.layers.first().map_or(0, |l| l.w_gate.rows);
        let batch = std::sync::Arc::new(crate::gpu::layer::BatchBufs::new(
            ctx,
            cfg.hidden_size,
            cfg.head_dim,
            n_q,
            n_kv,
            ffn,
            max_seq,
        )?);
        self.gpu_prefill_rows = batch.max_rows();
        let mut gl = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            gl.push(GpuLayer::new(
                ctx,
                &kernels,
                LayerSpec {
                    hidden: cfg.hidden_size,
                    head_dim: cfg.head_dim,
                    n_q,
                    n_kv,
                    group: cfg.group_size(),
                    q_skew: self.plan.q_skew(cfg),
                    max_seq,
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
                    batch: batch.clone(),
                },
            )?);
        }
        self.gpu_layers = Some((kernels, gl));
        Ok(())
    }

    /// Caps GPU prefill batches at `rows` tokens (at least 1; at most what the batch buffers
    /// allocated by [`Model::upload_to_gpu`] hold). A longer prompt goes in several batches.
    /// `1` prefills token by token, through the decode kernels.
    #[cfg(feature = "gpu")]
    pub fn set_gpu_prefill_rows(&mut self, rows: usize) {
        let most = self.gpu_layers.as_ref().and_then(|(_, gl)| gl.first()).map_or(1, |l| l.max_batch());
        self.gpu_prefill_rows = rows.clamp(1, most);
    }

    /// The GPU layers on `tokens`: the residual rows after the last layer (`t x hidden`).
    /// A single token (decode) takes the matrix-vector path, two round trips and two all_sums
    /// per layer; more go in batches of up to `gpu_prefill_rows`, still two round trips and two
    /// all_sums per layer but per batch, on `batch x hidden` values (the CPU path's shape).
    #[cfg(feature = "gpu")]
    fn forward_gpu(&self, tokens: &[u32], cache: &mut KvCache, comm: &dyn Comm) -> anyhow::Result<Vec<f32>> {
        let (kernels, gl) = self.gpu_layers.as_ref().expect("checked by caller");
        let h = self.cfg.hidden_size;
        if tokens.len() > 1 && self.gpu_prefill_rows > 1 {
            let mut x = vec![0f32; tokens.len() * h];
            for (&tok, xr) in tokens.iter().zip(x.chunks_exact_mut(h)) {
                ensure!((tok as usize) < self.cfg.vocab_size, "token {tok} out of vocabulary");
                self.embed.row_into(tok as usize, xr);
            }
            let mut part = vec![0f32; self.gpu_prefill_rows.min(tokens.len()) * h];
            for xs in x.chunks_mut(self.gpu_prefill_rows * h) {
                let part = &mut part[..xs.len()];
                for (li, l) in gl.iter().enumerate() {
                    l.attention_batch(kernels, xs, cache.len, part)?;
                    comm.all_sum(part).with_context(|| format!("all_sum after attention, layer {li}"))?;
                    xs.iter_mut().zip(part.iter()).for_each(|(a, b)| *a += b);
                    l.mlp_batch(kernels, xs, part)?;
                    comm.all_sum(part).with_context(|| format!("all_sum after MLP, layer {li}"))?;
                    xs.iter_mut().zip(part.iter()).for_each(|(a, b)| *a += b);
                }
                cache.len += xs.len() / h;
            }
            return Ok(x);
        }
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
            scratch: cpu::Scratch::default(),
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
        #[cfg(feature = "gpu")]
        if self.gpu_layers.is_some() {
            let x = self.forward_gpu(tokens, cache, comm)?;
            let out = self.finish(&x, x.len() / cfg.hidden_size, cache, comm, want_logits);
            cache.scratch.x = x; // its last row is the hidden state `forward_greedy` reads
            return out;
        }
        self.forward_cpu(tokens, cache, comm)?;
        let x = std::mem::take(&mut cache.scratch.x);
        let out = self.finish(&x, t, cache, comm, want_logits);
        cache.scratch.x = x;
        out
    }

    /// [`Model::forward_batch`] without logits, then the greedy next token, the same on every
    /// rank (a collective, like the pass). Each rank takes the largest logit of its slice of the
    /// vocabulary, and the ranks exchange one (value, index) word each: 8 bytes a rank instead
    /// of gathering the logits to rank 0 and broadcasting its choice. The token is
    /// [`argmax`](crate::sample::argmax) of the gathered logits: they are the same bits, the
    /// slices lie in rank order, and ties go to the lower index both ways.
    pub fn forward_greedy(&self, tokens: &[u32], cache: &mut KvCache, comm: &dyn Comm) -> anyhow::Result<u32> {
        self.forward_batch(tokens, cache, comm, false)?;
        let h = self.cfg.hidden_size;
        let cpu::Scratch { x, head: s, .. } = &mut cache.scratch;
        self.my_logits(&x[x.len() - h..], comm, s)?;
        let mine = Best::of(&s.mine, self.plan.vocab.start);
        let all = comm.all_gather_u64(&[Best::to_word(mine)]).context("choosing the next token")?;
        ensure!(all.len() == self.plan.size, "{} candidates from {} ranks", all.len(), self.plan.size);
        Ok(argmax_of(all.into_iter().map(Best::from_word)))
    }

    /// Records the residual fingerprint and, when asked, computes the last token's logits.
    fn finish(
        &self,
        x: &[f32],
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
        self.logits_with(&x[(t - 1) * h..], comm, &mut cache.scratch.head)
    }

    /// The output head: the separate `lm_head`, or the embedding when tied.
    fn head(&self) -> &Mat {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// This rank's logits, rows `plan.vocab` of the head times the normalised `xn`: on the GPU
    /// after `upload_to_gpu` (unless the slice is empty), else on the CPU (`q` holds `xn`
    /// quantised when the head takes Q8 inputs).
    fn head_slice(&self, xn: &[f32], q: &mut Q8Act, out: &mut [f32]) -> anyhow::Result<()> {
        #[cfg(feature = "gpu")]
        if let Some(g) = &self.head_gpu {
            return g.matvec(xn, out);
        }
        let head = self.head();
        let q = head.uses_q8().then(|| {
            q.quantize(xn);
            &*q
        });
        head.matvec_rows_q(self.plan.vocab.clone(), xn, q, out)
    }

    /// Logits `head · rmsnorm(hidden)` for a final hidden state `hidden` (the same on every
    /// rank), computed split across ranks: this rank computes the rows `plan.vocab`, then the
    /// slices are gathered to rank 0, which gets `Some(all logits)`; the others get `None`.
    /// A collective: every rank must call it at the same point. The result has the same bits as
    /// the whole head computed on one rank (each row's dot product does not depend on the
    /// slicing).
    pub fn logits(&self, hidden: &[f32], comm: &dyn Comm) -> anyhow::Result<Option<Vec<f32>>> {
        self.logits_with(hidden, comm, &mut cpu::HeadScratch::default())
    }

    /// This rank's logits, rows `plan.vocab` of the head times the normalised `hidden`, into
    /// `s.mine`: what [`Model::logits`] gathers and [`Model::forward_greedy`] picks from.
    fn my_logits(&self, hidden: &[f32], comm: &dyn Comm, s: &mut cpu::HeadScratch) -> anyhow::Result<()> {
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
        s.xn.clear();
        s.xn.extend_from_slice(hidden);
        rmsnorm_inplace(&mut s.xn, &self.final_norm, cfg.rms_eps);
        s.mine.resize(self.plan.vocab.len(), 0.0);
        self.head_slice(&s.xn, &mut s.q, &mut s.mine)
    }

    /// [`Model::logits`] with reusable buffers (decode calls it once per token).
    fn logits_with(
        &self,
        hidden: &[f32],
        comm: &dyn Comm,
        s: &mut cpu::HeadScratch,
    ) -> anyhow::Result<Option<Vec<f32>>> {
        let cfg = &self.cfg;
        self.my_logits(hidden, comm, s)?;
        if self.plan.size == 1 {
            // One rank computed the whole head: returned as it is, no gather.
            return Ok(Some(std::mem::take(&mut s.mine)));
        }
        let counts: Vec<usize> =
            (0..self.plan.size).map(|r| crate::shard::split_range(cfg.vocab_size, self.plan.size, r).len()).collect();
        let root = self.plan.rank == 0;
        let mut all = vec![0f32; if root { cfg.vocab_size } else { 0 }];
        comm.gather_f32(&s.mine, &mut all, &counts, 0).context("gathering the logit slices")?;
        Ok(root.then_some(all))
    }
}
