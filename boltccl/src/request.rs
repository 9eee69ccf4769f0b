//! Non-blocking calls: a group's queue of started calls, the progress thread that runs them in
//! the order they were started, the raw request the bindings hold, and the scoped, borrowing
//! form for Rust ([`Scope`]).
//!
//! The progress thread is started by a group's first non-blocking call and stopped when the
//! group is dropped (after it has finished every started call). It runs each call exactly as
//! a blocking call runs (`Core::run`: sequence numbers, deadlines, poisoning), so a failed
//! call poisons the group as before. A blocking call made while calls are queued waits until
//! they are done, then runs on the caller's thread; with none queued it costs one atomic load.

use crate::error::{Error, Result};
use crate::group::{Core, Group, Op};
use crate::types::{Element, ReduceOp};
use crossbeam_channel::{unbounded, Sender};
use parking_lot::{Condvar, Mutex};
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A queued call: runs on the progress thread with the group's core.
pub(crate) type Job = Box<dyn FnOnce(&Core) -> Result<()> + Send>;

/// Runs once when a request completes, on the thread that completed it, with its result.
pub type OnComplete = Box<dyn FnOnce(&Result<()>) + Send>;

thread_local! {
    /// Set on progress threads: a blocking call there would wait for itself.
    static ON_PROGRESS_THREAD: Cell<bool> = const { Cell::new(false) };
}

enum SlotState {
    Pending(Option<OnComplete>),
    Done(Result<()>),
}

struct Slot {
    state: Mutex<SlotState>,
    done: Condvar,
}

impl Slot {
    fn complete(&self, r: Result<()>) {
        let callback = {
            let mut st = self.state.lock();
            let cb = match &mut *st {
                SlotState::Pending(cb) => cb.take(),
                SlotState::Done(_) => None,
            };
            *st = SlotState::Done(r.clone());
            self.done.notify_all();
            cb
        };
        if let Some(cb) = callback {
            cb(&r);
        }
    }
}

/// A started call, as the bindings hold it: ask whether it is done, wait for it, or have a
/// function run when it completes. Cloning gives another handle on the same call. Dropping
/// it does not cancel or wait for the call (the buffers must stay valid regardless: see
/// [`Group::start_unchecked`]).
#[derive(Clone)]
pub struct RawRequest {
    slot: Arc<Slot>,
}

impl std::fmt::Debug for RawRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawRequest").field("done", &self.test().is_some()).finish()
    }
}

impl RawRequest {
    fn new() -> RawRequest {
        RawRequest { slot: Arc::new(Slot { state: Mutex::new(SlotState::Pending(None)), done: Condvar::new() }) }
    }

    /// The call's result once it has completed, `None` while it runs or waits its turn.
    pub fn test(&self) -> Option<Result<()>> {
        match &*self.slot.state.lock() {
            SlotState::Done(r) => Some(r.clone()),
            SlotState::Pending(_) => None,
        }
    }

    /// Wait for the call and return its result. Bounded: the call itself fails at the
    /// group's deadline if nothing moves, as every call does.
    pub fn wait(&self) -> Result<()> {
        let mut st = self.slot.state.lock();
        loop {
            if let SlotState::Done(r) = &*st {
                return r.clone();
            }
            self.slot.done.wait(&mut st);
        }
    }

    /// Like [`RawRequest::wait`], giving up after `timeout` (`None`: still running).
    pub fn wait_for(&self, timeout: std::time::Duration) -> Option<Result<()>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut st = self.slot.state.lock();
        loop {
            if let SlotState::Done(r) = &*st {
                return Some(r.clone());
            }
            if self.slot.done.wait_until(&mut st, deadline).timed_out() {
                return match &*st {
                    SlotState::Done(r) => Some(r.clone()),
                    SlotState::Pending(_) => None,
                };
            }
        }
    }

    /// Run `f` with the result when the call completes (at once, on this thread, if it has;
    /// else on the progress thread). Replaces an earlier function. `f` must not make a
    /// blocking call on the group (it would wait for itself): such a call fails with
    /// `InvalidArgument`.
    pub fn on_complete(&self, f: OnComplete) {
        let mut st = self.slot.state.lock();
        match &mut *st {
            SlotState::Pending(cb) => *cb = Some(f),
            SlotState::Done(r) => {
                let r = r.clone();
                drop(st);
                f(&r);
            }
        }
    }
}

struct Worker {
    jobs: Sender<(Job, RawRequest)>,
    thread: JoinHandle<()>,
}

/// A group's started calls and their progress thread.
#[derive(Default)]
pub(crate) struct Queue {
    worker: Mutex<Option<Worker>>,
    /// Calls started and not finished; read on every blocking call's fast path.
    pending: Arc<Pending>,
}

#[derive(Default)]
struct Pending {
    count: AtomicUsize,
    lock: Mutex<()>,
    idle: Condvar,
}

impl Queue {
    /// Queue `job`; starts the progress thread on first use.
    pub(crate) fn start(&self, core: &Arc<Core>, job: Job) -> Result<RawRequest> {
        let req = RawRequest::new();
        let mut worker = self.worker.lock();
        if worker.is_none() {
            *worker = Some(spawn(core.clone(), self.pending.clone())?);
        }
        self.pending.count.fetch_add(1, Ordering::SeqCst);
        let w = worker.as_ref().expect("started above");
        if w.jobs.send((job, req.clone())).is_err() {
            self.pending.finished();
            return Err(Error::Internal("the group's progress thread has stopped".into()));
        }
        Ok(req)
    }

    /// Wait until every started call has finished (the caller's blocking call comes after
    /// them). Free when none is queued.
    pub(crate) fn wait_idle(&self) -> Result<()> {
        if self.pending.count.load(Ordering::SeqCst) == 0 {
            return Ok(());
        }
        if ON_PROGRESS_THREAD.with(Cell::get) {
            return Err(Error::invalid(
                "a blocking call from a completion function would wait for itself: start it without waiting",
            ));
        }
        let mut g = self.pending.lock.lock();
        while self.pending.count.load(Ordering::SeqCst) > 0 {
            self.pending.idle.wait(&mut g);
        }
        Ok(())
    }

    /// Finish every started call, then stop the progress thread.
    pub(crate) fn shut_down(&self) {
        let Some(w) = self.worker.lock().take() else { return };
        drop(w.jobs);
        if w.thread.thread().id() == std::thread::current().id() {
            // Dropped from its own completion function: the thread exits when it returns.
            return;
        }
        let _ = w.thread.join();
    }
}

impl Pending {
    fn finished(&self) {
        let _g = self.lock.lock();
        self.count.fetch_sub(1, Ordering::SeqCst);
        self.idle.notify_all();
    }
}

fn spawn(core: Arc<Core>, pending: Arc<Pending>) -> Result<Worker> {
    let (jobs, rx) = unbounded::<(Job, RawRequest)>();
    let thread = std::thread::Builder::new()
        .name("boltccl-progress".into())
        .spawn(move || {
            ON_PROGRESS_THREAD.with(|f| f.set(true));
            for (job, req) in rx {
                let r = job(&core);
                // Completed (and its completion function run) before a blocking call that
                // waits for it goes on: that call then sees every earlier request done.
                req.slot.complete(r);
                pending.finished();
            }
        })
        .map_err(|e| Error::Internal(format!("cannot start the group's progress thread: {e}")))?;
    Ok(Worker { jobs, thread })
}

/// Starts calls that borrow their buffers until the scope ends (see [`Group::scope`]).
pub struct Scope<'scope, 'env: 'scope> {
    group: &'env Group,
    started: Mutex<Vec<RawRequest>>,
    /// Invariant in `'scope`, as `std::thread::Scope` is.
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

/// A call started in a [`Scope`]: [`Request::wait`] for its result. Its buffers stay
/// borrowed until the scope ends; the scope waits for every call, so dropping or leaking a
/// request is safe.
#[must_use = "wait() for the call's result (the scope also waits for it)"]
pub struct Request<'scope> {
    raw: RawRequest,
    _scope: PhantomData<&'scope ()>,
}

impl Request<'_> {
    /// Wait for the call and return its result.
    pub fn wait(self) -> Result<()> {
        self.raw.wait()
    }

    /// The result once the call has completed, `None` while it runs or waits its turn.
    pub fn test(&self) -> Option<Result<()>> {
        self.raw.test()
    }

    /// Run `f` with the result when the call completes (see [`RawRequest::on_complete`]).
    pub fn on_complete(&self, f: OnComplete) {
        self.raw.on_complete(f)
    }
}

pub(crate) fn scope<'env, T>(
    group: &'env Group,
    f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<T>,
) -> Result<T> {
    let s = Scope { group, started: Mutex::new(Vec::new()), _scope: PhantomData, _env: PhantomData };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&s)));
    // Every call started in the scope finishes before its buffers are given back.
    let mut first_err = None;
    for req in s.started.lock().drain(..) {
        if let Err(e) = req.wait() {
            first_err.get_or_insert(e);
        }
    }
    match r {
        Err(panic) => std::panic::resume_unwind(panic),
        Ok(Err(e)) => Err(e),
        Ok(Ok(v)) => first_err.map_or(Ok(v), Err),
    }
}

impl<'scope> Scope<'scope, '_> {
    /// Start `op`, which borrows its buffers for the rest of the scope.
    pub fn start(&'scope self, op: Op<'scope>) -> Result<Request<'scope>> {
        // SAFETY: `op` borrows its buffers for 'scope, and `scope` waits for every request
        // started here before 'scope ends, even when `f` panics or leaks the request.
        let raw = unsafe { self.group.start_unchecked(op)? };
        self.started.lock().push(raw.clone());
        Ok(Request { raw, _scope: PhantomData })
    }

    /// Start reducing `buf` in place with `op`.
    pub fn all_reduce<T: Element>(&'scope self, op: ReduceOp, buf: &'scope mut [T]) -> Result<Request<'scope>> {
        self.start(Op::AllReduce { op, dtype: T::DTYPE, input: None, output: bytemuck::cast_slice_mut(buf) })
    }

    /// Start reducing `input` with `op` into `output`.
    pub fn all_reduce_into<T: Element>(
        &'scope self,
        op: ReduceOp,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> Result<Request<'scope>> {
        let (input, output) = (Some(bytemuck::cast_slice(input)), bytemuck::cast_slice_mut(output));
        self.start(Op::AllReduce { op, dtype: T::DTYPE, input, output })
    }

    /// Start an elementwise sum across ranks, in place.
    pub fn all_sum<T: Element>(&'scope self, buf: &'scope mut [T]) -> Result<Request<'scope>> {
        self.all_reduce(ReduceOp::Sum, buf)
    }

    /// Start an elementwise maximum across ranks, in place.
    pub fn all_max<T: Element>(&'scope self, buf: &'scope mut [T]) -> Result<Request<'scope>> {
        self.all_reduce(ReduceOp::Max, buf)
    }

    /// Start an elementwise minimum across ranks, in place.
    pub fn all_min<T: Element>(&'scope self, buf: &'scope mut [T]) -> Result<Request<'scope>> {
        self.all_reduce(ReduceOp::Min, buf)
    }

    /// Start summing `input` across ranks into `output`.
    pub fn all_sum_into<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> Result<Request<'scope>> {
        self.all_reduce_into(ReduceOp::Sum, input, output)
    }

    /// Start gathering every rank's `input` into `output`, in rank order.
    pub fn all_gather<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> Result<Request<'scope>> {
        let (input, output) = (bytemuck::cast_slice(input), bytemuck::cast_slice_mut(output));
        self.start(Op::AllGather { dtype: T::DTYPE, input, output })
    }

    /// Start a reduce-scatter (sum): this rank gets block `rank()` of the summed `input`.
    pub fn reduce_scatter<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> Result<Request<'scope>> {
        self.reduce_scatter_with(ReduceOp::Sum, input, output)
    }

    /// Start a reduce-scatter with `op`: this rank gets block `rank()` of `input` reduced.
    pub fn reduce_scatter_with<T: Element>(
        &'scope self,
        op: ReduceOp,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> Result<Request<'scope>> {
        let (input, output) = (bytemuck::cast_slice(input), bytemuck::cast_slice_mut(output));
        self.start(Op::ReduceScatter { op, dtype: T::DTYPE, input, output })
    }

    /// Start a broadcast of `root`'s `buf`.
    pub fn broadcast<T: Element>(&'scope self, buf: &'scope mut [T], root: usize) -> Result<Request<'scope>> {
        self.start(Op::Broadcast { dtype: T::DTYPE, buf: bytemuck::cast_slice_mut(buf), root })
    }

    /// Start sending `buf` to `peer`.
    pub fn send<T: Element>(&'scope self, buf: &'scope [T], peer: usize) -> Result<Request<'scope>> {
        self.start(Op::Send { dtype: T::DTYPE, buf: bytemuck::cast_slice(buf), peer })
    }

    /// Start receiving into `buf` from `peer`.
    pub fn recv<T: Element>(&'scope self, buf: &'scope mut [T], peer: usize) -> Result<Request<'scope>> {
        self.start(Op::Recv { dtype: T::DTYPE, buf: bytemuck::cast_slice_mut(buf), peer })
    }

    /// Start a barrier.
    pub fn barrier(&'scope self) -> Result<Request<'scope>> {
        self.start(Op::Barrier)
    }
    /// Start an all-to-all: part q of `input` goes to rank q; `output` gets one part from
    /// every rank (see [`crate::Group::all_to_all`]).
    pub fn all_to_all<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
    ) -> Result<Request<'scope>> {
        let (input, output) = (bytemuck::cast_slice(input), bytemuck::cast_slice_mut(output));
        self.start(Op::AllToAll { dtype: T::DTYPE, input, output })
    }

    /// Start an all-to-all with a count per peer (see [`crate::Group::all_to_all_v`]).
    pub fn all_to_all_v<T: Element>(
        &'scope self,
        input: &'scope [T],
        send_counts: &'scope [usize],
        output: &'scope mut [T],
        recv_counts: &'scope [usize],
    ) -> Result<Request<'scope>> {
        let (input, output) = (bytemuck::cast_slice(input), bytemuck::cast_slice_mut(output));
        self.start(Op::AllToAllV { dtype: T::DTYPE, input, send_counts, output, recv_counts })
    }

    /// Start gathering every rank's `input` into the root's `output` (see
    /// [`crate::Group::gather`]).
    pub fn gather<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
        root: usize,
    ) -> Result<Request<'scope>> {
        let (input, output) = (bytemuck::cast_slice(input), bytemuck::cast_slice_mut(output));
        self.start(Op::Gather { dtype: T::DTYPE, input, output, root })
    }

    /// Start scattering the root's `input` in blocks to every rank's `output` (see
    /// [`crate::Group::scatter`]).
    pub fn scatter<T: Element>(
        &'scope self,
        input: &'scope [T],
        output: &'scope mut [T],
        root: usize,
    ) -> Result<Request<'scope>> {
        let (input, output) = (bytemuck::cast_slice(input), bytemuck::cast_slice_mut(output));
        self.start(Op::Scatter { dtype: T::DTYPE, input, output, root })
    }

    /// Start reducing every rank's `buf` with `op` into the root's (see
    /// [`crate::Group::reduce`]).
    pub fn reduce<T: Element>(
        &'scope self,
        buf: &'scope mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<Request<'scope>> {
        self.start(Op::Reduce { op, dtype: T::DTYPE, input: None, output: bytemuck::cast_slice_mut(buf), root })
    }
}
