//! Sharding plans: whole KV-head groups per rank, uneven splits, full coverage.

use boltccl_llm::config::{ModelConfig, RopeStyle};
use boltccl_llm::shard::{split_range, ShardPlan};

fn smollm2() -> ModelConfig {
    ModelConfig {
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
        max_seq_len: 8192,
        tie_embeddings: true,
        qkv_bias: false,
        qk_norm: false,
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
    // TP=2: 2 + 1 KV heads -> 6 + 3 query heads; MLP split in 32-wide units.
    assert_eq!((p(0, 2).kv_heads, p(0, 2).q_heads), (0..2, 0..6));
    assert_eq!((p(1, 2).kv_heads, p(1, 2).q_heads), (2..3, 6..9));
    assert_eq!((p(0, 2).ffn, p(1, 2).ffn), (0..768, 768..1536));
    // TP=4: rank 3 holds no heads but a quarter of the MLP.
    assert!(p(3, 4).kv_heads.is_empty() && p(3, 4).q_heads.is_empty());
    assert_eq!(p(3, 4).ffn, 1152..1536);
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
