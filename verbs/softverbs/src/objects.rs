//! Provider objects behind the ABI structs: context, PD, MR, CQ.
//!
//! Each object is a `#[repr(C)]` struct whose first field is the ABI struct, so the pointer
//! handed to C is also a pointer to our object.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::thread::JoinHandle;

use parking_lot::{Mutex, MutexGuard};
use verbs_abi::*;

use crate::config::Config;
use crate::counters::{self, Kind};
use crate::device::{DeviceInfo, SoftDevice};
use crate::error::Error;
use crate::qp::QpInner;

/// Per-device usage across the process (QPs and MRs), keyed by device name.
static DEVICE_USAGE: LazyLock<Mutex<HashMap<String, (usize, usize)>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Reserve one QP (`qp == true`) or MR slot on `dev`, or fail when at `limit`.
pub(crate) fn reserve(dev: &str, qp: bool, limit: usize) -> Result<(), Error> {
    let mut map = DEVICE_USAGE.lock();
    let e = map.entry(dev.to_string()).or_default();
    let slot = if qp { &mut e.0 } else { &mut e.1 };
    if *slot >= limit {
        return Err(if qp {
            Error::Busy("QP limit of the device reached")
        } else {
            Error::NoMem("MR limit of the device reached")
        });
    }
    *slot += 1;
    Ok(())
}

/// Release a slot taken by [`reserve`].
pub(crate) fn release(dev: &str, qp: bool) {
    let mut map = DEVICE_USAGE.lock();
    if let Some(e) = map.get_mut(dev) {
        let slot = if qp { &mut e.0 } else { &mut e.1 };
        *slot = slot.saturating_sub(1);
    }
}

/// A registered memory range as the data path sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrEntry {
    pub addr: u64,
    pub len: u64,
    pub pd_handle: u32,
    pub access: u32,
}

/// True when every SGE lies inside a registered MR of PD `pd_handle` (matching lkey) that
/// grants the `need` access bits.
pub(crate) fn sges_valid(mrs: &HashMap<u32, MrEntry>, pd_handle: u32, sges: &[ibv_sge], need: u32) -> bool {
    sges.iter().all(|s| {
        let Some(mr) = mrs.get(&s.lkey) else {
            return false;
        };
        let Some(end) = s.addr.checked_add(s.length as u64) else {
            return false;
        };
        mr.pd_handle == pd_handle && s.addr >= mr.addr && end <= mr.addr + mr.len && (mr.access & need) == need
    })
}

/// Shared state of an open context.
pub(crate) struct CtxInner {
    pub dev: DeviceInfo,
    pub cfg: Config,
    pub mrs: Mutex<HashMap<u32, MrEntry>>,
    next_handle: AtomicU32,
    ops: AtomicU64,
    failed: AtomicBool,
    pub qps: Mutex<Vec<Weak<QpInner>>>,
    pub threads: Mutex<HashMap<u32, JoinHandle<()>>>,
    rng: Mutex<u64>,
}

impl CtxInner {
    pub fn new(dev: DeviceInfo, cfg: Config) -> CtxInner {
        let seed = cfg.faults.seed;
        CtxInner {
            dev,
            cfg,
            mrs: Mutex::new(HashMap::new()),
            next_handle: AtomicU32::new(1),
            ops: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            qps: Mutex::new(Vec::new()),
            threads: Mutex::new(HashMap::new()),
            rng: Mutex::new(seed),
        }
    }

    /// A fresh handle / key seed.
    pub fn handle(&self) -> u32 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether the injected device failure has happened.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Count one verbs operation; fails once `SOFTVERBS_FAIL_AFTER` operations were done.
    pub fn tick(&self) -> Result<(), Error> {
        if self.is_failed() {
            return Err(Error::DeviceFailed);
        }
        let n = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
        match self.cfg.faults.fail_after {
            Some(limit) if n > limit => {
                self.fail();
                Err(Error::DeviceFailed)
            }
            _ => Ok(()),
        }
    }

    /// Mark the device failed and move every QP to the error state (flushing receives).
    pub fn fail(&self) {
        if self.failed.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::warn!(device = %self.dev.name(), "softverbs: injected device failure");
        let qps: Vec<_> = self.qps.lock().iter().filter_map(Weak::upgrade).collect();
        for qp in qps {
            qp.enter_error();
        }
    }

    /// True with probability `SOFTVERBS_DROP_RATE` (deterministic per seed).
    pub fn roll_drop(&self) -> bool {
        self.roll(self.cfg.faults.drop_rate)
    }

    /// True with probability `p`, from the context's generator (deterministic per seed; no
    /// draw at all when `p` is 0, so enabling one fault does not change another's sequence).
    pub fn roll(&self, p: f64) -> bool {
        p > 0.0 && ((self.random() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// The next number of the context's generator (splitmix64).
    pub fn random(&self) -> u64 {
        let mut s = self.rng.lock();
        *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Lock the MR table. Holding the guard while copying to/from user buffers makes
    /// `ibv_dereg_mr` wait until the copy is done.
    pub fn mrs(&self) -> MutexGuard<'_, HashMap<u32, MrEntry>> {
        self.mrs.lock()
    }

    /// Stop and join every receive thread of this context.
    pub fn stop_all_threads(&self) {
        let qps: Vec<_> = self.qps.lock().drain(..).filter_map(|w| w.upgrade()).collect();
        for qp in &qps {
            qp.stop.store(true, Ordering::SeqCst);
        }
        let threads: Vec<_> = self.threads.lock().drain().map(|(_, h)| h).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

/// `struct ibv_context` plus provider state.
#[repr(C)]
pub(crate) struct SoftContext {
    pub ibv: ibv_context,
    pub inner: Arc<CtxInner>,
    pub device: Box<SoftDevice>,
}

/// `struct ibv_pd` plus provider state.
#[repr(C)]
pub(crate) struct SoftPd {
    pub ibv: ibv_pd,
    pub ctx: Arc<CtxInner>,
    /// MRs and QPs using this PD.
    pub users: AtomicUsize,
}

/// An object others hang on (a PD holds MRs and QPs, a CQ QPs): freed only when unused.
pub(crate) trait Parent {
    /// Its live-object counter.
    const KIND: Kind;
    /// The error for a NULL handle.
    const NULL: &'static str;
    /// The error while children remain.
    const BUSY: &'static str;
    /// How many children use it.
    fn users(&self) -> &AtomicUsize;
}

impl Parent for SoftPd {
    const KIND: Kind = Kind::Pds;
    const NULL: &'static str = "NULL pd";
    const BUSY: &'static str = "PD still has MRs or QPs";
    fn users(&self) -> &AtomicUsize {
        &self.users
    }
}

/// `struct ibv_mr` plus provider state.
#[repr(C)]
pub(crate) struct SoftMr {
    pub ibv: ibv_mr,
    pub ctx: Arc<CtxInner>,
    pub pd: *const SoftPd,
}

/// Completion queue contents.
pub(crate) struct CqInner {
    queue: Mutex<VecDeque<ibv_wc>>,
    cap: usize,
    overrun: AtomicBool,
}

impl CqInner {
    pub fn new(cap: usize) -> CqInner {
        CqInner { queue: Mutex::new(VecDeque::with_capacity(cap.min(1024))), cap, overrun: AtomicBool::new(false) }
    }

    /// Add a completion; on overflow the CQ is marked overrun and the entry is lost.
    pub fn push(&self, wc: ibv_wc) {
        let mut q = self.queue.lock();
        if q.len() >= self.cap {
            self.overrun.store(true, Ordering::SeqCst);
            tracing::error!(cap = self.cap, "softverbs: CQ overrun, completion lost");
            return;
        }
        q.push_back(wc);
    }

    /// Pop up to `out.len()` completions; `Err` once the CQ has overrun.
    pub fn poll(&self, out: &mut [ibv_wc]) -> Result<usize, ()> {
        if self.overrun.load(Ordering::SeqCst) {
            return Err(());
        }
        let mut q = self.queue.lock();
        let n = out.len().min(q.len());
        for slot in out.iter_mut().take(n) {
            *slot = q.pop_front().expect("length checked");
        }
        Ok(n)
    }
}

/// `struct ibv_cq` plus provider state.
#[repr(C)]
pub(crate) struct SoftCq {
    pub ibv: ibv_cq,
    pub inner: Arc<CqInner>,
    pub ctx: Arc<CtxInner>,
    /// QPs attached to this CQ.
    pub users: AtomicUsize,
}

impl Parent for SoftCq {
    const KIND: Kind = Kind::Cqs;
    const NULL: &'static str = "NULL cq";
    const BUSY: &'static str = "CQ still attached to a QP";
    fn users(&self) -> &AtomicUsize {
        &self.users
    }
}

impl Drop for SoftContext {
    fn drop(&mut self) {
        self.inner.stop_all_threads();
        counters::dec(Kind::Contexts);
    }
}
