//! The in-process comm stand-in, the rank-divergence check, and the sampler.

mod common;

use boltccl_llm::comm::Comm;
use boltccl_llm::sample::{argmax, argmax_of, Best, Sampler};
use proptest::prelude::*;

#[test]
fn local_all_sum_is_identical_on_all_ranks() {
    let world = boltccl::Group::local_world(3);
    let res: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = world
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank() as f32;
                    let mut x = vec![0.1 * (r + 1.0), 1e8, -r];
                    c.all_sum(&mut x).unwrap();
                    let mut t = [if c.rank() == 1 { 42 } else { 0 }];
                    c.broadcast_u32(&mut t, 1).unwrap();
                    assert_eq!(t[0], 42);
                    x
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &res {
        assert_eq!(
            r.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            res[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
    assert!((res[0][0] - 0.6).abs() < 1e-6 && res[0][2] == -3.0);
}

/// The logits gather: uneven parts (one empty, which is never sent) land on the root in rank
/// order; the root need not be rank 0. Shape mistakes are local errors.
#[test]
fn gather_uneven_parts_to_the_root() {
    let counts = [2usize, 0, 3];
    let root = 2;
    let res: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = boltccl::Group::local_world(3)
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank();
                    let mine: Vec<f32> = (0..counts[r]).map(|i| (10 * r + i) as f32).collect();
                    let mut all = vec![f32::NAN; if r == root { 5 } else { 0 }];
                    c.gather_f32(&mine, &mut all, &counts, root).unwrap();
                    all
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(res[root], [0.0, 1.0, 20.0, 21.0, 22.0]);
    assert!(res[0].is_empty() && res[1].is_empty());
    let one = boltccl_llm::comm::SingleRank;
    let mut all = [0f32; 2];
    one.gather_f32(&[1.0, 2.0], &mut all, &[2], 0).unwrap();
    assert_eq!(all, [1.0, 2.0]);
    assert!(one.gather_f32(&[1.0], &mut all, &[2], 0).is_err(), "part length must match its count");
    assert!(one.gather_f32(&[1.0, 2.0], &mut [0f32; 3], &[2], 0).is_err(), "output must hold all parts");
}

#[test]
fn a_failed_rank_does_not_hang_the_others() {
    let mut world = boltccl::Group::local_world(3);
    let gone = world.pop().unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(gone); // rank 2 "fails" without joining the collective
    });
    let errs: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = world.into_iter().map(|c| s.spawn(move || c.all_sum(&mut [1.0]).is_err())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    t.join().unwrap();
    assert_eq!(errs, [true, true]);
}

proptest! {
    /// Ranks choosing a greedy token together ([`Best`] per vocabulary slice, passed as one
    /// word each) get the index `argmax` gives on the whole vocabulary: ties, NaN and empty
    /// slices included. Logits from a few values, so that ties are common.
    #[test]
    fn argmax_over_slices_is_argmax_of_the_whole(
        logits in prop::collection::vec(prop::sample::select(vec![f32::NAN, -0.0, 0.0, 1.0, 2.0, f32::INFINITY]), 0..40),
        cuts in prop::collection::vec(0usize..40, 0..5),
    ) {
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(logits.len())).collect();
        cuts.push(0);
        cuts.push(logits.len());
        cuts.sort();
        let words: Vec<u64> = cuts.windows(2).map(|w| Best::to_word(Best::of(&logits[w[0]..w[1]], w[0]))).collect();
        let sliced = argmax_of(words.into_iter().map(Best::from_word));
        prop_assert_eq!(sliced, argmax(&logits));
    }
}

#[test]
fn argmax_takes_the_first_largest_and_never_nan() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
    assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 2.0]), 3);
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[]), 0);
}

#[test]
fn sampler_greedy_seeded_and_top_p() {
    let logits = [0.0, 3.0, 2.9, -1.0, 1.0];
    assert_eq!(argmax(&logits), 1);
    assert_eq!(Sampler::greedy().pick(&logits), 1);
    // Same seed, same sequence; different seeds differ somewhere.
    let draw = |seed| {
        let mut s = Sampler::new(1.0, 1.0, seed);
        (0..64).map(|_| s.pick(&logits)).collect::<Vec<_>>()
    };
    assert_eq!(draw(7), draw(7));
    assert_ne!(draw(7), draw(8));
    // All five tokens are reachable at temperature 1 without top-p...
    let seen: std::collections::HashSet<u32> = (0..20).flat_map(draw).collect();
    assert_eq!(seen.len(), 5);
    // ...but a tiny nucleus keeps only the top token, and 0.6 keeps exactly the top two.
    let mut s = Sampler::new(1.0, 0.01, 3);
    assert!((0..100).all(|_| s.pick(&logits) == 1));
    let mut s = Sampler::new(1.0, 0.6, 3);
    let kept: std::collections::HashSet<u32> = (0..200).map(|_| s.pick(&logits)).collect();
    assert_eq!(kept, [1, 2].into_iter().collect());
}

/// A comm whose rank 1 gets a sum that is off by one ulp — the kind of non-determinism a
/// careless mesh all-reduce produces. `check_sync` must catch it (a 1-ulp change can be rounded away for a step or two).
struct SkewedComm(boltccl::Group);

impl Comm for SkewedComm {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn all_sum(&self, x: &mut [f32]) -> anyhow::Result<()> {
        self.0.all_sum(x)?;
        if self.rank() == 1 {
            x[0] = f32::from_bits(x[0].to_bits() ^ 1);
        }
        Ok(())
    }
    fn broadcast_u32(&self, x: &mut [u32], root: usize) -> anyhow::Result<()> {
        self.0.broadcast_u32(x, root)
    }
    fn all_gather_u64(&self, mine: &[u64]) -> anyhow::Result<Vec<u64>> {
        self.0.all_gather_u64(mine)
    }
    fn send_bytes(&self, x: &[u8], peer: usize) -> anyhow::Result<()> {
        self.0.send_bytes(x, peer)
    }
    fn recv_bytes(&self, x: &mut [u8], peer: usize) -> anyhow::Result<()> {
        self.0.recv_bytes(x, peer)
    }
}

#[test]
fn check_sync_detects_diverging_ranks() {
    use boltccl_llm::generate::{generate, GenOptions};
    use boltccl_llm::loader::safetensors::StoreDtype;
    use boltccl_llm::model::Model;
    use boltccl_llm::shard::ShardPlan;
    let spec = common::Spec::odd();
    let dir = common::write_checkpoint(&spec, &common::tensors(&spec), StoreDtype::F32);
    let src = common::open(&dir);
    let src = src.as_ref();
    for (skew, check) in [(true, true), (false, true), (true, false)] {
        let results: Vec<anyhow::Result<_>> = std::thread::scope(|s| {
            let hs: Vec<_> = boltccl::Group::local_world(2)
                .into_iter()
                .map(|c| {
                    s.spawn(move || {
                        let plan = ShardPlan::new(src.config(), c.rank(), 2).unwrap();
                        let model = Model::load(src, plan).unwrap();
                        let opts = GenOptions {
                            max_tokens: 4,
                            stop_tokens: Vec::new(),
                            record_logits: false,
                            check_sync: check,
                        };
                        let comm: Box<dyn Comm> = if skew { Box::new(SkewedComm(c)) } else { Box::new(c) };
                        generate(&model, comm.as_ref(), &[1, 2, 3], &mut Sampler::greedy(), &opts, |_| {})
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let failed: Vec<String> = results.iter().filter_map(|r| r.as_ref().err().map(|e| format!("{e:#}"))).collect();
        match (skew, check) {
            (true, true) => {
                assert!(failed.iter().any(|e| e.contains("rank 1 diverged from rank 0 at step")), "{failed:?}")
            }
            // Without skew nothing fails; without the check the skew goes unnoticed.
            _ => assert!(failed.is_empty(), "{failed:?}"),
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
