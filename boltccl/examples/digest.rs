//! Reference digests for the bitwise comparison of the Rust, C and Python APIs.
//!
//! Run as ranks (`BOLTCCL_RANK`, ... set); rank 0 prints `digest <dtype> <count> <fnv1a-64>`
//! for all_sum of the deterministic float32 and bfloat16 inputs that `examples/allsum.c
//! --digest` and `python/tests/workers/digest.py` also use.

use boltccl::bf16;

fn mix(i: u32, rank: u32) -> u32 {
    i.wrapping_mul(2_654_435_761).wrapping_add((rank + 1).wrapping_mul(40_503))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

fn main() -> Result<(), boltccl::Error> {
    let g = boltccl::init()?;
    let rank = g.rank() as u32;
    for n in [1000usize, 262_147] {
        let mut f: Vec<f32> = (0..n as u32).map(|i| ((mix(i, rank) >> 8) as i32 - 8_388_608) as f32 / 1024.0).collect();
        let mut b: Vec<bf16> = (0..n as u32)
            .map(|i| {
                let h = mix(i, rank);
                bf16::from_bits(((((h >> 16) & 0x07FF) + 0x3C00) | ((h & 1) << 15)) as u16)
            })
            .collect();
        g.all_sum(&mut f)?;
        g.all_sum(&mut b)?;
        if g.rank() == 0 {
            println!("digest float32 {n} {:016x}", fnv1a(bytemuck::cast_slice(&f)));
            println!("digest bfloat16 {n} {:016x}", fnv1a(bytemuck::cast_slice(&b)));
        }
    }
    g.barrier()
}
