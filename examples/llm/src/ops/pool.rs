//! A small fork-join thread pool for decode's parallel regions.
//!
//! Decoding one token runs about five parallel regions per layer (q/k/v, attention, o_proj,
//! gate/up, down) plus the output head: ~150 per token, each 10-100 µs of work on two cores. A
//! pool whose idle workers sleep (rayon's, after a short spin) pays a wake-up of several
//! microseconds per region and burns time in `sched_yield`; here workers spin on an atomic for
//! a while (about a millisecond) before parking, so a region starts within a cache-line
//! transfer, as in llama.cpp's thread pool. Between tokens and in long sequential stretches the
//! workers still go to sleep, so an idle process does not hold its cores.
//!
//! One job runs at a time. A thread that finds the pool busy (another in-process rank, or a
//! task that itself asks for parallelism) runs its work inline instead of waiting.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// How long a worker spins for the next job before parking.
const SPIN: std::time::Duration = std::time::Duration::from_millis(1);

/// The job being run: a task function called with indices `0..n`.
type Task<'a> = &'a (dyn Fn(usize) + Sync);

struct Shared {
    /// Published jobs, even; odd while a job is being written (a sequence lock).
    epoch: AtomicU64,
    /// The job: a thin pointer to the caller's `Task` (valid while the caller waits), and its
    /// task count.
    job: AtomicUsize,
    tasks: AtomicUsize,
    /// Next task to claim: `(job id << 32) | index`, so a claim can only succeed for the job it
    /// read (a worker late from the previous job fails its compare-and-swap).
    next: AtomicU64,
    /// Tasks finished in the current job.
    done: AtomicUsize,
    /// A task panicked.
    panicked: AtomicBool,
    /// Parked workers and their wake-up.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// The pool: `workers` threads plus the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    workers: usize,
    /// Held while a job runs; `try_lock` failing means busy: run inline.
    busy: Mutex<()>,
}

thread_local! {
    /// Set on pool workers: work they start runs inline.
    static IN_WORKER: Cell<bool> = const { Cell::new(false) };
}

static THREADS: OnceLock<usize> = OnceLock::new();
static POOL: OnceLock<Pool> = OnceLock::new();

/// Sets the number of threads (the caller included) before the pool is first used; later calls
/// and calls after first use have no effect. Returns the count in force.
pub fn set_threads(n: usize) -> usize {
    *THREADS.get_or_init(|| n.max(1))
}

/// Threads used by the CPU kernels: [`set_threads`], else `BOLTCCL_LLM_THREADS`, else every
/// core this process may run on.
pub fn threads() -> usize {
    *THREADS.get_or_init(|| {
        std::env::var("BOLTCCL_LLM_THREADS")
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// The process-wide pool ([`threads`] - 1 workers, started on first use).
pub fn global() -> &'static Pool {
    POOL.get_or_init(|| Pool::new(threads() - 1))
}

impl Pool {
    /// A pool with `workers` threads besides the caller.
    pub fn new(workers: usize) -> Self {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: AtomicUsize::new(0),
            tasks: AtomicUsize::new(0),
            next: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        for i in 0..workers {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("llm-worker-{i}"))
                .spawn(move || worker(&s))
                .expect("starting a pool thread");
        }
        Self { shared, workers, busy: Mutex::new(()) }
    }

    /// Runs `f(i)` for every `i in 0..n`, spread over the pool and the calling thread, and
    /// returns when all have finished. Inline when there are no workers, one task, the pool is
    /// busy, or the caller is itself a pool worker. A panic in a task is re-raised here after
    /// every task has finished.
    pub fn run(&self, n: usize, f: impl Fn(usize) + Sync) {
        let inline = self.workers == 0 || n <= 1 || IN_WORKER.with(Cell::get);
        let guard = match self.busy.try_lock() {
            _ if inline => None,
            Ok(g) => Some(g),
            // A task panicked in an earlier job (re-raised to its caller): the pool is fine.
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        let Some(_guard) = guard else {
            (0..n).for_each(f);
            return;
        };
        let s = &*self.shared;
        let task: Task = &f;
        let job = &task as *const Task as usize;
        let e = s.epoch.load(Relaxed);
        // Publish: odd epoch while writing, then the next even one (the sequence lock the
        // workers read the job under).
        s.epoch.store(e + 1, Relaxed);
        std::sync::atomic::fence(Release);
        s.job.store(job, Relaxed);
        s.tasks.store(n, Relaxed);
        s.done.store(0, Relaxed);
        let id = (e + 2) / 2;
        s.next.store(id << 32, Relaxed);
        // SeqCst: ordered before the sleeper count is read (see the parking in `worker`).
        s.epoch.store(e + 2, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.wake.notify_all();
        }
        run_tasks(s, id, n, job);
        // Wait for the workers' tasks; `task` must stay alive until then.
        while s.done.load(Acquire) < n {
            std::hint::spin_loop();
        }
        if s.panicked.swap(false, Relaxed) {
            panic!("a parallel task panicked");
        }
    }
}

/// Claims and runs tasks of job `id` (whose `Task` is at address `job`) until none are left.
fn run_tasks(s: &Shared, id: u64, n: usize, job: usize) {
    loop {
        let cur = s.next.load(Relaxed);
        if cur >> 32 != id || (cur & 0xFFFF_FFFF) as usize >= n {
            return;
        }
        if s.next.compare_exchange_weak(cur, cur + 1, AcqRel, Relaxed).is_err() {
            continue;
        }
        let i = (cur & 0xFFFF_FFFF) as usize;
        // SAFETY: `job` points to the publisher's `Task` of job `id`. Having claimed task `i` of
        // that job, which is not counted done yet, the publisher is still waiting in `run`, so
        // the `Task` (and what it borrows) is alive until the `fetch_add` below.
        let task: Task = unsafe { *(job as *const Task) };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task(i))).is_err() {
            s.panicked.store(true, Relaxed);
        }
        s.done.fetch_add(1, Release);
    }
}

fn worker(s: &Shared) {
    IN_WORKER.with(|w| w.set(true));
    let mut seen = 0u64;
    loop {
        // Wait for a published epoch we have not run.
        let mut since = std::time::Instant::now();
        let mut spins = 0u32;
        let e = loop {
            let e = s.epoch.load(Acquire);
            if e != seen && e.is_multiple_of(2) {
                break e;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) || since.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            // Park. The sleeper count is raised before the epoch is checked again, and the
            // publisher raises the epoch before reading the count (both SeqCst), so one of
            // the two always sees the other: no lost wake-up.
            let mut l = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.sleepers.fetch_add(1, SeqCst);
            while s.epoch.load(SeqCst) == seen || s.epoch.load(SeqCst) % 2 == 1 {
                l = s.wake.wait(l).unwrap_or_else(|p| p.into_inner());
            }
            s.sleepers.fetch_sub(1, SeqCst);
            since = std::time::Instant::now();
        };
        seen = e;
        // Read the job under the sequence lock: a torn read (a newer job being written) is
        // discarded, and the claim below fails anyway for a job that is no longer current.
        let job = s.job.load(Relaxed);
        let n = s.tasks.load(Relaxed);
        std::sync::atomic::fence(Acquire);
        if s.epoch.load(Relaxed) != e {
            continue;
        }
        run_tasks(s, e / 2, n, job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_once_across_many_jobs() {
        let pool = Pool::new(3);
        for n in [0, 1, 2, 5, 64, 1000] {
            for _ in 0..200 {
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                pool.run(n, |i| {
                    hits[i].fetch_add(1, Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "n = {n}");
            }
        }
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = Pool::new(2);
        let sum = AtomicUsize::new(0);
        pool.run(8, |i| {
            sum.fetch_add(i, Relaxed);
        });
        // Long enough for the workers to give up spinning and park.
        std::thread::sleep(std::time::Duration::from_millis(300));
        pool.run(8, |i| {
            sum.fetch_add(i, Relaxed);
        });
        assert_eq!(sum.load(Relaxed), 56);
    }

    #[test]
    fn nested_and_concurrent_callers_run_inline() {
        let pool = Arc::new(Pool::new(2));
        let count = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for _ in 0..100 {
                        pool.run(4, |_| {
                            pool.run(3, |_| {
                                count.fetch_add(1, Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(count.load(Relaxed), 3 * 100 * 4 * 3);
    }

    #[test]
    fn a_panicking_task_panics_the_caller_after_the_others_finish() {
        let pool = Pool::new(2);
        let ran = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(16, |i| {
                ran.fetch_add(1, Relaxed);
                assert!(i != 7, "task 7 fails");
            })
        }));
        assert!(r.is_err());
        assert_eq!(ran.load(Relaxed), 16);
        // The pool still works.
        let ok = AtomicUsize::new(0);
        pool.run(5, |_| {
            ok.fetch_add(1, Relaxed);
        });
        assert_eq!(ok.load(Relaxed), 5);
    }
}
