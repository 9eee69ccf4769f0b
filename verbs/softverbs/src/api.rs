//! The exported libibverbs C ABI. Every function checks its pointers for NULL, never unwinds
//! into C (panics become an error return), and reports errors the way libibverbs does:
//! `NULL` + `errno` for constructors, an errno value for `int` verbs, `-1` + `errno` for
//! `ibv_query_gid`.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, addr_of_mut, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use verbs_abi::*;

use crate::config::Config;
use crate::counters::{self, softverbs_counters, Kind};
use crate::device::{discover, SoftDevice};
use crate::error::{set_errno, Error};
use crate::objects::{release, reserve, CqInner, CtxInner, MrEntry, Parent, SoftContext, SoftCq, SoftMr, SoftPd};
use crate::qp::{rx_loop, QpInner};
use crate::warn_once;

/// Run `f`; on a panic return `on_panic` (and set errno to EIO).
fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            tracing::error!("softverbs: panic caught at the FFI boundary");
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// Report `e` as a NULL-returning constructor does.
fn null_err<T>(e: Error) -> *mut T {
    tracing::debug!(error = %e, "softverbs: call failed");
    set_errno(e.errno());
    null_mut()
}

/// Report `e` as an `int`-returning verb does.
fn int_err(e: Error) -> c_int {
    tracing::debug!(error = %e, "softverbs: call failed");
    set_errno(e.errno());
    e.errno()
}

fn zeroed<T>() -> T {
    // SAFETY: only used for the plain-data ABI structs (ints, arrays, pointers, pthread
    // objects), for which all-zero is a valid value (zeroed pthread objects are initialized
    // ones on glibc and are never used by this provider).
    unsafe { std::mem::zeroed() }
}

// --- devices -----------------------------------------------------------------------------

/// List the devices: one `rdma_<iface>` per interface with an IPv4 address.
///
/// # Safety
/// `num_devices` must be NULL or point to writable memory for one `int`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    warn_once();
    guard(null_mut(), || {
        let infos = match discover() {
            Ok(v) => v,
            Err(e) => return null_err(Error::Io(e)),
        };
        let mut list: Vec<*mut ibv_device> =
            infos.into_iter().map(|i| Box::into_raw(Box::new(SoftDevice::new(i))) as *mut ibv_device).collect();
        let n = list.len();
        list.push(null_mut());
        if !num_devices.is_null() {
            // SAFETY: the caller passes NULL or a valid int pointer.
            unsafe { *num_devices = n as c_int };
        }
        counters::inc(Kind::DeviceLists);
        Box::into_raw(list.into_boxed_slice()) as *mut *mut ibv_device
    })
}

/// Free a list from [`ibv_get_device_list`]. Contexts opened from it stay valid.
///
/// # Safety
/// `list` must come from `ibv_get_device_list` and not have been freed.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    guard((), || {
        if list.is_null() {
            return;
        }
        let mut n = 0;
        // SAFETY: the list is NULL-terminated (we built it so).
        while !unsafe { *list.add(n) }.is_null() {
            n += 1;
        }
        // SAFETY: rebuilds exactly the boxed slice of n + 1 entries leaked by get_device_list.
        let slice = unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(list, n + 1)) };
        for &d in slice.iter().take(n) {
            // SAFETY: each entry is a leaked Box<SoftDevice> (ibv is its first field).
            drop(unsafe { Box::from_raw(d as *mut SoftDevice) });
        }
        counters::dec(Kind::DeviceLists);
    })
}

/// The device's name (`rdma_<iface>`).
///
/// # Safety
/// `device` must be a device from `ibv_get_device_list` (or a context's `device`).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    if device.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null();
    }
    // SAFETY: device points to a live ibv_device.
    unsafe { (*device).name.as_ptr() }
}

fn ops() -> ibv_context_ops {
    let mut o: ibv_context_ops = zeroed();
    o.poll_cq = Some(op_poll_cq);
    o.req_notify_cq = Some(op_req_notify_cq);
    o.post_send = Some(op_post_send);
    o.post_recv = Some(op_post_recv);
    o.post_srq_recv = Some(op_post_srq_recv);
    o
}

/// Open a device. Reads the `SOFTVERBS_*` configuration from the environment.
///
/// # Safety
/// `device` must be a device from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    warn_once();
    guard(null_mut(), || {
        if device.is_null() {
            return null_err(Error::Invalid("NULL device"));
        }
        // SAFETY: devices we hand out are SoftDevice with ibv first.
        let info = unsafe { &(*(device as *mut SoftDevice)).info }.clone();
        let cfg = match Config::from_env() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("softverbs: {e}");
                return null_err(e);
            }
        };
        let dev = Box::new(SoftDevice::new(info.clone()));
        let ctx = Box::new(SoftContext {
            ibv: ibv_context {
                device: null_mut(),
                ops: ops(),
                cmd_fd: -1,
                async_fd: -1,
                num_comp_vectors: 1,
                mutex: zeroed(),
                abi_compat: null_mut(),
            },
            inner: Arc::new(CtxInner::new(info, cfg)),
            device: dev,
        });
        counters::inc(Kind::Contexts);
        let raw = Box::into_raw(ctx);
        // SAFETY: raw is a fresh, valid allocation; the device box lives as long as it.
        unsafe { (*raw).ibv.device = &mut (*raw).device.ibv as *mut ibv_device };
        raw as *mut ibv_context
    })
}

/// Close a context: stops and joins its receive threads. Objects not destroyed before are
/// leaked (and stay visible in `softverbs_live_objects`).
///
/// # Safety
/// `context` must come from `ibv_open_device` and not have been closed.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    guard(libc::EIO, || {
        if context.is_null() {
            return int_err(Error::Invalid("NULL context"));
        }
        // SAFETY: context is a leaked Box<SoftContext>; dropping it stops its threads.
        drop(unsafe { Box::from_raw(context as *mut SoftContext) });
        0
    })
}

/// # Safety
/// `context` must be a live context.
unsafe fn ctx_of<'a>(context: *mut ibv_context) -> Result<&'a SoftContext, Error> {
    if context.is_null() {
        return Err(Error::Invalid("NULL context"));
    }
    // SAFETY: per the function contract.
    Ok(unsafe { &*(context as *const SoftContext) })
}

/// Device attributes with the active profile's limits.
///
/// # Safety
/// `context` must be live; `attr` must point to a writable `ibv_device_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the function contract.
        let ctx = match unsafe { ctx_of(context) } {
            Ok(c) => c,
            Err(e) => return int_err(e),
        };
        if attr.is_null() {
            return int_err(Error::Invalid("NULL attr"));
        }
        if let Err(e) = ctx.inner.tick() {
            return int_err(e);
        }
        let l = &ctx.inner.cfg.limits;
        let mut a: ibv_device_attr = zeroed();
        for (d, b) in a.fw_ver.iter_mut().zip(b"softverbs-0.1 (test double)".iter()) {
            *d = *b as c_char;
        }
        let o = ctx.inner.dev.ipv4.octets();
        a.node_guid = u64::from_be_bytes([0x02, 0, 0x5e, 0xff, o[0], o[1], o[2], o[3]]).to_be();
        a.sys_image_guid = a.node_guid;
        a.max_mr_size = l.max_msg as u64;
        a.page_size_cap = 4096;
        a.vendor_id = 0x5356;
        a.max_qp = l.max_qp as c_int;
        a.max_qp_wr = l.max_qp_wr as c_int;
        a.max_sge = l.max_sge as c_int;
        a.max_cq = l.max_cq as c_int;
        a.max_cqe = l.max_cqe as c_int;
        a.max_mr = l.max_mr as c_int;
        a.max_pd = l.max_pd as c_int;
        a.atomic_cap = IBV_ATOMIC_NONE;
        a.max_pkeys = 1;
        a.phys_port_cnt = 1;
        // SAFETY: attr is non-null and writable per the contract.
        unsafe { attr.write(a) };
        0
    })
}

/// Port attributes. Fills only the legacy prefix (up to `link_layer`) that the exported
/// libibverbs symbol fills; the header's inline wrapper zeroes the struct first.
///
/// # Safety
/// `context` must be live; `port_attr` must point to a writable (compat) `ibv_port_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(context: *mut ibv_context, port_num: u8, port_attr: *mut c_void) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the function contract.
        let ctx = match unsafe { ctx_of(context) } {
            Ok(c) => c,
            Err(e) => return int_err(e),
        };
        if port_attr.is_null() || port_num != 1 {
            return int_err(Error::Invalid("port_num must be 1"));
        }
        if let Err(e) = ctx.inner.tick() {
            return int_err(e);
        }
        let l = &ctx.inner.cfg.limits;
        let p = port_attr as *mut ibv_port_attr;
        // SAFETY: p is writable for the compat prefix; each field is written in place.
        unsafe {
            addr_of_mut!((*p).state).write(IBV_PORT_ACTIVE);
            addr_of_mut!((*p).max_mtu).write(l.mtu);
            addr_of_mut!((*p).active_mtu).write(l.mtu);
            addr_of_mut!((*p).gid_tbl_len).write(2);
            addr_of_mut!((*p).port_cap_flags).write(1 << 26); // IBV_PORT_IP_BASED_GIDS
            addr_of_mut!((*p).max_msg_sz).write(l.max_msg);
            addr_of_mut!((*p).bad_pkey_cntr).write(0);
            addr_of_mut!((*p).qkey_viol_cntr).write(0);
            addr_of_mut!((*p).pkey_tbl_len).write(1);
            addr_of_mut!((*p).lid).write(0);
            addr_of_mut!((*p).sm_lid).write(0);
            addr_of_mut!((*p).lmc).write(0);
            addr_of_mut!((*p).max_vl_num).write(1);
            addr_of_mut!((*p).sm_sl).write(0);
            addr_of_mut!((*p).subnet_timeout).write(0);
            addr_of_mut!((*p).init_type_reply).write(0);
            addr_of_mut!((*p).active_width).write(1);
            addr_of_mut!((*p).active_speed).write(1);
            addr_of_mut!((*p).phys_state).write(5); // LinkUp
            addr_of_mut!((*p).link_layer).write(IBV_LINK_LAYER_ETHERNET);
        }
        0
    })
}

/// GID table entry: index 0 link-local, index 1 IPv4-mapped. Returns 0, or -1 with errno.
///
/// # Safety
/// `context` must be live; `gid` must point to a writable `ibv_gid`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the function contract.
        let ctx = match unsafe { ctx_of(context) } {
            Ok(c) => c,
            Err(e) => {
                int_err(e);
                return -1;
            }
        };
        if gid.is_null() || port_num != 1 || !(0..2).contains(&index) {
            int_err(Error::Invalid("bad port, index or gid pointer"));
            return -1;
        }
        if let Err(e) = ctx.inner.tick() {
            int_err(e);
            return -1;
        }
        // SAFETY: gid is non-null and writable per the contract.
        unsafe { gid.write(ctx.inner.dev.gids()[index as usize]) };
        0
    })
}

/// `ibv_wc_status_str`: a static description of a completion status.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_uint) -> *const c_char {
    let s: &'static [u8] = match status {
        IBV_WC_SUCCESS => b"success\0",
        IBV_WC_LOC_LEN_ERR => b"local length error\0",
        IBV_WC_LOC_QP_OP_ERR => b"local QP operation error\0",
        IBV_WC_LOC_PROT_ERR => b"local protection error\0",
        IBV_WC_WR_FLUSH_ERR => b"Work Request Flushed Error\0",
        IBV_WC_FATAL_ERR => b"fatal error\0",
        IBV_WC_GENERAL_ERR => b"general error\0",
        _ => b"unknown\0",
    };
    s.as_ptr() as *const c_char
}

// --- PD and MR ---------------------------------------------------------------------------

/// Allocate a protection domain.
///
/// # Safety
/// `context` must be live.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(null_mut(), || {
        // SAFETY: per the function contract.
        let ctx = match unsafe { ctx_of(context) } {
            Ok(c) => c,
            Err(e) => return null_err(e),
        };
        if let Err(e) = ctx.inner.tick() {
            return null_err(e);
        }
        let pd = Box::new(SoftPd {
            ibv: ibv_pd { context, handle: ctx.inner.handle() },
            ctx: ctx.inner.clone(),
            users: AtomicUsize::new(0),
        });
        counters::inc(Kind::Pds);
        Box::into_raw(pd) as *mut ibv_pd
    })
}

/// Free a PD or CQ: `EINVAL` for NULL, `EBUSY` while children still use it.
///
/// # Safety
/// `obj` is NULL or a leaked `Box<T>` not freed yet.
unsafe fn free_unused<T: Parent>(obj: *mut T) -> c_int {
    // SAFETY: NULL or live, per the contract.
    let Some(live) = (unsafe { obj.as_ref() }) else {
        return int_err(Error::Invalid(T::NULL));
    };
    if live.users().load(Ordering::SeqCst) != 0 {
        return int_err(Error::Busy(T::BUSY));
    }
    // SAFETY: a leaked Box<T>, freed once here.
    drop(unsafe { Box::from_raw(obj) });
    counters::dec(T::KIND);
    0
}

/// Free a protection domain; `EBUSY` while MRs or QPs use it.
///
/// # Safety
/// `pd` must come from `ibv_alloc_pd` and not have been freed.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: the caller's contract: NULL, or a live SoftPd behind its ibv_pd.
    guard(libc::EIO, || unsafe { free_unused(pd as *mut SoftPd) })
}

fn reg_mr_impl(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_uint) -> *mut ibv_mr {
    if pd.is_null() {
        return null_err(Error::Invalid("NULL pd"));
    }
    // SAFETY: pd is a live SoftPd per the caller's contract.
    let soft_pd = unsafe { &*(pd as *const SoftPd) };
    let ctx = &soft_pd.ctx;
    if let Err(e) = ctx.tick() {
        return null_err(e);
    }
    if addr.is_null() || length == 0 {
        return null_err(Error::Invalid("NULL address or zero length"));
    }
    let remote = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    if access & remote != 0 && access & IBV_ACCESS_LOCAL_WRITE == 0 {
        return null_err(Error::Invalid("remote write/atomic needs LOCAL_WRITE"));
    }
    let dev = ctx.dev.name();
    if let Err(e) = reserve(&dev, false, ctx.cfg.limits.max_mr) {
        return null_err(e);
    }
    let h = ctx.handle();
    let key = (h << 8) | 0x5a;
    ctx.mrs
        .lock()
        .insert(key, MrEntry { addr: addr as u64, len: length as u64, pd_handle: soft_pd.ibv.handle, access });
    soft_pd.users.fetch_add(1, Ordering::SeqCst);
    let mr = Box::new(SoftMr {
        ibv: ibv_mr { context: soft_pd.ibv.context, pd, addr, length, handle: h, lkey: key, rkey: key },
        ctx: ctx.clone(),
        pd: soft_pd as *const SoftPd,
    });
    counters::inc(Kind::Mrs);
    Box::into_raw(mr) as *mut ibv_mr
}

/// Register a memory region (the symbol the header's `ibv_reg_mr` macro calls).
///
/// # Safety
/// `pd` must be live; `[addr, addr+length)` must stay valid until `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
    guard(null_mut(), || reg_mr_impl(pd, addr, length, access as c_uint))
}

/// Register a memory region with an IOVA (used by the header's `ibv_reg_mr` macro for
/// optional access flags). Only `iova == addr` is supported.
///
/// # Safety
/// As [`ibv_reg_mr`].
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(null_mut(), || {
        if iova != addr as u64 {
            return null_err(Error::NotSupported("iova different from addr"));
        }
        reg_mr_impl(pd, addr, length, access)
    })
}

/// Deregister a memory region.
///
/// # Safety
/// `mr` must come from `ibv_reg_mr` and not have been deregistered.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        if mr.is_null() {
            return int_err(Error::Invalid("NULL mr"));
        }
        // SAFETY: mr is a leaked Box<SoftMr>, freed once here.
        let mr = unsafe { Box::from_raw(mr as *mut SoftMr) };
        mr.ctx.mrs.lock().remove(&mr.ibv.lkey);
        release(&mr.ctx.dev.name(), false);
        // SAFETY: the PD cannot be freed while this MR counts as its user.
        unsafe { (*mr.pd).users.fetch_sub(1, Ordering::SeqCst) };
        counters::dec(Kind::Mrs);
        0
    })
}

// --- CQ ----------------------------------------------------------------------------------

/// Create a completion queue. Completion channels are not supported (`EOPNOTSUPP`).
///
/// # Safety
/// `context` must be live.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard(null_mut(), || {
        // SAFETY: per the function contract.
        let ctx = match unsafe { ctx_of(context) } {
            Ok(c) => c,
            Err(e) => return null_err(e),
        };
        if let Err(e) = ctx.inner.tick() {
            return null_err(e);
        }
        if cqe < 1 || cqe as u32 > ctx.inner.cfg.limits.max_cqe {
            return null_err(Error::Invalid("cqe out of range"));
        }
        if !channel.is_null() {
            return null_err(Error::NotSupported("completion channels"));
        }
        if comp_vector != 0 {
            return null_err(Error::Invalid("comp_vector must be 0"));
        }
        let cq = Box::new(SoftCq {
            ibv: ibv_cq {
                context,
                channel: null_mut(),
                cq_context,
                handle: ctx.inner.handle(),
                cqe,
                mutex: zeroed(),
                cond: zeroed(),
                comp_events_completed: 0,
                async_events_completed: 0,
            },
            inner: Arc::new(CqInner::new(cqe as usize)),
            ctx: ctx.inner.clone(),
            users: AtomicUsize::new(0),
        });
        counters::inc(Kind::Cqs);
        Box::into_raw(cq) as *mut ibv_cq
    })
}

/// Destroy a completion queue; `EBUSY` while a QP uses it.
///
/// # Safety
/// `cq` must come from `ibv_create_cq` and not have been destroyed.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: the caller's contract: NULL, or a live SoftCq behind its ibv_cq.
    guard(libc::EIO, || unsafe { free_unused(cq as *mut SoftCq) })
}

unsafe extern "C" fn op_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        if cq.is_null() || (wc.is_null() && num_entries > 0) {
            return -libc::EINVAL;
        }
        if num_entries <= 0 {
            return 0;
        }
        // SAFETY: cq is a live SoftCq; wc holds num_entries entries (caller's contract).
        let (soft, out) =
            unsafe { (&*(cq as *const SoftCq), std::slice::from_raw_parts_mut(wc, num_entries as usize)) };
        match soft.inner.poll(out) {
            Ok(n) => n as c_int,
            Err(()) => -1,
        }
    })
}

unsafe extern "C" fn op_req_notify_cq(_cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    libc::EOPNOTSUPP
}

unsafe extern "C" fn op_post_srq_recv(_srq: *mut c_void, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    if !bad_wr.is_null() {
        // SAFETY: bad_wr is a valid out pointer per the verbs contract.
        unsafe { *bad_wr = wr };
    }
    libc::EOPNOTSUPP
}

// --- QP ----------------------------------------------------------------------------------

/// `struct ibv_qp` plus provider state.
#[repr(C)]
pub(crate) struct SoftQp {
    pub ibv: ibv_qp,
    pub inner: Arc<QpInner>,
    pub pd: *const SoftPd,
    pub send_cq: *const SoftCq,
    pub recv_cq: *const SoftCq,
}

/// Create a UC queue pair bound to a UDP port of the device's IPv4 address (`qp_num` is
/// the port). Any other type fails with `EOPNOTSUPP` (Apple returns 102, its EOPNOTSUPP);
/// the QP beyond the device limit fails with `EBUSY`.
///
/// # Safety
/// `pd` must be live; `attr` must point to a valid `ibv_qp_init_attr` whose CQs are live.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    guard(null_mut(), || {
        if pd.is_null() || attr.is_null() {
            return null_err(Error::Invalid("NULL pd or attr"));
        }
        // SAFETY: pd is a live SoftPd and attr a valid init attr per the contract.
        let (soft_pd, a) = unsafe { (&*(pd as *const SoftPd), &mut *attr) };
        let ctx = soft_pd.ctx.clone();
        if let Err(e) = ctx.tick() {
            return null_err(e);
        }
        if a.qp_type != IBV_QPT_UC {
            return null_err(Error::NotSupported("only UC queue pairs are supported"));
        }
        if a.send_cq.is_null() || a.recv_cq.is_null() {
            return null_err(Error::Invalid("send_cq and recv_cq are required"));
        }
        if !a.srq.is_null() {
            return null_err(Error::NotSupported("shared receive queues"));
        }
        let l = &ctx.cfg.limits;
        let c = a.cap;
        if c.max_send_wr > l.max_qp_wr
            || c.max_recv_wr > l.max_qp_wr
            || c.max_send_sge > l.max_sge
            || c.max_recv_sge > l.max_sge
            || c.max_inline_data > l.max_inline
        {
            return null_err(Error::Invalid("cap above the device limits"));
        }
        // SAFETY: the CQs are live SoftCqs per the contract.
        let (scq, rcq) = unsafe { (&*(a.send_cq as *const SoftCq), &*(a.recv_cq as *const SoftCq)) };
        if !Arc::ptr_eq(&scq.ctx, &ctx) || !Arc::ptr_eq(&rcq.ctx, &ctx) {
            return null_err(Error::Invalid("CQ belongs to another context"));
        }
        let dev = ctx.dev.name();
        if let Err(e) = reserve(&dev, true, l.max_qp) {
            return null_err(e);
        }
        let (sock, qpn) = match QpInner::bind(&ctx) {
            Ok(v) => v,
            Err(e) => {
                release(&dev, true);
                return null_err(e);
            }
        };
        let cap = ibv_qp_cap {
            max_send_wr: c.max_send_wr.max(1),
            max_recv_wr: c.max_recv_wr.max(1),
            max_send_sge: c.max_send_sge.max(1),
            max_recv_sge: c.max_recv_sge.max(1),
            max_inline_data: c.max_inline_data,
        };
        a.cap = cap;
        let inner = Arc::new(QpInner::new(
            ctx.clone(),
            sock,
            qpn,
            soft_pd.ibv.handle,
            scq.inner.clone(),
            rcq.inner.clone(),
            a.sq_sig_all != 0,
            cap,
        ));
        let thread_qp = inner.clone();
        counters::inc(Kind::RxThreads);
        let handle =
            match std::thread::Builder::new().name(format!("softverbs-rx-{qpn}")).spawn(move || rx_loop(thread_qp)) {
                Ok(h) => h,
                Err(e) => {
                    counters::dec(Kind::RxThreads);
                    release(&dev, true);
                    return null_err(Error::Io(e));
                }
            };
        ctx.threads.lock().insert(qpn, handle);
        ctx.qps.lock().push(Arc::downgrade(&inner));
        soft_pd.users.fetch_add(1, Ordering::SeqCst);
        scq.users.fetch_add(1, Ordering::SeqCst);
        rcq.users.fetch_add(1, Ordering::SeqCst);
        let qp = Box::new(SoftQp {
            ibv: ibv_qp {
                context: soft_pd.ibv.context,
                qp_context: a.qp_context,
                pd,
                send_cq: a.send_cq,
                recv_cq: a.recv_cq,
                srq: null_mut(),
                handle: qpn,
                qp_num: qpn,
                state: IBV_QPS_RESET,
                qp_type: IBV_QPT_UC,
                mutex: zeroed(),
                cond: zeroed(),
                events_completed: 0,
            },
            inner,
            pd: soft_pd as *const SoftPd,
            send_cq: scq as *const SoftCq,
            recv_cq: rcq as *const SoftCq,
        });
        counters::inc(Kind::Qps);
        Box::into_raw(qp) as *mut ibv_qp
    })
}

/// Destroy a queue pair: stops and joins its receive thread.
///
/// # Safety
/// `qp` must come from `ibv_create_qp` and not have been destroyed.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        if qp.is_null() {
            return int_err(Error::Invalid("NULL qp"));
        }
        // SAFETY: qp is a leaked Box<SoftQp>, freed once here.
        let qp = unsafe { Box::from_raw(qp as *mut SoftQp) };
        let inner = &qp.inner;
        inner.stop.store(true, Ordering::SeqCst);
        let handle = inner.ctx.threads.lock().remove(&inner.qpn);
        if let Some(h) = handle {
            let _ = h.join();
        }
        inner.ctx.qps.lock().retain(|w| w.upgrade().is_some_and(|q| !Arc::ptr_eq(&q, inner)));
        release(&inner.ctx.dev.name(), true);
        // SAFETY: PD and CQs cannot be freed while this QP counts as their user.
        unsafe {
            (*qp.pd).users.fetch_sub(1, Ordering::SeqCst);
            (*qp.send_cq).users.fetch_sub(1, Ordering::SeqCst);
            (*qp.recv_cq).users.fetch_sub(1, Ordering::SeqCst);
        }
        counters::dec(Kind::Qps);
        0
    })
}

/// Modify a queue pair: RESET→INIT→RTR→RTS (and →RESET/→ERR) with the UC attribute masks.
/// RTR needs a GRH whose `sgid_index` names an IPv4-mapped GID (index 1), else `EINVAL`.
///
/// # Safety
/// `qp` must be live; `attr` must point to a valid `ibv_qp_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int {
    guard(libc::EIO, || {
        if qp.is_null() || attr.is_null() {
            return int_err(Error::Invalid("NULL qp or attr"));
        }
        // SAFETY: qp is a live SoftQp; attr is valid per the contract. Only shared
        // references are formed (other threads may be posting on this QP).
        let (soft, a) = unsafe { (&*(qp as *const SoftQp), &*attr) };
        match soft.inner.modify(a, attr_mask) {
            Ok(state) => {
                // SAFETY: writes the ABI-visible state field in place, as libibverbs does.
                unsafe { addr_of_mut!((*qp).state).write(state) };
                0
            }
            Err(e) => int_err(e),
        }
    })
}

unsafe extern "C" fn op_post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    guard(libc::EIO, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: qp is a live SoftQp.
        let soft = unsafe { &*(qp as *const SoftQp) };
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: cur is a valid WR of the caller's NULL-terminated list.
            let w = unsafe { &*cur };
            if let Err(e) = soft.inner.post_send_one(w) {
                if !bad_wr.is_null() {
                    // SAFETY: bad_wr is a valid out pointer.
                    unsafe { *bad_wr = cur };
                }
                return int_err(e);
            }
            cur = w.next;
        }
        0
    })
}

unsafe extern "C" fn op_post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    guard(libc::EIO, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: qp is a live SoftQp.
        let soft = unsafe { &*(qp as *const SoftQp) };
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: cur is a valid WR of the caller's NULL-terminated list.
            let w = unsafe { &*cur };
            if let Err(e) = soft.inner.post_recv_one(w) {
                if !bad_wr.is_null() {
                    // SAFETY: bad_wr is a valid out pointer.
                    unsafe { *bad_wr = cur };
                }
                return int_err(e);
            }
            cur = w.next;
        }
        0
    })
}

// --- extras ------------------------------------------------------------------------------

/// Fill `*out` with the live object counts. Returns 0, or `EINVAL` when `out` is NULL.
///
/// # Safety
/// `out` must be NULL or point to a writable `struct softverbs_counters`.
#[no_mangle]
pub unsafe extern "C" fn softverbs_live_objects(out: *mut softverbs_counters) -> c_int {
    if out.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: out is non-null and writable per the contract.
    unsafe { out.write(counters::live_objects()) };
    0
}
