//! Tensor-parallel sharding plan: which heads and MLP features a rank owns.
//!
//! - KV heads are split into contiguous, as-even-as-possible ranges (remainder to the first
//!   ranks); each rank owns exactly the query heads that read its KV heads, so grouped-query
//!   attention needs no communication. A rank may own zero heads (e.g. 3 KV heads on 4 ranks):
//!   it then contributes a zero attention partial and still does its share of the MLP.
//! - MLP features are split the same way, in units of 32 when the width allows, so shards of
//!   block-quantised weights line up with quantisation blocks.
//! - The output head's *computation* is split by vocabulary rows (the weights stay replicated):
//!   each rank computes the logits of a contiguous slice and rank 0 gathers them. A rank gets an
//!   empty slice when the vocabulary is smaller than the world.

use std::ops::Range;

use anyhow::ensure;

use crate::config::ModelConfig;

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

/// The slice of the model one rank computes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    /// This rank.
    pub rank: usize,
    /// World size.
    pub size: usize,
    /// Owned KV heads (global indices).
    pub kv_heads: Range<usize>,
    /// Owned query heads (global indices) = the query heads of `kv_heads`.
    pub q_heads: Range<usize>,
    /// Owned MLP intermediate features (global indices).
    pub ffn: Range<usize>,
    /// Vocabulary entries whose logits this rank computes (global row indices of the output
    /// head, which every rank holds in full).
    pub vocab: Range<usize>,
}

impl ShardPlan {
    /// Plans rank `rank` of `size` for `cfg`.
    pub fn new(cfg: &ModelConfig, rank: usize, size: usize) -> anyhow::Result<Self> {
        ensure!(size > 0 && rank < size, "rank {rank} out of world size {size}");
        // More ranks than features would leave some rank with nothing to do at all; refuse with
        // a clear message rather than run an idle rank.
        ensure!(
            size <= cfg.intermediate_size,
            "tensor parallelism {size} exceeds the MLP width {}",
            cfg.intermediate_size
        );
        let kv_heads = split_range(cfg.num_kv_heads, size, rank);
        let g = cfg.group_size();
        let q_heads = kv_heads.start * g..kv_heads.end * g;
        let unit = ffn_unit(cfg, size);
        let u = split_range(cfg.intermediate_size / unit, size, rank);
        let ffn = u.start * unit..u.end * unit;
        let vocab = split_range(cfg.vocab_size, size, rank);
        Ok(Self { rank, size, kv_heads, q_heads, ffn, vocab })
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

/// 32 features (one quantisation block) when the MLP is a multiple of 32 wide with at least one
/// unit per rank, else single features.
fn ffn_unit(cfg: &ModelConfig, size: usize) -> usize {
    if cfg.intermediate_size.is_multiple_of(32) && cfg.intermediate_size / 32 >= size {
        32
    } else {
        1
    }
}
