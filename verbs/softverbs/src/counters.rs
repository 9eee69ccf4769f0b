//! Counters of live objects, so tests can prove nothing leaks.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live object counts (C: `struct softverbs_counters` in `include/softverbs.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct softverbs_counters {
    /// Device lists returned by `ibv_get_device_list` and not yet freed.
    pub device_lists: u64,
    /// Open contexts.
    pub contexts: u64,
    /// Protection domains.
    pub pds: u64,
    /// Completion queues.
    pub cqs: u64,
    /// Queue pairs.
    pub qps: u64,
    /// Memory regions.
    pub mrs: u64,
    /// Receive threads still running.
    pub rx_threads: u64,
}

/// Which counter to change.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    DeviceLists,
    Contexts,
    Pds,
    Cqs,
    Qps,
    Mrs,
    RxThreads,
}

static COUNTS: [AtomicU64; 7] = [
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
];

pub(crate) fn inc(k: Kind) {
    COUNTS[k as usize].fetch_add(1, Ordering::SeqCst);
}

pub(crate) fn dec(k: Kind) {
    COUNTS[k as usize].fetch_sub(1, Ordering::SeqCst);
}

/// Snapshot of the live object counts.
pub fn live_objects() -> softverbs_counters {
    let g = |k: Kind| COUNTS[k as usize].load(Ordering::SeqCst);
    softverbs_counters {
        device_lists: g(Kind::DeviceLists),
        contexts: g(Kind::Contexts),
        pds: g(Kind::Pds),
        cqs: g(Kind::Cqs),
        qps: g(Kind::Qps),
        mrs: g(Kind::Mrs),
        rx_threads: g(Kind::RxThreads),
    }
}

impl softverbs_counters {
    /// True when no object of any kind is alive.
    pub fn all_zero(&self) -> bool {
        *self == softverbs_counters::default()
    }
}
