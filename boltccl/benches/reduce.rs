//! Micro-benchmarks of the reduction kernels: how fast a rank can fold a received piece.
//! `cargo bench --bench reduce`

use boltccl::bench::{combine, fold, Order};
use boltccl::{DType, ReduceOp};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn kernels(c: &mut Criterion) {
    let mut g = c.benchmark_group("fold");
    for (dtype, bytes) in
        [(DType::F32, 1usize << 20), (DType::F32, 16 << 20), (DType::BF16, 1 << 20), (DType::F64, 1 << 20)]
    {
        let mut acc = vec![0u64; bytes / 8];
        let next = vec![0x3f80_0000_3f80_0000u64; bytes / 8];
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::new(format!("sum_{dtype}"), bytes), &bytes, |b, _| {
            b.iter(|| {
                fold(
                    ReduceOp::Sum,
                    dtype,
                    bytemuck::cast_slice_mut(&mut acc),
                    bytemuck::cast_slice(&next),
                    Order::AccFirst,
                )
            })
        });
    }
    let bytes = 1usize << 20;
    let (l, r) = (vec![1u64; bytes / 8], vec![2u64; bytes / 8]);
    let mut out = vec![0u64; bytes / 8];
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function("combine_max_f32/1048576", |b| {
        b.iter(|| {
            combine(
                ReduceOp::Max,
                DType::F32,
                bytemuck::cast_slice_mut(&mut out),
                bytemuck::cast_slice(&l),
                bytemuck::cast_slice(&r),
            )
        })
    });
    g.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
