//! Safe owners of verbs objects.
//!
//! Each object holds an `Arc` of its parent's inner state, so a parent cannot be destroyed
//! before its children whatever order the owners are dropped in — on success, on error
//! half-way through set-up, and on panic. `Drop` of each owner releases its object; the
//! fields (the parents) are dropped after it. This is what JACCL lacks: a failed init there
//! leaks its protection domain, and after about 60 the provider refuses new ones.

use super::errors::{verb_error, Verb};
use super::loader::Verbs;
use crate::error::Result;
use libc::c_int;
use std::ptr::NonNull;
use std::sync::Arc;
use verbs_abi::*;

/// The positive errno of the last failed call.
fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().filter(|&e| e > 0).unwrap_or(libc::EIO)
}

/// An `int`-returning verb's result as an errno (they return the errno, some return -1).
fn ret_errno(r: c_int) -> i32 {
    if r > 0 {
        r
    } else {
        last_errno()
    }
}

struct CtxInner {
    verbs: Arc<Verbs>,
    ptr: NonNull<ibv_context>,
    name: String,
}

// SAFETY: verbs contexts may be used from any thread (libibverbs is thread-safe); boltccl
// uses each from one thread at a time anyway.
unsafe impl Send for CtxInner {}
// SAFETY: as above.
unsafe impl Sync for CtxInner {}

impl Drop for CtxInner {
    fn drop(&mut self) {
        // SAFETY: the context was opened by open_device; every child holds an Arc of this,
        // so all of them are gone.
        let r = unsafe { (self.verbs.close_device)(self.ptr.as_ptr()) };
        if r != 0 {
            tracing::warn!(device = %self.name, errno = ret_errno(r), "ibv_close_device failed");
        }
    }
}

/// An open device.
#[derive(Clone)]
pub struct Context(Arc<CtxInner>);

impl Context {
    /// Open the device called `name`.
    pub fn open(verbs: &Arc<Verbs>, name: &str) -> Result<Context> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer; the list is freed below on every path.
        let list = unsafe { (verbs.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(verb_error(Verb::OpenDevice, name, None, last_errno()));
        }
        let mut found = None;
        let mut names = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` valid device pointers until it is freed.
            let dev = unsafe { *list.add(i) };
            // SAFETY: `dev` is a valid device; the name is a NUL-terminated string it owns.
            let dn = unsafe { std::ffi::CStr::from_ptr((verbs.get_device_name)(dev)) }.to_string_lossy().into_owned();
            if dn == name {
                found = Some(dev);
            }
            names.push(dn);
        }
        // SAFETY: open_device on a listed device; a context stays valid after the list is freed.
        let ctx = found.map(|dev| unsafe { (verbs.open_device)(dev) });
        let errno = last_errno();
        // SAFETY: freed once, after the last use of its entries.
        unsafe { (verbs.free_device_list)(list) };
        match ctx {
            None => Err(crate::Error::Unsupported(format!(
                "RDMA device {name} not found (this node has: {}); fix the device matrix (BOLTCCL_IBV_DEVICES) or \
                 check the cable with `boltccl doctor`",
                if names.is_empty() { "none".to_string() } else { names.join(", ") }
            ))),
            Some(p) => match NonNull::new(p) {
                None => Err(verb_error(Verb::OpenDevice, name, None, errno)),
                Some(ptr) => Ok(Context(Arc::new(CtxInner { verbs: verbs.clone(), ptr, name: name.to_string() }))),
            },
        }
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Port attributes (the legacy prefix the exported symbol fills; the rest stays zero).
    pub fn query_port(&self, port: u8) -> Result<ibv_port_attr> {
        let mut attr = ibv_port_attr::default();
        // SAFETY: valid context and a zeroed full-size struct (the symbol fills a prefix).
        let r = unsafe { (self.0.verbs.query_port)(self.0.ptr.as_ptr(), port, &mut attr) };
        if r != 0 {
            return Err(verb_error(Verb::Query, &self.0.name, None, ret_errno(r)));
        }
        Ok(attr)
    }

    /// GID `index` of `port`.
    pub fn query_gid(&self, port: u8, index: i32) -> Result<ibv_gid> {
        let mut gid = ibv_gid::default();
        // SAFETY: valid context and out-pointer.
        let r = unsafe { (self.0.verbs.query_gid)(self.0.ptr.as_ptr(), port, index, &mut gid) };
        if r != 0 {
            return Err(verb_error(Verb::Query, &self.0.name, None, ret_errno(r)));
        }
        Ok(gid)
    }

    /// Device attributes, when the library exports `ibv_query_device`.
    pub fn query_device(&self) -> Option<ibv_device_attr> {
        let f = self.0.verbs.query_device?;
        // SAFETY: plain C struct; all-zero is a valid value.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out-pointer of the header's layout.
        (unsafe { f(self.0.ptr.as_ptr(), &mut attr) } == 0).then_some(attr)
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        // SAFETY: valid context.
        let p = unsafe { (self.0.verbs.alloc_pd)(self.0.ptr.as_ptr()) };
        let ptr = NonNull::new(p).ok_or_else(|| verb_error(Verb::AllocPd, &self.0.name, None, last_errno()))?;
        Ok(ProtectionDomain(Arc::new(PdInner { ctx: self.0.clone(), ptr })))
    }

    /// Create a completion queue of `cqe` entries (no channel: boltccl polls).
    pub fn create_cq(&self, cqe: i32) -> Result<CompletionQueue> {
        // SAFETY: valid context; no channel, vector 0.
        let p = unsafe {
            (self.0.verbs.create_cq)(self.0.ptr.as_ptr(), cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0)
        };
        let ptr = NonNull::new(p).ok_or_else(|| verb_error(Verb::CreateCq, &self.0.name, None, last_errno()))?;
        Ok(CompletionQueue(Arc::new(CqInner { ctx: self.0.clone(), ptr })))
    }
}

struct PdInner {
    ctx: Arc<CtxInner>,
    ptr: NonNull<ibv_pd>,
}
// SAFETY: see CtxInner.
unsafe impl Send for PdInner {}
// SAFETY: see CtxInner.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated by alloc_pd; its QPs and MRs hold Arcs of this, so are gone.
        let r = unsafe { (self.ctx.verbs.dealloc_pd)(self.ptr.as_ptr()) };
        if r != 0 {
            tracing::warn!(device = %self.ctx.name, errno = ret_errno(r), "ibv_dealloc_pd failed");
        }
    }
}

/// A protection domain.
#[derive(Clone)]
pub struct ProtectionDomain(Arc<PdInner>);

impl ProtectionDomain {
    /// Register `len` bytes of fresh, zeroed, page-aligned memory for local write (receives
    /// land in it) and sends.
    pub fn alloc_registered(&self, len: usize) -> Result<MemoryRegion> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| crate::Error::Internal(format!("staging layout: {e}")))?;
        // SAFETY: non-zero size.
        let mem = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| crate::Error::Internal(format!("cannot allocate {len} bytes of staging memory")))?;
        let access = (IBV_ACCESS_LOCAL_WRITE) as c_int;
        // SAFETY: `mem` is `len` valid bytes that live until after dereg (MemoryRegion::drop).
        let mr = unsafe { (self.0.ctx.verbs.reg_mr)(self.0.ptr.as_ptr(), mem.as_ptr().cast(), len, access) };
        match NonNull::new(mr) {
            Some(mr) => Ok(MemoryRegion { mr, mem, layout, pd: self.0.clone() }),
            None => {
                let errno = last_errno();
                // SAFETY: allocated above with this layout, never registered.
                unsafe { std::alloc::dealloc(mem.as_ptr(), layout) };
                Err(verb_error(Verb::RegMr, &self.0.ctx.name, None, errno))
            }
        }
    }

    /// Register `len` bytes of caller memory at `addr` for sends (the device only reads it).
    ///
    /// # Safety
    /// The memory must stay allocated, and must not be written while a send posted from it is
    /// in flight, until the region is dropped or its last send has completed.
    pub unsafe fn register_user(&self, addr: *const u8, len: usize) -> Result<UserRegion> {
        // SAFETY: the caller keeps `len` bytes at `addr` allocated (see above); access 0 = local
        // read only, which is all a send needs.
        let mr = unsafe { (self.0.ctx.verbs.reg_mr)(self.0.ptr.as_ptr(), addr as *mut libc::c_void, len, 0) };
        match NonNull::new(mr) {
            Some(mr) => Ok(UserRegion { mr, start: addr as usize, len, pd: self.0.clone() }),
            None => Err(verb_error(Verb::RegMr, &self.0.ctx.name, None, last_errno())),
        }
    }

    /// Create a UC queue pair on `cq` (send and receive side) with the given depths.
    pub fn create_uc_qp(&self, cq: &CompletionQueue, send_wr: u32, recv_wr: u32) -> Result<QueuePair> {
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.0.ptr.as_ptr(),
            recv_cq: cq.0.ptr.as_ptr(),
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: send_wr,
                max_recv_wr: recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_UC,
            sq_sig_all: 0,
        };
        // SAFETY: valid PD and CQ of the same context; init attributes fully initialised.
        let p = unsafe { (self.0.ctx.verbs.create_qp)(self.0.ptr.as_ptr(), &mut init) };
        let ptr = NonNull::new(p).ok_or_else(|| verb_error(Verb::CreateQp, &self.0.ctx.name, None, last_errno()))?;
        Ok(QueuePair { ptr, _pd: self.0.clone(), cq: cq.0.clone() })
    }
}

struct CqInner {
    ctx: Arc<CtxInner>,
    ptr: NonNull<ibv_cq>,
}
// SAFETY: see CtxInner.
unsafe impl Send for CqInner {}
// SAFETY: see CtxInner.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: created by create_cq; QPs using it hold Arcs of this, so are gone.
        let r = unsafe { (self.ctx.verbs.destroy_cq)(self.ptr.as_ptr()) };
        if r != 0 {
            tracing::warn!(device = %self.ctx.name, errno = ret_errno(r), "ibv_destroy_cq failed");
        }
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct CompletionQueue(Arc<CqInner>);

impl CompletionQueue {
    /// Poll up to `wc.len()` completions through the context's ops table, exactly as the
    /// header's inline `ibv_poll_cq` does. Returns how many were filled.
    pub fn poll(&self, wc: &mut [ibv_wc]) -> Result<usize> {
        // SAFETY: the context outlives this CQ (Arc); reading its ops table is what the C
        // header's inline function does.
        let f = unsafe { (*self.0.ctx.ptr.as_ptr()).ops.poll_cq };
        let f = f.ok_or_else(|| verb_error(Verb::PollCq, &self.0.ctx.name, None, libc::ENOSYS))?;
        // SAFETY: valid CQ; `wc` has room for the count passed.
        let n = unsafe { f(self.0.ptr.as_ptr(), wc.len() as c_int, wc.as_mut_ptr()) };
        if n < 0 {
            return Err(verb_error(Verb::PollCq, &self.0.ctx.name, None, libc::EIO));
        }
        Ok(n as usize)
    }
}

/// A queue pair. Dropping it destroys it before its PD and CQ can go.
pub struct QueuePair {
    ptr: NonNull<ibv_qp>,
    _pd: Arc<PdInner>,
    cq: Arc<CqInner>,
}
// SAFETY: see CtxInner.
unsafe impl Send for QueuePair {}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created by create_qp, destroyed once; the fields keep PD and CQ alive.
        let r = unsafe { (self.cq.ctx.verbs.destroy_qp)(self.ptr.as_ptr()) };
        if r != 0 {
            tracing::warn!(device = %self.cq.ctx.name, errno = ret_errno(r), "ibv_destroy_qp failed");
        }
    }
}

impl QueuePair {
    /// The queue pair number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: valid QP; qp_num is set by the provider at creation.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }

    fn device(&self) -> &str {
        &self.cq.ctx.name
    }

    /// `ibv_modify_qp`; a failure is reported as `verb` failing.
    pub fn modify(&self, attr: &mut ibv_qp_attr, mask: c_int, verb: Verb, peer: usize) -> Result<()> {
        // SAFETY: valid QP; attr fully initialised.
        let r = unsafe { (self.cq.ctx.verbs.modify_qp)(self.ptr.as_ptr(), attr, mask) };
        if r != 0 {
            return Err(verb_error(verb, self.device(), Some(peer), ret_errno(r)));
        }
        Ok(())
    }

    /// Post one signalled send-with-immediate of `len` bytes at `offset` of `mr`.
    pub fn post_send(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        wr_id: u64,
        imm: u32,
        peer: usize,
    ) -> Result<()> {
        assert!(offset + len <= mr.len(), "send outside the staging buffer");
        let sge = ibv_sge { addr: mr.addr() as u64 + offset as u64, length: len as u32, lkey: mr.lkey() };
        self.post(sge, wr_id, imm, peer)
    }

    /// Post one signalled send-with-immediate of the `len` bytes at `addr`, inside `region`.
    ///
    /// # Safety
    /// The bytes must stay allocated and unwritten until the send's completion is polled.
    pub unsafe fn post_send_user(
        &self,
        region: &UserRegion,
        addr: usize,
        len: usize,
        wr_id: u64,
        imm: u32,
        peer: usize,
    ) -> Result<()> {
        assert!(region.contains(addr, len), "send outside the registered region");
        let sge = ibv_sge { addr: addr as u64, length: len as u32, lkey: region.lkey() };
        self.post(sge, wr_id, imm, peer)
    }

    fn post(&self, mut sge: ibv_sge, wr_id: u64, imm: u32, peer: usize) -> Result<()> {
        let mut wr = ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: IBV_WR_SEND_WITH_IMM,
            send_flags: IBV_SEND_SIGNALED,
            imm_data: imm.to_be(),
            ..Default::default()
        };
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the context outlives the QP; the ops table is the header's dispatch path.
        let f = unsafe { (*self.cq.ctx.ptr.as_ptr()).ops.post_send }
            .ok_or_else(|| verb_error(Verb::PostSend, self.device(), Some(peer), libc::ENOSYS))?;
        // SAFETY: valid QP, WR and SGE on the stack for the call; the buffer is registered and
        // stays untouched until the send completes (the caller's slot accounting).
        let r = unsafe { f(self.ptr.as_ptr(), &mut wr, &mut bad) };
        if r != 0 {
            return Err(verb_error(Verb::PostSend, self.device(), Some(peer), ret_errno(r)));
        }
        Ok(())
    }

    /// Post one receive of `len` bytes at `offset` of `mr`.
    pub fn post_recv(&self, mr: &MemoryRegion, offset: usize, len: usize, wr_id: u64, peer: usize) -> Result<()> {
        assert!(offset + len <= mr.len(), "receive outside the staging buffer");
        let mut sge = ibv_sge { addr: mr.addr() as u64 + offset as u64, length: len as u32, lkey: mr.lkey() };
        let mut wr = ibv_recv_wr { wr_id, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: as in post_send.
        let f = unsafe { (*self.cq.ctx.ptr.as_ptr()).ops.post_recv }
            .ok_or_else(|| verb_error(Verb::PostRecv, self.device(), Some(peer), libc::ENOSYS))?;
        // SAFETY: valid QP, WR and SGE; the slot is not read until its completion arrives.
        let r = unsafe { f(self.ptr.as_ptr(), &mut wr, &mut bad) };
        if r != 0 {
            return Err(verb_error(Verb::PostRecv, self.device(), Some(peer), ret_errno(r)));
        }
        Ok(())
    }
}

/// A registration of caller memory (zero-copy sends). Dropping it deregisters; the memory
/// stays the caller's.
pub struct UserRegion {
    mr: NonNull<ibv_mr>,
    start: usize,
    len: usize,
    pd: Arc<PdInner>,
}
// SAFETY: see CtxInner; the region only names memory, it never touches it.
unsafe impl Send for UserRegion {}

impl Drop for UserRegion {
    fn drop(&mut self) {
        // SAFETY: registered by reg_mr and deregistered once; the owner frees the memory.
        let r = unsafe { (self.pd.ctx.verbs.dereg_mr)(self.mr.as_ptr()) };
        if r != 0 {
            tracing::warn!(device = %self.pd.ctx.name, errno = ret_errno(r), "ibv_dereg_mr of caller memory failed");
        }
    }
}

impl UserRegion {
    /// Whether `[addr, addr + len)` lies inside the region.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.start && addr + len <= self.start + self.len
    }

    fn lkey(&self) -> u32 {
        // SAFETY: valid MR.
        unsafe { (*self.mr.as_ptr()).lkey }
    }
}

/// Registered, page-aligned staging memory owned with its registration.
pub struct MemoryRegion {
    mr: NonNull<ibv_mr>,
    mem: NonNull<u8>,
    layout: std::alloc::Layout,
    pd: Arc<PdInner>,
}
// SAFETY: see CtxInner; the memory is owned.
unsafe impl Send for MemoryRegion {}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by reg_mr, deregistered once, before the memory is freed.
        let r = unsafe { (self.pd.ctx.verbs.dereg_mr)(self.mr.as_ptr()) };
        if r != 0 {
            // The device may still write here: leaking the memory is the safe choice.
            tracing::warn!(device = %self.pd.ctx.name, errno = ret_errno(r), "ibv_dereg_mr failed; leaking its buffer");
            return;
        }
        // SAFETY: allocated with this layout; no longer registered.
        unsafe { std::alloc::dealloc(self.mem.as_ptr(), self.layout) };
    }
}

impl MemoryRegion {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    fn addr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    fn lkey(&self) -> u32 {
        // SAFETY: valid MR.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// Read `len` bytes at `offset`.
    ///
    /// # Safety
    /// No receive may be posted over that range (the device could be writing it).
    pub unsafe fn read(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset + len <= self.len());
        // SAFETY: in bounds; the caller guarantees the device is not writing it.
        unsafe { std::slice::from_raw_parts(self.addr().add(offset), len) }
    }

    /// Write `data` at `offset`.
    ///
    /// # Safety
    /// No send may be in flight from that range.
    pub unsafe fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.len());
        // SAFETY: in bounds; the caller guarantees the device is not reading it.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.addr().add(offset), data.len()) };
    }
}
