//! Small calls allocate nothing. The all_sums of tensor-parallel decode and the small
//! all_to_alls of expert parallelism run thousands of times a second, and a heap allocation and
//! its free cost more than the rest of an 8-byte call: moving the one-step all_sum's lists
//! inline took it from 0.51 to 0.44 µs at 2 ranks (2026-12-03, docs/benchmarks.md).
//!
//! Every allocation on a thread is counted; the ranks are threads of this process, on the same
//! shared-memory rings as rank processes. A call that waits long enough to sleep in the kernel
//! lists the descriptors to wake on (an allocation, next to a sleep): the ranks here poll for
//! up to ten seconds instead, so the count is the fast path's whatever the machine's load.

use boltccl::{Config, Group};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, counting each thread's allocations.
struct Counting;

// SAFETY: every call is passed on to the system allocator unchanged; the count is a plain
// thread-local cell (no allocation, and skipped once the thread's locals are gone).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded (the block came from `System`).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

/// Allocations by 100 calls of `call`, after 20 to warm up (the group's scratch pools grow on
/// first use and are kept).
fn per_100(mut call: impl FnMut()) -> usize {
    for _ in 0..20 {
        call();
    }
    let before = allocations();
    for _ in 0..100 {
        call();
    }
    allocations() - before
}

#[test]
fn small_all_sums_and_all_to_alls_allocate_nothing() {
    for n in [2, 3, 4] {
        let polling = Config { spin: Some(Duration::from_secs(10)), ..Config::default() };
        let world = Group::local_world_with(n, &polling);
        let counts: Vec<(usize, usize)> = std::thread::scope(|s| {
            let ranks: Vec<_> = world
                .iter()
                .map(|g| {
                    s.spawn(move || {
                        let mut x = [1.0f32, 2.0];
                        let input = vec![1.0f32; 2 * n];
                        let mut output = vec![0.0f32; 2 * n];
                        let sums = per_100(|| g.all_sum(&mut x).expect("all_sum"));
                        let parts = per_100(|| g.all_to_all(&input, &mut output).expect("all_to_all"));
                        (sums, parts)
                    })
                })
                .collect();
            ranks.into_iter().map(|r| r.join().expect("rank thread")).collect()
        });
        assert!(
            counts.iter().all(|&c| c == (0, 0)),
            "{n} ranks: allocations in 100 calls of an 8-byte all_sum and all_to_all, by rank: {counts:?}"
        );
    }
}
