//! Sharding plans: query heads split evenly (in exact-sum units), each rank's KV heads those its
//! query heads read, uneven splits, full coverage.

use boltccl_llm::config::{ModelConfig, RopeStyle};
use boltccl_llm::shard::{exact_head_unit, head_unit, split_range, ShardPlan};
use proptest::prelude::*;

fn smollm2() -> ModelConfig {
    ModelConfig {
        o_proj_block: 32,
        down_proj_block: 32,
        vocab_size: 49152,
        hidden_size: 576,
        intermediate_size: 1536,
        num_layers: 30,
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        rms_eps: 1e-5,
        rope_theta: 100000.0,
        rope_style: RopeStyle::Interleaved,
        rope_freq_divisors: Vec::new(),
        max_seq_len: 8192,
        tie_embeddings: true,
        qkv_bias: false,
        qk_norm: false,
        moe: None,
    }
}

#[test]
fn split_range_covers_evenly() {
    for n in 0..20 {
        for parts in 1..6 {
            let rs: Vec<_> = (0..parts).map(|i| split_range(n, parts, i)).collect();
            assert_eq!(rs[0].start, 0);
            assert_eq!(rs[parts - 1].end, n);
            for w in rs.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert!(w[0].len() >= w[1].len() && w[0].len() - w[1].len() <= 1);
            }
        }
    }
}

#[test]
fn smollm2_plans() {
    let c = smollm2();
    let p = |r, n| ShardPlan::new(&c, r, n).unwrap();
    // head_dim 64 = two blocks: single query heads are exact units.
    assert_eq!(exact_head_unit(&c), Some(1));
    // TP=2: 5 + 4 query heads; KV head 1 (query heads 3-5) is computed by both ranks. MLP
    // split in 32-wide units.
    assert_eq!((p(0, 2).q_heads, p(0, 2).kv_heads), (0..5, 0..2));
    assert_eq!((p(1, 2).q_heads, p(1, 2).kv_heads), (5..9, 1..3));
    assert_eq!((p(0, 2).q_skew(&c), p(1, 2).q_skew(&c)), (0, 2));
    assert_eq!((p(1, 2).kv_of(&c, 0), p(1, 2).kv_of(&c, 1)), (0, 1));
    assert_eq!((p(0, 2).ffn, p(1, 2).ffn), (0..768, 768..1536));
    // TP=3: one KV head each, no duplication.
    for r in 0..3 {
        assert_eq!((p(r, 3).q_heads, p(r, 3).kv_heads), (3 * r..3 * r + 3, r..r + 1));
    }
    // TP=4: 3 + 2 + 2 + 2 query heads; every rank has attention work and a quarter of the MLP.
    assert_eq!((p(3, 4).q_heads, p(3, 4).kv_heads), (7..9, 2..3));
    assert_eq!((p(1, 4).q_heads, p(1, 4).kv_heads), (3..5, 1..2));
    assert_eq!(p(3, 4).ffn, 1152..1536);
    // TP=10: more ranks than query heads; rank 9 holds none.
    assert!(p(9, 10).q_heads.is_empty() && p(9, 10).kv_heads.is_empty());
    // TP=5: 1536/32 = 48 units -> 10,10,10,9,9 units.
    assert_eq!(p(0, 5).ffn, 0..320);
    assert_eq!(p(4, 5).ffn, 1248..1536);
    assert!(p(4, 5).ffn.start % 32 == 0);
    // The output head's rows (logits) split evenly and cover the vocabulary.
    assert_eq!((p(0, 3).vocab, p(1, 3).vocab, p(2, 3).vocab), (0..16384, 16384..32768, 32768..49152));
    assert_eq!((p(0, 5).vocab, p(4, 5).vocab), (0..9831, 39322..49152));
}

#[test]
fn vocabulary_smaller_than_the_world_leaves_empty_slices() {
    let mut c = smollm2();
    c.vocab_size = 3;
    let v: Vec<_> = (0..4).map(|r| ShardPlan::new(&c, r, 4).unwrap().vocab).collect();
    assert_eq!(v, [0..1, 1..2, 2..3, 3..3]);
}

#[test]
fn too_many_ranks_is_a_clear_error() {
    let mut c = smollm2();
    c.intermediate_size = 4;
    let e = ShardPlan::new(&c, 0, 5).unwrap_err();
    assert!(e.to_string().contains("exceeds"), "{e}");
    assert!(ShardPlan::new(&c, 5, 5).is_err());
}

#[test]
fn narrow_heads_split_in_exact_units() {
    let mut c = smollm2();
    // head_dim 32 = one block: o_proj's exact unit is two query heads, and the plan keeps
    // every rank's share made of them (10 heads = 5 units -> 3 + 2 units at TP=2).
    (c.num_heads, c.num_kv_heads, c.head_dim) = (10, 5, 32);
    assert_eq!((exact_head_unit(&c), head_unit(&c)), (Some(2), 2));
    assert_eq!(ShardPlan::new(&c, 0, 2).unwrap().q_heads, 0..6);
    assert_eq!(ShardPlan::new(&c, 1, 2).unwrap().q_heads, 6..10);
    // 9 heads of 32 do not make whole units: no exact o_proj at any TP, split by single heads.
    (c.num_heads, c.num_kv_heads) = (9, 3);
    assert_eq!((exact_head_unit(&c), head_unit(&c)), (None, 1));
    assert_eq!(ShardPlan::new(&c, 0, 2).unwrap().q_heads, 0..5);
}

fn config(heads_per_kv: usize, kv_heads: usize, head_dim: usize) -> ModelConfig {
    ModelConfig { num_heads: heads_per_kv * kv_heads, num_kv_heads: kv_heads, head_dim, ..smollm2() }
}

proptest! {
    /// For any GQA shape and world size: the ranks' query heads tile all heads in order, as
    /// evenly as the unit allows (shares differ by at most one unit), each share is made of
    /// whole units, and each rank's KV heads are exactly those its query heads read.
    #[test]
    fn head_plans_tile_and_balance(
        group in 1usize..9,
        kv in 1usize..9,
        hd in prop::sample::select(vec![8usize, 16, 32, 48, 64, 80, 96, 128, 256]),
        size in 1usize..14,
    ) {
        let c = config(group, kv, hd);
        let unit = head_unit(&c);
        prop_assert!(c.num_heads.is_multiple_of(unit));
        if let Some(u) = exact_head_unit(&c) {
            prop_assert_eq!(u, unit);
            prop_assert!((u * hd).is_multiple_of(64));
        }
        let plans: Vec<_> = (0..size).map(|r| ShardPlan::new(&c, r, size).unwrap()).collect();
        let mut next = 0;
        for p in &plans {
            prop_assert_eq!(p.q_heads.start, next);
            next = p.q_heads.end;
            prop_assert!(p.q_heads.start.is_multiple_of(unit) && p.q_heads.end.is_multiple_of(unit));
            let lens = plans.iter().map(|p| p.q_heads.len());
            prop_assert!(lens.clone().max().unwrap() - lens.min().unwrap() <= unit);
            let read: Vec<usize> = p.q_heads.clone().map(|q| q / group).collect();
            let own: Vec<usize> = p.kv_heads.clone().collect();
            let mut dedup = read.clone();
            dedup.dedup();
            prop_assert_eq!(&dedup, &own, "KV heads must be exactly the ones read");
            for (i, &k) in read.iter().enumerate() {
                prop_assert_eq!(p.kv_of(&c, i), k - p.kv_heads.start);
                prop_assert_eq!((i + p.q_skew(&c)) / group, k - p.kv_heads.start);
            }
        }
        prop_assert_eq!(next, c.num_heads);
    }
}

/// K-quant row-parallel weights (256-element super-blocks) are split on super-block
/// boundaries: down_proj's features in 256-feature units, o_proj's columns in units of query
/// heads that make whole super-blocks; where the MLP has too few units for the world, 32.
#[test]
fn k_quant_shards_fall_on_super_blocks() {
    let cfg = ModelConfig { o_proj_block: 256, down_proj_block: 256, ..config(3, 8, 64) };
    assert_eq!(boltccl_llm::shard::exact_head_unit(&cfg), Some(4));
    for size in 1..=6 {
        for rank in 0..size {
            let p = ShardPlan::new(&cfg, rank, size).unwrap();
            assert!(
                p.ffn.start.is_multiple_of(256) && p.ffn.end.is_multiple_of(256),
                "TP={size} rank {rank}: {:?}",
                p.ffn
            );
            assert!(
                (p.q_heads.start * 64).is_multiple_of(256) && (p.q_heads.end * 64).is_multiple_of(256),
                "{:?}",
                p.q_heads
            );
        }
        assert!(ShardPlan::new(&cfg, 0, size).unwrap().ffn_in_units_of(&cfg, 256));
    }
    let p = ShardPlan::new(&cfg, 1, 7).unwrap();
    assert!(p.ffn.start.is_multiple_of(32) && !ShardPlan::new(&cfg, 0, 7).unwrap().ffn_in_units_of(&cfg, 256));
}
