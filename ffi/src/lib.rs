//! # boltccl C ABI
//!
//! The C interface to boltccl: opaque group handles, one result code per call, and a
//! thread-local error message. The header `include/boltccl.h` is generated from this crate
//! by cbindgen (`scripts/check-header.sh` checks it is up to date).
//!
//! Conventions (also in the header and in `docs/c-api.md`):
//! - Every fallible function returns a `boltccl_result`; `BOLTCCL_RESULT_OK` is 0.
//! - Out-parameters (`boltccl_group **out`) are written only on success.
//! - A NULL or invalid argument returns an error code; nothing panics across the boundary.
//! - `boltccl_last_error()` gives the full message of the calling thread's last error.
//! - Every group from `boltccl_init` or `boltccl_split` is released with `boltccl_group_free`.
#![allow(non_camel_case_types)]
#![deny(unsafe_op_in_unsafe_fn)]

mod error;
mod ops;
mod panic;
mod request;

pub use error::boltccl_result;
pub use request::*;

use boltccl::{Config, Group, Op, ReduceOp};
use error::{fail, fail_with, last_error_ptr};
use ops::rank_arg;
use panic::{check_null, ffi_panic_boundary, try_ffi};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::time::Duration;

/// An element type. Pass one of the `BOLTCCL_FLOAT32`, `BOLTCCL_BFLOAT16`, ... values
/// (`boltccl_dtype_value`); any other number is rejected with `BOLTCCL_RESULT_INVALID_PARAMETER`.
pub type boltccl_dtype = u32;

/// The element types, with their stable numbers (also used on the wire): never renumbered.
/// cbindgen:prefix-with-name=false
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum boltccl_dtype_value {
    /// 32-bit IEEE float.
    BOLTCCL_FLOAT32 = 0,
    /// 64-bit IEEE float.
    BOLTCCL_FLOAT64 = 1,
    /// 16-bit IEEE float.
    BOLTCCL_FLOAT16 = 2,
    /// bfloat16 (the upper 16 bits of a float32).
    BOLTCCL_BFLOAT16 = 3,
    /// Signed 8-bit integer.
    BOLTCCL_INT8 = 4,
    /// Signed 16-bit integer.
    BOLTCCL_INT16 = 5,
    /// Signed 32-bit integer.
    BOLTCCL_INT32 = 6,
    /// Signed 64-bit integer.
    BOLTCCL_INT64 = 7,
    /// Unsigned 8-bit integer.
    BOLTCCL_UINT8 = 8,
    /// Unsigned 16-bit integer.
    BOLTCCL_UINT16 = 9,
    /// Unsigned 32-bit integer.
    BOLTCCL_UINT32 = 10,
    /// Unsigned 64-bit integer.
    BOLTCCL_UINT64 = 11,
}

/// A reduction. Pass one of `BOLTCCL_SUM`, `BOLTCCL_MAX`, `BOLTCCL_MIN`
/// (`boltccl_reduce_op_value`); any other number is rejected with
/// `BOLTCCL_RESULT_INVALID_PARAMETER`.
pub type boltccl_reduce_op = u32;

/// The reductions, with their stable numbers (also used on the wire): never renumbered.
/// cbindgen:prefix-with-name=false
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum boltccl_reduce_op_value {
    /// Elementwise sum (integers wrap around).
    BOLTCCL_SUM = 0,
    /// Elementwise maximum.
    BOLTCCL_MAX = 1,
    /// Elementwise minimum.
    BOLTCCL_MIN = 2,
}

/// Settings for `boltccl_init`. Prepare it with `boltccl_config_init(&cfg)` (which sets
/// `size` and zeroes the rest), then set the fields you need: a zero or NULL field takes the
/// library default (not the environment). Settings that have no field here (algorithm, chunk
/// size, ...) take their defaults. The strings are copied during `boltccl_init`; they need
/// not outlive the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct boltccl_config {
    /// `sizeof(boltccl_config)` as the caller's header declared it: later versions append
    /// fields and read only what this size covers, so a program built against an older
    /// header keeps working. Set by `boltccl_config_init`.
    pub size: usize,
    /// This process's rank, `0 <= rank < world_size`.
    pub rank: c_int,
    /// Number of ranks (at least 1).
    pub world_size: c_int,
    /// `"ip:port"` where rank 0 listens and every rank dials (NUL-terminated). Required when
    /// `world_size > 1`.
    pub coordinator: *const c_char,
    /// Shared job secret (NUL-terminated), or NULL for none. All ranks must agree.
    pub job_key: *const c_char,
    /// Per-call deadline in milliseconds, counted from the last progress (0: 30000).
    pub timeout_ms: u64,
    /// Deadline for forming the group in milliseconds (0: 60000).
    pub init_timeout_ms: u64,
}

/// Prepare `*cfg` for `boltccl_init`: every field zero (the defaults) and `size` set.
/// NULL is ignored.
///
/// # Safety
/// `cfg` must be NULL or point to writable storage for one `boltccl_config`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_config_init(cfg: *mut boltccl_config) {
    if cfg.is_null() {
        return;
    }
    let blank = boltccl_config {
        size: std::mem::size_of::<boltccl_config>(),
        rank: 0,
        world_size: 0,
        coordinator: std::ptr::null(),
        job_key: std::ptr::null(),
        timeout_ms: 0,
        init_timeout_ms: 0,
    };
    // SAFETY: non-NULL and writable per the caller's contract.
    unsafe { cfg.write(blank) };
}

/// A group of ranks (opaque). Created by `boltccl_init` or `boltccl_split`, released with
/// `boltccl_group_free`.
///
/// Thread safety: a group may be used from any thread and shared between threads, but calls
/// on one group must not overlap: a call made while another is running on the same group
/// returns `BOLTCCL_RESULT_BUSY`. Use one group per thread (`boltccl_split`) for concurrency.
pub struct boltccl_group {
    _private: [u8; 0],
}

/// Borrow the `Group` behind a handle.
///
/// # Safety
/// `g` must be non-NULL and come from `boltccl_init`/`boltccl_split`, not yet freed.
unsafe fn group<'a>(g: *const boltccl_group) -> &'a Group {
    // SAFETY: the caller guarantees `g` is a live pointer made by `into_handle`.
    unsafe { &*(g as *const Group) }
}

fn into_handle(g: Group) -> *mut boltccl_group {
    Box::into_raw(Box::new(g)) as *mut boltccl_group
}

/// Read an optional NUL-terminated UTF-8 string.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string.
unsafe fn opt_str(name: &str, p: *const c_char) -> Result<Option<String>, boltccl_result> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL and NUL-terminated per the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.to_owned()))
        .map_err(|_| fail_with(boltccl_result::InvalidParameter, format!("config field `{name}` is not valid UTF-8")))
}

/// Form a group and store its handle in `*out`.
///
/// With `cfg == NULL` the settings come from the environment (`BOLTCCL_RANK`,
/// `BOLTCCL_WORLD_SIZE`, `BOLTCCL_COORDINATOR`, `BOLTCCL_JOB_KEY`, ..., or the MLX / Open MPI /
/// Slurm equivalents), as `boltccl launch` sets them. Blocks until every rank has joined or
/// the init deadline passes. `*out` is written only on success; free it with
/// `boltccl_group_free`.
///
/// # Safety
/// `cfg` must be NULL or point to a valid `boltccl_config` whose strings are NULL or
/// NUL-terminated; `out` must point to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn boltccl_init(cfg: *const boltccl_config, out: *mut *mut boltccl_group) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(out);
        // A C program has no `tracing` subscriber: warnings go to stderr (BOLTCCL_LOG filters).
        boltccl::log_to_stderr();
        let config = if cfg.is_null() {
            match Config::from_env() {
                Ok(c) => c,
                Err(e) => return fail(e),
            }
        } else {
            // SAFETY: non-NULL and valid per the caller's contract; `size` comes first in
            // every version of the struct.
            let size = unsafe { (*cfg).size };
            if size != std::mem::size_of::<boltccl_config>() {
                return fail_with(
                    boltccl_result::InvalidParameter,
                    format!(
                        "boltccl_config.size is {size}, not {} (this library's sizeof(boltccl_config)): \
                         prepare the config with boltccl_config_init(&cfg), and build against this \
                         version's boltccl.h",
                        std::mem::size_of::<boltccl_config>()
                    ),
                );
            }
            // SAFETY: as above, and `size` says the caller's struct is this version's.
            let c = unsafe { &*cfg };
            let rank = try_ffi!(rank_arg("rank", c.rank));
            let world_size = try_ffi!(rank_arg("world_size", c.world_size));
            let mut config = Config {
                rank,
                world_size,
                // SAFETY: the strings are NULL or NUL-terminated per the caller's contract.
                coordinator: try_ffi!(unsafe { opt_str("coordinator", c.coordinator) }),
                // SAFETY: as above.
                job_key: try_ffi!(unsafe { opt_str("job_key", c.job_key) }),
                ..Config::default()
            };
            if c.timeout_ms > 0 {
                config.timeout = Duration::from_millis(c.timeout_ms);
            }
            if c.init_timeout_ms > 0 {
                config.init_timeout = Duration::from_millis(c.init_timeout_ms);
            }
            config
        };
        match Group::new(config) {
            Ok(g) => {
                // SAFETY: `out` is non-NULL and writable per the caller's contract.
                unsafe { *out = into_handle(g) };
                boltccl_result::Ok
            }
            Err(e) => fail(e),
        }
    }
}

/// Release a group. NULL is ignored. Other ranks see this rank leave: free a group only
/// when the job is done with it (for example after a final `boltccl_barrier`).
///
/// # Safety
/// `g` must be NULL or a handle from `boltccl_init`/`boltccl_split` that was not freed yet,
/// with no call on it running in another thread. The handle is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn boltccl_group_free(g: *mut boltccl_group) {
    ffi_panic_boundary! {
        if !g.is_null() {
            // SAFETY: made by `into_handle` (a `Box<Group>`) and freed only once, per the contract.
            drop(unsafe { Box::from_raw(g as *mut Group) });
        }
    }
}

/// This process's rank in the group, or -1 if `g` is NULL.
///
/// # Safety
/// `g` must be NULL or a live group handle.
#[no_mangle]
pub unsafe extern "C" fn boltccl_rank(g: *const boltccl_group) -> c_int {
    ffi_panic_boundary! {
        if g.is_null() {
            return -1;
        }
        // SAFETY: non-NULL live handle per the contract.
        unsafe { group(g) }.rank() as c_int
    }
}

/// The number of ranks in the group, or -1 if `g` is NULL.
///
/// # Safety
/// `g` must be NULL or a live group handle.
#[no_mangle]
pub unsafe extern "C" fn boltccl_size(g: *const boltccl_group) -> c_int {
    ffi_panic_boundary! {
        if g.is_null() {
            return -1;
        }
        // SAFETY: non-NULL live handle per the contract.
        unsafe { group(g) }.size() as c_int
    }
}

/// Wait until every rank of the group has called `boltccl_barrier`.
///
/// # Safety
/// `g` must be NULL or a live group handle.
#[no_mangle]
pub unsafe extern "C" fn boltccl_barrier(g: *const boltccl_group) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: non-NULL live handle per the contract.
        match unsafe { group(g) }.barrier() {
            Ok(()) => boltccl_result::Ok,
            Err(e) => fail(e),
        }
    }
}

/// Run a blocking call built from C arguments.
fn finish(g: &Group, op: Result<Op<'_>, boltccl_result>) -> boltccl_result {
    match op {
        Ok(op) => match g.call(op) {
            Ok(()) => boltccl_result::Ok,
            Err(e) => fail(e),
        },
        Err(code) => code,
    }
}

/// Elementwise sum of `count` elements of `dtype` across ranks: `out` gets the sum of every
/// rank's `in`. `in == out` reduces in place; otherwise the buffers must not overlap. Every
/// rank gets bitwise-identical results. On error the contents of `out` are unspecified.
///
/// # Safety
/// `g` must be a live group handle; `in` must point to `count` readable elements and `out`
/// to `count` writable elements of `dtype` (either may be NULL only when `count` is 0).
#[no_mangle]
pub unsafe extern "C" fn boltccl_all_sum(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::all_reduce(ReduceOp::Sum, r#in, out, count, dtype) })
    }
}

/// Elementwise maximum across ranks; otherwise as `boltccl_all_sum`.
///
/// # Safety
/// As for `boltccl_all_sum`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_all_max(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::all_reduce(ReduceOp::Max, r#in, out, count, dtype) })
    }
}

/// Elementwise minimum across ranks; otherwise as `boltccl_all_sum`.
///
/// # Safety
/// As for `boltccl_all_sum`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_all_min(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::all_reduce(ReduceOp::Min, r#in, out, count, dtype) })
    }
}

/// Gather: `out` (`size * count` elements) gets every rank's `in` (`count` elements), in rank
/// order. The buffers must not overlap.
///
/// # Safety
/// `g` must be a live group handle; `in` must point to `count` readable elements and `out`
/// to `size * count` writable elements of `dtype`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_all_gather(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::all_gather(g, r#in, out, count, dtype) })
    }
}

/// Reduce-scatter with sum: `in` holds `size` blocks of `count` elements; this rank's `out`
/// (`count` elements) gets block `rank` summed over all ranks. The buffers must not overlap.
///
/// # Safety
/// `g` must be a live group handle; `in` must point to `size * count` readable elements and
/// `out` to `count` writable elements of `dtype`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_reduce_scatter(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::reduce_scatter(g, r#in, out, count, dtype) })
    }
}

/// Broadcast: every rank's `buf` (`count` elements) gets `root`'s.
///
/// # Safety
/// `g` must be a live group handle; `buf` must point to `count` writable elements of `dtype`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_broadcast(
    g: *const boltccl_group,
    buf: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    root: c_int,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::broadcast(buf, count, dtype, root) })
    }
}

/// All-to-all: `in` holds `size` parts of `count` elements, part q for rank q; `out` (`size`
/// parts of `count`) gets part `rank` of every rank's `in`, in rank order. The buffers must
/// not overlap.
///
/// # Safety
/// `g` must be a live group handle; `in` must point to `size * count` readable and `out` to
/// `size * count` writable elements of `dtype`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_all_to_all(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::all_to_all(g, r#in, out, count, dtype) })
    }
}

/// All-to-all with a count per rank: `in` holds `send_counts[q]` elements for each rank q in
/// turn, `out` gets `recv_counts[q]` from each. What rank q sends this rank must be what this
/// rank expects from q (else both fail, naming both counts). The buffers must not overlap.
///
/// # Safety
/// `g` must be a live group handle; `send_counts` and `recv_counts` must point to `size`
/// counts; `in` to as many readable elements of `dtype` as `send_counts` adds up to, `out` to
/// as many writable ones as `recv_counts` does.
#[no_mangle]
pub unsafe extern "C" fn boltccl_all_to_all_v(
    g: *const boltccl_group,
    r#in: *const c_void,
    send_counts: *const usize,
    out: *mut c_void,
    recv_counts: *const usize,
    dtype: boltccl_dtype,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::all_to_all_v(g, r#in, send_counts, out, recv_counts, dtype) })
    }
}

/// Gather: the root's `out` (`size * count` elements) gets every rank's `in` (`count`), in
/// rank order; on other ranks `out` is not used (NULL is fine).
///
/// # Safety
/// `g` must be a live group handle; `in` must point to `count` readable elements of `dtype`,
/// and on the root `out` to `size * count` writable ones, not overlapping `in`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_gather(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    root: c_int,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::gather(g, r#in, out, count, dtype, root) })
    }
}

/// Scatter: rank q's `out` (`count` elements) gets block q of the root's `in` (`size * count`);
/// on other ranks `in` is not used (NULL is fine).
///
/// # Safety
/// `g` must be a live group handle; `out` must point to `count` writable elements of `dtype`,
/// and on the root `in` to `size * count` readable ones, not overlapping `out`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_scatter(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    root: c_int,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::scatter(g, r#in, out, count, dtype, root) })
    }
}

/// Reduce: the root's `out` (`count` elements) gets every rank's `in` reduced with `op`, with
/// the bits the matching all-reduce gives; other ranks' `out` is not changed. `in == out` is
/// in place; otherwise the buffers must not overlap.
///
/// # Safety
/// `g` must be a live group handle; `in` must point to `count` readable and `out` to `count`
/// writable elements of `dtype`.
#[no_mangle]
pub unsafe extern "C" fn boltccl_reduce(
    g: *const boltccl_group,
    r#in: *const c_void,
    out: *mut c_void,
    count: usize,
    dtype: boltccl_dtype,
    op: boltccl_reduce_op,
    root: c_int,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::reduce(op, r#in, out, count, dtype, root) })
    }
}

/// Send `bytes` bytes to rank `peer`, which must call `boltccl_recv` with the same length.
/// Blocks until the data is on its way (for large buffers, until the peer is receiving).
///
/// # Safety
/// `g` must be a live group handle; `buf` must point to `bytes` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn boltccl_send(
    g: *const boltccl_group,
    buf: *const c_void,
    bytes: usize,
    peer: c_int,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::send(buf, bytes, peer) })
    }
}

/// Receive `bytes` bytes from rank `peer` into `buf`; the length must match the send.
///
/// # Safety
/// `g` must be a live group handle; `buf` must point to `bytes` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn boltccl_recv(
    g: *const boltccl_group,
    buf: *mut c_void,
    bytes: usize,
    peer: c_int,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        let g = unsafe { group(g) };
        // SAFETY: forwarded contract.
        finish(g, unsafe { ops::recv(buf, bytes, peer) })
    }
}

/// Split the group: ranks passing the same `color` (>= 0) form a new group, ordered by `key`
/// then by rank. A rank passing a negative `color` takes part but joins no group: it gets
/// `*out = NULL`. Every rank of `g` must call it. `*out` is written only on success; free a
/// non-NULL result with `boltccl_group_free` (independently of `g`, in any order).
///
/// # Safety
/// `g` must be a live group handle; `out` must point to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn boltccl_split(
    g: *const boltccl_group,
    color: c_int,
    key: i64,
    out: *mut *mut boltccl_group,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(out);
        let color = u32::try_from(color).ok();
        // SAFETY: live handle per the contract.
        match unsafe { group(g) }.split(color, key) {
            Ok(sub) => {
                // SAFETY: `out` is non-NULL and writable per the contract.
                unsafe { *out = sub.map_or(std::ptr::null_mut(), into_handle) };
                boltccl_result::Ok
            }
            Err(e) => fail(e),
        }
    }
}

/// Abort the group: callable from any thread (a signal handler included) while a call is
/// blocked on another, which then returns `BOLTCCL_RESULT_ABORTED` at once; every other rank
/// learns within moments and the group is poisoned (`boltccl_group_shrink` makes a working one).
/// Never blocks; a second call does nothing.
///
/// # Safety
/// `g` must be a live group handle.
#[no_mangle]
pub unsafe extern "C" fn boltccl_group_abort(g: *const boltccl_group) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        // SAFETY: live handle per the contract.
        unsafe { group(g) }.abort();
        boltccl_result::Ok
    }
}

/// Go on without the lost ranks: the ranks of `g` that call this within the deadline agree on
/// who is there, and each gets in `*out` a new group of them (ranks renumbered in order),
/// reusing the links (TCP, shared memory, RDMA queue pairs). `exclude` lists `n_exclude` ranks of `g` to leave
/// out whatever they do (NULL when `n_exclude` is 0); every survivor passes the same list.
/// After success `g` is done (its calls fail); free both with `boltccl_group_free`. Ranks that
/// fail during the shrink make it fail on every survivor: call it again.
///
/// # Safety
/// `g` must be a live group handle; `exclude` must point to `n_exclude` ints (or be NULL with
/// `n_exclude` 0); `out` must point to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn boltccl_group_shrink(
    g: *const boltccl_group,
    exclude: *const c_int,
    n_exclude: usize,
    out: *mut *mut boltccl_group,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(out);
        if n_exclude > 0 {
            check_null!(exclude);
        }
        let list: &[c_int] = if n_exclude == 0 {
            &[]
        } else {
            // SAFETY: non-NULL, `n_exclude` ints per the contract.
            unsafe { std::slice::from_raw_parts(exclude, n_exclude) }
        };
        let mut ranks = Vec::with_capacity(list.len());
        for &r in list {
            match usize::try_from(r) {
                Ok(r) => ranks.push(r),
                Err(_) => return fail(boltccl::Error::InvalidArgument(format!("excluded rank {r} is negative"))),
            }
        }
        // SAFETY: live handle per the contract.
        match unsafe { group(g) }.shrink_excluding(&ranks) {
            Ok(next) => {
                // SAFETY: `out` is non-NULL and writable per the contract.
                unsafe { *out = into_handle(next) };
                boltccl_result::Ok
            }
            Err(e) => fail(e),
        }
    }
}

/// Form a group of `size` ranks with replacement processes, through the normal bootstrap: the
/// ranks of `g` keep their order as ranks `0..boltccl_size(g)`, and the newcomers, started with
/// `BOLTCCL_RANK` `boltccl_size(g)..size`, `BOLTCCL_WORLD_SIZE=size` and the same
/// `coordinator` (`"host:port"`, where new rank 0 listens) and `job_key` (fresh for each
/// generation), take the rest. Every member of `g` calls it; every link is made anew, and `g`
/// is left as it is (free it with `boltccl_group_free` when done).
///
/// # Safety
/// `g` must be a live group handle; `coordinator` and `job_key` must be NUL-terminated
/// strings; `out` must point to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn boltccl_group_grow(
    g: *const boltccl_group,
    size: usize,
    coordinator: *const c_char,
    job_key: *const c_char,
    out: *mut *mut boltccl_group,
) -> boltccl_result {
    ffi_panic_boundary! {
        check_null!(g);
        check_null!(coordinator);
        check_null!(job_key);
        check_null!(out);
        // SAFETY: non-NULL, NUL-terminated per the contract.
        let strings = unsafe { (opt_str("coordinator", coordinator), opt_str("job_key", job_key)) };
        let (Ok(Some(coordinator)), Ok(Some(job_key))) = strings else {
            return boltccl_result::InvalidParameter;
        };
        // SAFETY: live handle per the contract.
        match unsafe { group(g) }.grow(size, &coordinator, &job_key) {
            Ok(next) => {
                // SAFETY: `out` is non-NULL and writable per the contract.
                unsafe { *out = into_handle(next) };
                boltccl_result::Ok
            }
            Err(e) => fail(e),
        }
    }
}

/// A static description of a `boltccl_result` code (never NULL; "unknown result code" for
/// numbers that are not codes). The string must not be freed.
#[no_mangle]
pub extern "C" fn boltccl_result_str(code: u32) -> *const c_char {
    // Taken as an integer, not as the enum: a C caller may pass any number.
    boltccl_result::describe(code).as_ptr()
}

/// The full message of the last error on the calling thread (an empty string if the last
/// call succeeded). The pointer stays valid until the next boltccl call on this thread;
/// copy the text to keep it. Never NULL; must not be freed.
#[no_mangle]
pub extern "C" fn boltccl_last_error() -> *const c_char {
    last_error_ptr()
}

/// The library version as a static string (`"0.1.0"`).
#[no_mangle]
pub extern "C" fn boltccl_version() -> *const c_char {
    static V: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => c"unknown",
    };
    V.as_ptr()
}

#[cfg(test)]
mod tests;
