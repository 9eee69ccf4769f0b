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
use crate::transport::{AbortSignal, InterruptCheck, InterruptSlot, Limits, LinkKind, Transport};
use crate::types::{Collective, DType, Element, ReduceOp};
use crate::wire::Header;
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};

mod bytes;
mod op;
mod survive;

pub use bytes::Bytes;
pub use op::Op;

/// State shared by a group and the sub-groups split from it: they use the same links.
struct Shared {
    /// Shared further with the groups a shrink makes (they reuse the links).
    transport: Arc<Mutex<Box<dyn Transport>>>,
    /// The first communication error; every later call reports it. Set once, read without a
    /// lock by every call.
    poison: OnceLock<Error>,
    /// Raised by [`Group::abort`], from any thread.
    abort: Arc<AbortSignal>,
    /// A shrink made new groups on these links: this state's groups are done with them.
    retired: std::sync::atomic::AtomicBool,
    /// Shrinks that led to these groups (it makes their ids differ).
    generation: u32,
    interrupt: InterruptSlot,
    cfg: Config,
    /// The transport's cabling, read once (transport ranks).
    cabling: Cabling,
    /// What carries the messages to each transport rank, read once.
    kinds: Vec<LinkKind>,
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
            poison: OnceLock::new(),
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
        crate::transport::mem::world(n, template)
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
        if let Some(e) = self.shared.poison.get().cloned().or_else(|| self.shared.abort.error()) {
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
            interrupt: Some(&self.shared.interrupt),
            bytes: call.count * call.dtype.size(),
            abort: Some(&self.shared.abort),
        };
        let mut comm =
            Comm { t: &mut **transport, members: &self.members, me: self.me, base, chunk: self.chunk, limits };
        let r = f(&mut comm, &mut st.scratch);
        if let Err(e) = &r {
            tracing::debug!("call failed: {e}");
            if !e.is_local() {
                let _ = self.shared.poison.set(e.clone());
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
