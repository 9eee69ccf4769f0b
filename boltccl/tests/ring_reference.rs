//! The ring all-reduce's floating-point results against a reference this test computes itself,
//! in the fold order the ring documents (`docs/algorithms.md`, "The ring's fold order"; `algo/ring.rs`):
//!
//! - the buffer is cut into segments of `2·P·B` elements, `B = min(64, max(1, 16 MiB /
//!   (2·chunk))) · chunk / element size`;
//! - each segment into two halves (the first one element longer when odd), the first going
//!   clockwise (direction +1), the second counter-clockwise (-1);
//! - each half into P blocks (the first ones one element longer);
//! - block `b` of a half is folded starting at rank `b`, then each rank along the direction
//!   adds its own, received value first: `((x_b ∘ x_{b+d}) ∘ x_{b+2d}) ∘ ...` (indices mod P).
//!
//! Inputs are random non-integer floats with NaN, ±infinity, -0.0, +0.0, subnormals and the
//! extremes mixed in, at 2–6 ranks, lengths around and across segment boundaries, for sum, max
//! and min, in float32, float64, float16 and bfloat16. Every rank must get identical bits, equal
//! to the reference (a NaN from a sum only as "a NaN": its payload is the hardware's choice).
//! For P ≥ 3 the ring order differs from the rank order, and the test checks that the inputs
//! tell them apart, so a wrong order cannot pass by luck.

mod common;

use boltccl::{bf16, f16, Algo, Config, Element, Group, ReduceOp};
use common::harness::free_port;
use common::threads::{on_threads, ranks_on_threads};
use std::ops::Range;
use std::time::Duration;

/// The pipelining unit used here: small, so segments are small and many.
const CHUNK: usize = 64;

trait Float: Element + Copy + std::fmt::Debug + PartialOrd {
    fn add(a: Self, b: Self) -> Self;
    fn is_nan(self) -> bool;
    fn bits(self) -> u64;
    fn from_f64(v: f64) -> Self;
    fn from_bits_u64(b: u64) -> Self;
    /// Bits of the special values: NaNs, infinities, zeros, subnormals, extremes.
    fn specials() -> Vec<u64>;
}

macro_rules! float {
    ($t:ty, $u:ty, $specials:expr) => {
        impl Float for $t {
            fn add(a: Self, b: Self) -> Self {
                a + b
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn bits(self) -> u64 {
                self.to_bits() as u64
            }
            fn from_f64(v: f64) -> Self {
                from_f64_as::<$t>(v)
            }
            fn from_bits_u64(b: u64) -> Self {
                <$t>::from_bits(b as $u)
            }
            fn specials() -> Vec<u64> {
                $specials.iter().map(|&v| v as u64).collect()
            }
        }
    };
}

fn from_f64_as<T: FromF64>(v: f64) -> T {
    T::convert(v)
}

trait FromF64 {
    fn convert(v: f64) -> Self;
}
impl FromF64 for f32 {
    fn convert(v: f64) -> f32 {
        v as f32
    }
}
impl FromF64 for f64 {
    fn convert(v: f64) -> f64 {
        v
    }
}
impl FromF64 for f16 {
    fn convert(v: f64) -> f16 {
        f16::from_f64(v)
    }
}
impl FromF64 for bf16 {
    fn convert(v: f64) -> bf16 {
        bf16::from_f64(v)
    }
}

// NaN (quiet, signalling, negative, with payloads), +inf, -inf, +0, -0, smallest and largest
// subnormals, largest finite, smallest normal.
float!(
    f32,
    u32,
    [
        0x7fc0_0000u32,
        0x7f80_0001,
        0xffc0_1234,
        0x7f80_0000,
        0xff80_0000,
        0,
        0x8000_0000,
        1,
        0x007f_ffff,
        0x8000_0001,
        0x7f7f_ffff,
        0x0080_0000
    ]
);
float!(
    f64,
    u64,
    [
        0x7ff8_0000_0000_0000u64,
        0x7ff0_0000_0000_0001,
        0xfff8_0000_0000_1234,
        0x7ff0_0000_0000_0000,
        0xfff0_0000_0000_0000,
        0,
        0x8000_0000_0000_0000,
        1,
        0x000f_ffff_ffff_ffff,
        0x8000_0000_0000_0001,
        0x7fef_ffff_ffff_ffff,
        0x0010_0000_0000_0000
    ]
);
float!(f16, u16, [0x7e00u16, 0x7c01, 0xfe12, 0x7c00, 0xfc00, 0, 0x8000, 1, 0x03ff, 0x8001, 0x7bff, 0x0400]);
float!(bf16, u16, [0x7fc0u16, 0x7f81, 0xffc1, 0x7f80, 0xff80, 0, 0x8000, 1, 0x007f, 0x8001, 0x7f7f, 0x0080]);

/// The documented reduction of two values, left operand first: sum, or max/min that keep a NaN
/// (the first NaN operand) and, on ties such as +0 against -0, the left operand.
fn apply<T: Float>(op: ReduceOp, a: T, b: T) -> T {
    match op {
        ReduceOp::Sum => T::add(a, b),
        ReduceOp::Max => {
            if a.is_nan() || a >= b {
                a
            } else if b.is_nan() || b > a {
                b
            } else {
                a
            }
        }
        ReduceOp::Min => {
            if a.is_nan() || a <= b {
                a
            } else if b.is_nan() || b < a {
                b
            } else {
                a
            }
        }
    }
}

/// Split `n` into `parts` ranges whose sizes differ by at most one, the first ones longer.
fn split(start: usize, n: usize, parts: usize) -> Vec<Range<usize>> {
    let (base, extra) = (n / parts, n % parts);
    let mut at = start;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            at += len;
            at - len..at
        })
        .collect()
}

/// Elements per segment, as documented.
fn segment_len(p: usize, chunk: usize, elem: usize) -> usize {
    let pieces = ((16usize << 20) / (2 * chunk)).clamp(1, 64);
    2 * p * (pieces * chunk / elem)
}

/// The ring's result, element by element, from every rank's input.
fn ring_reference<T: Float>(op: ReduceOp, inputs: &[Vec<T>], chunk: usize) -> Vec<T> {
    let (p, n) = (inputs.len(), inputs[0].len());
    let mut out = vec![T::from_f64(0.0); n];
    let seg = segment_len(p, chunk, std::mem::size_of::<T>());
    let mut start = 0;
    while start < n {
        let len = seg.min(n - start);
        for (h, half) in split(start, len, 2).into_iter().enumerate() {
            let d: isize = if h == 0 { 1 } else { -1 };
            for (b, block) in split(half.start, half.len(), p).into_iter().enumerate() {
                for i in block {
                    let mut acc = inputs[b][i];
                    for j in 1..p {
                        let q = (b as isize + d * j as isize).rem_euclid(p as isize) as usize;
                        acc = apply(op, acc, inputs[q][i]);
                    }
                    out[i] = acc;
                }
            }
        }
        start += len;
    }
    out
}

/// Rank order, for contrast.
fn rank_order<T: Float>(op: ReduceOp, inputs: &[Vec<T>]) -> Vec<T> {
    (0..inputs[0].len()).map(|i| inputs[1..].iter().fold(inputs[0][i], |acc, x| apply(op, acc, x[i]))).collect()
}

/// Random inputs: mostly non-integer values of every magnitude, with a special value (NaN,
/// infinity, signed zero, subnormal, extreme) at about one element in 40.
fn inputs<T: Float>(p: usize, n: usize, seed: u64) -> Vec<Vec<T>> {
    let specials = T::specials();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..p)
        .map(|_| {
            (0..n)
                .map(|_| {
                    let r = next();
                    if r % 40 == 0 {
                        T::from_bits_u64(specials[(r >> 8) as usize % specials.len()])
                    } else {
                        let mantissa = (r >> 11) as f64 / (1u64 << 53) as f64 - 0.5; // (-0.5, 0.5)
                        let exp = ((r >> 3) % 13) as i32 - 6; // 1e-6 .. 1e6
                        T::from_f64(mantissa * 10f64.powi(exp) * 3.7)
                    }
                })
                .collect()
        })
        .collect()
}

/// Lengths for `p` ranks: tiny ones (blocks of zero elements), around one segment, across
/// several.
fn lengths(p: usize, elem: usize) -> Vec<usize> {
    let seg = segment_len(p, CHUNK, elem);
    vec![0, 1, p - 1, 2 * p + 1, seg - 1, seg, seg + 1, 2 * seg + p + 3]
}

/// Every rank's result of the ring all-reduce (in place and out of place alternate) in process.
fn run_ring<T: Float>(op: ReduceOp, inputs: &[Vec<T>], in_place: bool) -> Vec<Vec<T>> {
    let p = inputs.len();
    let cfg =
        Config { algo: Algo::Ring, chunk_bytes: Some(CHUNK), timeout: Duration::from_secs(30), ..Config::default() };
    let ins = inputs.to_vec();
    on_threads(Group::local_world_with(p, &cfg), move |r, g| {
        assert_eq!(g.algorithm(boltccl::Collective::AllReduce, 4096), Algo::Ring);
        if in_place {
            let mut x = ins[r].clone();
            g.all_reduce(op, &mut x).unwrap();
            x
        } else {
            let mut out = vec![ins[r][0]; ins[r].len()];
            g.all_reduce_into(op, &ins[r], &mut out).unwrap();
            out
        }
    })
}

fn compare<T: Float>(label: &str, got: &[Vec<T>], want: &[T], op: ReduceOp) {
    for (r, g) in got.iter().enumerate() {
        assert_eq!(g.len(), want.len());
        for (i, (x, w)) in g.iter().zip(want).enumerate() {
            assert_eq!(x.bits(), got[0][i].bits(), "{label}: rank {r} element {i} differs from rank 0's bits");
            let same = if op == ReduceOp::Sum && w.is_nan() { x.is_nan() } else { x.bits() == w.bits() };
            assert!(
                same,
                "{label}: rank {r} element {i} is {x:?} ({:#x}), the ring order gives {w:?} ({:#x})",
                x.bits(),
                w.bits()
            );
        }
    }
}

fn check_type<T: Float>(name: &str) {
    let elem = std::mem::size_of::<T>();
    let mut order_mattered = 0;
    for p in 2..=6 {
        for (k, n) in lengths(p, elem).into_iter().enumerate() {
            for (o, op) in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min].into_iter().enumerate() {
                let seed = (p * 1000 + k * 10 + o) as u64;
                let xs = inputs::<T>(p, n, seed);
                let want = ring_reference(op, &xs, CHUNK);
                if op == ReduceOp::Sum && p >= 3 {
                    let other = rank_order(op, &xs);
                    order_mattered +=
                        want.iter().zip(&other).filter(|(a, b)| !a.is_nan() && a.bits() != b.bits()).count();
                }
                let label = format!("{name} {op:?} at {p} ranks, {n} elements");
                compare(&label, &run_ring(op, &xs, k % 2 == 0), &want, op);
            }
        }
    }
    assert!(
        order_mattered > 100,
        "{name}: the ring order and the rank order agree almost everywhere ({order_mattered})"
    );
}

#[test]
fn ring_float32_matches_the_documented_fold_order() {
    check_type::<f32>("float32");
}

#[test]
fn ring_float64_matches_the_documented_fold_order() {
    check_type::<f64>("float64");
}

#[test]
fn ring_float16_and_bfloat16_match_the_documented_fold_order() {
    check_type::<f16>("float16");
    check_type::<bf16>("bfloat16");
}

/// The same over TCP (ranks as threads, each forming its group over loopback), at 3 and 5
/// ranks, across segment boundaries.
#[test]
fn ring_over_tcp_matches_the_documented_fold_order() {
    for p in [3usize, 5] {
        let n = 2 * segment_len(p, CHUNK, 4) + 7;
        let xs = inputs::<f32>(p, n, 77 + p as u64);
        let want = ring_reference(ReduceOp::Sum, &xs, CHUNK);
        let port = free_port();
        let ins = xs.clone();
        let got = ranks_on_threads(p, move |r| {
            let cfg = Config {
                rank: r,
                world_size: p,
                coordinator: Some(format!("127.0.0.1:{port}")),
                job_key: Some("ring".into()),
                algo: Algo::Ring,
                chunk_bytes: Some(CHUNK),
                timeout: Duration::from_secs(30),
                init_timeout: Duration::from_secs(20),
                ..Config::default()
            };
            let g = Group::new(cfg).unwrap();
            let mut x = ins[r].clone();
            g.all_sum(&mut x).unwrap();
            x
        });
        compare(&format!("float32 over TCP at {p} ranks"), &got, &want, ReduceOp::Sum);
    }
}
