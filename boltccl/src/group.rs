//! [`Group`]: the public face of boltccl — the user's calls, and the bookkeeping of each
//! (sequence numbers, poisoning, serialisation). Which transport and which algorithm serve a
//! call is decided elsewhere ([`crate::transport::connect`], [`crate::algo::select`]).

use crate::algo::select::{select, Cabling};
use crate::algo::{direct, mesh, p2p, ring, ring_ops, Link, Scratch};
use crate::config::{Algo, Config};
use crate::error::{Error, Result};
use crate::transport::{InterruptCheck, Limits, LinkKind, Transport};
use crate::types::{Collective, DType, Element, ReduceOp};
use crate::wire::Header;
use parking_lot::Mutex;
use std::sync::Arc;

/// State shared by a group and the sub-groups split from it: they use the same links.
struct Shared {
    transport: Mutex<Box<dyn Transport>>,
    /// The first communication error; every later call reports it.
    poison: Mutex<Option<Error>>,
    interrupt: Mutex<Option<InterruptCheck>>,
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
/// `Group` is `Send` and `Sync`; calls on one group must not overlap (a second concurrent
/// call fails with [`Error::Busy`]). Use [`Group::split`] for independent groups.
pub struct Group {
    shared: Arc<Shared>,
    /// Group rank to transport rank.
    members: Vec<usize>,
    me: usize,
    id: u32,
    state: Mutex<State>,
    /// The cabling among the members, in group order.
    cabling: Cabling,
}

/// Form a group from the environment (`BOLTCCL_*`, or MLX / Open MPI / PMI / Slurm variables).
pub fn init() -> Result<Group> {
    Group::new(Config::from_env()?)
}

fn bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
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
        let t = crate::transport::connect(&cfg)?;
        Ok(Group::from_transport(t, cfg))
    }

    pub(crate) fn from_transport(t: Box<dyn Transport>, cfg: Config) -> Group {
        let (rank, size) = (t.rank(), t.size());
        let cabling = t.cabling();
        let kinds = (0..size).map(|p| t.link_kind(p)).collect();
        if cabling.shape() == crate::algo::select::Shape::Ring {
            tracing::info!("the RDMA links form a ring, not a full mesh: large collectives use the ring algorithms");
        }
        Group {
            shared: Arc::new(Shared {
                transport: Mutex::new(t),
                poison: Mutex::new(None),
                interrupt: Mutex::new(None),
                cfg,
                cabling: cabling.clone(),
                kinds,
            }),
            members: (0..size).collect(),
            me: rank,
            id: 0,
            state: Mutex::new(State::new(size)),
            cabling,
        }
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
            g.cabling = cabling.subset(&g.members);
            Arc::get_mut(&mut g.shared).expect("a new group shares nothing").cabling = cabling.clone();
        }
        world
    }

    /// The algorithm `coll` runs on a buffer of `bytes` bytes on this group (`auto` resolved
    /// from the size and the cabling; for all-gather the output, for reduce-scatter the input).
    pub fn algorithm(&self, coll: Collective, bytes: usize) -> Algo {
        if self.size() == 1 {
            return Algo::Mesh;
        }
        select(coll, bytes, &self.cabling, &self.shared.cfg)
    }

    /// What carries this rank's messages to `peer` (shared memory, RDMA, TCP).
    pub fn link_kind(&self, peer: usize) -> Result<LinkKind> {
        self.check_rank("peer", peer)?;
        Ok(self.shared.kinds[self.members[peer]])
    }

    /// This rank, 0-based.
    pub fn rank(&self) -> usize {
        self.me
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Install a check that blocked calls run every 50 ms (never on the fast path); when it
    /// returns `true` the call fails with [`Error::Interrupted`] and the group is poisoned.
    /// Shared with sub-groups. Language bindings use it to deliver Ctrl-C.
    pub fn set_interrupt_check(&self, check: Option<InterruptCheck>) {
        *self.shared.interrupt.lock() = check;
    }

    /// The settings this group was formed with.
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    /// Byte-level calls with the element type as a value: for language bindings, which hold
    /// untyped buffers.
    pub fn bytes(&self) -> Bytes<'_> {
        Bytes { g: self }
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
    fn run(&self, call: Call, f: impl FnOnce(&mut Link<'_>, &mut Scratch) -> Result<()>) -> Result<()> {
        let mut st = self.state.try_lock().ok_or(Error::Busy)?;
        if let Some(e) = self.shared.poison.lock().clone() {
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
        };
        let mut link = Link {
            t: &mut **transport,
            members: &self.members,
            me: self.me,
            base,
            chunk: self.shared.cfg.chunk_bytes,
            limits,
        };
        let r = f(&mut link, &mut st.scratch);
        if let Err(e) = &r {
            tracing::debug!("call failed: {e}");
            if !e.is_local() {
                self.shared.poison.lock().get_or_insert_with(|| e.clone());
                transport.abort(e);
            }
        }
        r
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
        self.run(Call::new(Collective::Barrier, DType::U8, ReduceOp::Sum, 0), |link, _| mesh::barrier(link))
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
        let n = {
            let mut st = self.state.try_lock().ok_or(Error::Busy)?;
            st.splits += 1;
            st.splits
        };
        let Some(color) = color else { return Ok(None) };
        let mut chosen: Vec<(i64, usize)> =
            (0..self.size()).filter(|&q| all[2 * q] == i64::from(color)).map(|q| (all[2 * q + 1], q)).collect();
        chosen.sort();
        let me = chosen
            .iter()
            .position(|&(_, q)| q == self.me)
            .ok_or_else(|| Error::Internal("split lost this rank".into()))?;
        let members: Vec<usize> = chosen.iter().map(|&(_, q)| self.members[q]).collect();
        let size = members.len();
        Ok(Some(Group {
            cabling: self.shared.cabling.subset(&members),
            shared: self.shared.clone(),
            members,
            me,
            id: mix(self.id, n, color),
            state: Mutex::new(State::new(size)),
        }))
    }
}

/// A group's byte-level calls (see [`Group::bytes`]): buffers are bytes, the element type a
/// value, and every length is checked against it.
pub struct Bytes<'g> {
    g: &'g Group,
}

fn whole(what: &str, len: usize, dtype: DType) -> Result<()> {
    if len % dtype.size() != 0 {
        return Err(Error::invalid(format!("{what} is {len} bytes, not a whole number of {dtype} elements")));
    }
    Ok(())
}

impl Bytes<'_> {
    /// Fail unless `whole` (named `what`) is `size()` blocks of `block` (named `per`) bytes.
    fn blocks(&self, what: &str, whole: usize, per: &str, block: usize, dtype: DType) -> Result<()> {
        let (size, e) = (self.g.size(), dtype.size());
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

    /// Reduce `output` across ranks with `op`; `input = None` means `output` holds the input
    /// (in place).
    pub fn all_reduce(&self, op: ReduceOp, dtype: DType, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        whole("the buffer", output.len(), dtype)?;
        if let Some(i) = input {
            if i.len() != output.len() {
                return Err(Error::invalid(format!(
                    "input has {} elements but output has {}: they must be the same length",
                    i.len() / dtype.size(),
                    output.len() / dtype.size()
                )));
            }
        }
        let algo = self.g.algorithm(Collective::AllReduce, output.len());
        let call = Call::new(Collective::AllReduce, dtype, op, output.len());
        self.g.run(call, |link, scratch| {
            if link.size() == 1 {
                if let Some(i) = input {
                    output.copy_from_slice(i);
                }
                return Ok(());
            }
            match algo {
                Algo::Mesh => mesh::all_reduce(link, scratch, op, dtype, input, output),
                Algo::Ring => ring::all_reduce(link, scratch, op, dtype, input, output),
                Algo::Direct | Algo::Auto => direct::all_reduce(link, scratch, op, dtype, input, output),
            }
        })
    }

    /// `output` gets every rank's `input` in rank order.
    pub fn all_gather(&self, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        whole("the input", input.len(), dtype)?;
        self.blocks("all_gather output", output.len(), "input", input.len(), dtype)?;
        let ring = self.g.algorithm(Collective::AllGather, output.len()) == Algo::Ring;
        self.g.run(Call::new(Collective::AllGather, dtype, ReduceOp::Sum, input.len()), |link, _| {
            if ring {
                ring_ops::all_gather(link, input, output, dtype.size())
            } else {
                direct::all_gather(link, input, output)
            }
        })
    }

    /// `input` holds `size()` blocks of `output.len()` bytes; this rank gets block `rank()`
    /// reduced with `op` over all ranks.
    pub fn reduce_scatter(&self, op: ReduceOp, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        whole("the output", output.len(), dtype)?;
        self.blocks("reduce_scatter input", input.len(), "output", output.len(), dtype)?;
        let ring = self.g.algorithm(Collective::ReduceScatter, input.len()) == Algo::Ring;
        self.g.run(Call::new(Collective::ReduceScatter, dtype, op, output.len()), |link, scratch| {
            if ring {
                ring_ops::reduce_scatter(link, scratch, op, dtype, input, output)
            } else {
                direct::reduce_scatter(link, scratch, op, dtype, input, output)
            }
        })
    }

    /// Every rank's `buf` gets `root`'s.
    pub fn broadcast(&self, dtype: DType, buf: &mut [u8], root: usize) -> Result<()> {
        whole("the buffer", buf.len(), dtype)?;
        self.g.check_rank("root", root)?;
        let algo = self.g.algorithm(Collective::Broadcast, buf.len());
        let call = Call { root, ..Call::new(Collective::Broadcast, dtype, ReduceOp::Sum, buf.len()) };
        self.g.run(call, |link, _| match algo {
            _ if link.size() == 1 => Ok(()),
            Algo::Ring => ring_ops::broadcast(link, buf, root, dtype.size()),
            Algo::Direct => direct::broadcast(link, buf, root, dtype.size()),
            Algo::Mesh | Algo::Auto => direct::broadcast_from_root(link, buf, root),
        })
    }

    /// Send `buf` to `peer`, which must receive with the same type and length.
    pub fn send(&self, dtype: DType, buf: &[u8], peer: usize) -> Result<()> {
        whole("the buffer", buf.len(), dtype)?;
        self.g.check_peer(peer)?;
        let call = Call { p2p: Some((peer, true)), ..Call::new(Collective::SendRecv, dtype, ReduceOp::Sum, buf.len()) };
        self.g.run(call, |link, _| p2p::send(link, buf, peer))
    }

    /// Receive into `buf` from `peer`, which must send with the same type and length.
    pub fn recv(&self, dtype: DType, buf: &mut [u8], peer: usize) -> Result<()> {
        whole("the buffer", buf.len(), dtype)?;
        self.g.check_peer(peer)?;
        let call =
            Call { p2p: Some((peer, false)), ..Call::new(Collective::SendRecv, dtype, ReduceOp::Sum, buf.len()) };
        self.g.run(call, |link, _| p2p::recv(link, buf, peer))
    }
}
