//! The integer dot-product kernels (weights in Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 blocks and
//! Q4_K / Q5_K / Q6_K super-blocks, activations in Q8 blocks): every instruction set this machine has returns the scalar reference's bits, the
//! reference computes the exact sum when no rounding can happen, and the Q8 products stay close
//! to the f32 products.

use boltccl_llm::ops::Mat;
use boltccl_llm::quant::dot::{dot_row_exact_scalar, dot_row_scalar, dot_rows_exact_with, dot_rows_with, Isa};
use boltccl_llm::quant::{GgmlType, Q8Act, QuantRows};
use boltccl_llm::sample::Rng;
use half::f16;

const TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Random GGML blocks for `rows x cols`, with scales from `scale(rng)`: every quant, high-bit
/// and sub-block scale byte random (every byte value, including -128 for Q8_0 and Q6_K's
/// scales, legal in a file though llama.cpp's quantiser never writes them), the f16 fields
/// set.
fn random_rows(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng, scale: &dyn Fn(&mut Rng) -> f32) -> QuantRows {
    let f16_at = ty.f16_fields();
    let mut bytes = Vec::new();
    for _ in 0..rows * cols / ty.block_elems() {
        let mut blk: Vec<u8> = (0..ty.block_bytes()).map(|_| (rng.next_u64() >> 56) as u8).collect();
        for (k, &at) in f16_at.iter().enumerate() {
            let v = if k == 0 { scale(rng) } else { scale(rng) * 4.0 - 2.0 * scale(rng) };
            blk[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
        bytes.extend(blk);
    }
    QuantRows::new(ty, cols, bytes).unwrap()
}

/// Whether rows of `cols` are whole blocks of `ty`.
fn fits(ty: GgmlType, cols: usize) -> bool {
    cols.is_multiple_of(ty.block_elems())
}

fn random_act(cols: usize, rng: &mut Rng) -> (Vec<f32>, Q8Act) {
    let x: Vec<f32> = (0..cols)
        .map(|i| {
            // Block 1 all zeros (a zero scale), one block of huge values, the rest ordinary.
            match i / 32 {
                1 => 0.0,
                3 => (rng.next_f32() - 0.5) * 1e4,
                _ => (rng.next_f32() - 0.5) * 3.0,
            }
        })
        .collect();
    let mut q = Q8Act::new();
    q.quantize(&x);
    (x, q)
}

fn ordinary_scale(rng: &mut Rng) -> f32 {
    (rng.next_f32() - 0.3) * 0.05
}

/// Scales that also hit zero, f16 subnormals and large values.
fn awkward_scale(rng: &mut Rng) -> f32 {
    match rng.next_u64() % 6 {
        0 => 0.0,
        1 => 3e-6 * (rng.next_f32() - 0.5), // f16 subnormal range
        2 => 1000.0 * (rng.next_f32() - 0.5),
        _ => ordinary_scale(rng),
    }
}

#[test]
fn every_instruction_set_returns_the_reference_bits() {
    let isas = Isa::available();
    eprintln!("instruction sets here: {isas:?}");
    let mut rng = Rng::new(7);
    // Block counts around the kernels' 8-block groups, their 64-block chunks and odd tails;
    // row counts around their groups of four.
    let shapes = [(1, 32), (3, 64), (4, 96), (5, 256), (9, 576), (7, 2080), (13, 4128), (2, 1536), (6, 768), (5, 2304)];
    for ty in TYPES {
        for &(rows, cols) in shapes.iter().filter(|s| fits(ty, s.1)) {
            for scale in [&ordinary_scale as &dyn Fn(&mut Rng) -> f32, &awkward_scale] {
                let w = random_rows(ty, rows, cols, &mut rng, scale);
                let (_, a) = random_act(cols, &mut rng);
                let want: Vec<u32> = (0..rows).map(|r| dot_row_scalar(&w, r, a.view()).to_bits()).collect();
                for &isa in &isas {
                    let mut got = vec![f32::NAN; rows];
                    dot_rows_with(isa, &w, 0..rows, a.view(), &mut got);
                    let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{ty:?} {rows}x{cols} on {isa:?}");
                    // A row range in the middle: the same bits as those rows of the whole.
                    if rows > 2 {
                        let mut mid = vec![0f32; rows - 2];
                        dot_rows_with(isa, &w, 1..rows - 1, a.view(), &mut mid);
                        let mid: Vec<u32> = mid.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(mid, want[1..rows - 1], "{ty:?} {rows}x{cols} rows 1.. on {isa:?}");
                    }
                }
            }
        }
    }
}

/// With power-of-two scales and few blocks every float operation is exact, so the kernels must
/// return the exact sum of the dequantised products: this pins the element order (nibbles), the
/// Q4_0 offset, the Q4_1 minimum and the signs, independently of how the reference groups them.
#[test]
fn exact_when_nothing_rounds() {
    let mut rng = Rng::new(11);
    let pow2 = |rng: &mut Rng| {
        let e = (rng.next_u64() % 3) as i32 - 2;
        let s = if rng.next_u64().is_multiple_of(2) { 1.0 } else { -1.0 };
        s * 2f32.powi(e)
    };
    // (The K-quants' 6-bit sub-block scales make sums too wide for f32 to hold exactly; their
    // element order is pinned by `close_to_the_f32_product` and by the decoding tests.)
    for ty in &TYPES[..5] {
        let ty = *ty;
        for cols in [32, 96, 288] {
            let w = random_rows(ty, 6, cols, &mut rng, &pow2);
            let dense = w.dequantize_all();
            // Activations that quantise exactly (max |x| = 127 gives d = 1; integers), small
            // enough that every partial sum stays within f32's 24 bits at these scales.
            let x: Vec<f32> =
                (0..cols).map(|i| if i % 32 == 0 { 127.0 } else { (rng.next_u64() % 31) as f32 - 15.0 }).collect();
            let mut a = Q8Act::new();
            a.quantize(&x);
            assert_eq!(a.dequantize(), x, "activations must quantise exactly here");
            for r in 0..6 {
                let exact: f64 =
                    dense[r * cols..(r + 1) * cols].iter().zip(&x).map(|(&w, &x)| w as f64 * x as f64).sum();
                for isa in Isa::available() {
                    let mut got = [0f32];
                    dot_rows_with(isa, &w, r..r + 1, a.view(), &mut got);
                    assert_eq!(got[0] as f64, exact, "{ty:?} cols {cols} row {r} on {isa:?}");
                }
            }
        }
    }
}

/// Q8 activations against f32 activations on the same weights: the error is the activation
/// rounding (at most half a step per element), bounded here per row.
#[test]
fn close_to_the_f32_product() {
    let mut rng = Rng::new(5);
    for ty in TYPES {
        let (rows, cols) = (37, 1536);
        let w = random_rows(ty, rows, cols, &mut rng, &ordinary_scale);
        let dense = w.dequantize_all();
        let x: Vec<f32> = (0..cols).map(|_| rng.next_f32() - 0.5).collect();
        let q8 = Mat::quantized_q8(w.clone());
        let mut got = vec![0f32; rows];
        q8.matvec(&x, &mut got).unwrap();
        let mut a = Q8Act::new();
        a.quantize(&x);
        let steps = a.dequantize();
        for r in 0..rows {
            let row = &dense[r * cols..(r + 1) * cols];
            let f32_dot: f64 = row.iter().zip(&x).map(|(&w, &x)| w as f64 * x as f64).sum();
            // |sum w (x - x_q)| <= sum |w| * step / 2, plus f32 rounding.
            let bound: f64 =
                row.iter().zip(&x).zip(&steps).map(|((&w, &x), &s)| (w as f64).abs() * (x - s).abs() as f64).sum();
            let err = (got[r] as f64 - f32_dot).abs();
            assert!(err <= bound * 1.01 + 1e-5, "{ty:?} row {r}: error {err} > bound {bound}");
        }
        // And the Mat path is the kernel's bits.
        for (r, g) in got.iter().enumerate() {
            assert_eq!(g.to_bits(), dot_row_scalar(&w, r, a.view()).to_bits());
        }
    }
}

/// A row-parallel layer split across ranks at block boundaries: each rank quantises only its
/// columns of the input, and gets exactly the blocks one rank quantising all of it would, so
/// the partial products are the same integers; only the f32 sum of the partials differs.
#[test]
fn column_shards_quantise_their_blocks_like_the_whole() {
    let mut rng = Rng::new(3);
    let (rows, cols) = (20, 1536);
    for ty in [GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q6_K] {
        let w = random_rows(ty, rows, cols, &mut rng, &ordinary_scale);
        let (x, whole) = random_act(cols, &mut rng);
        let mut full = vec![0f32; rows];
        dot_rows_with(Isa::Scalar, &w, 0..rows, whole.view(), &mut full);
        let cuts = [vec![0, 768, 1536], vec![0, 512, 1024, 1536], vec![0, 32, 1504, 1536], vec![0, 256, 1536]];
        for cuts in cuts.into_iter().filter(|c| c.iter().all(|&k| fits(ty, k))) {
            let mut sum = vec![0f32; rows];
            for c in cuts.windows(2) {
                let shard = w.slice_cols(c[0]..c[1]).unwrap();
                let mut own = Q8Act::new();
                own.quantize(&x[c[0]..c[1]]);
                let same = whole.blocks_view(c[0] / 32..c[1] / 32);
                let mut p = vec![0f32; rows];
                let mut p2 = vec![0f32; rows];
                dot_rows_with(Isa::Scalar, &shard, 0..rows, own.view(), &mut p);
                dot_rows_with(Isa::Scalar, &shard, 0..rows, same, &mut p2);
                assert_eq!(p, p2, "cuts {cuts:?}: a shard's own quantisation differs from the whole's blocks");
                sum.iter_mut().zip(&p).for_each(|(s, v)| *s += v);
            }
            for (a, b) in sum.iter().zip(&full) {
                assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "cuts {cuts:?}: {a} vs {b}");
            }
        }
        // A K-quant shard cannot start inside a super-block.
        assert!(ty.block_elems() == 32 || w.slice_cols(32..1536).is_none());
    }
}

/// Step 6 (row-parallel layers): every instruction set gives the reference's f64 bits, for units
/// smaller than, equal to and larger than the kernels' chunks.
#[test]
fn exact_sums_match_the_reference_everywhere() {
    let mut rng = Rng::new(17);
    for ty in TYPES {
        for &(rows, cols) in [(5, 576), (9, 1536), (4, 4224), (3, 192), (4, 2304)].iter().filter(|s| fits(ty, s.1)) {
            let nb = cols / 32;
            let w = random_rows(ty, rows, cols, &mut rng, &awkward_scale);
            let (_, a) = random_act(cols, &mut rng);
            for unit in [2, 4, 6, 66, nb] {
                if unit > nb || (unit % 2 == 1 && unit < nb) {
                    continue;
                }
                let want: Vec<u64> = (0..rows).map(|r| dot_row_exact_scalar(&w, r, a.view(), unit).to_bits()).collect();
                for isa in Isa::available() {
                    let mut got = vec![f64::NAN; rows];
                    dot_rows_exact_with(isa, &w, 0..rows, a.view(), unit, &mut got);
                    let got: Vec<u64> = got.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{ty:?} {rows}x{cols} unit {unit} on {isa:?}");
                }
            }
        }
    }
}

/// The point of step 6: cut the columns at unit boundaries in any way (as tensor-parallel ranks
/// do), and the exact partial sums add up, in any order, to the bits of the whole row; and the
/// result stays within f32 rounding of the plain kernel's.
#[test]
fn exact_sums_do_not_depend_on_the_column_split() {
    let mut rng = Rng::new(23);
    let (rows, cols, unit) = (12, 1536, 4);
    let scale = (1u64 << boltccl_llm::quant::dot::GRID_BITS) as f64;
    for ty in TYPES {
        let w = random_rows(ty, rows, cols, &mut rng, &ordinary_scale);
        let (x, whole) = random_act(cols, &mut rng);
        let mut full = vec![0f64; rows];
        dot_rows_exact_with(Isa::best(), &w, 0..rows, whole.view(), unit, &mut full);
        let mut plain = vec![0f32; rows];
        dot_rows_with(Isa::best(), &w, 0..rows, whole.view(), &mut plain);
        // Within f32 rounding of the terms' magnitudes (the K-quants' minimums cancel large
        // terms).
        let dense = w.dequantize_all();
        for (r, (e, p)) in full.iter().zip(&plain).enumerate() {
            let e = (e / scale) as f32;
            let mag: f32 = dense[r * cols..(r + 1) * cols].iter().zip(&x).map(|(w, x)| (w * x).abs()).sum();
            assert!((e - p).abs() <= 1e-5 * (1.0 + p.abs() + mag), "{ty:?}: exact {e} vs plain {p}");
        }
        let cuts = [vec![0, 768, 1536], vec![0, 512, 1024, 1536], vec![0, 384, 768, 1152, 1536], vec![0, 128, 1536]];
        for cuts in cuts.into_iter().filter(|c| c.iter().all(|&k| fits(ty, k))) {
            let parts: Vec<Vec<f64>> = cuts
                .windows(2)
                .map(|c| {
                    let shard = w.slice_cols(c[0]..c[1]).unwrap();
                    let mut own = Q8Act::new();
                    own.quantize(&x[c[0]..c[1]]);
                    let mut p = vec![0f64; rows];
                    dot_rows_exact_with(Isa::best(), &shard, 0..rows, own.view(), unit, &mut p);
                    p
                })
                .collect();
            for r in 0..rows {
                let fwd = parts.iter().fold(0f64, |s, p| s + p[r]);
                let rev = parts.iter().rev().fold(0f64, |s, p| s + p[r]);
                assert_eq!(fwd.to_bits(), full[r].to_bits(), "{ty:?} cuts {cuts:?} row {r}");
                assert_eq!(rev.to_bits(), full[r].to_bits(), "{ty:?} cuts {cuts:?} row {r}, reversed");
            }
        }
    }
}
