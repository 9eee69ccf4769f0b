//! Qwen3-MoE's routed-experts MLP on the CPU, split across ranks either way
//! ([`MoeSplit`](crate::shard::MoeSplit)).
//!
//! Every rank holds the whole (replicated) residual stream, so every rank computes the router
//! and the routing of every token itself, with the same bits: dispatching the tokens to the
//! experts' ranks needs no message. What differs is how the experts' outputs are combined:
//!
//! - `tp`: each rank holds a column slice of every expert, computes its slice of each chosen
//!   expert for every token, weights and sums them per token, and one all_sum (`t x hidden`
//!   values) adds the ranks' partials, as the dense MLP does.
//! - `ep`: each rank holds whole experts and computes their outputs for the tokens routed to
//!   them; one all_to_all_v hands every rank every expert's outputs (each rank keeps the whole
//!   residual, so each needs them all), and each rank sums them per token.
//!
//! When the experts' down products are exact ([`MoeLayer::exact`], the default for
//! block-quantised files whose expert width splits in whole units), `tp` instead all_sums each
//! chosen expert's partial outputs (`t x k x hidden` values, integers on a grid, in f64),
//! and every rank weights the exact sums itself. Either way a token's chosen experts are
//! weighted and summed in expert index order, from each expert's output with the same bits
//! whichever ranks computed it, so the layer's output has the same bits with either split and
//! at every number of ranks. (With f32 down products `ep` keeps that property, each expert
//! being computed whole by one rank, and `tp` rounds its partial sums per split.)

use anyhow::{ensure, Context};

use super::cpu::{from_grid, quantized_for, sized, Scratch};
use super::{Layer, Model};
use crate::comm::Comm;
use crate::ops::{products, products_exact, rmsnorm, silu, softmax, Mat};
use crate::quant::Q8Act;
use crate::shard::{split_range, MoeSplit};

/// One expert's shard: its gate and up rows and down columns (all of them with `ep`, this
/// rank's feature slice with `tp`).
pub(super) struct Expert {
    /// Global expert index.
    pub(super) index: usize,
    /// `[local_ffn, hidden]`
    pub(super) gate: Mat,
    pub(super) up: Mat,
    /// `[hidden, local_ffn]`
    pub(super) down: Mat,
}

/// A mixture-of-experts MLP layer's shard.
pub(super) struct MoeLayer {
    /// `[experts, hidden]`, f32, on every rank (llama.cpp keeps it f32 in quantised files too).
    pub(super) router: Mat,
    /// The experts this rank holds, in index order ([`crate::shard::ShardPlan::experts`]).
    pub(super) experts: Vec<Expert>,
    /// Whether the experts' down products are exact (integers on a grid, [`products_exact`]),
    /// on every rank alike: then `tp` sums each expert's partial outputs exactly, and every
    /// split and number of ranks gives each expert's output the same bits.
    pub(super) exact: bool,
}

impl MoeLayer {
    /// Every matrix, for packing and size accounting.
    pub(super) fn mats_mut(&mut self) -> impl Iterator<Item = &mut Mat> {
        std::iter::once(&mut self.router)
            .chain(self.experts.iter_mut().flat_map(|e| [&mut e.gate, &mut e.up, &mut e.down]))
    }

    /// Bytes of weights held.
    pub(super) fn size_bytes(&self) -> usize {
        let e: usize = self.experts.iter().map(|e| e.gate.size_bytes() + e.up.size_bytes() + e.down.size_bytes()).sum();
        e + self.router.size_bytes()
    }
}

/// The experts one token uses and their weights, in expert index order: the softmax over all
/// router logits, the `k` largest probabilities (ties to the lower index), renormalised to sum
/// to one (llama.cpp's `qwen3moe` graph normalises the top-k weights).
pub fn route(logits: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut p = logits.to_vec();
    softmax(&mut p);
    let mut order: Vec<usize> = (0..p.len()).collect();
    // Stable sort: equal probabilities keep the lower index first.
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    order.truncate(k);
    let sum: f32 = order.iter().map(|&e| p[e]).sum();
    let mut chosen: Vec<(usize, f32)> = order.into_iter().map(|e| (e, p[e] / sum)).collect();
    chosen.sort_by_key(|&(e, _)| e);
    chosen
}

impl Model {
    /// The mixture-of-experts MLP for `t` tokens: adds its output to the residual `s.x`.
    /// A collective (an all_sum with `tp`, an all_to_all_v with `ep`).
    pub(super) fn moe(
        &self,
        l: &Layer,
        m: &MoeLayer,
        t: usize,
        s: &mut Scratch,
        comm: &dyn Comm,
    ) -> anyhow::Result<()> {
        let cfg = &self.cfg;
        let mc = cfg.moe.context("a mixture-of-experts layer in a dense model")?;
        let (h, n_exp) = (cfg.hidden_size, mc.experts);
        let xn = sized(&mut s.xn, t * h);
        for (xr, nr) in s.x.chunks_exact(h).zip(xn.chunks_exact_mut(h)) {
            rmsnorm(xr, &l.ffn_norm, cfg.rms_eps, nr);
        }
        let xn = &*xn;
        let mut logits = vec![0f32; t * n_exp];
        products(&[&m.router], xn, None, t, &mut logits)?;
        let routes: Vec<Vec<(usize, f32)>> = logits.chunks_exact(n_exp).map(|r| route(r, mc.used)).collect();
        // Tokens per expert, in token order: the rows of that expert's batch.
        let mut tokens: Vec<Vec<usize>> = vec![Vec::new(); n_exp];
        for (tok, r) in routes.iter().enumerate() {
            for &(e, _) in r {
                tokens[e].push(tok);
            }
        }
        // This rank's experts' outputs, one block per expert in index order: exact partials
        // (scaled up by 2^GRID_BITS) or f32.
        let (mut mine, mut mine64) = (Vec::new(), Vec::new());
        for ex in &m.experts {
            let toks = &tokens[ex.index];
            if m.exact {
                expert_out_exact(ex, toks, xn, h, &mut mine64)
            } else {
                expert_out(ex, toks, xn, h, &mut mine)
            }
            .with_context(|| format!("expert {}", ex.index))?;
        }
        // Where each expert's block starts in `all`, which holds every expert's in index order.
        let mut start = vec![0usize; n_exp + 1];
        for e in 0..n_exp {
            start[e + 1] = start[e] + tokens[e].len() * h;
        }
        let all = match self.plan.moe {
            MoeSplit::Tp => {
                ensure!(
                    m.experts.len() == n_exp,
                    "tensor-parallel experts: this rank holds {} of {n_exp}",
                    m.experts.len()
                );
                if m.exact {
                    comm.all_sum_f64(&mut mine64).context("all_sum of the experts' exact partials")?;
                    mine64.iter().map(|&v| from_grid(v)).collect()
                } else {
                    mine
                }
            }
            MoeSplit::Ep => {
                // Every rank needs every expert's outputs (the residual is replicated), so each
                // sends its block to every rank, itself included; ranks hold contiguous expert
                // ranges in rank order, so what arrives is in expert index order.
                if m.exact {
                    mine = mine64.iter().map(|&v| from_grid(v)).collect();
                }
                let size = self.plan.size;
                let counts: Vec<usize> = (0..size)
                    .map(|r| {
                        let e = split_range(n_exp, size, r);
                        start[e.end] - start[e.start]
                    })
                    .collect();
                ensure!(
                    mine.len() == counts[self.plan.rank],
                    "expert outputs: {} values, not {}",
                    mine.len(),
                    counts[self.plan.rank]
                );
                let send: Vec<f32> = (0..size).flat_map(|_| mine.iter().copied()).collect();
                let mut all = vec![0f32; start[n_exp]];
                comm.all_to_all_v_f32(&send, &vec![mine.len(); size], &mut all, &counts)
                    .context("all_to_all_v of the experts' outputs")?;
                all
            }
        };
        // Each token's experts, weighted, in expert index order. With inexact `tp` these are
        // this rank's partial sums.
        let mut out = vec![0f32; t * h];
        let mut seen = vec![0usize; n_exp];
        for (tok, (o, r)) in out.chunks_exact_mut(h).zip(&routes).enumerate() {
            for &(e, w) in r {
                debug_assert_eq!(tokens[e][seen[e]], tok);
                let at = start[e] + seen[e] * h;
                seen[e] += 1;
                o.iter_mut().zip(&all[at..at + h]).for_each(|(a, y)| *a += w * y);
            }
        }
        if self.plan.moe == MoeSplit::Tp && !m.exact {
            comm.all_sum(&mut out)?;
        }
        s.x.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
        Ok(())
    }
}

/// Appends `ex`'s outputs (`hidden` values per token, in `toks` order) for the tokens `toks`
/// of the normalised inputs `xn` to `out`: one batch, so the expert's weights are read once.
fn expert_out(ex: &Expert, toks: &[usize], xn: &[f32], h: usize, out: &mut Vec<f32>) -> anyhow::Result<()> {
    let n = toks.len();
    if n == 0 {
        return Ok(());
    }
    let hb = expert_hidden(ex, toks, xn, h)?;
    let mut qh = Q8Act::new();
    let qh = quantized_for(&[&ex.down], &hb, &mut qh);
    let at = out.len();
    out.resize(at + n * h, 0.0);
    products(&[&ex.down], &hb, qh, n, &mut out[at..])
}

/// [`expert_out`] with exact down products: integers scaled by 2^GRID_BITS, in f64. A rank
/// holding none of the expert's features appends zeros.
fn expert_out_exact(ex: &Expert, toks: &[usize], xn: &[f32], h: usize, out: &mut Vec<f64>) -> anyhow::Result<()> {
    let n = toks.len();
    let at = out.len();
    out.resize(at + n * h, 0.0);
    if n == 0 || ex.down.cols == 0 {
        return Ok(());
    }
    let hb = expert_hidden(ex, toks, xn, h)?;
    let mut q = Q8Act::new();
    let qh = quantized_for(&[&ex.down], &hb, &mut q).context("exact products take Q8 inputs")?;
    products_exact(&ex.down, qh, n, &mut out[at..])
}

/// `silu(gate · x) * (up · x)` for the tokens `toks` of `xn`: `toks.len() x` the expert's
/// features held here.
fn expert_hidden(ex: &Expert, toks: &[usize], xn: &[f32], h: usize) -> anyhow::Result<Vec<f32>> {
    let n = toks.len();
    let xe: Vec<f32> = toks.iter().flat_map(|&tok| xn[tok * h..(tok + 1) * h].iter().copied()).collect();
    let nf = ex.gate.rows;
    let mut q = Q8Act::new();
    let qx = quantized_for(&[&ex.gate, &ex.up], &xe, &mut q);
    let mut gu = vec![0f32; 2 * n * nf];
    products(&[&ex.gate, &ex.up], &xe, qx, n, &mut gu)?;
    let (g, u) = gu.split_at(n * nf);
    Ok(g.iter().zip(u).map(|(&g, &u)| silu(g) * u).collect())
}
