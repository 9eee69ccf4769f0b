//! Tensor-parallel sharding plan: which heads and MLP features a rank owns.
//!
//! - Query heads are split into contiguous, as-even-as-possible ranges (remainder to the first
//!   ranks), in units of [`head_unit`] heads (one head unless o_proj's exact sums need more).
//!   Each rank computes the KV heads its query heads read: with grouped-query attention a KV
//!   head whose query group is cut between ranks is projected and cached by each of them (a
//!   little duplicated work, as KV heads are few), so attention needs no communication and the
//!   query work, which dominates, is even. SmolLM2 (9 query heads, 3 KV heads) splits 5 + 4 at
//!   TP = 2, both ranks computing KV head 1. A rank may own zero heads (e.g. 9 heads on 10
//!   ranks): it then contributes a zero attention partial and still does its share of the MLP.
//! - MLP features are split the same way, in units of down_proj's quantisation block (32, or
//!   256 for a K-quant) when the width allows, so shards of block-quantised weights line up with
//!   quantisation blocks.
//! - Mixture-of-experts layers ([`MoeSplit`]): with `tp` every rank holds every expert's
//!   slice of features (the `ffn` range above, of one expert's width); with `ep` each rank holds
//!   whole experts, a contiguous range of them ([`ShardPlan::experts`]).
//! - The output head's *computation* is split by vocabulary rows (the weights stay replicated):
//!   each rank computes the logits of a contiguous slice and rank 0 gathers them. A rank gets an
//!   empty slice when the vocabulary is smaller than the world.

use std::ops::Range;

use anyhow::ensure;

use crate::config::ModelConfig;
use crate::quant::QK;

/// Contiguous share of `n` units for part `idx` of `parts`; the first `n % parts` parts get
/// one extra unit.
pub fn split_range(n: usize, parts: usize, idx: usize) -> Range<usize> {
    assert!(parts > 0 && idx < parts);
    let base = n / parts;
    let extra = n % parts;
    let start = idx * base + idx.min(extra);
    let len = base + usize::from(idx < extra);
    start..start + len
}

/// How a mixture-of-experts layer is split across ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MoeSplit {
    /// Tensor-parallel experts: every rank holds a column slice of every expert (like the
    /// dense MLP) and the layer ends with one all_sum of the residual width per token.
    #[default]
    Tp,
    /// Expert-parallel: each rank holds `experts / ranks` whole experts; the chosen experts'
    /// outputs come back to every rank by an all_to_all_v.
    Ep,
}

/// The slice of the model one rank computes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    /// This rank.
    pub rank: usize,
    /// World size.
    pub size: usize,
    /// Owned query heads (global indices).
    pub q_heads: Range<usize>,
    /// KV heads this rank projects and caches (global indices): those its query heads read.
    /// The first and last may also be computed by the neighbouring ranks.
    pub kv_heads: Range<usize>,
    /// Owned MLP intermediate features (global indices).
    pub ffn: Range<usize>,
    /// Vocabulary entries whose logits this rank computes (global row indices of the output
    /// head, which every rank holds in full).
    pub vocab: Range<usize>,
    /// How mixture-of-experts layers are split (unused by dense models).
    pub moe: MoeSplit,
    /// Experts this rank holds (global indices): all of them (each sliced to `ffn`) with
    /// [`MoeSplit::Tp`], a contiguous share of whole experts with [`MoeSplit::Ep`], none for a
    /// dense model.
    pub experts: Range<usize>,
}

impl ShardPlan {
    /// Plans rank `rank` of `size` for `cfg`, splitting experts (if any) the default way.
    pub fn new(cfg: &ModelConfig, rank: usize, size: usize) -> anyhow::Result<Self> {
        Self::with_moe(cfg, rank, size, MoeSplit::default())
    }

    /// Plans rank `rank` of `size` for `cfg`, splitting experts as `moe` says.
    pub fn with_moe(cfg: &ModelConfig, rank: usize, size: usize, moe: MoeSplit) -> anyhow::Result<Self> {
        ensure!(size > 0 && rank < size, "rank {rank} out of world size {size}");
        let experts = match (cfg.moe, moe) {
            (None, _) => 0..0,
            (Some(m), MoeSplit::Tp) => 0..m.experts,
            (Some(m), MoeSplit::Ep) => {
                // A rank without experts would idle through every MLP: refuse instead.
                ensure!(
                    size <= m.experts,
                    "expert parallelism over {size} ranks needs at least {size} experts, the model has {}",
                    m.experts
                );
                split_range(m.experts, size, rank)
            }
        };
        // More ranks than features would leave some rank with nothing to do at all; refuse with
        // a clear message rather than run an idle rank.
        ensure!(
            size <= cfg.intermediate_size,
            "tensor parallelism {size} exceeds the MLP width {}",
            cfg.intermediate_size
        );
        let hu = head_unit(cfg);
        let u = split_range(cfg.num_heads / hu, size, rank);
        let q_heads = u.start * hu..u.end * hu;
        let g = cfg.group_size();
        let kv_heads = if q_heads.is_empty() { 0..0 } else { q_heads.start / g..q_heads.end.div_ceil(g) };
        let unit = ffn_unit(cfg, size);
        let u = split_range(cfg.intermediate_size / unit, size, rank);
        let ffn = u.start * unit..u.end * unit;
        let vocab = split_range(cfg.vocab_size, size, rank);
        Ok(Self { rank, size, q_heads, kv_heads, ffn, vocab, moe, experts })
    }

    /// The local KV head (index into `kv_heads`) that local query head `q` (index into
    /// `q_heads`) reads.
    pub fn kv_of(&self, cfg: &ModelConfig, q: usize) -> usize {
        (self.q_heads.start + q) / cfg.group_size() - self.kv_heads.start
    }

    /// Query heads this rank skips in the group of its first KV head (`kv_of(q)` is
    /// `(q + skew) / group_size`): 0 when its share starts on a KV group.
    pub fn q_skew(&self, cfg: &ModelConfig) -> usize {
        self.q_heads.start - self.kv_heads.start * cfg.group_size()
    }

    /// Whether every rank's MLP share (not only this one's) is made of whole `unit`s of
    /// features, which the exact sums of the quantised model need for down_proj (see
    /// [`crate::quant::dot`], step 6). The same answer on every rank.
    pub fn ffn_in_units_of(&self, cfg: &ModelConfig, unit: usize) -> bool {
        let u = ffn_unit(cfg, self.size);
        cfg.intermediate_size.is_multiple_of(unit)
            && (0..self.size).all(|r| {
                let s = split_range(cfg.intermediate_size / u, self.size, r);
                (s.start * u).is_multiple_of(unit) && (s.end * u).is_multiple_of(unit)
            })
    }
}

/// The fewest whole query heads whose o_proj columns make an even number of quantisation blocks,
/// the unit of o_proj's exact sums (see [`crate::quant::dot`], step 6): 1 when `head_dim` is a
/// multiple of 64, 2 for 32 or 96, ... `None` when the query heads do not divide into such units;
/// then no split (TP = 1 included) sums o_proj exactly. It depends on the model only, never on
/// the world size, so TP = 1 and TP = N use the same unit.
pub fn exact_head_unit(cfg: &ModelConfig) -> Option<usize> {
    // An even number of 32-blocks that is also whole blocks of o_proj's encoding (256 columns
    // for a K-quant).
    let block_pair = lcm(2 * QK, cfg.o_proj_block.max(1));
    let heads = block_pair / gcd(cfg.head_dim, block_pair);
    cfg.num_heads.is_multiple_of(heads).then_some(heads)
}

/// Query heads per unit of the attention split: [`exact_head_unit`] when there is one, so that
/// every rank's share of o_proj is made of whole exact units, else single heads.
pub fn head_unit(cfg: &ModelConfig) -> usize {
    exact_head_unit(cfg).unwrap_or(1)
}

/// Least common multiple.
pub fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// One quantisation block of down_proj's columns (32 features, 256 for a K-quant) when the MLP
/// is a multiple of it wide with at least one unit per rank, else 32 features if that works
/// (a K-quant down_proj then falls back to f32 shards), else single features.
fn ffn_unit(cfg: &ModelConfig, size: usize) -> usize {
    let fits = |u: usize| cfg.intermediate_size.is_multiple_of(u) && cfg.intermediate_size / u >= size;
    [cfg.down_proj_block.max(32), 32].into_iter().find(|&u| fits(u)).unwrap_or(1)
}
