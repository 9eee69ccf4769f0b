//! [`Group`]: the public face of boltccl.

use crate::algo::{self, Ctx};
use crate::config::{Algo, Backend, Config};
use crate::dtype::{DType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::transport::mem::MemTransport;
use crate::transport::{InterruptCheck, Limits, Transport};
use crate::wire::{Coll, Header};
use parking_lot::Mutex;
use std::sync::Arc;

/// State shared by a group and the sub-groups split from it: they use the same links.
struct Shared {
    transport: Mutex<Box<dyn Transport>>,
    /// The first communication error; every later call reports it.
    poison: Mutex<Option<Error>>,
    interrupt: Mutex<Option<InterruptCheck>>,
    cfg: Config,
    /// The transport's [`Transport::cabling`], read once.
    cabling: Option<Vec<Vec<bool>>>,
}

/// Per-group call state. Locked for the whole call: a second concurrent call gets `Busy`.
struct State {
    seq: u32,
    send_seq: Vec<u32>,
    recv_seq: Vec<u32>,
    splits: u32,
    scratch: Vec<u64>,
    stage: Vec<u64>,
}

impl State {
    fn new(size: usize) -> State {
        State {
            seq: 0,
            send_seq: vec![0; size],
            recv_seq: vec![0; size],
            splits: 0,
            scratch: Vec::new(),
            stage: Vec::new(),
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
    /// The members are cabled as a ring (in group order) but not as a full mesh: large
    /// collectives then use the ring algorithms, which talk to neighbours only.
    ring_cabled: bool,
}

/// Whether `members` (in order) are joined as a ring by fast links without being a full mesh.
fn ring_cabled(cabling: Option<&[Vec<bool>]>, members: &[usize]) -> bool {
    let Some(c) = cabling else { return false };
    let n = members.len();
    let linked = |a: usize, b: usize| c[members[a]][members[b]];
    let mesh = (0..n).all(|a| (0..n).all(|b| linked(a, b)));
    n >= 3 && !mesh && (0..n).all(|a| linked(a, (a + 1) % n))
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

/// `BOLTCCL_BACKEND=auto`: verbs when a device matrix is configured and the verbs library
/// and devices are there, else TCP — saying why in the log.
fn auto_transport(cfg: &Config) -> Result<Box<dyn Transport>> {
    // Bootstrap checks the resolved choice like any agreed setting, so a node without RDMA
    // is named at start-up instead of failing on the first collective.
    let tcp = Config { backend: Backend::Tcp, ..cfg.clone() };
    let cfg = &Config { backend: Backend::Verbs, ..cfg.clone() };
    if cfg.ibv_devices.is_none() {
        tracing::debug!("BOLTCCL_BACKEND=auto: no RDMA device matrix configured (BOLTCCL_IBV_DEVICES), using TCP");
        return Ok(Box::new(crate::bootstrap::connect(&tcp)?));
    }
    // Decide before any rank connects, from what this node has, so that ranks only disagree
    // when their nodes differ (and then bootstrap's version/settings check does not help:
    // the verbs set-up fails with a clear error on both sides).
    match crate::transport::verbs::loader::Verbs::load(cfg.ibv_library.as_deref()).and_then(|v| v.device_names()) {
        Ok(names) if !names.is_empty() => Ok(Box::new(crate::transport::verbs::connect(cfg)?)),
        Ok(_) => {
            tracing::warn!("BOLTCCL_BACKEND=auto: the verbs library lists no RDMA device; using TCP");
            Ok(Box::new(crate::bootstrap::connect(&tcp)?))
        }
        Err(e) => {
            tracing::warn!("BOLTCCL_BACKEND=auto: RDMA unavailable ({e}); using TCP");
            Ok(Box::new(crate::bootstrap::connect(&tcp)?))
        }
    }
}

impl Group {
    /// Form a group as `cfg` describes: connects to the coordinator and peers.
    pub fn new(cfg: Config) -> Result<Group> {
        cfg.validate()?;
        let transport: Box<dyn Transport> = if cfg.world_size == 1 {
            Box::new(MemTransport::world(1).pop().expect("one rank"))
        } else {
            match cfg.backend {
                Backend::Tcp => Box::new(crate::bootstrap::connect(&cfg)?),
                Backend::Verbs => Box::new(crate::transport::verbs::connect(&cfg)?),
                Backend::Auto => auto_transport(&cfg)?,
            }
        };
        Ok(Group::from_transport(transport, cfg))
    }

    fn from_transport(t: Box<dyn Transport>, cfg: Config) -> Group {
        let cabling = t.cabling();
        Group::with_cabling(t, cfg, cabling)
    }

    fn with_cabling(t: Box<dyn Transport>, cfg: Config, cabling: Option<Vec<Vec<bool>>>) -> Group {
        let (rank, size) = (t.rank(), t.size());
        let members: Vec<usize> = (0..size).collect();
        let ring_cabled = ring_cabled(cabling.as_deref(), &members);
        if ring_cabled {
            tracing::info!("the RDMA links form a ring, not a full mesh: large collectives use the ring algorithms");
        }
        Group {
            ring_cabled,
            shared: Arc::new(Shared {
                transport: Mutex::new(t),
                poison: Mutex::new(None),
                interrupt: Mutex::new(None),
                cfg,
                cabling,
            }),
            members,
            me: rank,
            id: 0,
            state: Mutex::new(State::new(size)),
        }
    }

    /// `n` ranks in this process (one per thread), connected in memory. Handy for tests and
    /// for single-machine users; uses default settings.
    pub fn local_world(n: usize) -> Vec<Group> {
        Group::local_world_with(n, &Config::default())
    }

    /// Like [`Group::local_world`] with the settings of `template` (rank and size are set here).
    pub fn local_world_with(n: usize, template: &Config) -> Vec<Group> {
        MemTransport::world(n)
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                let cfg = Config { rank, world_size: n, ..template.clone() };
                Group::from_transport(Box::new(t), cfg)
            })
            .collect()
    }

    /// Like [`Group::local_world_with`], choosing algorithms as if the ranks were cabled as
    /// `cabling[i][j]` says (tests use it to compute in memory what an RDMA ring gives).
    #[doc(hidden)]
    pub fn local_world_cabled(n: usize, template: &Config, cabling: Vec<Vec<bool>>) -> Vec<Group> {
        MemTransport::world(n)
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                let cfg = Config { rank, world_size: n, ..template.clone() };
                Group::with_cabling(Box::new(t), cfg, Some(cabling.clone()))
            })
            .collect()
    }

    /// The algorithm an all-reduce of `bytes` bytes runs on this group (`auto` resolved from
    /// the size and the cabling).
    pub fn all_reduce_algorithm(&self, bytes: usize) -> Algo {
        if self.size() == 1 {
            return Algo::Mesh;
        }
        self.pick(bytes)
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

    fn check_rank(&self, what: &str, r: usize) -> Result<()> {
        if r >= self.size() {
            return Err(Error::invalid(format!(
                "{what} {r} is out of range: this group has ranks 0..{}",
                self.size() - 1
            )));
        }
        Ok(())
    }

    /// Run one call: serialise, check poison, build the context, poison on failure.
    /// `p2p` is `(peer, sending)` for point-to-point calls, which count per pair and direction.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        coll: Coll,
        dtype: DType,
        op: ReduceOp,
        count: usize,
        aux: usize,
        p2p: Option<(usize, bool)>,
        f: impl FnOnce(&mut Ctx<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut st = self.state.try_lock().ok_or(Error::Busy)?;
        if let Some(e) = self.shared.poison.lock().clone() {
            return Err(Error::Poisoned(Box::new(e)));
        }
        let counter = match p2p {
            Some((peer, true)) => &mut st.send_seq[peer],
            Some((peer, false)) => &mut st.recv_seq[peer],
            None => &mut st.seq,
        };
        *counter = counter.wrapping_add(1);
        let seq = *counter;
        let base = Header::data(coll, self.id, seq, dtype, op, count as u64, aux as u16);
        let span = tracing::debug_span!("call", op = %coll.describe(op as u8), rank = self.me, count, seq);
        let _enter = span.enter();
        let mut guard = self.shared.transport.lock();
        let State { scratch, stage, .. } = &mut *st;
        let mut ctx = Ctx {
            t: &mut **guard,
            members: &self.members,
            me: self.me,
            base,
            chunk: self.shared.cfg.chunk_bytes,
            scratch,
            stage,
            limits: Limits {
                timeout: self.shared.cfg.timeout,
                op: op_name(coll, op),
                interrupt: self.shared.interrupt.lock().clone(),
            },
        };
        let r = f(&mut ctx);
        if let Err(e) = &r {
            tracing::debug!("call failed: {e}");
            if !e.is_local() {
                let mut poison = self.shared.poison.lock();
                if poison.is_none() {
                    *poison = Some(e.clone());
                }
                guard.abort(e);
            }
        }
        r
    }

    fn check_len(&self, what: &str, len: usize, dtype: DType) -> Result<()> {
        if len % dtype.size() != 0 {
            return Err(Error::invalid(format!("{what} is {len} bytes, not a whole number of {dtype} elements")));
        }
        Ok(())
    }

    /// The all-reduce algorithm for a `bytes`-long buffer.
    fn pick(&self, bytes: usize) -> Algo {
        match self.shared.cfg.algo {
            Algo::Auto if bytes <= self.shared.cfg.mesh_max_bytes => Algo::Mesh,
            Algo::Auto if self.ring_cabled => Algo::Ring,
            Algo::Auto => Algo::Direct,
            a => a,
        }
    }

    /// Whether all-gather, reduce-scatter and broadcast moving `bytes` go around the ring
    /// (forced by `BOLTCCL_ALGO=ring`, or large on a ring-cabled group) rather than direct.
    fn around_ring(&self, bytes: usize) -> bool {
        match self.shared.cfg.algo {
            Algo::Ring => true,
            Algo::Auto => self.ring_cabled && bytes > self.shared.cfg.mesh_max_bytes,
            _ => false,
        }
    }

    /// Reduce raw bytes of `dtype` elements across ranks. `input = None` means `output`
    /// holds the input (in place). The building block of the typed calls and the bindings.
    pub fn all_reduce_raw(&self, op: ReduceOp, dtype: DType, input: Option<&[u8]>, output: &mut [u8]) -> Result<()> {
        self.check_len("the buffer", output.len(), dtype)?;
        if let Some(i) = input {
            if i.len() != output.len() {
                return Err(Error::invalid(format!(
                    "input has {} elements but output has {}: they must be the same length",
                    i.len() / dtype.size(),
                    output.len() / dtype.size()
                )));
            }
        }
        let algo = self.pick(output.len());
        self.run(Coll::AllReduce, dtype, op, output.len() / dtype.size(), 0, None, |ctx| {
            if ctx.size() == 1 {
                if let Some(i) = input {
                    output.copy_from_slice(i);
                }
                return Ok(());
            }
            match algo {
                Algo::Mesh => algo::mesh::all_reduce(ctx, op, dtype, input, output),
                Algo::Ring => algo::ring::all_reduce(ctx, op, dtype, input, output),
                Algo::Direct | Algo::Auto => algo::direct::all_reduce(ctx, op, dtype, input, output),
            }
        })
    }

    /// Reduce `buf` in place with `op`.
    pub fn all_reduce<T: Element>(&self, op: ReduceOp, buf: &mut [T]) -> Result<()> {
        self.all_reduce_raw(op, T::DTYPE, None, bytes_mut(buf))
    }

    /// Reduce `input` with `op` into `output` (same length).
    pub fn all_reduce_into<T: Element>(&self, op: ReduceOp, input: &[T], output: &mut [T]) -> Result<()> {
        self.all_reduce_raw(op, T::DTYPE, Some(bytes(input)), bytes_mut(output))
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

    /// Elementwise maximum of `input` across ranks, written to `output`.
    pub fn all_max_into<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.all_reduce_into(ReduceOp::Max, input, output)
    }

    /// Elementwise minimum of `input` across ranks, written to `output`.
    pub fn all_min_into<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.all_reduce_into(ReduceOp::Min, input, output)
    }

    /// Gather raw bytes: `output` gets every rank's `input` in rank order.
    pub fn all_gather_raw(&self, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.check_len("the input", input.len(), dtype)?;
        if output.len() != input.len() * self.size() {
            return Err(Error::invalid(format!(
                "all_gather output has {} elements but needs size × input = {} × {} = {}",
                output.len() / dtype.size(),
                self.size(),
                input.len() / dtype.size(),
                input.len() * self.size() / dtype.size()
            )));
        }
        let ring = self.around_ring(output.len());
        self.run(Coll::AllGather, dtype, ReduceOp::Sum, input.len() / dtype.size(), 0, None, |ctx| {
            if ring {
                algo::ring_ops::all_gather(ctx, input, output, dtype.size())
            } else {
                algo::direct::all_gather(ctx, input, output)
            }
        })
    }

    /// `output` (of `size() * input.len()` elements) gets every rank's `input`, in rank order.
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.all_gather_raw(T::DTYPE, bytes(input), bytes_mut(output))
    }

    /// Reduce-scatter raw bytes: `input` holds `size()` blocks of `output.len()` bytes; this
    /// rank gets block `rank()` reduced with `op` over all ranks.
    pub fn reduce_scatter_raw(&self, op: ReduceOp, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        self.check_len("the output", output.len(), dtype)?;
        if input.len() != output.len() * self.size() {
            return Err(Error::invalid(format!(
                "reduce_scatter input has {} elements but needs size × output = {} × {} = {}",
                input.len() / dtype.size(),
                self.size(),
                output.len() / dtype.size(),
                output.len() * self.size() / dtype.size()
            )));
        }
        let ring = self.around_ring(input.len());
        self.run(Coll::ReduceScatter, dtype, op, output.len() / dtype.size(), 0, None, |ctx| {
            if ring {
                algo::ring_ops::reduce_scatter(ctx, op, dtype, input, output)
            } else {
                algo::direct::reduce_scatter(ctx, op, dtype, input, output)
            }
        })
    }

    /// Sum `input` (of `size() * output.len()` elements) across ranks; this rank gets block
    /// `rank()` of the result.
    pub fn reduce_scatter<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<()> {
        self.reduce_scatter_raw(ReduceOp::Sum, T::DTYPE, bytes(input), bytes_mut(output))
    }

    /// Like [`Group::reduce_scatter`] with another reduction.
    pub fn reduce_scatter_with<T: Element>(&self, op: ReduceOp, input: &[T], output: &mut [T]) -> Result<()> {
        self.reduce_scatter_raw(op, T::DTYPE, bytes(input), bytes_mut(output))
    }

    /// Broadcast raw bytes from `root`.
    pub fn broadcast_raw(&self, dtype: DType, buf: &mut [u8], root: usize) -> Result<()> {
        self.check_len("the buffer", buf.len(), dtype)?;
        self.check_rank("root", root)?;
        let large = buf.len() > self.shared.cfg.mesh_max_bytes;
        let ring = self.around_ring(buf.len());
        self.run(Coll::Broadcast, dtype, ReduceOp::Sum, buf.len() / dtype.size(), root, None, |ctx| {
            if ctx.size() == 1 {
                return Ok(());
            }
            if ring {
                algo::ring_ops::broadcast(ctx, buf, root, dtype.size())
            } else {
                algo::direct::broadcast(ctx, buf, root, dtype.size(), large)
            }
        })
    }

    /// Every rank's `buf` gets `root`'s.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.broadcast_raw(T::DTYPE, bytes_mut(buf), root)
    }

    /// Wait until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.run(Coll::Barrier, DType::U8, ReduceOp::Sum, 0, 0, None, algo::mesh::barrier)
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        self.check_rank("peer", peer)?;
        if peer == self.me {
            return Err(Error::invalid(format!("rank {peer} cannot send to or receive from itself")));
        }
        Ok(())
    }

    /// Send raw bytes to `peer`, which must call `recv` with the same type and length.
    pub fn send_raw(&self, dtype: DType, buf: &[u8], peer: usize) -> Result<()> {
        self.check_len("the buffer", buf.len(), dtype)?;
        self.check_peer(peer)?;
        self.run(Coll::SendRecv, dtype, ReduceOp::Sum, buf.len() / dtype.size(), 0, Some((peer, true)), |ctx| {
            algo::p2p::send(ctx, buf, peer)
        })
    }

    /// Receive raw bytes from `peer`, which must call `send` with the same type and length.
    pub fn recv_raw(&self, dtype: DType, buf: &mut [u8], peer: usize) -> Result<()> {
        self.check_len("the buffer", buf.len(), dtype)?;
        self.check_peer(peer)?;
        self.run(Coll::SendRecv, dtype, ReduceOp::Sum, buf.len() / dtype.size(), 0, Some((peer, false)), |ctx| {
            algo::p2p::recv(ctx, buf, peer)
        })
    }

    /// Send `buf` to `peer`. Blocks until it is on its way (for large buffers, until the
    /// peer is receiving).
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.send_raw(T::DTYPE, bytes(buf), peer)
    }

    /// Receive into `buf` from `peer`; the sizes and types must match the send.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.recv_raw(T::DTYPE, bytes_mut(buf), peer)
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
        let ring_cabled = ring_cabled(self.shared.cabling.as_deref(), &members);
        Ok(Some(Group {
            ring_cabled,
            shared: self.shared.clone(),
            members,
            me,
            id: mix(self.id, n, color),
            state: Mutex::new(State::new(size)),
        }))
    }
}

fn op_name(coll: Coll, op: ReduceOp) -> &'static str {
    match (coll, op) {
        (Coll::AllReduce, ReduceOp::Sum) => "all_sum",
        (Coll::AllReduce, ReduceOp::Max) => "all_max",
        (Coll::AllReduce, ReduceOp::Min) => "all_min",
        (Coll::AllGather, _) => "all_gather",
        (Coll::ReduceScatter, _) => "reduce_scatter",
        (Coll::Broadcast, _) => "broadcast",
        (Coll::Barrier, _) => "barrier",
        (Coll::SendRecv, _) => "send/recv",
    }
}
