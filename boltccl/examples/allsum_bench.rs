//! all_sum benchmark from Rust, the baseline for `scripts/bench-bindings.sh` (which runs the
//! same measurement from Python). Run as ranks; rank 0 prints one `BENCH {json}` line:
//! `lat_us` (4-byte all_sum, median time per call) and `busbw_gbs` (64 MiB
//! float32, bus bandwidth = bytes / time * 2 (n-1) / n, best of 5 rounds) and `call_us` (4-byte
//! all_sum on a one-rank group: the cost of the call itself, without the network, which is
//! what a binding adds to; it is far less noisy than `lat_us` on a loaded machine).

use std::time::Instant;

fn main() -> Result<(), boltccl::Error> {
    let g = boltccl::init()?;
    let iters: usize = std::env::var("BENCH_LAT_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    let big_iters: usize = std::env::var("BENCH_BW_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);

    let mut small = [1.0f32];
    for _ in 0..iters / 5 {
        g.all_sum(&mut small)?;
    }
    // Median of per-call times: robust to the preemptions of a loaded machine.
    let mut times = Vec::with_capacity(iters);
    g.barrier()?;
    for _ in 0..iters {
        let t = Instant::now();
        g.all_sum(&mut small)?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let lat = times[iters / 2];

    let solo = boltccl::Group::new(boltccl::Config::default())?;
    let mut call = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..iters * 20 {
            solo.all_sum(&mut small)?;
        }
        call = call.min(t.elapsed().as_secs_f64() / (iters * 20) as f64);
    }

    let n = 16 << 20; // 64 MiB of f32
    let mut big = vec![1.0f32; n];
    g.all_sum(&mut big)?;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        g.barrier()?;
        let t = Instant::now();
        for _ in 0..big_iters {
            g.all_sum(&mut big)?;
        }
        best = best.min(t.elapsed().as_secs_f64() / big_iters as f64);
    }
    let p = g.size() as f64;
    let busbw = (n * 4) as f64 / best * 2.0 * (p - 1.0) / p / 1e9;
    if g.rank() == 0 {
        println!(
            "BENCH {{\"api\": \"rust\", \"ranks\": {}, \"lat_us\": {:.3}, \"call_us\": {:.4}, \"busbw_gbs\": {:.3}}}",
            g.size(),
            lat * 1e6,
            call * 1e6,
            busbw
        );
    }
    g.barrier()
}
