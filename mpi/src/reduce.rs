//! How an `MPI_Allreduce` is served: by one of boltccl's own reductions, or by folding the
//! program's own function over every rank's data in rank order.
//!
//! Either way every rank gets the same bits, on every run:
//! - boltccl's reductions are deterministic by design (a fixed fold order whatever the
//!   transport or timing);
//! - the fold gathers all inputs and applies the user function as
//!   `((x0 op x1) op x2) ...` on every rank alike, so the bits depend only on the inputs.
//!
//! MLX sums float16 and bfloat16 through user functions (`MPI_Op_create` over
//! `MPI_Type_contiguous(2, MPI_UINT8_T)`), and those sums are its tensor-parallel hot path, so
//! a user function over 2-byte items is *recognised*: it is called once on probe values, and
//! if it matches exactly one of the float16/bfloat16 sum, max or min bit for bit, the call
//! runs boltccl's own reduction of that type (reduce-scatter/all-gather bandwidth instead of
//! gathering every rank's data). The probe's sums are the correctly rounded sum of the two
//! operands, which is what MLX's `a += b` computes: it rounds the exact float32 sum (float32
//! has more than 2p + 2 bits for both formats, so rounding twice equals rounding once). Its
//! max and min are `std::max(acc, in)` and `std::min(acc, in)`, NaN operands included, which
//! tells float16 from bfloat16 (a float16 NaN is an ordinary bfloat16 number). Anything else
//! (a function the probe does not pin down, other item sizes, MLX's complex64 max and min)
//! is folded.

use crate::abi::{Datatype, Elem, Handle, Operation, UserFn};
use boltccl::{bf16, f16, DType, Group, ReduceOp};
use std::ffi::{c_int, c_void};

/// How an all-reduce runs.
#[derive(Debug, Clone, Copy)]
pub enum Plan {
    /// boltccl's reduction `op` over elements of `dtype`.
    Native { dtype: DType, op: ReduceOp },
    /// Gather every rank's items and fold them with the user function.
    Fold(UserFn),
}

/// Choose how to reduce items of `ty` with `op`.
pub fn plan(ty: &Datatype, op: &Operation) -> Result<Plan, String> {
    if let Some(f) = op.user {
        let item = ty.item_bytes();
        let found = match op.recognised.get() {
            Some(&(size, found)) if size == item => found,
            Some(_) => recognise(f, item),
            None => op.recognised.get_or_init(|| (item, recognise(f, item))).1,
        };
        return Ok(match found {
            Some((dtype, op)) => Plan::Native { dtype, op },
            None => Plan::Fold(f),
        });
    }
    let op = op.builtin.ok_or("an operation with neither a predefined nor a user function")?;
    let (dtype, _) = ty.elem.carried_as();
    match (ty.elem, op) {
        // C's bool has no sum: as in MLX's own backends, true + true stays true (or), and
        // max and min are or and and. MLX's bools are the bytes 0 and 1.
        (Elem::Bool, ReduceOp::Sum | ReduceOp::Max) => Ok(Plan::Native { dtype, op: ReduceOp::Max }),
        (Elem::Bool, ReduceOp::Min) => Ok(Plan::Native { dtype, op: ReduceOp::Min }),
        (Elem::Complex64, ReduceOp::Max | ReduceOp::Min) => Err(format!(
            "MPI_{} of {}: complex numbers have no order; pass a user operation (MPI_Op_create), \
             as MLX does",
            op.name().to_uppercase(),
            ty.name()
        )),
        _ => Ok(Plan::Native { dtype, op }),
    }
}

/// The (a, b) pairs, as 16-bit patterns, that tell the 2-byte candidates apart: sums that
/// differ between float16 and bfloat16, a tie that rounds to even, an overflow, order in both
/// directions, and float16 NaNs that are bfloat16 numbers.
const PROBES: [(u16, u16); 12] = [
    (0x3C00, 0x3C00),
    (0x3C00, 0x4000),
    (0x4000, 0x3C00),
    (0xBC00, 0x3555),
    (0x3555, 0x1234),
    (0x3C01, 0x1000),
    (0x3C00, 0x1000),
    (0x7BFF, 0x7BFF),
    (0xC4D2, 0x4123),
    (0x3C00, 0x7D00),
    (0x7D00, 0x3C00),
    (0x0001, 0x8003),
];

/// What `f` computes on 2-byte items, if the probe pins it down to exactly one of the float16
/// and bfloat16 sum, max and min.
fn recognise(f: UserFn, item_bytes: usize) -> Option<(DType, ReduceOp)> {
    if item_bytes != 2 {
        return None;
    }
    let mut inout: Vec<u16> = PROBES.iter().map(|&(a, _)| a).collect();
    let mut input: Vec<u16> = PROBES.iter().map(|&(_, b)| b).collect();
    let mut len = PROBES.len() as c_int;
    let mut ty = Datatype::contiguous(Elem::Num(DType::U8), 2);
    // SAFETY: both buffers hold `len` 2-byte items; `ty` is a live datatype handle. The
    // function is the program's reduction, which MPI lets the library call on any data.
    unsafe {
        f(input.as_mut_ptr() as *mut c_void, inout.as_mut_ptr() as *mut c_void, &mut len, &mut ty as *mut Handle)
    };
    let candidates =
        [DType::F16, DType::BF16].into_iter().flat_map(|d| ReduceOp::ALL.into_iter().map(move |op| (d, op))).filter(
            |&(d, op)| PROBES.iter().zip(&inout).all(|(&(a, b), &got)| expected(d, op, a, b).is_none_or(|e| e == got)),
        );
    let mut found = candidates.collect::<Vec<_>>();
    tracing::debug!(?found, "recognising a user reduction over 2-byte items");
    (found.len() == 1).then(|| found.remove(0))
}

/// `acc op in` as MLX's float16/bfloat16 functions compute it, for `acc = a`, `in = b`;
/// `None` where a sum involves a NaN (its payload is not pinned down).
fn expected(d: DType, op: ReduceOp, a: u16, b: u16) -> Option<u16> {
    let (x, y) = match d {
        DType::F16 => (f16::from_bits(a).to_f32(), f16::from_bits(b).to_f32()),
        _ => (bf16::from_bits(a).to_f32(), bf16::from_bits(b).to_f32()),
    };
    match op {
        ReduceOp::Sum if x.is_nan() || y.is_nan() => None,
        ReduceOp::Sum => Some(match d {
            DType::F16 => f16::from_f32(x + y).to_bits(),
            _ => bf16::from_f32(x + y).to_bits(),
        }),
        // std::max(acc, in) is `acc < in ? in : acc`; std::min(acc, in) is `in < acc ? in : acc`.
        ReduceOp::Max => Some(if x < y { b } else { a }),
        ReduceOp::Min => Some(if y < x { b } else { a }),
    }
}

/// All-reduce `count` items of `ty` by gathering every rank's and folding them with `f` in
/// rank order. `input = None`: `output` holds this rank's items.
pub fn fold(
    g: &Group,
    f: UserFn,
    ty: Handle,
    item_bytes: usize,
    count: usize,
    input: Option<&[u8]>,
    output: &mut [u8],
) -> boltccl::Result<()> {
    let bytes = item_bytes * count;
    let n = g.size();
    let mut all = vec![0u8; n * bytes];
    match input {
        Some(inp) => g.bytes().all_gather(DType::U8, inp, &mut all)?,
        None => {
            let mine = output.to_vec();
            g.bytes().all_gather(DType::U8, &mine, &mut all)?
        }
    }
    let mut len = c_int::try_from(count).map_err(|_| boltccl::Error::InvalidArgument("count over INT_MAX".into()))?;
    let mut ty = ty;
    // Block r becomes (x0 op ... op x(r-1)) op xr: MPI's user functions compute
    // `inout = in op inout`, so the running result goes in as `in`.
    for r in 1..n {
        let (done, rest) = all.split_at_mut(r * bytes);
        let acc = &mut done[(r - 1) * bytes..];
        // SAFETY: `acc` and `rest` hold `count` items of `ty` each and do not overlap.
        unsafe { f(acc.as_mut_ptr() as *mut c_void, rest.as_mut_ptr() as *mut c_void, &mut len, &mut ty) };
    }
    output.copy_from_slice(&all[(n - 1) * bytes..]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! user_fn {
        ($name:ident, $t:ty, |$acc:ident, $x:ident| $body:expr) => {
            unsafe extern "C" fn $name(input: *mut c_void, inout: *mut c_void, len: *mut c_int, _: *mut Handle) {
                // SAFETY: the caller passes `*len` items in both buffers.
                let (n, i, o) = unsafe { (*len as usize, input as *const $t, inout as *mut $t) };
                for k in 0..n {
                    // SAFETY: k < n.
                    let ($acc, $x) = unsafe { (*o.add(k), *i.add(k)) };
                    // SAFETY: k < n.
                    unsafe { *o.add(k) = $body };
                }
            }
        };
    }

    user_fn!(sum_f16, f16, |acc, x| f16::from_f32(acc.to_f32() + x.to_f32()));
    user_fn!(sum_bf16, bf16, |acc, x| bf16::from_f32(acc.to_f32() + x.to_f32()));
    user_fn!(max_f16, f16, |acc, x| if acc < x { x } else { acc });
    user_fn!(max_bf16, bf16, |acc, x| if acc < x { x } else { acc });
    user_fn!(min_f16, f16, |acc, x| if x < acc { x } else { acc });
    user_fn!(min_bf16, bf16, |acc, x| if x < acc { x } else { acc });
    user_fn!(prod_f16, f16, |acc, x| f16::from_f32(acc.to_f32() * x.to_f32()));
    user_fn!(sum_u16, u16, |acc, x| acc.wrapping_add(x));

    #[test]
    fn recognises_mlx_half_precision_functions_and_nothing_else() {
        assert_eq!(recognise(sum_f16, 2), Some((DType::F16, ReduceOp::Sum)));
        assert_eq!(recognise(sum_bf16, 2), Some((DType::BF16, ReduceOp::Sum)));
        assert_eq!(recognise(max_f16, 2), Some((DType::F16, ReduceOp::Max)));
        assert_eq!(recognise(max_bf16, 2), Some((DType::BF16, ReduceOp::Max)));
        assert_eq!(recognise(min_f16, 2), Some((DType::F16, ReduceOp::Min)));
        assert_eq!(recognise(min_bf16, 2), Some((DType::BF16, ReduceOp::Min)));
        assert_eq!(recognise(prod_f16, 2), None);
        assert_eq!(recognise(sum_u16, 2), None);
        assert_eq!(recognise(sum_f16, 4), None);
    }

    fn op_of(f: UserFn) -> &'static Operation {
        // SAFETY: a fresh handle made just above.
        unsafe { crate::abi::operation(Operation::user(f, true)).unwrap() }
    }

    #[test]
    fn plans() {
        let half = Datatype::contiguous(Elem::Num(DType::U8), 2);
        // SAFETY: fresh handles.
        let half = unsafe { crate::abi::datatype(half).unwrap() };
        assert!(matches!(plan(half, op_of(sum_bf16)).unwrap(), Plan::Native { dtype: DType::BF16, op: ReduceOp::Sum }));
        assert!(matches!(plan(half, op_of(prod_f16)).unwrap(), Plan::Fold(_)));
        let b = &crate::abi::ompi_mpi_c_bool;
        let c = &crate::abi::ompi_mpi_c_complex;
        let (sum, max, min) =
            (&crate::abi::ompi_mpi_op_sum, &crate::abi::ompi_mpi_op_max, &crate::abi::ompi_mpi_op_min);
        assert!(matches!(plan(b, sum).unwrap(), Plan::Native { dtype: DType::U8, op: ReduceOp::Max }));
        assert!(matches!(plan(b, min).unwrap(), Plan::Native { dtype: DType::U8, op: ReduceOp::Min }));
        assert!(matches!(plan(c, sum).unwrap(), Plan::Native { dtype: DType::F32, op: ReduceOp::Sum }));
        assert!(plan(c, max).unwrap_err().contains("no order"));
    }

    #[test]
    fn fold_applies_the_function_in_rank_order() {
        // A non-commutative function: a fold that reorders ranks gives another answer.
        unsafe extern "C" fn left_digits(input: *mut c_void, inout: *mut c_void, len: *mut c_int, _: *mut Handle) {
            // SAFETY: `*len` u32 items in each buffer.
            let (n, i, o) = unsafe { (*len as usize, input as *const u32, inout as *mut u32) };
            for k in 0..n {
                // SAFETY: k < n.
                unsafe { *o.add(k) = *i.add(k) * 10 + *o.add(k) };
            }
        }
        let groups = Group::local_world(3);
        // As an address: a raw pointer cannot cross threads.
        let ty = &crate::abi::ompi_mpi_uint32_t as *const Datatype as usize;
        let outs: Vec<Vec<u8>> = std::thread::scope(|s| {
            let hs: Vec<_> = groups
                .iter()
                .map(|g| {
                    s.spawn(move || {
                        let mine = [g.rank() as u32 + 1, 7];
                        let mut out = vec![0u8; 8];
                        let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_ne_bytes()).collect();
                        fold(g, left_digits, ty as Handle, 4, 2, Some(&bytes), &mut out).unwrap();
                        out
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for out in outs {
            let v: Vec<u32> = out.chunks(4).map(|c| u32::from_ne_bytes(c.try_into().unwrap())).collect();
            assert_eq!(v, [123, 777]);
        }
    }
}
