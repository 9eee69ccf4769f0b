// All-reduce and all-gather: every rank adds its vector into everyone's, then every rank gets
// every rank's block. Run it as 4 ranks from the repository root:
//
//     cargo build --example allreduce
//     cargo run -- launch -n 4 -- target/debug/examples/allreduce
//
// `boltccl launch` starts the ranks and sets BOLTCCL_RANK, BOLTCCL_WORLD_SIZE,
// BOLTCCL_COORDINATOR and BOLTCCL_JOB_KEY; `boltccl::init()` reads them (or the variables of
// torchrun, mpirun, srun or mlx.launch, when one of those started the process).

fn main() -> boltccl::Result<()> {
    let g = boltccl::init()?;
    let (rank, size) = (g.rank(), g.size());

    // Rank r holds r + i at index i, so the sum over the ranks is size * i + (0 + 1 + ... + size-1).
    let mut x: Vec<f32> = (0..1000).map(|i| (rank + i) as f32).collect();
    g.all_sum(&mut x)?; // in place; every rank gets the same bits
    for (i, v) in x.iter().enumerate() {
        assert_eq!(*v, (size * i + size * (size - 1) / 2) as f32);
    }

    // Each rank contributes 2 elements; `all` gets every rank's, in rank order.
    let mut all = vec![0u32; 2 * size];
    g.all_gather(&[rank as u32, 100 + rank as u32], &mut all)?;
    assert_eq!(all[2 * (size - 1)], (size - 1) as u32);

    println!("rank {rank} of {size}: all_sum x[999] = {}, all_gather {all:?}", x[999]);
    Ok(())
}
