//! Ranks that are threads of one process: shared-memory rings between every pair (the same
//! links processes on one host use), and an in-process control plane.
//!
//! For fast tests of the algorithms and for single-process users. Frames are real encoded
//! headers in real rings, so header checks, aborts and timeouts behave as between processes.

use super::links::Links;
use super::progress::{Control, WaitPolicy};
use super::shm::ring::{can_pull, slot, Inbox, PeerInbox, Pulls, RingPair};
use super::shm::ShmChannel;
use crate::config::Config;
use crate::error::Error;
use crate::wire;
use parking_lot::Mutex;
use rustix::event::PollFd;
use std::sync::Arc;

/// The `n` ranks of an in-process world, each a [`Links`] over shared-memory rings, in rank
/// order, as `cfg` sets them up: ring size (`BOLTCCL_SHM_RING_BYTES`), pulls of large payloads
/// (`BOLTCCL_SHM_PULL_BYTES`, 0: none) and polling budget (`BOLTCCL_SPIN_US`).
pub(crate) fn world(n: usize, cfg: &Config) -> Vec<Links> {
    let inboxes: Vec<Arc<Inbox>> = (0..n)
        .map(|r| {
            let rings = n.saturating_sub(1).max(1);
            Arc::new(Inbox::create(r, rings, cfg.shm_ring_bytes).expect("the kernel gives shared memory"))
        })
        .collect();
    let bells: Vec<PeerInbox> = inboxes.iter().map(|i| i.as_peer()).collect();
    let aborted = Arc::new(Mutex::new(None));
    // Threads of one process pull large payloads from each other like processes do, where the
    // system lets a process read its own memory that way.
    let me = std::process::id() as i32;
    let word = 0x5eedu64.to_le_bytes();
    let pulls = match can_pull(me, word.as_ptr() as usize, &word) {
        true => Pulls { from_peer: Some(me), by_peer: true, min: cfg.shm_pull_bytes },
        false => Pulls::default(),
    };
    // Threads of one process share its cores.
    let wait = WaitPolicy::here(n, cfg.spin);
    let group: Vec<usize> = (0..n).collect();
    (0..n)
        .map(|rank| {
            let pairs = (0..n)
                .map(|p| {
                    (p != rank).then(|| {
                        RingPair::new(
                            p,
                            inboxes[rank].clone(),
                            slot(&group, rank, p),
                            bells[p].clone(),
                            slot(&group, p, rank),
                        )
                        .expect("rings laid out by this process")
                        .with_pulls(pulls)
                    })
                })
                .collect();
            let channel = ShmChannel::new(inboxes[rank].clone(), pairs, (0..n).map(|_| None).collect());
            let control = MemControl { rank, aborted: aborted.clone(), bells: bells.clone() };
            Links::new(rank, n, Box::new(channel), Box::new(control), wait)
        })
        .collect()
}

/// The in-process control plane: one shared abort slot, and every rank's doorbell to wake it.
struct MemControl {
    rank: usize,
    aborted: Arc<Mutex<Option<Error>>>,
    bells: Vec<PeerInbox>,
}

impl Control for MemControl {
    fn check(&mut self) -> Option<Error> {
        self.aborted.lock().clone()
    }

    fn wake_on<'a>(&'a self, _: &mut Vec<PollFd<'a>>) {}

    // Threads of one process stall together or not at all: no notes to follow.
    fn waiting(&mut self, _: usize) {}

    fn waits_of(&self, _: usize) -> Option<usize> {
        None
    }

    fn abort(&mut self, cause: &Error) {
        self.aborted.lock().get_or_insert_with(|| wire::relayed(self.rank, cause));
        for b in &self.bells {
            b.wake();
        }
    }

    fn settled(&self) -> bool {
        // An abort is in the shared slot at once; nothing else can come.
        true
    }
}
