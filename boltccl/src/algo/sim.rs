//! A transport without I/O, for testing the algorithms: every rank of a world runs its
//! algorithm on a thread of its own against a [`Sim`], and the sims meet on one [`Board`].
//!
//! The board is strict where real transports are lenient, so that whatever passes here passes
//! on every transport:
//!
//! - **rendezvous**: a send completes only when the peer's exchange takes it (no buffering:
//!   shared-memory rings and RDMA credits are finite, so an algorithm must not rely on them);
//!   an exchange returns when all its receives have landed and all its sends were taken;
//! - **pairing**: the k-th send from `a` to `b` is the k-th receive `b` posts for `a`; its
//!   header (collective, sequence, part, length, ...) must equal the one `b` expects, and its
//!   length the buffer's;
//! - **no deadlock**: when every unfinished rank waits and nothing can move, the board says
//!   who waits for what and fails every rank.
//!
//! It implements [`Transport`], the one seam the algorithms see, so the algorithms run here
//! exactly as they run over sockets: nothing in them knows about the board. It copies each
//! payload (a test double: the copies are its own, not the algorithms').

use crate::error::{Error, Result};
use crate::topology::Cabling;
use crate::transport::{Limits, LinkKind, OnRecv, RecvOp, SendOp, Transport};
use crate::wire::Header;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

/// A message on its way: what was sent, and which send it was.
struct Msg {
    id: u64,
    header: Header,
    data: Vec<u8>,
}

/// What one exchange moved, as one rank saw it: (peer, header) per send and per receive.
#[derive(Debug, Clone, Default)]
pub(crate) struct Step {
    pub sends: Vec<(usize, Header)>,
    pub recvs: Vec<(usize, Header)>,
}

struct State {
    /// `queues[from][to]`: sends posted and not yet taken, in order.
    queues: Vec<Vec<VecDeque<Msg>>>,
    /// Sends taken by their receiver, until their sender's exchange returns.
    taken: HashSet<u64>,
    next_id: u64,
    /// Bumped on every change a waiting rank could act on.
    progress: u64,
    /// Per rank: waiting, and the `progress` it last looked at.
    waiting: Vec<Option<u64>>,
    finished: Vec<bool>,
    /// Why the world stopped (a deadlock, a mismatch, an abort).
    failed: Option<String>,
    /// Per rank, every exchange it ran.
    log: Vec<Vec<Step>>,
}

impl State {
    /// Every unfinished rank waits and has seen the latest change: nothing can move.
    fn stuck(&self) -> bool {
        (0..self.finished.len()).all(|r| self.finished[r] || self.waiting[r] == Some(self.progress))
    }

    fn describe(&self) -> String {
        let mut s = String::from("deadlock:");
        for (from, row) in self.queues.iter().enumerate() {
            for (to, q) in row.iter().enumerate() {
                if let Some(m) = q.front() {
                    s += &format!(" {} send(s) {from}->{to} not taken (first part {:#x});", q.len(), m.header.part);
                }
            }
        }
        let waiting: Vec<usize> = (0..self.waiting.len()).filter(|&r| self.waiting[r].is_some()).collect();
        s + &format!(" waiting ranks {waiting:?}")
    }
}

/// Where the ranks of one simulated world meet.
pub(crate) struct Board {
    state: Mutex<State>,
    moved: Condvar,
    cabling: Cabling,
}

impl Board {
    pub fn new(cabling: Cabling) -> Arc<Board> {
        let n = cabling.size();
        Arc::new(Board {
            state: Mutex::new(State {
                queues: (0..n).map(|_| (0..n).map(|_| VecDeque::new()).collect()).collect(),
                taken: HashSet::new(),
                next_id: 0,
                progress: 0,
                waiting: vec![None; n],
                finished: vec![false; n],
                failed: None,
                log: vec![Vec::new(); n],
            }),
            moved: Condvar::new(),
            cabling,
        })
    }

    /// Rank `rank` is done (returned or failed): no more exchanges from it.
    pub fn finish(&self, rank: usize) {
        let mut st = self.state.lock();
        st.finished[rank] = true;
        st.progress += 1;
        self.moved.notify_all();
    }

    /// After every rank finished: the sends nobody took (none, when the algorithm is sound),
    /// and each rank's exchanges.
    pub fn leftovers(&self) -> (usize, Vec<Vec<Step>>) {
        let st = self.state.lock();
        (st.queues.iter().flatten().map(VecDeque::len).sum(), st.log.clone())
    }
}

/// One rank's end of a [`Board`].
pub(crate) struct Sim {
    pub rank: usize,
    pub board: Arc<Board>,
}

impl Sim {
    fn fail(&self, st: &mut State, why: String) -> Error {
        if st.failed.is_none() {
            st.failed = Some(why);
        }
        st.progress += 1;
        self.board.moved.notify_all();
        Error::Internal(format!("rank {}: {}", self.rank, st.failed.as_deref().unwrap_or_default()))
    }
}

impl Transport for Sim {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.board.cabling.size()
    }

    fn exchange(
        &mut self,
        sends: &[SendOp<'_>],
        recvs: &mut [RecvOp<'_>],
        on_recv: &mut OnRecv<'_>,
        _limits: &Limits<'_>,
    ) -> Result<()> {
        let (me, n) = (self.rank, self.size());
        let mut st = self.board.state.lock();
        let step = Step {
            sends: sends.iter().map(|s| (s.peer, s.header)).collect(),
            recvs: recvs.iter().map(|r| (r.peer, r.expect)).collect(),
        };
        st.log[me].push(step);
        for s in sends {
            if s.peer >= n || s.data.len() != s.header.len as usize {
                return Err(self.fail(
                    &mut st,
                    format!("bad send to {} ({} bytes, header says {})", s.peer, s.data.len(), s.header.len),
                ));
            }
        }
        for r in recvs.iter() {
            if r.peer >= n || r.buf.len() != r.expect.len as usize {
                return Err(self.fail(
                    &mut st,
                    format!("bad receive from {} ({} bytes, expects {})", r.peer, r.buf.len(), r.expect.len),
                ));
            }
        }
        let mut mine = Vec::with_capacity(sends.len());
        for s in sends {
            let id = st.next_id;
            st.next_id += 1;
            mine.push(id);
            st.queues[me][s.peer].push_back(Msg { id, header: s.header, data: s.data.to_vec() });
        }
        st.progress += 1;
        self.board.moved.notify_all();
        let mut landed = vec![false; recvs.len()];
        loop {
            if let Some(why) = st.failed.clone() {
                return Err(Error::Internal(format!("rank {me}: {why}")));
            }
            // Receives from one peer land in list order: a peer whose next one cannot is done
            // for this pass.
            let mut blocked = vec![false; n];
            for i in 0..recvs.len() {
                let from = recvs[i].peer;
                if landed[i] || blocked[from] {
                    continue;
                }
                let Some(m) = st.queues[from][me].pop_front() else {
                    blocked[from] = true;
                    continue;
                };
                if m.header != recvs[i].expect {
                    let why = format!("{from}->{me}: sent {:?}, expected {:?}", m.header, recvs[i].expect);
                    return Err(self.fail(&mut st, why));
                }
                recvs[i].buf.copy_from_slice(&m.data);
                st.taken.insert(m.id);
                st.progress += 1;
                landed[i] = true;
                self.board.moved.notify_all();
                if let Err(e) = on_recv(recvs, i) {
                    self.fail(&mut st, format!("rank {me}'s receive callback failed: {e}"));
                    return Err(e);
                }
            }
            if landed.iter().all(|&l| l) && mine.iter().all(|id| st.taken.contains(id)) {
                for id in &mine {
                    st.taken.remove(id);
                }
                return Ok(());
            }
            st.waiting[me] = Some(st.progress);
            if st.stuck() {
                let why = st.describe();
                st.waiting[me] = None;
                return Err(self.fail(&mut st, why));
            }
            self.board.moved.wait(&mut st);
            st.waiting[me] = None;
        }
    }

    fn abort(&mut self, cause: &Error) {
        let mut st = self.board.state.lock();
        self.fail(&mut st, format!("rank {} aborted: {cause}", self.rank));
    }

    fn cabling(&self) -> Cabling {
        self.board.cabling.clone()
    }

    fn link_kind(&self, peer: usize) -> LinkKind {
        if peer == self.rank {
            LinkKind::Local
        } else {
            LinkKind::Tcp
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::select::{AllReducePlan, HostsPlan, ReducePlan};
    use crate::algo::{all_to_all, direct, doubling, hosts, one_step, p2p, ring, ring_ops, rooted, Comm, Scratch};
    use crate::types::{Collective, DType, ReduceOp};
    use proptest::prelude::*;
    use std::time::Duration;

    /// Every algorithm as one case: what it is, and for broadcasts the root.
    #[derive(Debug, Clone, Copy)]
    enum Algo {
        AllReduce(AllReduce, bool),
        AllGather(bool),
        ReduceScatter(bool),
        Broadcast(Broadcast, usize),
        Barrier,
        SendRecv,
        /// Equal parts; pairwise rounds or all at once.
        AllToAll(bool),
        /// Per-pair counts (some zero); pairwise rounds or all at once.
        AllToAllV(bool),
        Gather(usize),
        Scatter(usize),
        /// The form, the root, in place.
        Reduce(Reduce, usize, bool),
    }

    #[derive(Debug, Clone, Copy)]
    enum Reduce {
        ToRoot,
        Direct,
        Doubling,
        Ring,
    }

    #[derive(Debug, Clone, Copy)]
    enum AllReduce {
        OneStep,
        Doubling,
        Ring,
        Direct,
        Hosts { per_host: usize, large: bool },
    }

    #[derive(Debug, Clone, Copy)]
    enum Broadcast {
        Ring,
        Direct,
        FromRoot,
    }

    /// Every case a world of `n` ranks can run (`in_place` for the all-reduces).
    fn cases(n: usize, in_place: bool) -> Vec<Algo> {
        let mut v = vec![Algo::AllGather(true), Algo::AllGather(false), Algo::ReduceScatter(true)];
        v.extend([Algo::ReduceScatter(false), Algo::Barrier]);
        if n > 1 {
            for a in [AllReduce::OneStep, AllReduce::Doubling, AllReduce::Ring, AllReduce::Direct] {
                v.push(Algo::AllReduce(a, in_place));
            }
            for per_host in (2..n).filter(|h| n % h == 0) {
                for large in [false, true] {
                    v.push(Algo::AllReduce(AllReduce::Hosts { per_host, large }, in_place));
                }
            }
            for root in 0..n {
                for b in [Broadcast::Ring, Broadcast::Direct, Broadcast::FromRoot] {
                    v.push(Algo::Broadcast(b, root));
                }
            }
            v.push(Algo::SendRecv);
            for root in 0..n {
                v.extend([Algo::Gather(root), Algo::Scatter(root)]);
                for form in [Reduce::ToRoot, Reduce::Direct, Reduce::Doubling, Reduce::Ring] {
                    v.push(Algo::Reduce(form, root, in_place));
                }
            }
        }
        v.extend([Algo::AllToAll(false), Algo::AllToAll(true), Algo::AllToAllV(false), Algo::AllToAllV(true)]);
        v
    }

    /// Elements rank `q` sends rank `p` in the all-to-all-v case (`count` per block): a third
    /// of the pairs send nothing, the others differ in length.
    fn vcount(q: usize, p: usize, count: usize) -> usize {
        if (q + 2 * p) % 3 == 0 {
            0
        } else {
            count + q + 2 * p
        }
    }

    /// The part rank `q` sends rank `p` in the all-to-all-v case.
    fn vpart(q: usize, p: usize, count: usize) -> Vec<u8> {
        (0..vcount(q, p, count)).flat_map(|i| value(q, p * 1000 + i).to_ne_bytes()).collect()
    }

    /// Rank `r`'s element `i`: small enough that sums over 8 ranks are exact.
    fn value(r: usize, i: usize) -> i32 {
        ((r * 7919 + i * 31) % 201) as i32 - 100
    }

    fn data(r: usize, count: usize) -> Vec<u8> {
        (0..count).flat_map(|i| value(r, i).to_ne_bytes()).collect()
    }

    fn summed(n: usize, range: std::ops::Range<usize>) -> Vec<u8> {
        range.flat_map(|i| (0..n).map(|r| value(r, i)).sum::<i32>().to_ne_bytes()).collect()
    }

    /// What rank `r` of `n` must end with.
    fn expected(algo: Algo, n: usize, r: usize, count: usize) -> Vec<u8> {
        match algo {
            Algo::AllReduce(..) => summed(n, 0..count),
            Algo::AllGather(_) => (0..n).flat_map(|q| data(q, count)).collect(),
            Algo::ReduceScatter(_) => summed(n, r * count..(r + 1) * count),
            Algo::Broadcast(_, root) => data(root, count),
            Algo::Barrier => Vec::new(),
            Algo::SendRecv => data(r & !1, count),
            Algo::AllToAll(_) => {
                (0..n).flat_map(|q| data(q, n * count)[r * count * 4..(r + 1) * count * 4].to_vec()).collect()
            }
            Algo::AllToAllV(_) => (0..n).flat_map(|q| vpart(q, r, count)).collect(),
            Algo::Gather(root) if r == root => (0..n).flat_map(|q| data(q, count)).collect(),
            Algo::Gather(_) => Vec::new(),
            Algo::Scatter(root) => data(root, n * count)[r * count * 4..(r + 1) * count * 4].to_vec(),
            Algo::Reduce(_, root, _) if r == root => summed(n, 0..count),
            Algo::Reduce(..) => data(r, count),
        }
    }

    /// Run `algo` on rank `comm.me`: its result buffer.
    fn run(comm: &mut Comm<'_>, scratch: &mut Scratch, algo: Algo, count: usize) -> Result<Vec<u8>> {
        let (me, n, e, dt, sum) = (comm.me, comm.size(), 4, DType::I32, ReduceOp::Sum);
        match algo {
            Algo::AllReduce(a, in_place) => {
                let input = data(me, count);
                let mut out = if in_place { input.clone() } else { vec![0xa5; input.len()] };
                let input = (!in_place).then_some(&input[..]);
                match a {
                    AllReduce::OneStep => one_step::all_reduce(comm, scratch, sum, dt, input, &mut out)?,
                    AllReduce::Doubling => doubling::all_reduce(comm, scratch, sum, dt, input, &mut out)?,
                    AllReduce::Ring => ring::all_reduce(comm, scratch, sum, dt, input, &mut out)?,
                    AllReduce::Direct => direct::all_reduce(comm, scratch, sum, dt, input, &mut out)?,
                    AllReduce::Hosts { per_host, large } => {
                        let cabling = comm.t.cabling();
                        let levels = cabling.levels(me).expect("equal hosts of two or more ranks");
                        let plan = HostsPlan { levels, large, local_chunk: comm.chunk };
                        assert_eq!(cabling.host_ranks()[0].len(), per_host);
                        hosts::all_reduce(comm, scratch, &plan, sum, dt, input, &mut out)?
                    }
                }
                Ok(out)
            }
            Algo::AllGather(on_ring) => {
                let mut out = vec![0xa5; n * count * e];
                if on_ring {
                    ring_ops::all_gather(comm, &data(me, count), &mut out, e)?
                } else {
                    direct::all_gather(comm, &data(me, count), &mut out)?
                }
                Ok(out)
            }
            Algo::ReduceScatter(on_ring) => {
                let mut out = vec![0xa5; count * e];
                let input: Vec<u8> = data(me, n * count);
                if on_ring {
                    ring_ops::reduce_scatter(comm, scratch, sum, dt, &input, &mut out)?
                } else {
                    direct::reduce_scatter(comm, scratch, sum, dt, &input, &mut out)?
                }
                Ok(out)
            }
            Algo::Broadcast(b, root) => {
                let mut buf = data(me, count);
                match b {
                    Broadcast::Ring => ring_ops::broadcast(comm, &mut buf, root, e)?,
                    Broadcast::Direct => direct::broadcast(comm, &mut buf, root, e)?,
                    Broadcast::FromRoot => direct::broadcast_from_root(comm, &mut buf, root)?,
                }
                Ok(buf)
            }
            Algo::Barrier => one_step::barrier(comm).map(|()| Vec::new()),
            Algo::SendRecv => {
                // Even ranks send to the odd rank above them; an odd world's last rank sits out.
                let mut buf = data(me, count);
                if me % 2 == 0 && me + 1 < n {
                    p2p::send(comm, &buf, me + 1)?;
                } else if me % 2 == 1 {
                    p2p::recv(comm, &mut buf, me - 1)?;
                }
                Ok(buf)
            }
            Algo::AllToAll(pairwise) => {
                let mut out = vec![0xa5; n * count * e];
                let parts: Vec<_> = (0..n).map(|q| q * count * e..(q + 1) * count * e).collect();
                all_to_all::all_to_all(comm, &data(me, n * count), &parts, &mut out, &parts, None, pairwise)?;
                Ok(out)
            }
            Algo::AllToAllV(pairwise) => {
                let send: Vec<usize> = (0..n).map(|q| vcount(me, q, count)).collect();
                let recv: Vec<usize> = (0..n).map(|q| vcount(q, me, count)).collect();
                let layout = |c: &[usize]| {
                    let mut at = 0;
                    c.iter().map(|&k| (at..at + k * e, at += k * e).0).collect::<Vec<_>>()
                };
                let input: Vec<u8> = (0..n).flat_map(|q| vpart(me, q, count)).collect();
                let mut out = vec![0xa5; recv.iter().sum::<usize>() * e];
                let counts = all_to_all::Counts { send: &send, recv: &recv };
                all_to_all::all_to_all(comm, &input, &layout(&send), &mut out, &layout(&recv), Some(counts), pairwise)?;
                Ok(out)
            }
            Algo::Gather(root) => {
                let mut out = vec![0xa5; if me == root { n * count * e } else { 0 }];
                rooted::gather(comm, &data(me, count), &mut out, root)?;
                Ok(out)
            }
            Algo::Scatter(root) => {
                let input = if me == root { data(me, n * count) } else { Vec::new() };
                let mut out = vec![0xa5; count * e];
                rooted::scatter(comm, &input, &mut out, root)?;
                Ok(out)
            }
            Algo::Reduce(form, root, in_place) => {
                let plan = match form {
                    Reduce::ToRoot => ReducePlan::ToRoot,
                    Reduce::Direct => ReducePlan::Direct,
                    Reduce::Doubling => ReducePlan::AllReduce(AllReducePlan::Doubling),
                    Reduce::Ring => ReducePlan::AllReduce(AllReducePlan::Ring),
                };
                let input = data(me, count);
                if in_place {
                    let mut buf = input;
                    rooted::reduce(comm, scratch, &plan, sum, dt, None, &mut buf, root)?;
                    Ok(buf)
                } else {
                    // Other ranks' output is left as it was: start it as their input to compare.
                    let mut out = if me == root { vec![0xa5; input.len()] } else { input.clone() };
                    rooted::reduce(comm, scratch, &plan, sum, dt, Some(&input), &mut out, root)?;
                    Ok(out)
                }
            }
        }
    }

    /// The header every rank of a call starts from (as `Group` builds it).
    fn base(algo: Algo, count: usize) -> Header {
        let (coll, root) = match algo {
            Algo::AllReduce(..) => (Collective::AllReduce, 0),
            Algo::AllGather(_) => (Collective::AllGather, 0),
            Algo::ReduceScatter(_) => (Collective::ReduceScatter, 0),
            Algo::Broadcast(_, root) => (Collective::Broadcast, root),
            Algo::Barrier => (Collective::Barrier, 0),
            Algo::SendRecv => (Collective::SendRecv, 0),
            Algo::AllToAll(_) => (Collective::AllToAll, 0),
            Algo::AllToAllV(_) => (Collective::AllToAllV, 0),
            Algo::Gather(root) => (Collective::Gather, root),
            Algo::Scatter(root) => (Collective::Scatter, root),
            Algo::Reduce(_, root, _) => (Collective::Reduce, root),
        };
        Header::data(coll, 7, 3, DType::I32, ReduceOp::Sum, count as u64 * 4, root as u16)
    }

    fn cabling_for(algo: Algo, n: usize) -> Cabling {
        match algo {
            Algo::AllReduce(AllReduce::Hosts { per_host, .. }, _) => {
                Cabling::uniform(n).with_hosts((0..n).map(|r| r / per_host).collect())
            }
            _ => Cabling::uniform(n),
        }
    }

    /// What a world did: each rank's result, the sends nobody took, and each rank's exchanges.
    struct Outcome {
        results: Vec<Result<Vec<u8>>>,
        left: usize,
        log: Vec<Vec<Step>>,
    }

    /// Each rank runs `body` on a thread of its own, all on one board.
    fn world<F>(cabling: Cabling, chunk: usize, base: Header, body: F) -> Outcome
    where
        F: Fn(&mut Comm<'_>, &mut Scratch) -> Result<Vec<u8>> + Sync,
    {
        let n = cabling.size();
        let board = Board::new(cabling);
        let members: Vec<usize> = (0..n).collect();
        let limits = Limits { timeout: Duration::from_secs(60), op: "sim", interrupt: None, bytes: 0, abort: None };
        let results = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let (board, members, limits, body) = (Arc::clone(&board), &members, limits.clone(), &body);
                    s.spawn(move || {
                        let mut sim = Sim { rank, board: Arc::clone(&board) };
                        let mut comm = Comm { t: &mut sim, members, me: rank, base, chunk, limits };
                        let out = body(&mut comm, &mut Scratch::default());
                        board.finish(rank);
                        out
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
        });
        let (left, log) = board.leftovers();
        Outcome { results, left, log }
    }

    /// Run `algo` on `n` ranks with `count` elements per block in pieces of `chunk` bytes:
    /// every send meets its receive (same header, same size), nothing deadlocks, nothing is
    /// left over, and every rank ends with the right bytes.
    fn check(algo: Algo, n: usize, count: usize, chunk: usize) -> std::result::Result<(), String> {
        let Outcome { results, left, log } =
            world(cabling_for(algo, n), chunk, base(algo, count), |comm, scratch| run(comm, scratch, algo, count));
        let ctx = format!("{algo:?} on {n} ranks, {count} elements, chunk {chunk}");
        for (r, res) in results.into_iter().enumerate() {
            let got = res.map_err(|e| format!("{ctx}: rank {r}: {e}"))?;
            if got != expected(algo, n, r, count) {
                return Err(format!("{ctx}: rank {r} ended with the wrong bytes"));
            }
        }
        if left != 0 {
            return Err(format!("{ctx}: {left} sends never received"));
        }
        // The log agrees: per pair, as many receives as sends, with the same headers in order.
        for a in 0..n {
            for b in 0..n {
                let sent = log[a].iter().flat_map(|s| &s.sends).filter(|(to, _)| *to == b).map(|(_, h)| h);
                let got = log[b].iter().flat_map(|s| &s.recvs).filter(|(from, _)| *from == a).map(|(_, h)| h);
                if !sent.eq(got) {
                    return Err(format!("{ctx}: {a}->{b} sends and receives differ"));
                }
            }
        }
        Ok(())
    }

    /// Element counts per block, by pipelining unit: none, less than a piece, one piece, a
    /// piece and a bit, and more pieces per peer than one exchange carries ([`super::super::MAX_BATCH`]).
    fn size_classes(chunk: usize) -> [usize; 6] {
        let piece = chunk / 4;
        [0, 1, piece, piece + 1, 5 * piece + 3, (super::super::MAX_BATCH + 1) * piece * 8 + 3]
    }

    #[test]
    fn every_algorithm_pairs_its_sends_and_receives_on_one_to_eight_ranks() {
        let chunk = 16;
        for n in 1..=8 {
            for (k, count) in size_classes(chunk).into_iter().enumerate() {
                for algo in cases(n, k % 2 == 0) {
                    if let Err(e) = check(algo, n, count, chunk) {
                        panic!("{e}");
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn any_algorithm_any_size_pairs_up(n in 1usize..=8, count in 0usize..700, units in 1usize..6, pick: prop::sample::Index, in_place: bool) {
            let all = cases(n, in_place);
            let algo = all[pick.index(all.len())];
            check(algo, n, count, units * 8).map_err(TestCaseError::fail)?;
        }
    }

    /// The board catches what it is for: a cycle of sends before receives, and a header that
    /// differs from the one expected.
    #[test]
    fn the_board_reports_deadlocks_and_mismatches() {
        let base = Header::data(Collective::AllReduce, 1, 1, DType::U8, ReduceOp::Sum, 4, 0);
        let Outcome { results, .. } = world(Cabling::uniform(3), 8, base, |comm, _| {
            let (me, n) = (comm.me, comm.size());
            let hdr = comm.hdr(crate::wire::Phase::Scatter, 0, 0, 4)?;
            let sends = [SendOp { peer: (me + 1) % n, header: hdr, data: &[1, 2, 3, 4] }];
            comm.exchange(&sends, &mut [], &mut |_, _| Ok(()))?;
            let mut buf = [0; 4];
            let mut recvs = [RecvOp { peer: (me + n - 1) % n, expect: hdr, buf: &mut buf }];
            comm.exchange(&[], &mut recvs, &mut |_, _| Ok(()))?;
            Ok(buf.to_vec())
        });
        assert!(results.iter().all(|r| matches!(r, Err(e) if e.to_string().contains("deadlock"))), "{results:?}");

        let Outcome { results, .. } = world(Cabling::uniform(2), 8, base, |comm, _| {
            let other = 1 - comm.me;
            let sent = comm.hdr(crate::wire::Phase::Scatter, 0, comm.me, 4)?;
            let expect = comm.hdr(crate::wire::Phase::Scatter, 0, comm.me, 4)?;
            let mut buf = [0; 4];
            let sends = [SendOp { peer: other, header: sent, data: &[1, 2, 3, 4] }];
            let mut recvs = [RecvOp { peer: other, expect, buf: &mut buf }];
            comm.exchange(&sends, &mut recvs, &mut |_, _| Ok(()))?;
            Ok(buf.to_vec())
        });
        assert!(results.iter().any(|r| matches!(r, Err(e) if e.to_string().contains("expected"))), "{results:?}");
    }
}
