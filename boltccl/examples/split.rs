// Sub-groups: split one group into the even and the odd ranks, each a group of its own with
// its own ranks and calls. Run it as 4 ranks from the repository root:
//
//     cargo build --example split
//     cargo run -- launch -n 4 -- target/debug/examples/split

fn main() -> boltccl::Result<()> {
    let g = boltccl::init()?;
    let rank = g.rank();

    // Every rank of `g` makes the call. Same colour, same sub-group; the key orders its ranks
    // (here the highest rank of each colour becomes rank 0 of its sub-group).
    let sub = g.split(Some((rank % 2) as u32), -(rank as i64))?.expect("every rank chose a colour");
    let mut x = [rank as u64];
    sub.all_sum(&mut x)?; // the sum over this rank's sub-group only
    let expected: usize = (0..g.size()).filter(|r| r % 2 == rank % 2).sum();
    assert_eq!(x[0], expected as u64);

    // A colour of `None`: the rank takes part in the split but joins no sub-group.
    let first_two = g.split((rank < 2).then_some(0), rank as i64)?;
    if let Some(pair) = &first_two {
        let mut token = [rank as u32 * 10];
        pair.broadcast(&mut token, 0)?; // from the pair's rank 0, which is g's rank 0
        assert_eq!(token[0], 0);
    }

    let (sub_rank, sub_size, in_pair) = (sub.rank(), sub.size(), first_two.is_some());
    println!("rank {rank}: sub-group rank {sub_rank} of {sub_size}, sum {}, in the pair: {in_pair}", x[0]);
    Ok(())
}
