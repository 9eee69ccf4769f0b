//! The decoder layers on the CPU: one forward pass over `t` tokens, in buffers kept with the
//! KV cache and reused by every later pass, so that decoding allocates nothing per token.

use anyhow::Context;

use super::{KvCache, Layer, Model};
use crate::comm::Comm;
use crate::ops::{
    attend_head, par, products, products_exact, rmsnorm, rmsnorm_inplace, rope_table, rope_with, silu, KvHead, Mat,
};
use crate::quant::dot::GRID_BITS;
use crate::quant::Q8Act;

/// Per-sequence working memory (sized on first use).
#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// Residual stream, `t x hidden`: the pass's result.
    pub(super) x: Vec<f32>,
    pub(super) xn: Vec<f32>,
    /// q, k and v of all tokens, one after the other.
    qkv: Vec<f32>,
    att: Vec<f32>,
    scores: Vec<f32>,
    /// This rank's partial sum of o_proj or down_proj, before all_sum: f32, or exact (see
    /// [`crate::quant::dot`], step 6) in `part64`.
    part: Vec<f32>,
    part64: Vec<f64>,
    gate_up: Vec<f32>,
    h: Vec<f32>,
    /// RoPE `(cos, sin)` per token and frequency.
    rope: Vec<(f32, f32)>,
    /// `xn`, `att` and `h` quantised, for the matrices that take Q8 inputs.
    qx: Q8Act,
    qatt: Q8Act,
    qh: Q8Act,
    /// The output head's buffers.
    pub(super) head: HeadScratch,
}

/// Working memory of [`Model::logits`]: the normalised hidden state, it quantised, and this
/// rank's slice of the logits.
#[derive(Debug, Default)]
pub(super) struct HeadScratch {
    pub(super) xn: Vec<f32>,
    pub(super) q: Q8Act,
    pub(super) mine: Vec<f32>,
}

/// `v` as `n` values (growing it once; stale contents are overwritten by the caller).
pub(super) fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    v.resize(n, 0.0);
    &mut v[..n]
}

/// `q` holding `x` quantised when any of `mats` takes Q8 inputs, else `None`.
pub(super) fn quantized_for<'a>(mats: &[&Mat], x: &[f32], q: &'a mut Q8Act) -> Option<&'a Q8Act> {
    if mats.iter().any(|m| m.uses_q8()) {
        q.quantize(x);
        Some(q)
    } else {
        None
    }
}

/// Sums the ranks' partials (`s.part`, or `s.part64` when `exact`) and adds them to the
/// residual stream. Exact partials are integers scaled by 2^GRID_BITS: their f64 all_sum is
/// exact, and every rank scales the same sum back the same way.
fn add_all_sum(s: &mut Scratch, exact: bool, comm: &dyn Comm) -> anyhow::Result<()> {
    if exact {
        comm.all_sum_f64(&mut s.part64)?;
        s.x.iter_mut().zip(&s.part64).for_each(|(a, &b)| *a += from_grid(b));
    } else {
        comm.all_sum(&mut s.part)?;
        s.x.iter_mut().zip(&s.part).for_each(|(a, b)| *a += b);
    }
    Ok(())
}

/// An exact sum (an integer, the value scaled up by 2^GRID_BITS) as the f32 it stands for.
pub(super) fn from_grid(v: f64) -> f32 {
    (v * (1.0 / (1u64 << GRID_BITS) as f64)) as f32
}

/// `part` (f32 partial) or `part64` (exact) sized for `n` values.
fn partial(part: &mut Vec<f32>, part64: &mut Vec<f64>, exact: bool, n: usize) {
    if exact {
        part64.resize(n, 0.0);
    } else {
        part.resize(n, 0.0);
    }
}

/// Rows per MLP task step: the gate and up rows of one step live on the stack.
const MLP_STEP: usize = 64;

impl Model {
    /// Runs `tokens` (positions `cache.len()..`) through every layer on the CPU, leaving the
    /// residual stream in `cache.scratch.x`.
    pub(super) fn forward_cpu(&self, tokens: &[u32], cache: &mut KvCache, comm: &dyn Comm) -> anyhow::Result<()> {
        let cfg = &self.cfg;
        let (t, h) = (tokens.len(), cfg.hidden_size);
        let KvCache { k, v, scratch: s, len, .. } = cache;
        let pos0 = *len;
        let x = sized(&mut s.x, t * h);
        for (&tok, xr) in tokens.iter().zip(x.chunks_exact_mut(h)) {
            anyhow::ensure!((tok as usize) < cfg.vocab_size, "token {tok} out of vocabulary");
            self.embed.row_into(tok as usize, xr);
        }
        let half = self.inv_freq.len();
        s.rope.resize(t * half, (0.0, 0.0));
        for (tok, row) in s.rope.chunks_exact_mut(half.max(1)).enumerate() {
            rope_table(pos0 + tok, &self.inv_freq, row);
        }
        for (li, l) in self.layers.iter().enumerate() {
            self.attention(l, pos0, t, s, &mut k[li], &mut v[li])?;
            add_all_sum(s, l.o_exact, comm).with_context(|| format!("all_sum after attention, layer {li}"))?;
            if let Some(m) = &l.moe {
                self.moe(l, m, t, s, comm).with_context(|| format!("experts of layer {li}"))?;
                continue;
            }
            self.mlp(l, t, s)?;
            add_all_sum(s, l.down_exact, comm).with_context(|| format!("all_sum after MLP, layer {li}"))?;
        }
        *len += t;
        Ok(())
    }

    /// This rank's attention heads for `t` tokens: `s.part` gets its o_proj partial (zeros
    /// without heads), and the tokens' K/V are appended to `kc`/`vc`.
    fn attention(
        &self,
        l: &Layer,
        pos0: usize,
        t: usize,
        s: &mut Scratch,
        kc: &mut Vec<f32>,
        vc: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        let cfg = &self.cfg;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (n_q, n_kv) = (self.plan.q_heads.len(), self.plan.kv_heads.len());
        partial(&mut s.part, &mut s.part64, l.o_exact, t * h);
        if n_q == 0 {
            // No heads here (more ranks than query heads): contribute zeros to the sum.
            s.part.fill(0.0);
            s.part64.fill(0.0);
            return Ok(());
        }
        let xn = sized(&mut s.xn, t * h);
        for (xr, nr) in s.x.chunks_exact(h).zip(xn.chunks_exact_mut(h)) {
            rmsnorm(xr, &l.attn_norm, cfg.rms_eps, nr);
        }
        let mats = [&l.wq, &l.wk, &l.wv];
        let qx = quantized_for(&mats, xn, &mut s.qx);
        let (nqd, nkd) = (n_q * hd, n_kv * hd);
        let qkv = sized(&mut s.qkv, t * (nqd + 2 * nkd));
        products(&mats, xn, qx, t, qkv)?;
        let (q, rest) = qkv.split_at_mut(t * nqd);
        let (k, v) = rest.split_at_mut(t * nkd);
        for (y, b) in [(&mut *q, &l.bq), (&mut *k, &l.bk), (&mut *v, &l.bv)] {
            if let Some(b) = b {
                for row in y.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                }
            }
        }
        let half = self.inv_freq.len();
        for (y, norm, heads) in [(&mut *q, &l.q_norm, n_q), (&mut *k, &l.k_norm, n_kv)] {
            for (tok, row) in y.chunks_exact_mut(heads * hd).enumerate() {
                for head in row.chunks_exact_mut(hd) {
                    if let Some(w) = norm {
                        rmsnorm_inplace(head, w, cfg.rms_eps);
                    }
                    rope_with(head, &s.rope[tok * half..(tok + 1) * half], cfg.rope_style);
                }
            }
        }
        // Cache layout [pos][kv_head][head_dim] is exactly the token-major k/v layout.
        kc.extend_from_slice(k);
        vc.extend_from_slice(v);
        let (kc, vc, q) = (&*kc, &*vc, &*q);
        // Local query head qh reads local KV head (qh + skew) / group: a rank's share may start
        // inside a KV head's query group (see `ShardPlan`).
        let (group, skew) = (cfg.group_size(), self.plan.q_skew(cfg));
        let scale = 1.0 / (hd as f32).sqrt();
        let stride = pos0 + t; // longest sequence a token of this pass attends to
        let scores = sized(&mut s.scores, t * n_q * stride);
        let att = sized(&mut s.att, t * nqd);
        par::for_each_chunk2(att, hd, scores, stride, |i, out, sc| {
            let (tok, qh) = (i / n_q, i % n_q);
            let kvh = (qh + skew) / group; // local KV head serving local query head qh
            let sc = &mut sc[..pos0 + tok + 1]; // causal: up to and including this token
            let kv = KvHead { k: kc, v: vc, stride: n_kv * hd, at: kvh * hd };
            attend_head(&q[i * hd..(i + 1) * hd], kv, scale, sc, out);
        });
        let qatt = quantized_for(&[&l.wo], att, &mut s.qatt);
        if l.o_exact {
            products_exact(&l.wo, qatt.expect("exact products take Q8 inputs"), t, &mut s.part64)
        } else {
            products(&[&l.wo], att, qatt, t, &mut s.part)
        }
    }

    /// This rank's MLP features for `t` tokens: `s.part` gets its down_proj partial.
    fn mlp(&self, l: &Layer, t: usize, s: &mut Scratch) -> anyhow::Result<()> {
        let cfg = &self.cfg;
        let h = cfg.hidden_size;
        let xn = sized(&mut s.xn, t * h);
        for (xr, nr) in s.x.chunks_exact(h).zip(xn.chunks_exact_mut(h)) {
            rmsnorm(xr, &l.ffn_norm, cfg.rms_eps, nr);
        }
        let qx = quantized_for(&[&l.w_gate, &l.w_up], xn, &mut s.qx);
        let nf = self.plan.ffn.len();
        let hb = sized(&mut s.h, t * nf);
        if t == 1 && l.w_gate.on_cpu() && l.w_up.on_cpu() {
            // One parallel region: each task multiplies its features' gate and up rows and
            // applies SwiGLU right away (the same values as the unfused path below).
            let (xn, qxv) = (&*xn, qx.map(Q8Act::view));
            let chunk = par::per_task(nf, 4, 16);
            par::for_each_chunk(hb, chunk, |ci, hc| {
                let (mut g, mut u) = ([0f32; MLP_STEP], [0f32; MLP_STEP]);
                for (k, hs) in hc.chunks_mut(MLP_STEP).enumerate() {
                    let r0 = ci * chunk + k * MLP_STEP;
                    let n = hs.len();
                    l.w_gate.rows_into(r0..r0 + n, xn, qxv, &mut g[..n]);
                    l.w_up.rows_into(r0..r0 + n, xn, qxv, &mut u[..n]);
                    for ((o, &gi), &ui) in hs.iter_mut().zip(&g[..n]).zip(&u[..n]) {
                        *o = silu(gi) * ui;
                    }
                }
            });
        } else {
            let gu = sized(&mut s.gate_up, 2 * t * nf);
            products(&[&l.w_gate, &l.w_up], xn, qx, t, gu)?;
            let (g, u) = gu.split_at(t * nf);
            for ((o, &gi), &ui) in hb.iter_mut().zip(g).zip(u) {
                *o = silu(gi) * ui;
            }
        }
        let qh = quantized_for(&[&l.w_down], hb, &mut s.qh);
        partial(&mut s.part, &mut s.part64, l.down_exact, t * h);
        if l.down_exact {
            products_exact(&l.w_down, qh.expect("exact products take Q8 inputs"), t, &mut s.part64)
        } else {
            products(&[&l.w_down], hb, qh, t, &mut s.part)
        }
    }
}
