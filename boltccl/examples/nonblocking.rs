// Non-blocking calls: start an all-reduce, compute while it runs, then wait for it. Run it as
// 2 ranks from the repository root:
//
//     cargo build --example nonblocking
//     cargo run -- launch -n 2 -- target/debug/examples/nonblocking

fn main() -> boltccl::Result<()> {
    let g = boltccl::init()?;
    let size = g.size() as f32;
    let mut grads = vec![1.0f32; 4 << 20]; // 16 MiB
    let mut step = [g.rank() as u64];
    let mut other = 0.0f64;

    // The scope borrows the buffers until it ends, and every call started in it has finished
    // when `scope` returns (as with `std::thread::scope`).
    g.scope(|s| {
        let sum = s.all_sum(&mut grads)?; // started: runs on the group's progress thread
        let max = s.all_reduce(boltccl::ReduceOp::Max, &mut step)?; // queued behind it
        other = (1..1_000_000).map(|i| 1.0 / i as f64).sum(); // meanwhile, this thread computes
        sum.wait()?; // calls complete in the order they were started
        max.wait()
    })?;

    assert!(grads.iter().all(|&v| v == size));
    assert_eq!(step[0], g.size() as u64 - 1);
    println!("rank {}: all_sum {}, all_max {}, computed {other:.3} meanwhile", g.rank(), grads[0], step[0]);
    Ok(())
}
