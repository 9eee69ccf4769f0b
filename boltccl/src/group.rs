//! [`Group`]: the public face of boltccl — the user's calls, and the bookkeeping of each
//! (sequence numbers, poisoning, serialisation). Which transport and which algorithm serve a
//! call is decided elsewhere ([`crate::connect::connect`], [`crate::algo::select`]); calls
//! started without waiting are queued and run by the group's progress thread
//! ([`crate::request`]).

use crate::algo::select::{self, select, AllReducePlan, AllToAllPlan, BroadcastPlan, GatherPlan};
use crate::algo::{all_to_all, rooted};
use crate::algo::{direct, doubling, hosts, one_step, p2p, ring, ring_ops, Comm, Scratch};
use crate::config::{Algo, Config};
use crate::error::{Error, Result};
use crate::request::{Queue, RawRequest, Scope};
use crate::topology::{chunk_bytes, Cabling, Shape};
use crate::transport::{AbortSignal, InterruptCheck, Limits, LinkKind, Transport};
use crate::types::{Collective, DType, Element, ReduceOp};
use crate::wire::Header;
use parking_lot::Mutex;
use std::sync::Arc;

/// State shared by a group and the sub-groups split from it: they use the same links.
struct Shared {
    /// Shared further with the groups a shrink makes (they reuse the links).
    transport: Arc<Mutex<Box<dyn Transport>>>,
    /// The first communication error; every later call reports it.
    poison: Mutex<Option<Error>>,
    /// Raised by [`Group::abort`], from any thread.
    abort: Arc<AbortSignal>,
    /// A shrink made new groups on these links: this state's groups are done with them.
    retired: std::sync::atomic::AtomicBool,
    /// Shrinks that led to these groups (it makes their ids differ).
    generation: u32,
    interrupt: Mutex<Option<InterruptCheck>>,
    cfg: Config,
    /// The transport's cabling, read once (transport ranks).
    cabling: Cabling,
    /// What carries the messages to each transport rank, read once.
    kinds: Vec<LinkKind>,
}

impl Shared {
    /// If [`Group::abort`] was raised, tell the other ranks (once; the transport's abort is
    /// idempotent) — when the links are free, else the call holding them does it.
    fn tell_abort(&self) {
        if self.retired.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if let Some(e) = self.abort.error() {
            if let Some(mut t) = self.transport.try_lock() {
                t.abort(&e);
            }
        }
    }
}

/// Per-group call state. Locked for the whole call: a second concurrent call gets `Busy`.
struct State {
    seq: u32,
    send_seq: Vec<u32>,
    recv_seq: Vec<u32>,
    splits: u32,
    scratch: Scratch,
}

impl State {
    fn new(size: usize) -> State {
        State { seq: 0, send_seq: vec![0; size], recv_seq: vec![0; size], splits: 0, scratch: Scratch::default() }
    }
}

/// One call, as its header names it.
struct Call {
    coll: Collective,
    dtype: DType,
    op: ReduceOp,
    /// Element count, as every rank must give it.
    count: usize,
    /// Broadcast's root.
    root: usize,
    /// For point-to-point calls, the peer and whether this rank sends: they count per pair and
    /// direction, not per group.
    p2p: Option<(usize, bool)>,
}

impl Call {
    fn new(coll: Collective, dtype: DType, op: ReduceOp, bytes: usize) -> Call {
        Call { coll, dtype, op, count: bytes / dtype.size(), root: 0, p2p: None }
    }

    /// The name errors give the call.
    fn name(&self) -> &'static str {
        match (self.coll, self.op) {
            (Collective::AllReduce, ReduceOp::Sum) => "all_sum",
            (Collective::AllReduce, ReduceOp::Max) => "all_max",
            (Collective::AllReduce, ReduceOp::Min) => "all_min",
            (c, _) => c.name(),
        }
    }
}

/// A set of ranks that run collectives together.
///
/// All calls block until this rank's part is done, and fail instead of hanging: each has a
/// deadline (`BOLTCCL_TIMEOUT_MS`, counted from the last progress), a dead peer is named
/// within moments, and after any communication error the group is poisoned (later calls
/// return [`Error::Poisoned`] with the original cause). Argument errors caught before
/// anything is sent (wrong lengths, ranks out of range) leave the group usable.
///
/// Reductions are deterministic: every rank gets the same bits, and the same inputs give the
/// same bits on every run, whatever the timing.
///
/// Non-blocking calls: [`Group::scope`] starts calls that borrow their buffers until the
/// scope ends, run in the order started by the group's progress thread while the caller
/// computes. A blocking call made while such calls are queued waits its turn.
///
/// `Group` is `Send` and `Sync`; calls on one group must not overlap (a second concurrent
/// call fails with [`Error::Busy`]). Use [`Group::split`] for independent groups.
pub struct Group {
    core: Arc<Core>,
    /// Started, unfinished calls and the thread that runs them (started on the first).
    queue: Queue,
}

/// Everything a call needs, shared with the group's progress thread.
pub(crate) struct Core {
    shared: Arc<Shared>,
    /// Group rank to transport rank.
    members: Vec<usize>,
    me: usize,
    id: u32,
    state: Mutex<State>,
    /// The cabling among the members, in group order.
    cabling: Cabling,
    /// The pipelining unit of this group's calls.
    chunk: usize,
}

/// The pipelining unit of a group of `members` (transport ranks, `me` among them).
fn chunk_of(shared: &Shared, members: &[usize], me: usize) -> usize {
    let all_shm = members.iter().enumerate().all(|(i, &q)| i == me || shared.kinds[q] == LinkKind::SharedMemory);
    chunk_bytes(&shared.cfg, members.len(), all_shm)
}

/// How a call gets the group's call state.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Fail with [`Error::Busy`] if another call holds it (the caller's own thread).
    Try,
    /// Wait for it (the progress thread, whose calls were started in order).
    Wait,
}

/// Form a group from the environment (`BOLTCCL_*`, or MLX / Open MPI / PMI / Slurm variables).
pub fn init() -> Result<Group> {
    Group::new(Config::from_env()?)
}

pub(crate) fn bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

pub(crate) fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

fn mix(a: u32, b: u32, c: u32) -> u32 {
    // splitmix-style hash: sub-group ids differ from their parent's and from each other's.
    let mut x = ((a as u64) << 32 | b as u64) ^ ((c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) as u32
}

impl Group {
    /// Form a group as `cfg` describes: connects to the coordinator and peers.
    pub fn new(cfg: Config) -> Result<Group> {
        cfg.validate()?;
        let t = crate::connect::connect(&cfg)?;
        Ok(Group::from_transport(t, cfg))
    }

    pub(crate) fn from_transport(t: Box<dyn Transport>, cfg: Config) -> Group {
        let (rank, size) = (t.rank(), t.size());
        let cabling = t.cabling();
        let kinds = (0..size).map(|p| t.link_kind(p)).collect();
        if cabling.shape() == Shape::Ring {
            tracing::info!("the RDMA links form a ring, not a full mesh: large collectives use the ring algorithms");
        }
        let shared = Arc::new(Shared {
            transport: Arc::new(Mutex::new(t)),
            poison: Mutex::new(None),
            abort: Arc::new(AbortSignal::new().expect("a socket pair for the abort signal")),
            retired: Default::default(),
            generation: 0,
            interrupt: Mutex::new(None),
            cfg,
            cabling: cabling.clone(),
            kinds,
        });
        let members: Vec<usize> = (0..size).collect();
        Group::from_core(Core {
            chunk: chunk_of(&shared, &members, rank),
            shared,
            members,
            me: rank,
            id: 0,
            state: Mutex::new(State::new(size)),
            cabling,
        })
    }

    fn from_core(core: Core) -> Group {
        Group { core: Arc::new(core), queue: Queue::default() }
    }

    /// `n` ranks in this process (one per thread), connected in memory. Handy for tests and
    /// for single-machine users; uses default settings.
    pub fn local_world(n: usize) -> Vec<Group> {
        Group::local_world_with(n, &Config::default())
    }

    /// Like [`Group::local_world`] with the settings of `template` (rank and size are set here).
    pub fn local_world_with(n: usize, template: &Config) -> Vec<Group> {
        crate::transport::mem::world(n, template.shm_ring_bytes, template.shm_pull_bytes)
            .into_iter()
            .enumerate()
            .map(|(rank, t)| Group::from_transport(Box::new(t), Config { rank, world_size: n, ..template.clone() }))
            .collect()
    }

    /// Like [`Group::local_world_with`], choosing algorithms as if the ranks were cabled as
    /// `cabling` says: computes in one process the bits a cluster cabled so would give.
    pub fn local_world_cabled(n: usize, template: &Config, cabling: Cabling) -> Vec<Group> {
        let mut world = Group::local_world_with(n, template);
        for g in &mut world {
            let core = Arc::get_mut(&mut g.core).expect("a new group shares nothing");
            core.cabling = cabling.subset(&core.members);
            Arc::get_mut(&mut core.shared).expect("a new group shares nothing").cabling = cabling.clone();
        }
        world
    }

    /// The algorithm `coll` runs on a buffer of `bytes` bytes on this group (`auto` resolved
    /// from the size and the cabling; for all-gather the output, for reduce-scatter the input).
    pub fn algorithm(&self, coll: Collective, bytes: usize) -> Algo {
        self.core.algorithm(coll, bytes)
    }

    /// This group's ranks by host (ranks that share memory), in rank order, hosts in the order
    /// of their first ranks: what the two-level all-reduce ([`Algo::Hosts`]) folds by.
    pub fn hosts(&self) -> Vec<Vec<usize>> {
        self.core.cabling.host_ranks()
    }

    /// What carries this rank's messages to `peer` (shared memory, RDMA, TCP).
    pub fn link_kind(&self, peer: usize) -> Result<LinkKind> {
        let core = &self.core;
        core.check_rank("peer", peer)?;
        Ok(core.shared.kinds[core.members[peer]])
    }

    /// This rank, 0-based.
    pub fn rank(&self) -> usize {
        self.core.me
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.core.members.len()
    }

    /// Install a check that blocked calls run every 50 ms (never on the fast path); when it
    /// returns `true` the call fails with [`Error::Interrupted`] and the group is poisoned.
    /// Shared with sub-groups. Language bindings use it to deliver Ctrl-C.
    pub fn set_interrupt_check(&self, check: Option<InterruptCheck>) {
        *self.core.shared.interrupt.lock() = check;
    }

    /// The settings this group was formed with.
    pub fn config(&self) -> &Config {
        &self.core.shared.cfg
    }

    /// The pipelining unit of this group's calls, in bytes: `BOLTCCL_CHUNK_BYTES`, or under
    /// `auto` 1 MiB, and up to 8 MiB when every pair of the group is shared memory.
    pub fn chunk_bytes(&self) -> usize {
        self.core.chunk
    }

    /// Byte-level calls with the element type as a value: for language bindings, which hold
    /// untyped buffers.
    pub fn bytes(&self) -> Bytes<'_> {
        Bytes { g: self }
    }

    /// Run a call given as an [`Op`] (as the bindings hand calls over), blocking like the
    /// typed calls: checked, then run on this thread after every started call has finished
    /// (they were started first), with no thread hand-off when none is queued.
    pub fn call(&self, op: Op<'_>) -> Result<()> {
        op.check(&self.core)?;
        self.queue.wait_idle()?;
        op.run(&self.core, Turn::Try)
    }

    /// Start a checked call without waiting for it: the progress thread runs it after every
    /// call started before it. Argument errors are returned here, everything else by the
    /// request.
    ///
    /// # Safety
    /// The buffers `op` borrows must stay valid, and must not be accessed except through the
    /// request, until the request has completed (`RawRequest::wait` returned, or
    /// `RawRequest::test` returned `Some`), even if the `RawRequest` is dropped or leaked.
    pub unsafe fn start_unchecked(&self, op: Op<'_>) -> Result<RawRequest> {
        op.check(&self.core)?;
        // SAFETY: `Op` differs from `Op<'static>` only in lifetimes; the caller keeps the
        // borrowed buffers alive and untouched until the request completes.
        let op: Op<'static> = unsafe { std::mem::transmute::<Op<'_>, Op<'static>>(op) };
        self.queue.start(&self.core, Box::new(move |core: &Core| op.run(core, Turn::Wait)))
    }

    /// Run `f` with a [`Scope`] that starts calls without waiting for them; every call started
    /// in the scope has finished when `scope` returns (as with `std::thread::scope`).
    ///
    /// ```no_run
    /// # let g = boltccl::init()?;
    /// let mut grads = vec![1.0f32; 1 << 20];
    /// let mut other = vec![0.0f32; 1024];
    /// g.scope(|s| {
    ///     let r = s.all_sum(&mut grads)?;   // runs on the group's progress thread
    ///     other.iter_mut().for_each(|v| *v += 1.0); // meanwhile: compute
    ///     r.wait()
    /// })?;
    /// # Ok::<(), boltccl::Error>(())
    /// ```
    ///
    /// Calls complete in the order they were started (on every rank alike). Returns `f`'s
    /// result, or the first error of a call that `f` did not wait for. Buffers stay borrowed
    /// until the scope ends.
    pub fn scope<'env, T>(
        &'env self,
        f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<T>,
    ) -> Result<T> {
        crate::request::scope(self, f)
    }

    /// Reduce `buf` in place with `op`.
    pub fn all_reduce<T: Element>(&self, op: ReduceOp, buf: &mut [T]) -> Result<()> {
        self.bytes().all_reduce(op, T::DTYPE, None, bytes_mut(buf))
    }

    /// Reduce `input` with `op` into `output` (same length).
    pub fn all_reduce_into<T: Element>(&self, op: ReduceOp, input: &[T], output: &mut [T]) -> Result<()> {
        self.bytes().all_reduce(op, T::DTYPE, Some(bytes(input)), bytes_mut(output))
    }

    /// Elementwise sum across ranks, in place.
    pub fn all_sum<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.all_reduce(ReduceOp::Sum, buf)
    }

    /// Elementwise maximum across ranks, in place.
    pub fn all_max<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.all_reduce(ReduceOp::Max, buf)
    }

    /// Elementwise minimum across ranks, in place.
    pub fn all_min<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.all_reduce(ReduceOp::Min, buf)
    }

    /// Elementwise sum of `input` across ranks, written to `output`.
    pub fn all_sum_into<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.all_reduce_into(ReduceOp::Sum, input, output)
    }

    /// `output` (of `size() * input.len()` elements) gets every rank's `input`, in rank order.
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.bytes().all_gather(T::DTYPE, bytes(input), bytes_mut(output))
    }

    /// Sum `input` (of `size() * output.len()` elements) across ranks; this rank gets block
    /// `rank()` of the result.
    pub fn reduce_scatter<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.reduce_scatter_with(ReduceOp::Sum, input, output)
    }

    /// Like [`Group::reduce_scatter`] with another reduction.
    pub fn reduce_scatter_with<T: Element>(&self, op: ReduceOp, input: &[T], output: &mut [T]) -> Result<()> {
        self.bytes().reduce_scatter(op, T::DTYPE, bytes(input), bytes_mut(output))
    }

    /// Every rank's `buf` gets `root`'s.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.bytes().broadcast(T::DTYPE, bytes_mut(buf), root)
    }

    /// Wait until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.call(Op::Barrier)
    }

    /// Send `buf` to `peer`, which must call [`Group::recv`] with the same type and length.
    /// Blocks until it is on its way (for large buffers, until the peer is receiving).
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.bytes().send(T::DTYPE, bytes(buf), peer)
    }

    /// Receive into `buf` from `peer`; the sizes and types must match the send.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.bytes().recv(T::DTYPE, bytes_mut(buf), peer)
    }

    /// Abort the group: callable from any thread (a signal handler included) while a call is
    /// blocked or in flight on another; never blocks, and a second call does nothing.
    ///
    /// The call in flight returns [`Error::Aborted`] naming this rank at once, the other ranks
    /// learn within moments (their calls fail naming this rank), and the group is poisoned:
    /// later calls return [`Error::Poisoned`]. [`Group::shrink`] makes a working group again.
    /// Groups split from this one share its links and are aborted with it.
    pub fn abort(&self) {
        let rank = self.core.members[self.core.me];
        let e = Error::Aborted { rank, reason: format!("rank {rank} called abort()") };
        if self.core.shared.abort.raise(e.clone()) {
            if let Some(mut p) = self.core.shared.poison.try_lock() {
                p.get_or_insert(e);
            }
            self.core.shared.tell_abort();
        }
    }

    /// Go on without the ranks that are lost: the survivors (the ranks that call `shrink`
    /// within `BOLTCCL_TIMEOUT_MS`) agree on who is there and each gets a new group of them,
    /// ranks renumbered densely in this group's order. Works on a poisoned group (after a rank
    /// died, or [`Group::abort`]) and on a healthy one.
    ///
    /// The links among the survivors are reused — TCP connections and shared-memory rings —
    /// with no coordinator and no new connection; what the failed calls left on them is
    /// dropped. (A group with RDMA links between survivors gets [`Error::InvalidArgument`]
    /// saying so: those cannot be kept yet.) A rank that is alive but does not call `shrink`
    /// in time is left out, and its own `shrink` then fails saying so. Ranks that fail during
    /// the shrink make it fail (within the deadline, on every survivor) rather than give two
    /// different groups: call `shrink` again.
    ///
    /// The new group takes over the links: this group, and every group split from it or it
    /// from, is done (its calls return [`Error::Poisoned`]).
    pub fn shrink(&self) -> Result<Group> {
        self.shrink_excluding(&[])
    }

    /// [`Group::shrink`], leaving out the ranks `exclude` (ranks of this group) whatever they
    /// do. Every survivor must pass the same list.
    pub fn shrink_excluding(&self, exclude: &[usize]) -> Result<Group> {
        let core = &self.core;
        for &r in exclude {
            core.check_rank("excluded rank", r)?;
        }
        if exclude.contains(&core.me) {
            return Err(Error::invalid(format!("rank {} cannot exclude itself from the group it shrinks", core.me)));
        }
        // Started calls end first (at once, on a poisoned group).
        self.queue.wait_idle()?;
        let _st = core.state.try_lock().ok_or(Error::Busy)?;
        let shared = &core.shared;
        let candidates: Vec<usize> =
            core.members.iter().enumerate().filter(|(g, _)| !exclude.contains(g)).map(|(_, &t)| t).collect();
        let started = std::time::Instant::now();
        let survivors = {
            let mut t = shared.transport.lock();
            match t.shrink(&candidates, shared.cfg.timeout) {
                Ok(s) => s,
                Err(e) => {
                    shared.poison.lock().get_or_insert_with(|| e.clone());
                    return Err(e);
                }
            }
        };
        shared.retired.store(true, std::sync::atomic::Ordering::SeqCst);
        shared
            .poison
            .lock()
            .get_or_insert_with(|| Error::invalid("this group was shrunk: use the group that shrink() returned"));
        let members: Vec<usize> = core.members.iter().copied().filter(|t| survivors.contains(t)).collect();
        let me = members
            .iter()
            .position(|&t| t == core.members[core.me])
            .ok_or_else(|| Error::Internal("shrink lost this rank".into()))?;
        tracing::debug!(rank = me, size = members.len(), took = ?started.elapsed(), "shrink: new group");
        let next = Arc::new(Shared {
            transport: shared.transport.clone(),
            poison: Mutex::new(None),
            abort: Arc::new(AbortSignal::new().map_err(|e| Error::local_io("abort signal", e))?),
            retired: Default::default(),
            generation: shared.generation + 1,
            interrupt: Mutex::new(shared.interrupt.lock().clone()),
            cfg: shared.cfg.clone(),
            cabling: shared.cabling.clone(),
            kinds: shared.kinds.clone(),
        });
        let size = members.len();
        Ok(Group::from_core(Core {
            cabling: next.cabling.subset(&members),
            chunk: chunk_of(&next, &members, me),
            id: mix(core.id, next.generation, u32::MAX),
            shared: next,
            members,
            me,
            state: Mutex::new(State::new(size)),
        }))
    }

    /// Split into sub-groups: ranks with the same `color` form one, ordered by `key` (then by
    /// rank). Ranks passing `None` take part in the split but join no group (they get
    /// `None`). A collective call: every rank of this group must make it.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Group>> {
        let mine = [color.map_or(-1, i64::from), key];
        let mut all = vec![0i64; 2 * self.size()];
        self.all_gather(&mine, &mut all)?;
        let core = &self.core;
        let n = {
            let mut st = core.state.try_lock().ok_or(Error::Busy)?;
            st.splits += 1;
            st.splits
        };
        let Some(color) = color else { return Ok(None) };
        let mut chosen: Vec<(i64, usize)> =
            (0..self.size()).filter(|&q| all[2 * q] == i64::from(color)).map(|q| (all[2 * q + 1], q)).collect();
        chosen.sort();
        let me = chosen
            .iter()
            .position(|&(_, q)| q == core.me)
            .ok_or_else(|| Error::Internal("split lost this rank".into()))?;
        let members: Vec<usize> = chosen.iter().map(|&(_, q)| core.members[q]).collect();
        let size = members.len();
        Ok(Some(Group::from_core(Core {
            cabling: core.shared.cabling.subset(&members),
            chunk: chunk_of(&core.shared, &members, me),
            shared: core.shared.clone(),
            members,
            me,
            id: mix(core.id, n, color),
            state: Mutex::new(State::new(size)),
        })))
    }

    /// `input` holds `size()` equal parts: part q goes to rank q, and `output` (as long as
    /// `input`) gets part `rank()` of every rank's input, in rank order.
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.bytes().all_to_all(T::DTYPE, bytes(input), bytes_mut(output))
    }

    /// All-to-all with a count per peer: `input` holds `send_counts[q]` elements for each rank
    /// q in turn, and `output` gets `recv_counts[q]` elements from each. What rank q sends
    /// this rank must be what this rank expects from q (else every rank of the pair fails,
    /// naming both counts); zero-length parts are allowed.
    pub fn all_to_all_v<T: Element>(
        &self,
        input: &[T],
        send_counts: &[usize],
        output: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        self.bytes().all_to_all_v(T::DTYPE, bytes(input), send_counts, bytes_mut(output), recv_counts)
    }

    /// The root's `output` (`size()` times as long as `input`) gets every rank's `input`, in
    /// rank order; on the other ranks `output` is not used (pass an empty slice).
    pub fn gather<T: Element>(&self, input: &[T], output: &mut [T], root: usize) -> Result<()> {
        self.bytes().gather(T::DTYPE, bytes(input), bytes_mut(output), root)
    }

    /// Rank q's `output` gets block q of the root's `input` (`size()` blocks as long as
    /// `output`); on the other ranks `input` is not used (pass an empty slice).
    pub fn scatter<T: Element>(&self, input: &[T], output: &mut [T], root: usize) -> Result<()> {
        self.bytes().scatter(T::DTYPE, bytes(input), bytes_mut(output), root)
    }

    /// The root's `buf` gets every rank's `buf` reduced with `op`: the same bits
    /// [`Group::all_reduce`] would give. Other ranks' `buf` is not changed.
    pub fn reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        self.bytes().reduce(op, T::DTYPE, None, bytes_mut(buf), root)
    }
}

impl Drop for Group {
    /// Finishes every started call (each bounded by the group's deadlines), then stops the
    /// progress thread.
    fn drop(&mut self) {
        self.queue.shut_down();
    }
}

impl Core {
    fn size(&self) -> usize {
        self.members.len()
    }

    fn algorithm(&self, coll: Collective, bytes: usize) -> Algo {
        if self.size() == 1 {
            return Algo::Mesh;
        }
        select(coll, bytes, &self.cabling, &self.shared.cfg)
    }

    fn check_rank(&self, what: &str, r: usize) -> Result<()> {
        if r >= self.size() {
            return Err(Error::invalid(format!(
                "{what} {r} is out of range: this group has ranks 0..{}",
                self.size() - 1
            )));
        }
        Ok(())
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        self.check_rank("peer", peer)?;
        if peer == self.me {
            return Err(Error::invalid(format!("rank {peer} cannot send to or receive from itself")));
        }
        Ok(())
    }

    /// Run one call: serialise, check poison, number it, run `f` on the links, poison on
    /// failure.
    fn run(&self, call: Call, turn: Turn, f: impl FnOnce(&mut Comm<'_>, &mut Scratch) -> Result<()>) -> Result<()> {
        let mut st = match turn {
            Turn::Try => self.state.try_lock().ok_or(Error::Busy)?,
            Turn::Wait => self.state.lock(),
        };
        if let Some(e) = self.shared.poison.lock().clone().or_else(|| self.shared.abort.error()) {
            return Err(Error::Poisoned(Box::new(e)));
        }
        let counter = match call.p2p {
            Some((peer, true)) => &mut st.send_seq[peer],
            Some((peer, false)) => &mut st.recv_seq[peer],
            None => &mut st.seq,
        };
        *counter = counter.wrapping_add(1);
        let seq = *counter;
        let base = Header::data(call.coll, self.id, seq, call.dtype, call.op, call.count as u64, call.root as u16);
        let span = tracing::debug_span!("call", op = call.name(), rank = self.me, count = call.count, seq);
        let _enter = span.enter();
        let mut transport = self.shared.transport.lock();
        let limits = Limits {
            timeout: self.shared.cfg.timeout,
            op: call.name(),
            interrupt: self.shared.interrupt.lock().clone(),
            bytes: call.count * call.dtype.size(),
            abort: Some(self.shared.abort.clone()),
        };
        let mut comm =
            Comm { t: &mut **transport, members: &self.members, me: self.me, base, chunk: self.chunk, limits };
        let r = f(&mut comm, &mut st.scratch);
        if let Err(e) = &r {
            tracing::debug!("call failed: {e}");
            if !e.is_local() {
                self.shared.poison.lock().get_or_insert_with(|| e.clone());
                transport.abort(e);
            }
        }
        drop(transport);
        // An abort raised while this call held the links (so `Group::abort` could not tell the
        // other ranks itself) is told now: raised before its `try_lock` failed, so seen here.
        self.shared.tell_abort();
        r
    }
}

/// One call on byte buffers, as the bindings and the non-blocking forms hand it over:
/// checked (`Op::check`) before it is run or queued.
#[derive(Debug)]
pub enum Op<'a> {
    /// Reduce `output` across ranks with `op`; `input: None` means `output` holds the input.
    AllReduce {
        /// The reduction.
        op: ReduceOp,
        /// Element type.
        dtype: DType,
        /// Input, or `None` for in place.
        input: Option<&'a [u8]>,
        /// Output (and input when in place).
        output: &'a mut [u8],
    },
    /// `output` gets every rank's `input`, in rank order.
    AllGather {
        /// Element type.
        dtype: DType,
        /// This rank's block.
        input: &'a [u8],
        /// `size` blocks.
        output: &'a mut [u8],
    },
    /// `input` holds `size` blocks; this rank gets block `rank` reduced with `op`.
    ReduceScatter {
        /// The reduction.
        op: ReduceOp,
        /// Element type.
        dtype: DType,
        /// `size` blocks.
        input: &'a [u8],
        /// This rank's block.
        output: &'a mut [u8],
    },
    /// Every rank's `buf` gets `root`'s.
    Broadcast {
        /// Element type.
        dtype: DType,
        /// The buffer.
        buf: &'a mut [u8],
        /// The sending rank.
        root: usize,
    },
    /// Send `buf` to `peer`.
    Send {
        /// Element type.
        dtype: DType,
        /// The data.
        buf: &'a [u8],
        /// The receiving rank.
        peer: usize,
    },
    /// Receive into `buf` from `peer`.
    Recv {
        /// Element type.
        dtype: DType,
        /// Where the data lands.
        buf: &'a mut [u8],
        /// The sending rank.
        peer: usize,
    },
    /// Wait for every rank.
    Barrier,
    /// `input` holds `size` equal parts; part q goes to rank q, and `output` gets part `rank`
    /// of every rank's input, in rank order.
    AllToAll {
        /// Element type.
        dtype: DType,
        /// `size` parts, one per rank.
        input: &'a [u8],
        /// `size` parts, one from each rank.
        output: &'a mut [u8],
    },
    /// Like `AllToAll` with a count per peer: `input` holds `send_counts[q]` elements for each
    /// rank q in turn, `output` gets `recv_counts[q]` from each. What rank q sends this rank
    /// must be what this rank expects from q.
    AllToAllV {
        /// Element type.
        dtype: DType,
        /// The parts for ranks 0, 1, ..., back to back.
        input: &'a [u8],
        /// Elements for each rank.
        send_counts: &'a [usize],
        /// The parts from ranks 0, 1, ..., back to back.
        output: &'a mut [u8],
        /// Elements from each rank.
        recv_counts: &'a [usize],
    },
    /// The root's `output` gets every rank's `input`, in rank order; other ranks' `output` is
    /// not used (it may be empty).
    Gather {
        /// Element type.
        dtype: DType,
        /// This rank's block.
        input: &'a [u8],
        /// On the root, `size` blocks.
        output: &'a mut [u8],
        /// The receiving rank.
        root: usize,
    },
    /// Rank q's `output` gets block q of the root's `input`; other ranks' `input` is not used
    /// (it may be empty).
    Scatter {
        /// Element type.
        dtype: DType,
        /// On the root, `size` blocks.
        input: &'a [u8],
        /// This rank's block.
        output: &'a mut [u8],
        /// The sending rank.
        root: usize,
    },
    /// The root's `output` gets every rank's input reduced with `op`, with the bits the same
    /// all-reduce gives; other ranks' `output` is not changed.
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// Element type.
        dtype: DType,
        /// Input, or `None` when `output` holds it.
        input: Option<&'a [u8]>,
        /// The root's result (and the input when `input` is `None`).
        output: &'a mut [u8],
        /// The receiving rank.
        root: usize,
    },
}

fn whole(what: &str, len: usize, dtype: DType) -> Result<()> {
    if len % dtype.size() != 0 {
        return Err(Error::invalid(format!("{what} is {len} bytes, not a whole number of {dtype} elements")));
    }
    Ok(())
}

/// Fail unless `whole` (named `what`) is `size` blocks of `block` (named `per`) bytes.
fn blocks(size: usize, what: &str, whole: usize, per: &str, block: usize, dtype: DType) -> Result<()> {
    let e = dtype.size();
    if whole != block * size {
        return Err(Error::invalid(format!(
            "{what} has {} elements but needs size × {per} = {size} × {} = {}",
            whole / e,
            block / e,
            block * size / e
        )));
    }
    Ok(())
}

impl Op<'_> {
    /// The argument checks, made before anything is sent: a failure leaves the group usable.
    fn check(&self, g: &Core) -> Result<()> {
        match self {
            Op::AllReduce { dtype, input, output, .. } => {
                whole("the buffer", output.len(), *dtype)?;
                if let Some(i) = input {
                    if i.len() != output.len() {
                        return Err(Error::invalid(format!(
                            "input has {} elements but output has {}: they must be the same length",
                            i.len() / dtype.size(),
                            output.len() / dtype.size()
                        )));
                    }
                }
                Ok(())
            }
            Op::AllGather { dtype, input, output } => {
                whole("the input", input.len(), *dtype)?;
                blocks(g.size(), "all_gather output", output.len(), "input", input.len(), *dtype)
            }
            Op::ReduceScatter { dtype, input, output, .. } => {
                whole("the output", output.len(), *dtype)?;
                blocks(g.size(), "reduce_scatter input", input.len(), "output", output.len(), *dtype)
            }
            Op::Broadcast { dtype, buf, root } => {
                whole("the buffer", buf.len(), *dtype)?;
                g.check_rank("root", *root)
            }
            Op::Send { dtype, buf, peer } => {
                whole("the buffer", buf.len(), *dtype)?;
                g.check_peer(*peer)
            }
            Op::Recv { dtype, buf, peer } => {
                whole("the buffer", buf.len(), *dtype)?;
                g.check_peer(*peer)
            }
            Op::Barrier => Ok(()),
            Op::AllToAll { .. } | Op::AllToAllV { .. } | Op::Gather { .. } | Op::Scatter { .. } | Op::Reduce { .. } => {
                self.check_rooted_and_all_to_all(g)
            }
        }
    }

    /// Run the (checked) call on `g`'s links.
    pub(crate) fn run(self, g: &Core, turn: Turn) -> Result<()> {
        match self {
            Op::AllReduce { op, dtype, input, output } => {
                let plan = select::all_reduce(output.len(), &g.cabling, g.me, &g.shared.cfg);
                let call = Call::new(Collective::AllReduce, dtype, op, output.len());
                g.run(call, turn, |comm, scratch| {
                    if comm.size() == 1 {
                        if let Some(i) = input {
                            output.copy_from_slice(i);
                        }
                        return Ok(());
                    }
                    match &plan {
                        AllReducePlan::OneStep => one_step::all_reduce(comm, scratch, op, dtype, input, output),
                        AllReducePlan::Doubling => doubling::all_reduce(comm, scratch, op, dtype, input, output),
                        AllReducePlan::Ring => ring::all_reduce(comm, scratch, op, dtype, input, output),
                        AllReducePlan::Direct => direct::all_reduce(comm, scratch, op, dtype, input, output),
                        AllReducePlan::Hosts(plan) => hosts::all_reduce(comm, scratch, plan, op, dtype, input, output),
                    }
                })
            }
            Op::AllGather { dtype, input, output } => {
                let plan = select::gather(output.len(), &g.cabling, &g.shared.cfg);
                g.run(Call::new(Collective::AllGather, dtype, ReduceOp::Sum, input.len()), turn, |comm, _| match plan {
                    GatherPlan::Ring => ring_ops::all_gather(comm, input, output, dtype.size()),
                    GatherPlan::Direct => direct::all_gather(comm, input, output),
                })
            }
            Op::ReduceScatter { op, dtype, input, output } => {
                let plan = select::gather(input.len(), &g.cabling, &g.shared.cfg);
                g.run(Call::new(Collective::ReduceScatter, dtype, op, output.len()), turn, |comm, scratch| match plan {
                    GatherPlan::Ring => ring_ops::reduce_scatter(comm, scratch, op, dtype, input, output),
                    GatherPlan::Direct => direct::reduce_scatter(comm, scratch, op, dtype, input, output),
                })
            }
            Op::Broadcast { dtype, buf, root } => {
                let plan = select::broadcast(buf.len(), &g.cabling, &g.shared.cfg);
                let call = Call { root, ..Call::new(Collective::Broadcast, dtype, ReduceOp::Sum, buf.len()) };
                g.run(call, turn, |comm, _| match plan {
                    _ if comm.size() == 1 => Ok(()),
                    BroadcastPlan::Ring => ring_ops::broadcast(comm, buf, root, dtype.size()),
                    BroadcastPlan::Direct => direct::broadcast(comm, buf, root, dtype.size()),
                    BroadcastPlan::FromRoot => direct::broadcast_from_root(comm, buf, root),
                })
            }
            Op::Send { dtype, buf, peer } => {
                let call = Call {
                    p2p: Some((peer, true)),
                    ..Call::new(Collective::SendRecv, dtype, ReduceOp::Sum, buf.len())
                };
                g.run(call, turn, |comm, _| p2p::send(comm, buf, peer))
            }
            Op::Recv { dtype, buf, peer } => {
                let call = Call {
                    p2p: Some((peer, false)),
                    ..Call::new(Collective::SendRecv, dtype, ReduceOp::Sum, buf.len())
                };
                g.run(call, turn, |comm, _| p2p::recv(comm, buf, peer))
            }
            Op::Barrier => g.run(Call::new(Collective::Barrier, DType::U8, ReduceOp::Sum, 0), turn, |comm, _| {
                one_step::barrier(comm)
            }),
            op @ (Op::AllToAll { .. }
            | Op::AllToAllV { .. }
            | Op::Gather { .. }
            | Op::Scatter { .. }
            | Op::Reduce { .. }) => op.run_rooted_and_all_to_all(g, turn),
        }
    }
}

/// A group's byte-level calls (see [`Group::bytes`]): buffers are bytes, the element type a
/// value, and every length is checked against it.
pub struct Bytes<'g> {
    g: &'g Group,
}

impl Bytes<'_> {
    /// Reduce `output` across ranks with `op`; `input = None` means `output` holds the input
    /// (in place).
    pub fn all_reduce(&self, op: ReduceOp, dtype: DType, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        self.g.call(Op::AllReduce { op, dtype, input, output })
    }

    /// `output` gets every rank's `input` in rank order.
    pub fn all_gather(&self, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.g.call(Op::AllGather { dtype, input, output })
    }

    /// `input` holds `size()` blocks of `output.len()` bytes; this rank gets block `rank()`
    /// reduced with `op` over all ranks.
    pub fn reduce_scatter(&self, op: ReduceOp, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.g.call(Op::ReduceScatter { op, dtype, input, output })
    }

    /// Every rank's `buf` gets `root`'s.
    pub fn broadcast(&self, dtype: DType, buf: &mut [u8], root: usize) -> Result<()> {
        self.g.call(Op::Broadcast { dtype, buf, root })
    }

    /// Send `buf` to `peer`, which must receive with the same type and length.
    pub fn send(&self, dtype: DType, buf: &[u8], peer: usize) -> Result<()> {
        self.g.call(Op::Send { dtype, buf, peer })
    }

    /// Receive into `buf` from `peer`, which must send with the same type and length.
    pub fn recv(&self, dtype: DType, buf: &mut [u8], peer: usize) -> Result<()> {
        self.g.call(Op::Recv { dtype, buf, peer })
    }
    /// `input` holds `size()` equal parts; part q goes to rank q, and `output` (as long as
    /// `input`) gets part `rank()` of every rank's input, in rank order.
    pub fn all_to_all(&self, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.g.call(Op::AllToAll { dtype, input, output })
    }

    /// All-to-all with a count per peer (in elements): `input` holds `send_counts[q]` elements
    /// for each rank q in turn, `output` gets `recv_counts[q]` from each.
    pub fn all_to_all_v(
        &self,
        dtype: DType,
        input: &[u8],
        send_counts: &[usize],
        output: &mut [u8],
        recv_counts: &[usize],
    ) -> Result<()> {
        self.g.call(Op::AllToAllV { dtype, input, send_counts, output, recv_counts })
    }

    /// The root's `output` gets every rank's `input`, in rank order (ignored elsewhere).
    pub fn gather(&self, dtype: DType, input: &[u8], output: &mut [u8], root: usize) -> Result<()> {
        self.g.call(Op::Gather { dtype, input, output, root })
    }

    /// Rank q's `output` gets block q of the root's `input` (ignored elsewhere).
    pub fn scatter(&self, dtype: DType, input: &[u8], output: &mut [u8], root: usize) -> Result<()> {
        self.g.call(Op::Scatter { dtype, input, output, root })
    }

    /// The root's `output` gets every rank's input (`input`, or `output` when `None`) reduced
    /// with `op`; other ranks' `output` is not changed.
    pub fn reduce(
        &self,
        op: ReduceOp,
        dtype: DType,
        input: Option<&[u8]>,
        output: &mut [u8],
        root: usize,
    ) -> Result<()> {
        self.g.call(Op::Reduce { op, dtype, input, output, root })
    }
}

/// Byte offsets of parts of `counts` elements of `e` bytes laid back to back; `None` on
/// overflow.
fn layout(counts: &[usize], e: usize) -> Option<Vec<std::ops::Range<usize>>> {
    let mut at = 0usize;
    counts
        .iter()
        .map(|&n| {
            let end = at.checked_add(n.checked_mul(e)?)?;
            let r = at..end;
            at = end;
            Some(r)
        })
        .collect()
}

impl Op<'_> {
    /// The argument checks of all-to-all, gather, scatter and reduce.
    fn check_rooted_and_all_to_all(&self, g: &Core) -> Result<()> {
        let p = g.size();
        match self {
            Op::AllToAll { dtype, input, output } => {
                whole("the input", input.len(), *dtype)?;
                if input.len() % (p * dtype.size()) != 0 {
                    return Err(Error::invalid(format!(
                        "all_to_all input has {} elements, not a multiple of the group's {p} ranks: \
                         give every rank a part of the same length",
                        input.len() / dtype.size()
                    )));
                }
                blocks(p, "all_to_all output", output.len(), "part", input.len() / p, *dtype)
            }
            Op::AllToAllV { dtype, input, send_counts, output, recv_counts } => {
                for (what, counts, buf, len) in
                    [("send", send_counts, "input", input.len()), ("receive", recv_counts, "output", output.len())]
                {
                    if counts.len() != p {
                        return Err(Error::invalid(format!(
                            "all_to_all_v has {} {what} counts but the group has {p} ranks: give one per rank",
                            counts.len()
                        )));
                    }
                    let total =
                        layout(counts, dtype.size()).and_then(|r| r.last().map(|r| r.end)).unwrap_or(usize::MAX);
                    if total != len {
                        whole(&format!("the {buf}"), len, *dtype)?;
                        return Err(Error::invalid(format!(
                            "all_to_all_v {buf} has {} elements but the {what} counts add up to {}: \
                             make them agree",
                            len / dtype.size(),
                            counts.iter().fold(0usize, |a, &n| a.saturating_add(n))
                        )));
                    }
                }
                let me = g.me;
                if send_counts[me] != recv_counts[me] {
                    return Err(Error::invalid(format!(
                        "all_to_all_v: rank {me} sends itself {} elements but expects {} from itself: \
                         its send and receive counts at index {me} must be equal",
                        send_counts[me], recv_counts[me]
                    )));
                }
                Ok(())
            }
            Op::Gather { dtype, input, output, root } => {
                whole("the input", input.len(), *dtype)?;
                g.check_rank("root", *root)?;
                if g.me == *root {
                    blocks(p, "gather output", output.len(), "input", input.len(), *dtype)?;
                }
                Ok(())
            }
            Op::Scatter { dtype, input, output, root } => {
                whole("the output", output.len(), *dtype)?;
                g.check_rank("root", *root)?;
                if g.me == *root {
                    blocks(p, "scatter input", input.len(), "output", output.len(), *dtype)?;
                }
                Ok(())
            }
            Op::Reduce { dtype, input, output, root, .. } => {
                whole("the buffer", output.len(), *dtype)?;
                if let Some(i) = input {
                    if i.len() != output.len() {
                        return Err(Error::invalid(format!(
                            "reduce input has {} elements but output has {}: they must be the same length",
                            i.len() / dtype.size(),
                            output.len() / dtype.size()
                        )));
                    }
                }
                g.check_rank("root", *root)
            }
            _ => Ok(()),
        }
    }

    /// Run a (checked) all-to-all, gather, scatter or reduce.
    fn run_rooted_and_all_to_all(self, g: &Core, turn: Turn) -> Result<()> {
        let p = g.size();
        match self {
            Op::AllToAll { dtype, input, output } => {
                let plan = select::all_to_all(&g.shared.cfg);
                let m = input.len() / p;
                let parts: Vec<std::ops::Range<usize>> = (0..p).map(|q| q * m..(q + 1) * m).collect();
                let call = Call::new(Collective::AllToAll, dtype, ReduceOp::Sum, input.len());
                g.run(call, turn, |comm, _| {
                    let pairwise = plan == AllToAllPlan::Pairwise;
                    all_to_all::all_to_all(comm, input, &parts, output, &parts, None, pairwise)
                })
            }
            Op::AllToAllV { dtype, input, send_counts, output, recv_counts } => {
                let plan = select::all_to_all(&g.shared.cfg);
                let e = dtype.size();
                let send = layout(send_counts, e).ok_or_else(|| Error::Internal("checked counts overflow".into()))?;
                let recv = layout(recv_counts, e).ok_or_else(|| Error::Internal("checked counts overflow".into()))?;
                let call = Call::new(Collective::AllToAllV, dtype, ReduceOp::Sum, input.len());
                g.run(call, turn, |comm, _| {
                    let counts = all_to_all::Counts { send: send_counts, recv: recv_counts };
                    let pairwise = plan == AllToAllPlan::Pairwise;
                    all_to_all::all_to_all(comm, input, &send, output, &recv, Some(counts), pairwise)
                })
            }
            Op::Gather { dtype, input, output, root } => {
                let call = Call { root, ..Call::new(Collective::Gather, dtype, ReduceOp::Sum, input.len()) };
                g.run(call, turn, |comm, _| match comm.size() {
                    1 => {
                        output.copy_from_slice(input);
                        Ok(())
                    }
                    _ => rooted::gather(comm, input, output, root),
                })
            }
            Op::Scatter { dtype, input, output, root } => {
                let call = Call { root, ..Call::new(Collective::Scatter, dtype, ReduceOp::Sum, output.len()) };
                g.run(call, turn, |comm, _| match comm.size() {
                    1 => {
                        output.copy_from_slice(input);
                        Ok(())
                    }
                    _ => rooted::scatter(comm, input, output, root),
                })
            }
            Op::Reduce { op, dtype, input, output, root } => {
                let plan = select::reduce(output.len(), &g.cabling, g.me, &g.shared.cfg);
                let call = Call { root, ..Call::new(Collective::Reduce, dtype, op, output.len()) };
                g.run(call, turn, |comm, scratch| {
                    if comm.size() == 1 {
                        if let Some(i) = input {
                            output.copy_from_slice(i);
                        }
                        return Ok(());
                    }
                    rooted::reduce(comm, scratch, &plan, op, dtype, input, output, root)
                })
            }
            _ => Err(Error::Internal("not an all-to-all or rooted call".into())),
        }
    }
}
