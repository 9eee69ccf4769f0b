//! Calls built from C arguments: the checks every entry point shares (NULL pointers, element
//! types, overflow, overlap), giving the `Op` that the blocking and the non-blocking forms run.

use crate::boltccl_dtype;
use crate::error::{boltccl_result, fail_with};
use boltccl::{DType, Group, Op, ReduceOp};
use std::ffi::{c_int, c_void};

pub(crate) fn dtype(d: boltccl_dtype) -> Result<DType, boltccl_result> {
    u8::try_from(d).ok().and_then(DType::from_u8).ok_or_else(|| {
        fail_with(
            boltccl_result::InvalidParameter,
            format!("unknown dtype {d}: pass one of BOLTCCL_FLOAT32 ... BOLTCCL_UINT64"),
        )
    })
}

pub(crate) fn rank_arg(what: &str, r: c_int) -> Result<usize, boltccl_result> {
    usize::try_from(r).map_err(|_| fail_with(boltccl_result::InvalidParameter, format!("{what} {r} is negative")))
}

fn byte_len(count: usize, d: DType) -> Result<usize, boltccl_result> {
    count.checked_mul(d.size()).filter(|&n| n <= isize::MAX as usize).ok_or_else(|| {
        fail_with(boltccl_result::InvalidParameter, format!("count {count} of {d} overflows the address space"))
    })
}

/// A read-only slice from a C pointer; NULL is allowed only for zero bytes.
///
/// # Safety
/// When `len > 0`, `p` must point to `len` readable bytes that stay valid for `'a`.
unsafe fn slice<'a>(name: &str, p: *const c_void, len: usize) -> Result<&'a [u8], boltccl_result> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(fail_with(boltccl_result::NullParameter, format!("argument `{name}` is NULL")));
    }
    // SAFETY: non-NULL, and the caller guarantees `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(p as *const u8, len) })
}

/// A writable slice from a C pointer; NULL is allowed only for zero bytes.
///
/// # Safety
/// When `len > 0`, `p` must point to `len` writable bytes, valid and not otherwise
/// accessed for `'a`.
unsafe fn slice_mut<'a>(name: &str, p: *mut c_void, len: usize) -> Result<&'a mut [u8], boltccl_result> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(fail_with(boltccl_result::NullParameter, format!("argument `{name}` is NULL")));
    }
    // SAFETY: non-NULL, and the caller guarantees `len` exclusive writable bytes.
    Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) })
}

/// Fail unless the byte ranges `[a, a+alen)` and `[b, b+blen)` are disjoint.
fn disjoint(a: *const c_void, alen: usize, b: *const c_void, blen: usize) -> Result<(), boltccl_result> {
    let (a, b) = (a as usize, b as usize);
    if alen == 0 || blen == 0 || a.saturating_add(alen) <= b || b.saturating_add(blen) <= a {
        return Ok(());
    }
    Err(fail_with(
        boltccl_result::InvalidParameter,
        "the input and output buffers overlap: pass the same pointer for in place, or disjoint buffers",
    ))
}

/// An all-reduce of `count` elements; `input == output` is in place.
///
/// # Safety
/// `input` must point to `count` readable and `output` to `count` writable elements of
/// `dt`, valid for `'a` and not otherwise accessed meanwhile.
pub(crate) unsafe fn all_reduce<'a>(
    op: ReduceOp,
    input: *const c_void,
    output: *mut c_void,
    count: usize,
    dt: boltccl_dtype,
) -> Result<Op<'a>, boltccl_result> {
    let dtype = dtype(dt)?;
    let len = byte_len(count, dtype)?;
    if input as *const u8 == output as *const u8 {
        // SAFETY: `count` writable elements at `output` per the contract.
        let output = unsafe { slice_mut("out", output, len)? };
        return Ok(Op::AllReduce { op, dtype, input: None, output });
    }
    disjoint(input, len, output, len)?;
    // SAFETY: `count` readable elements at `input`, disjoint from `output` (checked).
    let input = Some(unsafe { slice("in", input, len)? });
    // SAFETY: `count` writable elements at `output` per the contract.
    let output = unsafe { slice_mut("out", output, len)? };
    Ok(Op::AllReduce { op, dtype, input, output })
}

/// An all-gather: `count` elements in, `size * count` out.
///
/// # Safety
/// As for [`all_reduce`], with `size * count` writable elements at `output`.
pub(crate) unsafe fn all_gather<'a>(
    g: &Group,
    input: *const c_void,
    output: *mut c_void,
    count: usize,
    dt: boltccl_dtype,
) -> Result<Op<'a>, boltccl_result> {
    let dtype = dtype(dt)?;
    let len = byte_len(count, dtype)?;
    let out_len = byte_len(count.saturating_mul(g.size()), dtype)?;
    disjoint(input, len, output, out_len)?;
    // SAFETY: readable `count` elements per the contract; disjoint from `out` (checked).
    let input = unsafe { slice("in", input, len)? };
    // SAFETY: writable `size * count` elements per the contract.
    let output = unsafe { slice_mut("out", output, out_len)? };
    Ok(Op::AllGather { dtype, input, output })
}

/// A reduce-scatter (sum): `size * count` elements in, `count` out.
///
/// # Safety
/// As for [`all_reduce`], with `size * count` readable elements at `input`.
pub(crate) unsafe fn reduce_scatter<'a>(
    g: &Group,
    input: *const c_void,
    output: *mut c_void,
    count: usize,
    dt: boltccl_dtype,
) -> Result<Op<'a>, boltccl_result> {
    let dtype = dtype(dt)?;
    let len = byte_len(count, dtype)?;
    let in_len = byte_len(count.saturating_mul(g.size()), dtype)?;
    disjoint(input, in_len, output, len)?;
    // SAFETY: readable `size * count` elements per the contract; disjoint (checked).
    let input = unsafe { slice("in", input, in_len)? };
    // SAFETY: writable `count` elements per the contract.
    let output = unsafe { slice_mut("out", output, len)? };
    Ok(Op::ReduceScatter { op: ReduceOp::Sum, dtype, input, output })
}

/// A broadcast of `count` elements from `root`.
///
/// # Safety
/// `buf` must point to `count` writable elements of `dt`, valid for `'a`.
pub(crate) unsafe fn broadcast<'a>(
    buf: *mut c_void,
    count: usize,
    dt: boltccl_dtype,
    root: c_int,
) -> Result<Op<'a>, boltccl_result> {
    let dtype = dtype(dt)?;
    let root = rank_arg("root", root)?;
    let len = byte_len(count, dtype)?;
    // SAFETY: writable `count` elements per the contract.
    let buf = unsafe { slice_mut("buf", buf, len)? };
    Ok(Op::Broadcast { dtype, buf, root })
}

/// Sending `bytes` bytes to `peer`.
///
/// # Safety
/// `buf` must point to `bytes` readable bytes, valid for `'a`.
pub(crate) unsafe fn send<'a>(buf: *const c_void, bytes: usize, peer: c_int) -> Result<Op<'a>, boltccl_result> {
    let peer = rank_arg("peer", peer)?;
    // SAFETY: readable `bytes` bytes per the contract.
    let buf = unsafe { slice("buf", buf, bytes)? };
    Ok(Op::Send { dtype: DType::U8, buf, peer })
}

/// Receiving `bytes` bytes from `peer`.
///
/// # Safety
/// `buf` must point to `bytes` writable bytes, valid for `'a`.
pub(crate) unsafe fn recv<'a>(buf: *mut c_void, bytes: usize, peer: c_int) -> Result<Op<'a>, boltccl_result> {
    let peer = rank_arg("peer", peer)?;
    // SAFETY: writable `bytes` bytes per the contract.
    let buf = unsafe { slice_mut("buf", buf, bytes)? };
    Ok(Op::Recv { dtype: DType::U8, buf, peer })
}

/// The C reduction numbers (`boltccl_reduce_op_value`) as a `ReduceOp`.
pub(crate) fn reduce_op(op: u32) -> Result<ReduceOp, boltccl_result> {
    u8::try_from(op).ok().and_then(ReduceOp::from_u8).ok_or_else(|| {
        fail_with(
            boltccl_result::InvalidParameter,
            format!("unknown reduction {op}: pass BOLTCCL_SUM, BOLTCCL_MAX or BOLTCCL_MIN"),
        )
    })
}

/// An all-to-all: `size * count` elements in and out.
///
/// # Safety
/// `input` must point to `size * count` readable and `output` to `size * count` writable
/// elements of `dt`, valid for `'a` and not otherwise accessed meanwhile.
pub(crate) unsafe fn all_to_all<'a>(
    g: &Group,
    input: *const c_void,
    output: *mut c_void,
    count: usize,
    dt: boltccl_dtype,
) -> Result<Op<'a>, boltccl_result> {
    let dtype = dtype(dt)?;
    let len = byte_len(count.saturating_mul(g.size()), dtype)?;
    disjoint(input, len, output, len)?;
    // SAFETY: readable `size * count` elements per the contract; disjoint (checked).
    let input = unsafe { slice("in", input, len)? };
    // SAFETY: writable `size * count` elements per the contract.
    let output = unsafe { slice_mut("out", output, len)? };
    Ok(Op::AllToAll { dtype, input, output })
}

/// `size` counts from a C array.
///
/// # Safety
/// `p` must point to `size` readable `size_t`s, valid for `'a`.
unsafe fn counts<'a>(g: &Group, name: &str, p: *const usize) -> Result<&'a [usize], boltccl_result> {
    if p.is_null() {
        return Err(fail_with(boltccl_result::NullParameter, format!("argument `{name}` is NULL")));
    }
    // SAFETY: non-NULL, and the caller guarantees `size` readable counts.
    Ok(unsafe { std::slice::from_raw_parts(p, g.size()) })
}

/// An all-to-all with `send_counts[q]` elements to and `recv_counts[q]` from each rank q.
///
/// # Safety
/// `send_counts` and `recv_counts` must point to `size` readable counts; `input` to as many
/// readable elements as `send_counts` adds up to, `output` to as many writable ones as
/// `recv_counts` does; all valid for `'a` and not otherwise accessed meanwhile.
pub(crate) unsafe fn all_to_all_v<'a>(
    g: &Group,
    input: *const c_void,
    send_counts: *const usize,
    output: *mut c_void,
    recv_counts: *const usize,
    dt: boltccl_dtype,
) -> Result<Op<'a>, boltccl_result> {
    let dtype = dtype(dt)?;
    // SAFETY: `size` readable counts each, per the contract.
    let (send_counts, recv_counts) =
        unsafe { (counts(g, "send_counts", send_counts)?, counts(g, "recv_counts", recv_counts)?) };
    let total = |c: &[usize]| c.iter().try_fold(0usize, |a, &n| a.checked_add(n)).unwrap_or(usize::MAX);
    let in_len = byte_len(total(send_counts), dtype)?;
    let out_len = byte_len(total(recv_counts), dtype)?;
    disjoint(input, in_len, output, out_len)?;
    // SAFETY: readable elements for the send counts per the contract; disjoint (checked).
    let input = unsafe { slice("in", input, in_len)? };
    // SAFETY: writable elements for the receive counts per the contract.
    let output = unsafe { slice_mut("out", output, out_len)? };
    Ok(Op::AllToAllV { dtype, input, send_counts, output, recv_counts })
}

/// A gather of `count` elements a rank to `root` (`size * count` out there; `out` is not
/// used elsewhere and may be NULL).
///
/// # Safety
/// `input` must point to `count` readable elements; on the root `output` to `size * count`
/// writable ones; valid for `'a` and not otherwise accessed meanwhile.
pub(crate) unsafe fn gather<'a>(
    g: &Group,
    input: *const c_void,
    output: *mut c_void,
    count: usize,
    dt: boltccl_dtype,
    root: c_int,
) -> Result<Op<'a>, boltccl_result> {
    let dtype = dtype(dt)?;
    let root = rank_arg("root", root)?;
    let len = byte_len(count, dtype)?;
    let out_len = if g.rank() == root { byte_len(count.saturating_mul(g.size()), dtype)? } else { 0 };
    disjoint(input, len, output, out_len)?;
    // SAFETY: readable `count` elements per the contract; disjoint (checked).
    let input = unsafe { slice("in", input, len)? };
    // SAFETY: writable `size * count` elements on the root per the contract (none elsewhere).
    let output = unsafe { slice_mut("out", output, out_len)? };
    Ok(Op::Gather { dtype, input, output, root })
}

/// A scatter of `count` elements a rank from `root` (`size * count` in there; `in` is not
/// used elsewhere and may be NULL).
///
/// # Safety
/// On the root `input` must point to `size * count` readable elements; `output` to `count`
/// writable ones; valid for `'a` and not otherwise accessed meanwhile.
pub(crate) unsafe fn scatter<'a>(
    g: &Group,
    input: *const c_void,
    output: *mut c_void,
    count: usize,
    dt: boltccl_dtype,
    root: c_int,
) -> Result<Op<'a>, boltccl_result> {
    let dtype = dtype(dt)?;
    let root = rank_arg("root", root)?;
    let len = byte_len(count, dtype)?;
    let in_len = if g.rank() == root { byte_len(count.saturating_mul(g.size()), dtype)? } else { 0 };
    disjoint(input, in_len, output, len)?;
    // SAFETY: readable `size * count` elements on the root per the contract (none elsewhere).
    let input = unsafe { slice("in", input, in_len)? };
    // SAFETY: writable `count` elements per the contract; disjoint (checked).
    let output = unsafe { slice_mut("out", output, len)? };
    Ok(Op::Scatter { dtype, input, output, root })
}

/// A reduce of `count` elements to `root`; `input == output` is in place.
///
/// # Safety
/// As for [`all_reduce`].
pub(crate) unsafe fn reduce<'a>(
    op: u32,
    input: *const c_void,
    output: *mut c_void,
    count: usize,
    dt: boltccl_dtype,
    root: c_int,
) -> Result<Op<'a>, boltccl_result> {
    let op = reduce_op(op)?;
    let root = rank_arg("root", root)?;
    // SAFETY: forwarded contract.
    match unsafe { all_reduce(op, input, output, count, dt)? } {
        Op::AllReduce { op, dtype, input, output } => Ok(Op::Reduce { op, dtype, input, output, root }),
        _ => unreachable!("all_reduce builds an all-reduce"),
    }
}
