//! # libboltccl_mpi: the part of Open MPI's ABI that MLX uses, served by boltccl
//!
//! MLX's `mpi` backend does not link MPI: it opens `$MLX_MPI_LIBNAME` (else `libmpi.so` /
//! `libmpi.dylib`) at run time, checks that `MPI_Get_library_version` says "Open MPI", and
//! resolves thirteen functions and sixteen objects by name. This library exports exactly
//! those, each a thin call into boltccl, so every `mx.distributed` program (mlx-lm's sharded
//! models, `nn.average_gradients`) runs over boltccl's transports, deadlines and checks with
//! one environment variable and no change to MLX or to the program:
//!
//! ```text
//! boltccl launch -n 3 -- python generate.py        # sets MLX_MPI_LIBNAME itself
//! mpirun -np 3 -x MLX_MPI_LIBNAME=$(python -c 'import boltccl.mlx as m; print(m.mpi_library())') python generate.py
//! ```
//!
//! It is not an MPI: nothing beyond that subset is here (see [`abi`] for the ABI facts).
//!
//! Errors follow MPI's default, `MPI_ERRORS_ARE_FATAL`, because MLX ignores return codes: a
//! call that fails, or that the subset cannot serve (an unknown datatype, `MPI_ANY_SOURCE`, a
//! count that disagrees with the peer's), prints boltccl's error on stderr (the kind, the
//! rank to blame, what to do) and ends the process with status [`FATAL_EXIT`]. A dead or
//! stalled peer is noticed within boltccl's deadlines, on every rank, so the whole job ends
//! with the first failure named; MLX is never handed data that did not arrive.
#![allow(non_upper_case_globals, non_snake_case)]

pub mod abi;
mod reduce;

use abi::{Comm, Datatype, Handle, MpiStatus, Operation, SplitComm, UserFn};
use boltccl::{DType, Group};
use parking_lot::RwLock;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The exit status of a process ended by a failed call.
pub const FATAL_EXIT: c_int = 1;

/// The world's life: before `MPI_Init`, between it and `MPI_Finalize`, after.
enum World {
    Fresh,
    Running(Group),
    Finalized,
}

/// The world group. Calls on `MPI_COMM_WORLD` hold a read lock, so `MPI_Finalize` (which
/// takes the write lock) waits for a call in flight, itself bounded by boltccl's deadlines.
static WORLD: RwLock<World> = RwLock::new(World::Fresh);
/// This process's world rank and size, for messages (`usize::MAX`: not known yet).
static RANK: AtomicUsize = AtomicUsize::new(usize::MAX);
static SIZE: AtomicUsize = AtomicUsize::new(0);

/// What a call could not do.
type Failure = String;

/// Print why `call` failed and end the process (see the crate documentation).
fn fatal(call: &str, why: &str) -> ! {
    let rank = match RANK.load(Ordering::Relaxed) {
        usize::MAX => String::from("before the group formed"),
        r => format!("on rank {r} of {}", SIZE.load(Ordering::Relaxed)),
    };
    eprintln!(
        "boltccl MPI: {call} failed {rank}: {why}\nboltccl MPI: errors are fatal (MPI_ERRORS_ARE_FATAL): \
         this process exits with status {FATAL_EXIT} rather than hand MLX data it did not receive"
    );
    // `_exit`, not `exit`: the host's exit handlers (MLX's destructors call MPI_Finalize)
    // could wait on the very call that failed. Peers see this rank's links close and fail
    // within their deadlines, naming this rank.
    // SAFETY: `_exit` never returns and touches no Rust state.
    unsafe { libc::_exit(FATAL_EXIT) }
}

/// Run the body of `call`, turning a failure or a panic into [`fatal`].
fn guarded(call: &str, body: impl FnOnce() -> Result<(), Failure>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => abi::MPI_SUCCESS,
        Ok(Err(why)) => fatal(call, &why),
        Err(panic) => {
            let what =
                panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
            fatal(call, &format!("internal error (a bug in boltccl): {}", what.unwrap_or_default()))
        }
    }
}

/// Run `f` on the group behind `comm`.
///
/// # Safety
/// `comm` must be a communicator handle the program holds (see [`abi::comm`]).
unsafe fn on_group<R>(comm: Handle, f: impl FnOnce(&Group) -> Result<R, Failure>) -> Result<R, Failure> {
    // SAFETY: per the caller's contract.
    match unsafe { abi::comm(comm) }? {
        Comm::World => match &*WORLD.read() {
            World::Running(g) => f(g),
            World::Fresh => Err("MPI_Init has not been called".into()),
            World::Finalized => Err("MPI_Finalize has already been called".into()),
        },
        Comm::Split(g) => f(g),
        Comm::Null => Err("the communicator is MPI_COMM_NULL (this rank joined no communicator in the split)".into()),
    }
}

fn count_arg(what: &str, n: c_int) -> Result<usize, Failure> {
    usize::try_from(n).map_err(|_| format!("{what} is {n}: it must not be negative"))
}

fn rank_arg(what: &str, r: c_int, size: usize) -> Result<usize, Failure> {
    match usize::try_from(r) {
        Ok(r) if r < size => Ok(r),
        _ if r == abi::MPI_ANY_SOURCE => {
            Err(format!("{what} is MPI_ANY_SOURCE: boltccl receives from a named rank only (the subset MLX needs)"))
        }
        _ => Err(format!("{what} is {r}, not a rank of this communicator of {size}")),
    }
}

/// The size in bytes of `count` items of `ty` at `p`; a NULL `p` is refused unless that is 0.
fn buffer_len(p: *const c_void, count: usize, ty: &Datatype) -> Result<usize, Failure> {
    let n = count.checked_mul(ty.item_bytes()).ok_or("the buffer's size overflows")?;
    if n != 0 && p.is_null() {
        return Err(format!("a NULL buffer for {count} items of {}", ty.name()));
    }
    Ok(n)
}

/// The bytes of `count` items of `ty` at `p` (an empty slice for none, whatever `p` is).
///
/// # Safety
/// Unless the size is zero, `p` must point to that many readable bytes.
unsafe fn bytes<'a>(p: *const c_void, count: usize, ty: &Datatype) -> Result<&'a [u8], Failure> {
    let n = buffer_len(p, count, ty)?;
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: non-NULL and `n` readable bytes per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p as *const u8, n) })
}

/// Like [`bytes`], writable.
///
/// # Safety
/// Unless the size is zero, `p` must point to that many writable bytes that nothing else
/// accesses during the call.
unsafe fn bytes_mut<'a>(p: *mut c_void, count: usize, ty: &Datatype) -> Result<&'a mut [u8], Failure> {
    let n = buffer_len(p, count, ty)?;
    if n == 0 {
        return Ok(&mut []);
    }
    // SAFETY: non-NULL, `n` writable bytes, not aliased, per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) })
}

/// What boltccl carries `count` items of `ty` as: an element type and a number of them.
fn carried(ty: &Datatype, count: usize) -> (DType, usize) {
    let (dtype, per) = ty.elem.carried_as();
    (dtype, count * ty.count * per)
}

fn committed(call: &str, ty: &Datatype) -> Result<(), Failure> {
    if ty.is_committed() {
        Ok(())
    } else {
        Err(format!("{call} got the datatype {} before MPI_Type_commit", ty.name()))
    }
}

fn disjoint(a: &[u8], b: &[u8]) -> Result<(), Failure> {
    let (a0, b0) = (a.as_ptr() as usize, b.as_ptr() as usize);
    if a0 < b0 + b.len() && b0 < a0 + a.len() {
        return Err("the send and receive buffers overlap; pass MPI_IN_PLACE to reduce in place".into());
    }
    Ok(())
}

/// The library's name and version. Contains "Open MPI" because MLX refuses any library
/// whose string does not; the rest says what it really is.
pub const LIBRARY_VERSION: &str = concat!(
    "boltccl ",
    env!("CARGO_PKG_VERSION"),
    " (the subset of the Open MPI ABI that MLX uses, over boltccl; not Open MPI)"
);

/// `MPI_Get_library_version`.
///
/// # Safety
/// `version` must have room for `MPI_MAX_LIBRARY_VERSION_STRING` bytes; `len` must be
/// writable.
#[no_mangle]
pub unsafe extern "C" fn MPI_Get_library_version(version: *mut c_char, len: *mut c_int) -> c_int {
    guarded("MPI_Get_library_version", || {
        if version.is_null() || len.is_null() {
            return Err("NULL argument".into());
        }
        let s = LIBRARY_VERSION.as_bytes();
        const _: () = assert!(LIBRARY_VERSION.len() < abi::MPI_MAX_LIBRARY_VERSION_STRING);
        // SAFETY: room for MPI_MAX_LIBRARY_VERSION_STRING bytes per the contract, more than
        // the string and its NUL; `len` writable.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), version as *mut u8, s.len());
            *version.add(s.len()) = 0;
            *len = s.len() as c_int;
        }
        Ok(())
    })
}

/// `MPI_Init`: forms the world group from the environment, as `boltccl::init()` does (under
/// `boltccl launch`, `mpirun`, `mlx.launch`, torchrun or Slurm). Without a launcher the
/// world is this process alone, as in Open MPI (MLX then uses no backend).
///
/// # Safety
/// The arguments are not read (MPI allows NULL).
#[no_mangle]
pub unsafe extern "C" fn MPI_Init(_argc: *mut c_int, _argv: *mut *mut *mut c_char) -> c_int {
    guarded("MPI_Init", || {
        let mut world = WORLD.write();
        match &*world {
            World::Fresh => {}
            World::Running(_) => return Err("MPI_Init was called twice".into()),
            World::Finalized => return Err("MPI_Init after MPI_Finalize".into()),
        }
        // As the C library does: boltccl's warnings reach stderr (BOLTCCL_LOG filters) unless
        // the process has a `tracing` subscriber of its own.
        boltccl::log_to_stderr();
        let g = boltccl::init().map_err(|e| e.to_string())?;
        SIZE.store(g.size(), Ordering::Relaxed);
        RANK.store(g.rank(), Ordering::Relaxed);
        *world = World::Running(g);
        Ok(())
    })
}

/// `MPI_Finalize`: waits for a call in flight on the world, then leaves the group (its peers
/// are told, so its links closing is not a failure). Communicators from `MPI_Comm_split` keep
/// working until freed: MLX frees them after this call.
#[no_mangle]
pub extern "C" fn MPI_Finalize() -> c_int {
    guarded("MPI_Finalize", || {
        let mut world = WORLD.write();
        match std::mem::replace(&mut *world, World::Finalized) {
            World::Running(g) => {
                drop(g);
                Ok(())
            }
            World::Fresh => Err("MPI_Finalize before MPI_Init".into()),
            World::Finalized => Err("MPI_Finalize was called twice".into()),
        }
    })
}

/// Write `of(group)` for the communicator `comm` to `out`: `MPI_Comm_rank`, `MPI_Comm_size`.
///
/// # Safety
/// `comm` must be a live communicator handle; `out` NULL or writable.
unsafe fn comm_number(call: &str, comm: Handle, out: *mut c_int, of: fn(&Group) -> usize) -> c_int {
    guarded(call, || {
        // SAFETY: per the contract.
        let v = unsafe { on_group(comm, |g| Ok(of(g))) }?;
        if out.is_null() {
            return Err("NULL output pointer".into());
        }
        // SAFETY: non-NULL, writable per the contract.
        unsafe { *out = v as c_int };
        Ok(())
    })
}

/// `MPI_Comm_rank`.
///
/// # Safety
/// `comm` must be a live communicator handle; `rank` writable.
#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_rank(comm: Handle, rank: *mut c_int) -> c_int {
    // SAFETY: the caller's contract is comm_number's.
    unsafe { comm_number("MPI_Comm_rank", comm, rank, Group::rank) }
}

/// `MPI_Comm_size`.
///
/// # Safety
/// `comm` must be a live communicator handle; `size` writable.
#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_size(comm: Handle, size: *mut c_int) -> c_int {
    // SAFETY: the caller's contract is comm_number's.
    unsafe { comm_number("MPI_Comm_size", comm, size, Group::size) }
}

/// `MPI_Comm_split`: `boltccl::Group::split`. Ranks with the same `color` form a group,
/// ordered by `key` then by rank; `MPI_UNDEFINED` joins none and gets `MPI_COMM_NULL`.
///
/// # Safety
/// `comm` must be a live communicator handle; `newcomm` writable.
#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_split(comm: Handle, color: c_int, key: c_int, newcomm: *mut Handle) -> c_int {
    guarded("MPI_Comm_split", || {
        if newcomm.is_null() {
            return Err("NULL newcomm pointer".into());
        }
        let color = match color {
            abi::MPI_UNDEFINED => None,
            c => Some(u32::try_from(c).map_err(|_| format!("color {c}: it must be >= 0 or MPI_UNDEFINED"))?),
        };
        // SAFETY: per the contract.
        let sub = unsafe { on_group(comm, |g| g.split(color, i64::from(key)).map_err(|e| e.to_string())) }?;
        let h = sub.map_or_else(abi::comm_null, SplitComm::into_handle);
        // SAFETY: writable per the contract.
        unsafe { *newcomm = h };
        Ok(())
    })
}

/// `MPI_Comm_free`: releases a communicator from `MPI_Comm_split` and sets `*comm` to
/// `MPI_COMM_NULL`. Allowed after `MPI_Finalize` (MLX frees its split communicators then).
///
/// # Safety
/// `comm` must point to a communicator handle that has not been freed.
#[no_mangle]
pub unsafe extern "C" fn MPI_Comm_free(comm: *mut Handle) -> c_int {
    guarded("MPI_Comm_free", || {
        if comm.is_null() {
            return Err("NULL communicator pointer".into());
        }
        // SAFETY: readable and a live handle per the contract.
        let h = unsafe { *comm };
        // SAFETY: as above.
        match unsafe { abi::comm(h) }? {
            Comm::Split(_) => {
                // SAFETY: a split communicator's handle, freed once: `*comm` is reset below.
                unsafe { SplitComm::free(h) };
                // SAFETY: writable per the contract.
                unsafe { *comm = abi::comm_null() };
                Ok(())
            }
            Comm::World => Err("MPI_COMM_WORLD cannot be freed (MPI_Finalize releases it)".into()),
            Comm::Null => Err("MPI_COMM_NULL cannot be freed".into()),
        }
    })
}

/// `MPI_Allreduce`: in place when `sendbuf` is `MPI_IN_PLACE`. Predefined datatypes with
/// `MPI_SUM`/`MPI_MAX`/`MPI_MIN` run boltccl's reductions; user operations are recognised or
/// folded in rank order (see `reduce`). Every rank gets the same bits.
///
/// # Safety
/// The buffers must hold `count` items of `datatype`; the handles must be live.
#[no_mangle]
pub unsafe extern "C" fn MPI_Allreduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    datatype: Handle,
    op: Handle,
    comm: Handle,
) -> c_int {
    guarded("MPI_Allreduce", || {
        let count = count_arg("count", count)?;
        // SAFETY: live handles per the contract.
        let (ty, opr) = unsafe { (abi::datatype(datatype)?, abi::operation(op)?) };
        committed("MPI_Allreduce", ty)?;
        // SAFETY: `recvbuf` holds `count` items, not accessed elsewhere, per the contract.
        let output = unsafe { bytes_mut(recvbuf, count, ty) }?;
        let input = if sendbuf == abi::MPI_IN_PLACE || std::ptr::eq(sendbuf, recvbuf) {
            None
        } else {
            // SAFETY: `sendbuf` holds `count` items per the contract.
            let input = unsafe { bytes(sendbuf, count, ty) }?;
            disjoint(input, output)?;
            Some(input)
        };
        let plan = reduce::plan(ty, opr).map_err(|e| format!("{e} (datatype {})", ty.name()))?;
        // SAFETY: per the contract.
        unsafe {
            on_group(comm, |g| {
                match plan {
                    reduce::Plan::Native { dtype, op, .. } => g.bytes().all_reduce(op, dtype, input, output),
                    reduce::Plan::Fold(f) => reduce::fold(g, f, datatype, ty.item_bytes(), count, input, output),
                }
                .map_err(|e| e.to_string())
            })
        }
    })
}

/// `MPI_Allgather`: every rank's block, in rank order; in place when `sendbuf` is
/// `MPI_IN_PLACE` (this rank's block is already in `recvbuf`).
///
/// # Safety
/// `sendbuf` must hold `sendcount` items of `sendtype`, `recvbuf` the communicator's size
/// times `recvcount` items of `recvtype`; the handles must be live.
#[no_mangle]
pub unsafe extern "C" fn MPI_Allgather(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: Handle,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: Handle,
    comm: Handle,
) -> c_int {
    guarded("MPI_Allgather", || {
        let recvcount = count_arg("recvcount", recvcount)?;
        // SAFETY: a live handle per the contract.
        let rty = unsafe { abi::datatype(recvtype) }?;
        committed("MPI_Allgather", rty)?;
        // SAFETY: per the contract.
        unsafe {
            on_group(comm, |g| {
                let n = g.size();
                let output = bytes_mut(recvbuf, recvcount * n, rty)?;
                let block = output.len() / n;
                let mine;
                let input: &[u8] = if sendbuf == abi::MPI_IN_PLACE {
                    mine = output[g.rank() * block..][..block].to_vec();
                    &mine
                } else {
                    let sendcount = count_arg("sendcount", sendcount)?;
                    let sty = abi::datatype(sendtype)?;
                    committed("MPI_Allgather", sty)?;
                    let input = bytes(sendbuf, sendcount, sty)?;
                    if input.len() != block {
                        return Err(format!(
                            "sends {sendcount} x {} ({} bytes) but receives {recvcount} x {} ({block} bytes) \
                             per rank: they must be the same size",
                            sty.name(),
                            input.len(),
                            rty.name()
                        ));
                    }
                    disjoint(input, output)?;
                    input
                };
                let (dtype, _) = carried(rty, recvcount);
                g.bytes().all_gather(dtype, input, output).map_err(|e| e.to_string())
            })
        }
    })
}

fn tag_arg(call: &str, tag: c_int, any_ok: bool) -> Result<(), Failure> {
    if tag == 0 || (any_ok && tag == abi::MPI_ANY_TAG) {
        return Ok(());
    }
    Err(format!(
        "{call} with tag {tag}: boltccl's messages between two ranks arrive in order and carry no \
         tag, so the subset takes tag 0 (and MPI_ANY_TAG to receive), as MLX uses"
    ))
}

/// `MPI_Send` (tag 0): blocks until the message is on its way.
///
/// # Safety
/// `buf` must hold `count` items of `datatype`; the handles must be live.
#[no_mangle]
pub unsafe extern "C" fn MPI_Send(
    buf: *const c_void,
    count: c_int,
    datatype: Handle,
    dest: c_int,
    tag: c_int,
    comm: Handle,
) -> c_int {
    guarded("MPI_Send", || {
        tag_arg("MPI_Send", tag, false)?;
        let count = count_arg("count", count)?;
        // SAFETY: live handle, readable buffer, per the contract.
        let ty = unsafe { abi::datatype(datatype) }?;
        committed("MPI_Send", ty)?;
        // SAFETY: as above.
        let data = unsafe { bytes(buf, count, ty) }?;
        let (dtype, _) = carried(ty, count);
        // SAFETY: per the contract.
        unsafe {
            on_group(comm, |g| {
                let dest = rank_arg("dest", dest, g.size())?;
                g.bytes().send(dtype, data, dest).map_err(|e| e.to_string())
            })
        }
    })
}

/// `MPI_Recv` from a named rank, tag 0 or `MPI_ANY_TAG`. The message must be exactly `count`
/// items (a shorter or longer one is a fatal mismatch, never a partial buffer).
///
/// # Safety
/// `buf` must have room for `count` items of `datatype`; `status` must be NULL
/// (`MPI_STATUS_IGNORE`) or writable; the handles must be live.
#[no_mangle]
pub unsafe extern "C" fn MPI_Recv(
    buf: *mut c_void,
    count: c_int,
    datatype: Handle,
    source: c_int,
    tag: c_int,
    comm: Handle,
    status: *mut MpiStatus,
) -> c_int {
    guarded("MPI_Recv", || {
        tag_arg("MPI_Recv", tag, true)?;
        let count = count_arg("count", count)?;
        // SAFETY: live handle, writable buffer, per the contract.
        let ty = unsafe { abi::datatype(datatype) }?;
        committed("MPI_Recv", ty)?;
        // SAFETY: as above.
        let data = unsafe { bytes_mut(buf, count, ty) }?;
        let (dtype, _) = carried(ty, count);
        let len = data.len();
        // SAFETY: per the contract.
        let source = unsafe {
            on_group(comm, |g| {
                let source = rank_arg("source", source, g.size())?;
                g.bytes().recv(dtype, data, source).map_err(|e| e.to_string())?;
                Ok(source)
            })
        }?;
        if !status.is_null() {
            let s = MpiStatus { source: source as c_int, tag: 0, error: abi::MPI_SUCCESS, cancelled: 0, ucount: len };
            // SAFETY: writable per the contract.
            unsafe { status.write(s) };
        }
        Ok(())
    })
}

/// `MPI_Type_contiguous`: `count` consecutive items of `oldtype` (MLX makes its float16 and
/// bfloat16 types as two `MPI_UINT8_T`).
///
/// # Safety
/// `oldtype` must be a live datatype handle; `newtype` writable.
#[no_mangle]
pub unsafe extern "C" fn MPI_Type_contiguous(count: c_int, oldtype: Handle, newtype: *mut Handle) -> c_int {
    guarded("MPI_Type_contiguous", || {
        let count = count_arg("count", count)?;
        if count == 0 {
            return Err("count is 0: a type must have at least one element".into());
        }
        // SAFETY: a live handle per the contract.
        let old = unsafe { abi::datatype(oldtype) }?;
        if newtype.is_null() {
            return Err("NULL newtype pointer".into());
        }
        let h = Datatype::contiguous(old.elem, old.count * count);
        // SAFETY: writable per the contract.
        unsafe { *newtype = h };
        Ok(())
    })
}

/// `MPI_Type_commit`.
///
/// # Safety
/// `datatype` must point to a live datatype handle.
#[no_mangle]
pub unsafe extern "C" fn MPI_Type_commit(datatype: *mut Handle) -> c_int {
    guarded("MPI_Type_commit", || {
        if datatype.is_null() {
            return Err("NULL datatype pointer".into());
        }
        // SAFETY: readable, and a live handle, per the contract.
        unsafe { abi::datatype(*datatype) }?.commit();
        Ok(())
    })
}

/// `MPI_Op_create`: a user reduction (see `reduce` for how it is run).
///
/// # Safety
/// `function` must be a reduction with MPI's signature; `op` writable.
#[no_mangle]
pub unsafe extern "C" fn MPI_Op_create(function: Option<UserFn>, commute: c_int, op: *mut Handle) -> c_int {
    guarded("MPI_Op_create", || {
        let f = function.ok_or("NULL function")?;
        if op.is_null() {
            return Err("NULL op pointer".into());
        }
        // SAFETY: writable per the contract.
        unsafe { *op = Operation::user(f, commute != 0) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi::Elem;

    #[test]
    fn the_version_string_passes_mlx_check_and_says_what_it_is() {
        let mut buf = [0 as c_char; abi::MPI_MAX_LIBRARY_VERSION_STRING];
        let mut len = 0;
        // SAFETY: a buffer of the documented size.
        assert_eq!(unsafe { MPI_Get_library_version(buf.as_mut_ptr(), &mut len) }, 0);
        let s: Vec<u8> = buf[..len as usize].iter().map(|&c| c as u8).collect();
        let s = String::from_utf8(s).unwrap();
        assert!(s.contains("Open MPI"), "{s}");
        assert!(s.starts_with("boltccl ") && s.contains("not Open MPI"), "{s}");
    }

    #[test]
    fn contiguous_types_multiply_and_keep_their_element() {
        let mut t: Handle = std::ptr::null();
        let u8h = &abi::ompi_mpi_uint8_t as *const Datatype as Handle;
        // SAFETY: a predefined handle and a writable out-pointer.
        assert_eq!(unsafe { MPI_Type_contiguous(2, u8h, &mut t) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { MPI_Type_commit(&mut t) }, 0);
        // SAFETY: just made.
        let ty = unsafe { abi::datatype(t) }.unwrap();
        assert_eq!((ty.elem, ty.count, ty.item_bytes()), (Elem::Num(DType::U8), 2, 2));
        assert!(ty.is_committed());
        assert_eq!(ty.name(), "contiguous(2, uint8)");
    }

    #[test]
    fn handles_of_one_kind_are_refused_as_another() {
        let f = &abi::ompi_mpi_float as *const Datatype as Handle;
        let w = &abi::ompi_mpi_comm_world as *const abi::PredefinedComm as Handle;
        // SAFETY: predefined handles.
        unsafe {
            assert!(abi::comm(f).is_err());
            assert!(abi::datatype(w).is_err());
            assert!(abi::operation(f).is_err());
            assert!(abi::datatype(abi::MPI_IN_PLACE as Handle).is_err());
            assert!(abi::datatype(std::ptr::null()).is_err());
        }
    }
}
