//! The in-process comm stand-in and the sampler.

use boltccl_llm::comm::{Comm, LocalThreadComm};
use boltccl_llm::sample::{argmax, Sampler};

#[test]
fn local_all_sum_is_identical_on_all_ranks() {
    let world = LocalThreadComm::world(3);
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

#[test]
fn a_failed_rank_does_not_hang_the_others() {
    let mut world = LocalThreadComm::world(3);
    let gone = world.pop().unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(gone); // rank 2 "fails" without joining the collective
    });
    let errs: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = world
            .into_iter()
            .map(|c| s.spawn(move || c.all_sum(&mut [1.0]).is_err()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    t.join().unwrap();
    assert_eq!(errs, [true, true]);
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
