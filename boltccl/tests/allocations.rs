//! Small calls allocate nothing. The all_sums of tensor-parallel decode and the small
//! all_to_alls of expert parallelism run thousands of times a second, and a heap allocation and
//! its free cost more than the rest of an 8-byte call: moving the one-step all_sum's lists
//! inline took it from 0.60 to 0.35 µs at 2 ranks (2026-12-03, docs/benchmarks.md).
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

/// Allocations in 100 calls of each small operation on one rank of `n`, by operation.
fn small_calls(g: &Group, n: usize) -> Vec<(&'static str, usize)> {
    let (me, next, prev) = (g.rank(), (g.rank() + 1) % n, (g.rank() + n - 1) % n);
    let mut x = [1.0f32, 2.0];
    let whole = vec![1.0f32; 2 * n];
    let mut out = vec![0.0f32; 2 * n];
    let mut part = [0.0f32; 2];
    let root_out = |out: &mut Vec<f32>| if me == 0 { 2 * n } else { 0 }.min(out.len());
    let k = root_out(&mut out);
    vec![
        ("all_sum", per_100(|| g.all_sum(&mut x).expect("all_sum"))),
        ("all_max", per_100(|| g.all_max(&mut x).expect("all_max"))),
        ("all_gather", per_100(|| g.all_gather(&x, &mut out).expect("all_gather"))),
        ("reduce_scatter", per_100(|| g.reduce_scatter(&whole, &mut part).expect("reduce_scatter"))),
        ("broadcast", per_100(|| g.broadcast(&mut x, 0).expect("broadcast"))),
        ("barrier", per_100(|| g.barrier().expect("barrier"))),
        (
            "send/recv",
            per_100(|| {
                // Even ranks send first, so a ring of sends cannot wait on itself.
                if me % 2 == 0 {
                    g.send(&x, next).expect("send");
                    g.recv(&mut part, prev).expect("recv");
                } else {
                    g.recv(&mut part, prev).expect("recv");
                    g.send(&x, next).expect("send");
                }
            }),
        ),
        ("all_to_all", per_100(|| g.all_to_all(&whole, &mut out).expect("all_to_all"))),
        ("gather", per_100(|| g.gather(&x, &mut out[..k], 0).expect("gather"))),
        ("scatter", per_100(|| g.scatter(if me == 0 { &whole } else { &[] }, &mut part, 0).expect("scatter"))),
        ("reduce", per_100(|| g.reduce(&mut x, boltccl::ReduceOp::Sum, 0).expect("reduce"))),
    ]
}

#[test]
fn small_calls_allocate_nothing() {
    for n in [2, 3, 4] {
        let polling = Config { spin: Some(Duration::from_secs(10)), ..Config::default() };
        let world = Group::local_world_with(n, &polling);
        let counts: Vec<Vec<(&str, usize)>> = std::thread::scope(|s| {
            let ranks: Vec<_> = world.iter().map(|g| s.spawn(move || small_calls(g, n))).collect();
            ranks.into_iter().map(|r| r.join().expect("rank thread")).collect()
        });
        let allocating: Vec<_> = counts.iter().flatten().filter(|(_, c)| *c > 0).collect();
        assert!(allocating.is_empty(), "{n} ranks: allocations in 100 small calls: {counts:?}");
    }
}
