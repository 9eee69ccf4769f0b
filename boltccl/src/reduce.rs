//! Reduction kernels over raw byte buffers.
//!
//! Collectives move bytes; these kernels give them meaning. Every kernel applies the operator
//! in one explicit operand order, so that the algorithms can promise the same bits on every
//! rank and every run (floating-point addition is not associative, and with NaN payloads not
//! even commutative). Simple loops: the compiler vectorises them for f32/f64/integers.

use crate::types::{DType, ReduceOp};
use half::{bf16, f16};

/// Operand order for [`fold`]: which side of the operator the accumulator is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// `acc = acc op next`
    AccFirst,
    /// `acc = next op acc`
    NextFirst,
}

trait Arith: bytemuck::Pod {
    fn sum(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)] fn max(a: Self, b: Self) -> Self { if a >= b { a } else { b } }
            #[inline(always)] fn min(a: Self, b: Self) -> Self { if a <= b { a } else { b } }
        }
    )*};
}
int_arith!(i8, i16, i32, i64, u8, u16, u32, u64);

// Floats: max/min propagate NaN (the first NaN operand wins) so a NaN is never hidden, and
// ties (+0 vs -0) keep the left operand: with a fixed operand order the result is fixed.
macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(a: Self, b: Self) -> Self { a + b }
            #[inline(always)] fn max(a: Self, b: Self) -> Self {
                if a.is_nan() || a >= b { a } else if b.is_nan() || b > a { b } else { a }
            }
            #[inline(always)] fn min(a: Self, b: Self) -> Self {
                if a.is_nan() || a <= b { a } else if b.is_nan() || b < a { b } else { a }
            }
        }
    )*};
}
float_arith!(f32, f64, f16, bf16);

#[inline(always)]
fn op_fn<T: Arith>(op: ReduceOp) -> fn(T, T) -> T {
    match op {
        ReduceOp::Sum => T::sum,
        ReduceOp::Max => T::max,
        ReduceOp::Min => T::min,
    }
}

fn fold_typed<T: Arith>(op: ReduceOp, acc: &mut [u8], next: &[u8], order: Order) {
    // Aligned fast path; buffers from C or Python may be unaligned, which the slow path covers.
    match (bytemuck::try_cast_slice_mut::<u8, T>(acc), bytemuck::try_cast_slice::<u8, T>(next)) {
        (Ok(a), Ok(n)) => {
            // Separate loops per operator so each one vectorises on its own.
            macro_rules! run {
                ($f:expr) => {
                    match order {
                        Order::AccFirst => a.iter_mut().zip(n).for_each(|(x, y)| *x = $f(*x, *y)),
                        Order::NextFirst => a.iter_mut().zip(n).for_each(|(x, y)| *x = $f(*y, *x)),
                    }
                };
            }
            match op {
                ReduceOp::Sum => run!(T::sum),
                ReduceOp::Max => run!(T::max),
                ReduceOp::Min => run!(T::min),
            }
        }
        _ => {
            let f = op_fn::<T>(op);
            let size = std::mem::size_of::<T>();
            for (a, n) in acc.chunks_exact_mut(size).zip(next.chunks_exact(size)) {
                let x: T = bytemuck::pod_read_unaligned(a);
                let y: T = bytemuck::pod_read_unaligned(n);
                let r = match order {
                    Order::AccFirst => f(x, y),
                    Order::NextFirst => f(y, x),
                };
                a.copy_from_slice(bytemuck::bytes_of(&r));
            }
        }
    }
}

fn combine_typed<T: Arith>(op: ReduceOp, out: &mut [u8], lhs: &[u8], rhs: &[u8]) {
    match (
        bytemuck::try_cast_slice_mut::<u8, T>(out),
        bytemuck::try_cast_slice::<u8, T>(lhs),
        bytemuck::try_cast_slice::<u8, T>(rhs),
    ) {
        (Ok(o), Ok(l), Ok(r)) => {
            macro_rules! run {
                ($f:expr) => {
                    o.iter_mut().zip(l.iter().zip(r)).for_each(|(o, (l, r))| *o = $f(*l, *r))
                };
            }
            match op {
                ReduceOp::Sum => run!(T::sum),
                ReduceOp::Max => run!(T::max),
                ReduceOp::Min => run!(T::min),
            }
        }
        _ => {
            out.copy_from_slice(lhs);
            fold_typed::<T>(op, out, rhs, Order::AccFirst);
        }
    }
}

macro_rules! dispatch {
    ($dtype:expr, $f:ident, $($arg:expr),*) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::F16 => $f::<f16>($($arg),*),
            DType::BF16 => $f::<bf16>($($arg),*),
            DType::I8 => $f::<i8>($($arg),*),
            DType::I16 => $f::<i16>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::U8 => $f::<u8>($($arg),*),
            DType::U16 => $f::<u16>($($arg),*),
            DType::U32 => $f::<u32>($($arg),*),
            DType::U64 => $f::<u64>($($arg),*),
        }
    };
}

/// `acc = acc op next` (or `next op acc`, see [`Order`]), elementwise.
///
/// # Panics
/// If the lengths differ or are not a multiple of the element size (a caller bug).
pub fn fold(op: ReduceOp, dtype: DType, acc: &mut [u8], next: &[u8], order: Order) {
    assert_eq!(acc.len(), next.len(), "fold: length mismatch");
    assert_eq!(acc.len() % dtype.size(), 0, "fold: partial element");
    dispatch!(dtype, fold_typed, op, acc, next, order)
}

/// `out = lhs op rhs`, elementwise.
///
/// # Panics
/// If the lengths differ or are not a multiple of the element size (a caller bug).
pub fn combine(op: ReduceOp, dtype: DType, out: &mut [u8], lhs: &[u8], rhs: &[u8]) {
    assert!(out.len() == lhs.len() && lhs.len() == rhs.len(), "combine: length mismatch");
    assert_eq!(out.len() % dtype.size(), 0, "combine: partial element");
    dispatch!(dtype, combine_typed, op, out, lhs, rhs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    #[test]
    fn sum_max_min_f32() {
        let a = [1.0f32, -2.0, 3.5, f32::NAN];
        let b = [0.5f32, 4.0, -3.5, 1.0];
        let mut acc = bytes(&a);
        fold(ReduceOp::Sum, DType::F32, &mut acc, &bytes(&b), Order::AccFirst);
        let r: &[f32] = bytemuck::cast_slice(&acc);
        assert_eq!(&r[..3], &[1.5, 2.0, 0.0]);
        assert!(r[3].is_nan());
        let mut out = vec![0u8; 16];
        combine(ReduceOp::Max, DType::F32, &mut out, &bytes(&a), &bytes(&b));
        let r: &[f32] = bytemuck::cast_slice(&out);
        assert_eq!(&r[..3], &[1.0, 4.0, 3.5]);
        assert!(r[3].is_nan(), "max must propagate NaN");
        combine(ReduceOp::Min, DType::F32, &mut out, &bytes(&b), &bytes(&a));
        let r: &[f32] = bytemuck::cast_slice(&out);
        assert_eq!(&r[..3], &[0.5, -2.0, -3.5]);
        assert!(r[3].is_nan(), "min must propagate NaN");
    }

    #[test]
    fn integers_wrap() {
        let mut acc = bytes(&[i8::MAX, 5]);
        fold(ReduceOp::Sum, DType::I8, &mut acc, &bytes(&[1i8, -10]), Order::NextFirst);
        assert_eq!(bytemuck::cast_slice::<u8, i8>(&acc), &[i8::MIN, -5]);
    }

    #[test]
    fn half_types_round_per_add() {
        let one = bf16::from_f32(1.0);
        let tiny = bf16::from_f32(1.0 / 512.0);
        let mut acc = bytes(&[one]);
        fold(ReduceOp::Sum, DType::BF16, &mut acc, &bytes(&[tiny]), Order::AccFirst);
        // bf16 has 8 significant bits: 1 + 2^-9 rounds back to 1.
        assert_eq!(bytemuck::cast_slice::<u8, bf16>(&acc)[0], one);
    }

    #[test]
    fn unaligned_buffers_give_the_same_answer() {
        let a: Vec<f64> = (0..17).map(|i| i as f64 * 0.25).collect();
        let b: Vec<f64> = (0..17).map(|i| 100.0 - i as f64).collect();
        let mut aligned = bytes(&a);
        fold(ReduceOp::Sum, DType::F64, &mut aligned, &bytes(&b), Order::AccFirst);
        let mut shifted = vec![0u8; aligned.len() + 1];
        shifted[1..].copy_from_slice(&bytes(&a));
        let mut nb = vec![0u8; aligned.len() + 3];
        nb[3..].copy_from_slice(&bytes(&b));
        fold(ReduceOp::Sum, DType::F64, &mut shifted[1..], &nb[3..], Order::AccFirst);
        assert_eq!(&shifted[1..], &aligned[..]);
    }
}
