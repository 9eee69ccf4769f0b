//! Non-blocking calls: `boltccl_*_async` start a call and hand back a `boltccl_request`;
//! `boltccl_test`, `boltccl_wait` and `boltccl_request_free` finish it.
//!
//! Calls on one group complete in the order they were started, on the group's progress
//! thread; a blocking call made meanwhile waits for them. Deadlines, poisoning and dead-rank
//! reports are those of the blocking calls: an error comes back from `boltccl_wait` (or
//! `boltccl_test`) with its message in `boltccl_last_error()` on the waiting thread.

use crate::error::{boltccl_result, fail};
use crate::panic::{check_null, ffi_panic_boundary, try_ffi};
use crate::{boltccl_dtype, boltccl_group, boltccl_reduce_op, group, ops};
use boltccl::{Op, RawRequest, ReduceOp};
use std::ffi::{c_int, c_void};

/// A started call (opaque). Made by the `boltccl_*_async` functions; finish it with
/// `boltccl_wait` (or poll `boltccl_test`), then release it with `boltccl_request_free`.
///
/// Buffers: the call reads and writes the caller's buffers until it has completed
/// (`boltccl_wait` returned, or `boltccl_test` set `*done`); they must stay allocated and
/// untouched until then. `boltccl_request_free` of an unfinished request waits for it first.
pub struct boltccl_request {
    _private: [u8; 0],
}

/// Start `op` on `g` and store the request in `*req` (written only on success).
///
/// # Safety
/// `g` live; `req` writable; the buffers `op` borrows stay valid until the call completes.
unsafe fn start(
    g: *const boltccl_group,
    op: Result<Op<'_>, boltccl_result>,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    let op = try_ffi!(op);
    // SAFETY: live handle per the contract.
    let g = unsafe { group(g) };
    // SAFETY: the caller keeps the buffers valid and untouched until the request completes
    // (the documented contract of every `_async` function).
    match unsafe { g.start_unchecked(op) } {
        Ok(r) => {
            // SAFETY: `req` is non-NULL and writable per the contract.
            unsafe { *req = Box::into_raw(Box::new(r)) as *mut boltccl_request };
            boltccl_result::Ok
        }
        Err(e) => fail(e),
    }
}

/// The `RawRequest` behind a handle.
///
/// # Safety
/// `r` must be a live handle from a `boltccl_*_async` function.
unsafe fn raw<'a>(r: *const boltccl_request) -> &'a RawRequest {
    // SAFETY: made by `start` from a `Box<RawRequest>`, not yet freed.
    unsafe { &*(r as *const RawRequest) }
}

/// Start `boltccl_all_sum` without waiting; `*req` gets the request.
///
/// # Safety
/// As for `boltccl_all_sum`, and `in`/`out` must stay valid and untouched until the request
/// completes; `req` must point to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn boltccl_all_sum_async(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::all_reduce(ReduceOp::Sum, r#in, out, count, dtype), req) }
    }
}

/// Start `boltccl_all_max` without waiting; as `boltccl_all_sum_async`.
///
/// # Safety
/// As for `boltccl_all_sum_async`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_all_max_async(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::all_reduce(ReduceOp::Max, r#in, out, count, dtype), req) }
    }
}

/// Start `boltccl_all_min` without waiting; as `boltccl_all_sum_async`.
///
/// # Safety
/// As for `boltccl_all_sum_async`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_all_min_async(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::all_reduce(ReduceOp::Min, r#in, out, count, dtype), req) }
    }
}

/// Start `boltccl_all_gather` without waiting.
///
/// # Safety
/// As for `boltccl_all_gather`, with the buffers kept until the request completes; `req`
/// writable.
#[no_mangle]
pub unsafe extern "C" fn boltccl_all_gather_async(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: live handle per the contract.
        let gr = unsafe { group(g) };
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::all_gather(gr, r#in, out, count, dtype), req) }
    }
}

/// Start `boltccl_reduce_scatter` without waiting.
///
/// # Safety
/// As for `boltccl_reduce_scatter`, with the buffers kept until the request completes;
/// `req` writable.
#[no_mangle]
pub unsafe extern "C" fn boltccl_reduce_scatter_async(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: live handle per the contract.
        let gr = unsafe { group(g) };
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::reduce_scatter(gr, r#in, out, count, dtype), req) }
    }
}

/// Start `boltccl_broadcast` without waiting.
///
/// # Safety
/// As for `boltccl_broadcast`, with `buf` kept until the request completes; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn boltccl_broadcast_async(
    g: *const boltccl_group,
    buf: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    root: c_int,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::broadcast(buf, count, dtype, root), req) }
    }
}

/// Start `boltccl_all_to_all` without waiting.
///
/// # Safety
/// As for `boltccl_all_to_all`, with the buffers (and counts) kept until the request completes;
/// `req` writable.
#[no_mangle]
pub unsafe extern "C" fn boltccl_all_to_all_async(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: live handle per the contract.
        let gr = unsafe { group(g) };
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::all_to_all(gr, r#in, out, count, dtype), req) }
    }
}

/// Start `boltccl_all_to_all_v` without waiting.
///
/// # Safety
/// As for `boltccl_all_to_all_v`, with the buffers (and counts) kept until the request completes;
/// `req` writable.
#[no_mangle]
pub unsafe extern "C" fn boltccl_all_to_all_v_async(
    g: *const boltccl_group,
    r#in: *const c_void,
    send_counts: *const usize,
    out: *mut c_void,
    recv_counts: *const usize,
    dtype: boltccl_dtype,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: live handle per the contract.
        let gr = unsafe { group(g) };
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::all_to_all_v(gr, r#in, send_counts, out, recv_counts, dtype), req) }
    }
}

/// Start `boltccl_gather` without waiting.
///
/// # Safety
/// As for `boltccl_gather`, with the buffers (and counts) kept until the request completes;
/// `req` writable.
#[no_mangle]
pub unsafe extern "C" fn boltccl_gather_async(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    root: c_int,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: live handle per the contract.
        let gr = unsafe { group(g) };
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::gather(gr, r#in, out, count, dtype, root), req) }
    }
}

/// Start `boltccl_scatter` without waiting.
///
/// # Safety
/// As for `boltccl_scatter`, with the buffers (and counts) kept until the request completes;
/// `req` writable.
#[no_mangle]
pub unsafe extern "C" fn boltccl_scatter_async(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    root: c_int,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: live handle per the contract.
        let gr = unsafe { group(g) };
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::scatter(gr, r#in, out, count, dtype, root), req) }
    }
}

/// Start `boltccl_reduce` without waiting.
///
/// # Safety
/// As for `boltccl_reduce`, with the buffers (and counts) kept until the request completes;
/// `req` writable.
#[no_mangle]
pub unsafe extern "C" fn boltccl_reduce_async(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    op: boltccl_reduce_op,
    root: c_int,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::reduce(op, r#in, out, count, dtype, root), req) }
    }
}

/// Start `boltccl_send` without waiting.
///
/// # Safety
/// As for `boltccl_send`, with `buf` kept until the request completes; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn boltccl_send_async(
    g: *const boltccl_group,
    buf: *const c_void,
    bytes: usize,
    peer: c_int,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::send(buf, bytes, peer), req) }
    }
}

/// Start `boltccl_recv` without waiting.
///
/// # Safety
/// As for `boltccl_recv`, with `buf` kept until the request completes; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn boltccl_recv_async(
    g: *const boltccl_group,
    buf: *mut c_void,
    bytes: usize,
    peer: c_int,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: forwarded contract.
        unsafe { start(g, ops::recv(buf, bytes, peer), req) }
    }
}

/// Start a barrier without waiting.
///
/// # Safety
/// `g` must be a live group handle; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn boltccl_barrier_async(
    g: *const boltccl_group,
    req: *mut *mut boltccl_request,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(req);
        // SAFETY: forwarded contract.
        unsafe { start(g, Ok(Op::Barrier), req) }
    }
}

/// Has the call completed? Sets `*done` to 1 and returns the call's result when it has;
/// sets `*done` to 0 and returns `BOLTCCL_RESULT_OK` while it runs or waits its turn. Never
/// blocks.
///
/// # Safety
/// `req` must be a live request handle; `done` must point to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_test(req: *const boltccl_request, done: *mut c_int) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(req);
        check_null!(done);
        // SAFETY: live handle per the contract.
        let r = unsafe { raw(req) }.test();
        // SAFETY: writable per the contract.
        unsafe { *done = c_int::from(r.is_some()) };
        match r {
            None | Some(Ok(())) => boltccl_result::Ok,
            Some(Err(e)) => fail(e),
        }
    }
}

/// Wait for the call and return its result (the group's deadlines bound the wait: a call
/// that stops making progress fails). May be called again; the result stays the same.
///
/// # Safety
/// `req` must be a live request handle.
#[no_mangle]
pub unsafe extern "C" fn boltccl_wait(req: *const boltccl_request) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(req);
        // SAFETY: live handle per the contract.
        match unsafe { raw(req) }.wait() {
            Ok(()) => boltccl_result::Ok,
            Err(e) => fail(e),
        }
    }
}

/// Release a request; an unfinished one is waited for first (its buffers are in use until
/// then). NULL is ignored.
///
/// # Safety
/// `req` must be NULL or a live request handle, freed only once.
#[no_mangle]
pub unsafe extern "C" fn boltccl_request_free(req: *mut boltccl_request) {
    ffi_panic_boundary! {
        if !req.is_null() {
            // SAFETY: made by `start` from a `Box<RawRequest>`, freed once per the contract.
            let r = unsafe { Box::from_raw(req as *mut RawRequest) };
            let _ = r.wait();
        }
    }
}
