//! Micro-benchmarks of the CPU's matrix-vector kernels: one weight matrix of each block type,
//! 2048 columns (Llama-3.2-1B's hidden size) and about 48 MB (past the last-level cache, as a
//! model's weights are), times one Q8 activation vector on one thread; throughput in weight
//! bytes; for the K-quants also the exact sums of row-parallel shards. `cargo bench -p
//! boltccl-llm --bench dot`
//! (`BOLTCCL_LLM_ISA=avx2` and the like compare instruction sets).

use boltccl_llm::quant::dot::{dot_rows, dot_rows_exact};
use boltccl_llm::quant::{GgmlType, Q8Act, QuantRows};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;

const COLS: usize = 2048;
const BYTES: usize = 48 << 20;

/// Rows of `ty` filled with pseudo-random bytes, the f16 scale fields set to a small value.
fn weights(ty: GgmlType) -> QuantRows {
    let row_bytes = COLS / ty.block_elems() * ty.block_bytes();
    let rows = BYTES / row_bytes / 4 * 4;
    let mut bytes = vec![0u8; rows * row_bytes];
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    for chunk in bytes.chunks_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        chunk.copy_from_slice(&s.to_le_bytes()[..chunk.len()]);
    }
    let scale = f16::from_f32(0.01).to_le_bytes();
    for blk in bytes.chunks_mut(ty.block_bytes()) {
        for &at in ty.f16_fields() {
            blk[at..at + 2].copy_from_slice(&scale);
        }
    }
    QuantRows::new(ty, COLS, bytes).expect("whole blocks")
}

fn kernels(c: &mut Criterion) {
    let mut g = c.benchmark_group("matvec");
    g.sample_size(20);
    let x: Vec<f32> = (0..COLS).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
    let mut a = Q8Act::new();
    a.quantize(&x);
    for ty in
        [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K]
    {
        let w = weights(ty);
        let mut out = vec![0f32; w.rows()];
        g.throughput(Throughput::Bytes(w.size_bytes() as u64));
        g.bench_with_input(BenchmarkId::new(format!("{ty:?}"), w.size_bytes()), &w, |b, w| {
            b.iter(|| dot_rows(w, 0..w.rows(), a.view(), &mut out))
        });
        // The exact sums of row-parallel shards (step 6), in units of 4 and 8 blocks.
        if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
            let mut exact = vec![0f64; w.rows()];
            for unit in [4, 8] {
                g.bench_with_input(
                    BenchmarkId::new(format!("{ty:?}-exact-unit-{unit}"), w.size_bytes()),
                    &w,
                    |b, w| b.iter(|| dot_rows_exact(w, 0..w.rows(), a.view(), unit, &mut exact)),
                );
            }
        }
    }
    g.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
