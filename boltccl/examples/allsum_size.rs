//! all_sum bandwidth for one buffer size, ranks as processes (run under a launcher or
//! `scripts/bench_netns.sh`). Prints, on rank 0, the time per call and the bus bandwidth
//! (2(p-1)/p × bytes / time, the NCCL convention: comparable across algorithms and sizes).
//!
//! Environment: the usual `BOLTCCL_*` variables; `BENCH_BYTES` (default 64 MiB), `BENCH_ITERS`
//! (default 3).

use std::time::Instant;

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> boltccl::Result<()> {
    let g = boltccl::init()?;
    let bytes = env_num("BENCH_BYTES", 64 << 20);
    let iters = env_num("BENCH_ITERS", 3).max(1);
    let p = g.size();
    let mut x = vec![1.0f32; bytes / 4];
    g.all_sum(&mut x)?; // warm-up: first-touch pages, fill the pipelines
    g.barrier()?;
    let t = Instant::now();
    for _ in 0..iters {
        g.all_sum(&mut x)?;
    }
    let per = t.elapsed().as_secs_f64() / iters as f64;
    // Each call multiplies every element by p: check the answer, not just the clock.
    let want = (p as f32).powi(iters as i32 + 1);
    assert!(x.iter().all(|&v| v == want), "wrong all_sum result: {} != {want}", x[0]);
    if g.rank() == 0 {
        let bus = 2.0 * (p as f64 - 1.0) / p as f64 * bytes as f64 / per;
        println!(
            "BENCH ranks={p} algo={} ran={} bytes={bytes} time_ms={:.1} busbw_MBps={:.1}",
            g.config().algo.name(),
            g.algorithm(boltccl::Collective::AllReduce, bytes).name(),
            per * 1e3,
            bus / 1e6
        );
    }
    Ok(())
}
