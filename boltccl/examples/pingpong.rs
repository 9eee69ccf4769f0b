//! Round-trip latency of a 4-byte send/recv between ranks 0 and 1, and of a 4-byte all_sum:
//! `boltccl launch -n 2 -- target/release/examples/pingpong`
use std::time::Instant;

fn main() -> boltccl::Result<()> {
    let g = boltccl::init()?;
    let iters = 20_000;
    let mut x = [1f32];
    let mut lat = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        if g.rank() == 0 {
            g.send(&x, 1)?;
            g.recv(&mut x, 1)?;
        } else if g.rank() == 1 {
            g.recv(&mut x, 0)?;
            g.send(&x, 0)?;
        }
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    let mut sums = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        g.all_sum(&mut x)?;
        sums.push(t.elapsed().as_secs_f64() * 1e6);
    }
    sums.sort_by(f64::total_cmp);
    if g.rank() == 0 {
        println!(
            "send/recv round trip: median {:.1} us, p10 {:.1}, p90 {:.1}",
            lat[iters / 2],
            lat[iters / 10],
            lat[iters * 9 / 10]
        );
        println!(
            "all_sum 4 B: median {:.1} us, p10 {:.1}, p90 {:.1}",
            sums[iters / 2],
            sums[iters / 10],
            sums[iters * 9 / 10]
        );
    }
    Ok(())
}
