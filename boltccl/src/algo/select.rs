//! Which algorithm a call runs: a pure function of the collective, its size, the cabling and
//! the agreed settings, so every rank picks the same one (and `boltccl doctor` can say which).
//!
//! What is asked (`BOLTCCL_ALGO`, an [`Algo`]) and what runs are two types: each collective's
//! planner returns a plan with exactly the forms that collective has ([`AllReducePlan`],
//! [`GatherPlan`], [`BroadcastPlan`]), so running one is an exhaustive match. The forced
//! rules are the planners' matches on [`Config::algo`]: a forced algorithm runs wherever the
//! collective has that form; where it has not, the automatic choice runs, never onto the ring.

use crate::config::{Algo, Backend, Config};
use crate::topology::{chunk_bytes, Cabling, Levels, Shape};
use crate::types::Collective;

/// How an all-reduce runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AllReducePlan {
    /// Every rank sends its whole buffer to every peer ([`super::one_step`]).
    OneStep,
    /// Recursive doubling ([`super::doubling`]).
    Doubling,
    /// Reduce-scatter then all-gather ([`super::direct`]).
    Direct,
    /// The bidirectional ring ([`super::ring`]).
    Ring,
    /// Two levels ([`super::hosts`]).
    Hosts(HostsPlan),
}

/// A two-level all-reduce: this rank's levels, and which form it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostsPlan {
    /// This rank's host and its peers at the same position on the other hosts.
    pub levels: Levels,
    /// Above `BOLTCCL_MESH_MAX_BYTES`: the reduce-scatter form (else mesh inside, mesh across).
    pub large: bool,
    /// The pipelining unit inside a host (shared memory).
    pub local_chunk: usize,
}

/// How an all-gather or a reduce-scatter runs: they have the same two forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GatherPlan {
    /// All links at once ([`super::direct`]).
    Direct,
    /// Around the ring ([`super::ring_ops`]).
    Ring,
}

/// How a broadcast runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BroadcastPlan {
    /// The root sends the whole buffer to every rank (the mesh form).
    FromRoot,
    /// The root scatters, then every rank all-gathers ([`super::direct`]).
    Direct,
    /// Around the ring ([`super::ring_ops`]).
    Ring,
}

/// How an all-to-all (either form) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllToAllPlan {
    /// Every part to every peer at once ([`super::all_to_all`]).
    Direct,
    /// P-1 rounds of one peer each way ([`super::all_to_all`]).
    Pairwise,
}

/// How a reduce to a root runs: as the all-reduce of the same size would, so the root gets the
/// bits an all-reduce gives ([`super::rooted`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReducePlan {
    /// Every rank sends its whole buffer to the root, which folds in rank order (where the
    /// all-reduce is the mesh).
    ToRoot,
    /// Reduce-scatter in rank order, then the shards to the root (where it is direct).
    Direct,
    /// The all-reduce itself, its result kept by the root only (doubling, ring, two levels).
    AllReduce(AllReducePlan),
}

/// Where automatic all-to-alls of equal parts go pairwise over TCP: from this many bytes of
/// each rank's input.
pub(crate) const PAIRWISE_MIN_BYTES: usize = 1 << 20;

/// The all-to-all's schedule. Forced `ring`: the pairwise rounds (round 1 is the ring's
/// neighbours); every other forced value, all peers at once. `auto`: the rounds for an
/// all_to_all of equal parts of at least [`PAIRWISE_MIN_BYTES`] on three or more ranks whose
/// exchange crosses TCP (the TCP backend, or several hosts and no RDMA cabling), all peers
/// at once otherwise. Over TCP at 4 ranks the rounds took 0.83-0.97x the time of all at once
/// from 1 to 64 MiB (docs/benchmarks.md, 2026-12-02), as Open MPI's tuned all-to-all goes
/// pairwise for large messages: one peer at a time instead of every connection's copies and
/// buffers competing. Over shared memory all at once wins at every size (the rounds add a wait
/// per peer: 1.3-2.2x the time at 16 B, 1.08-1.35x at 16-64 MiB), and RDMA is not measured.
/// `bytes` is `None` for all_to_all_v, whose ranks pass inputs of different sizes and so could
/// not agree on a size rule: all at once.
pub(crate) fn all_to_all(bytes: Option<usize>, cabling: &Cabling, cfg: &Config) -> AllToAllPlan {
    match cfg.algo {
        Algo::Ring => AllToAllPlan::Pairwise,
        Algo::Auto if bytes.is_some_and(|b| b >= PAIRWISE_MIN_BYTES) && crosses_tcp(cabling, cfg) => {
            AllToAllPlan::Pairwise
        }
        Algo::Auto | Algo::Mesh | Algo::Doubling | Algo::Direct | Algo::Hosts => AllToAllPlan::Direct,
    }
}

/// Whether a group of three or more ranks exchanges over TCP: the backend says so, or its
/// ranks sit on several hosts and no RDMA links are cabled.
fn crosses_tcp(cabling: &Cabling, cfg: &Config) -> bool {
    let hosts = cabling.known_hosts();
    cabling.size() >= 3
        && (cfg.backend == Backend::Tcp || (hosts.is_some_and(|h| h > 1) && !cabling.has_device_matrix()))
}

/// The reduce of `bytes` to a root: the all-reduce's plan ([`all_reduce`]), with its rank-order
/// forms replaced by their cheaper rooted twins (same fold, same bits).
pub(crate) fn reduce(bytes: usize, cabling: &Cabling, me: usize, cfg: &Config) -> ReducePlan {
    match all_reduce(bytes, cabling, me, cfg) {
        AllReducePlan::OneStep => ReducePlan::ToRoot,
        AllReducePlan::Direct => ReducePlan::Direct,
        other @ (AllReducePlan::Doubling | AllReducePlan::Ring | AllReducePlan::Hosts(_)) => {
            ReducePlan::AllReduce(other)
        }
    }
}

/// The all-reduce of `bytes` by group rank `me` over `cabling`, with the agreed settings.
///
/// Forced (`BOLTCCL_ALGO`): mesh, doubling, direct and ring run as forced. Automatic: two
/// levels on a group spread over hosts with several ranks each ([`Cabling::levels`]: shared
/// memory inside hosts, host totals over the network); up to `BOLTCCL_MESH_MAX_BYTES`
/// (decode-sized messages), recursive doubling on 4, 8, 16, ... ranks without RDMA links
/// (fewer messages where each costs system calls) and the mesh (one round trip) otherwise;
/// above it the ring on a ring-cabled group, direct otherwise. `hosts` cannot be forced
/// (`BOLTCCL_ALGO` does not accept it); set in a `Config` it means automatic.
pub(crate) fn all_reduce(bytes: usize, cabling: &Cabling, me: usize, cfg: &Config) -> AllReducePlan {
    let large = bytes > cfg.mesh_max_bytes;
    match cfg.algo {
        Algo::Mesh => AllReducePlan::OneStep,
        Algo::Doubling => AllReducePlan::Doubling,
        Algo::Direct => AllReducePlan::Direct,
        Algo::Ring => AllReducePlan::Ring,
        Algo::Auto | Algo::Hosts => match cabling.levels(me) {
            Some(levels) => {
                let local_chunk = chunk_bytes(cfg, levels.local.len(), true);
                AllReducePlan::Hosts(HostsPlan { levels, large, local_chunk })
            }
            None if !large && cabling.doubles() => AllReducePlan::Doubling,
            None if !large => AllReducePlan::OneStep,
            None if cabling.shape() == Shape::Ring => AllReducePlan::Ring,
            None => AllReducePlan::Direct,
        },
    }
}

/// The all-gather or reduce-scatter of `bytes` (the whole buffer: for all-gather the output,
/// for reduce-scatter the input): the ring when forced, or automatically when large on a
/// ring-cabled group; direct otherwise. They have no mesh, doubling or two-level form: forcing
/// one of those runs direct (never the ring, which only `ring` or the cabling choose).
pub(crate) fn gather(bytes: usize, cabling: &Cabling, cfg: &Config) -> GatherPlan {
    match cfg.algo {
        Algo::Ring => GatherPlan::Ring,
        Algo::Auto if bytes > cfg.mesh_max_bytes && cabling.shape() == Shape::Ring => GatherPlan::Ring,
        Algo::Auto | Algo::Mesh | Algo::Doubling | Algo::Direct | Algo::Hosts => GatherPlan::Direct,
    }
}

/// The broadcast of `bytes`. Forced: mesh (the root sends to every rank), direct and ring run
/// as forced, whatever the size. Automatic: the ring when large on a ring-cabled group; else,
/// above `BOLTCCL_MESH_MAX_BYTES` on more than two ranks, direct (scatter then all-gather, so
/// the root's link is not the bottleneck); the root sending to everyone otherwise. Broadcast
/// has no doubling or two-level form: forcing one of those chooses as automatic does, without
/// the ring.
pub(crate) fn broadcast(bytes: usize, cabling: &Cabling, cfg: &Config) -> BroadcastPlan {
    let large = bytes > cfg.mesh_max_bytes;
    let spread = || if large && cabling.size() > 2 { BroadcastPlan::Direct } else { BroadcastPlan::FromRoot };
    match cfg.algo {
        Algo::Mesh => BroadcastPlan::FromRoot,
        Algo::Direct => BroadcastPlan::Direct,
        Algo::Ring => BroadcastPlan::Ring,
        Algo::Auto if large && cabling.shape() == Shape::Ring => BroadcastPlan::Ring,
        Algo::Auto | Algo::Doubling | Algo::Hosts => spread(),
    }
}

impl AllReducePlan {
    /// The algorithm's name.
    pub(crate) fn algo(&self) -> Algo {
        match self {
            AllReducePlan::OneStep => Algo::Mesh,
            AllReducePlan::Doubling => Algo::Doubling,
            AllReducePlan::Direct => Algo::Direct,
            AllReducePlan::Ring => Algo::Ring,
            AllReducePlan::Hosts(_) => Algo::Hosts,
        }
    }
}

impl AllToAllPlan {
    /// The algorithm's name (the pairwise rounds are named after the ring, which forces them).
    pub(crate) fn algo(self) -> Algo {
        match self {
            AllToAllPlan::Direct => Algo::Direct,
            AllToAllPlan::Pairwise => Algo::Ring,
        }
    }
}

impl ReducePlan {
    /// The algorithm's name: the all-reduce's whose bits it gives.
    pub(crate) fn algo(&self) -> Algo {
        match self {
            ReducePlan::ToRoot => Algo::Mesh,
            ReducePlan::Direct => Algo::Direct,
            ReducePlan::AllReduce(plan) => plan.algo(),
        }
    }
}

impl GatherPlan {
    /// The algorithm's name.
    pub(crate) fn algo(self) -> Algo {
        match self {
            GatherPlan::Direct => Algo::Direct,
            GatherPlan::Ring => Algo::Ring,
        }
    }
}

impl BroadcastPlan {
    /// The algorithm's name.
    pub(crate) fn algo(self) -> Algo {
        match self {
            BroadcastPlan::FromRoot => Algo::Mesh,
            BroadcastPlan::Direct => Algo::Direct,
            BroadcastPlan::Ring => Algo::Ring,
        }
    }
}

/// The algorithm `coll` runs on `bytes` (the whole buffer: for all-gather the output, for
/// reduce-scatter the input), over `cabling`, with the agreed settings `cfg`: the name of the
/// plan `all_reduce`, `gather`, `broadcast`, `all_to_all` or `reduce` (in this module) makes
/// (barrier, send/recv, and the rooted gather and scatter have one form, named mesh).
pub fn select(coll: Collective, bytes: usize, cabling: &Cabling, cfg: &Config) -> Algo {
    match coll {
        Collective::AllReduce => all_reduce(bytes, cabling, 0, cfg).algo(),
        Collective::AllGather | Collective::ReduceScatter => gather(bytes, cabling, cfg).algo(),
        Collective::Broadcast => broadcast(bytes, cabling, cfg).algo(),
        Collective::AllToAll => all_to_all(Some(bytes), cabling, cfg).algo(),
        Collective::AllToAllV => all_to_all(None, cabling, cfg).algo(),
        Collective::Reduce => reduce(bytes, cabling, 0, cfg).algo(),
        Collective::Barrier | Collective::SendRecv | Collective::Gather | Collective::Scatter => Algo::Mesh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::tests::ring4;
    use Algo::{Auto, Direct, Doubling, Hosts, Mesh, Ring};
    use Collective::*;

    #[test]
    fn all_reduce_on_two_levels() {
        let two_by_two = Cabling::uniform(4).with_hosts(vec![0, 0, 2, 2]);
        // All-reduce on two levels whatever the size; the other collectives as before.
        let cfg = Config::default();
        assert_eq!(select(AllReduce, 4, &two_by_two, &cfg), Hosts);
        assert_eq!(select(AllReduce, 1 << 30, &two_by_two, &cfg), Hosts);
        assert_eq!(select(AllReduce, 1 << 30, &two_by_two, &Config { algo: Direct, ..cfg.clone() }), Direct);
        assert_eq!(select(AllGather, 1 << 30, &two_by_two, &cfg), Direct);
    }

    #[test]
    fn table() {
        let cfg = |algo| Config { algo, mesh_max_bytes: 1000, ..Config::default() };
        let (small, big) = (1000, 1001);
        let mesh = Cabling::uniform(4);
        let two = Cabling::uniform(2);
        let (three, eight) = (Cabling::uniform(3), Cabling::uniform(8));
        let cabled = Cabling::from_links(vec![vec![true; 4]; 4]);
        let ring = ring4();
        #[rustfmt::skip]
        let rows: &[(Collective, usize, &Cabling, Algo, Algo)] = &[
            // collective, bytes, cabling, BOLTCCL_ALGO, chosen
            (AllReduce, small, &mesh, Auto, Doubling),
            (AllReduce, small, &eight, Auto, Doubling),
            (AllReduce, small, &two, Auto, Mesh),
            (AllReduce, small, &three, Auto, Mesh),
            (AllReduce, small, &cabled, Auto, Mesh),
            (AllReduce, small, &three, Doubling, Doubling),
            (AllReduce, big, &mesh, Auto, Direct),
            (AllReduce, big, &mesh, Doubling, Doubling),
            (AllReduce, small, &ring, Auto, Mesh),
            (AllReduce, big, &ring, Auto, Ring),
            (AllReduce, small, &mesh, Ring, Ring),
            (AllReduce, big, &mesh, Mesh, Mesh),
            (AllReduce, big, &ring, Direct, Direct),
            (AllGather, small, &ring, Auto, Direct),
            (AllGather, big, &ring, Auto, Ring),
            (AllGather, big, &mesh, Auto, Direct),
            (AllGather, small, &mesh, Ring, Ring),
            (AllGather, big, &mesh, Mesh, Direct),
            (ReduceScatter, big, &ring, Auto, Ring),
            (ReduceScatter, big, &ring, Direct, Direct),
            (Broadcast, small, &mesh, Auto, Mesh),
            (Broadcast, big, &mesh, Auto, Direct),
            (Broadcast, big, &two, Auto, Mesh),
            (Broadcast, big, &mesh, Mesh, Mesh),
            (Broadcast, small, &mesh, Direct, Direct),
            (Broadcast, big, &ring, Doubling, Direct),
            (Broadcast, big, &ring, Auto, Ring),
            (Broadcast, small, &mesh, Ring, Ring),
            (Broadcast, small, &mesh, Doubling, Mesh),
            (AllGather, small, &mesh, Doubling, Direct),
            (Barrier, 0, &ring, Ring, Mesh),
            (SendRecv, big, &ring, Ring, Mesh),
            (AllToAll, small, &mesh, Auto, Direct),
            (AllToAll, big, &ring, Auto, Direct),
            (AllToAll, big, &mesh, Mesh, Direct),
            (AllToAll, small, &mesh, Ring, Ring),
            (AllToAllV, big, &mesh, Ring, Ring),
            (AllToAllV, big, &ring, Doubling, Direct),
            (Gather, big, &ring, Auto, Mesh),
            (Scatter, small, &mesh, Ring, Mesh),
            // Reduce names the all-reduce whose bits it gives.
            (Reduce, small, &mesh, Auto, Doubling),
            (Reduce, small, &two, Auto, Mesh),
            (Reduce, small, &three, Auto, Mesh),
            (Reduce, big, &mesh, Auto, Direct),
            (Reduce, big, &ring, Auto, Ring),
            (Reduce, big, &mesh, Mesh, Mesh),
            (Reduce, small, &mesh, Direct, Direct),
        ];
        for &(coll, bytes, cabling, algo, want) in rows {
            assert_eq!(
                select(coll, bytes, cabling, &cfg(algo)),
                want,
                "{coll:?} of {bytes} B, {:?}, {algo:?}",
                cabling.shape()
            );
        }
    }

    #[test]
    fn large_all_to_alls_go_pairwise_over_tcp() {
        let (small, big) = (PAIRWISE_MIN_BYTES - 4, PAIRWISE_MIN_BYTES);
        let tcp = Config { backend: Backend::Tcp, ..Config::default() };
        let auto = Config::default();
        let four = Cabling::uniform(4);
        let two_hosts = Cabling::uniform(4).with_hosts(vec![0, 0, 2, 2]);
        let one_host = Cabling::uniform(4).with_hosts(vec![0, 0, 0, 0]);
        let cabled = Cabling::from_links(vec![vec![true; 4]; 4]).with_hosts(vec![0, 0, 2, 2]);
        #[rustfmt::skip]
        let rows: &[(Collective, usize, &Cabling, &Config, Algo)] = &[
            (AllToAll, big, &four, &tcp, Ring),
            (AllToAll, small, &four, &tcp, Direct),
            (AllToAll, big, &Cabling::uniform(2), &tcp, Direct),
            (AllToAll, big, &two_hosts, &auto, Ring),
            (AllToAll, big, &one_host, &auto, Direct),
            (AllToAll, big, &four, &auto, Direct), // in process: nothing known of hosts
            (AllToAll, big, &cabled, &auto, Direct),
            (AllToAllV, big, &four, &tcp, Direct),
            (AllToAll, big, &four, &Config { algo: Direct, ..tcp.clone() }, Direct),
        ];
        for &(coll, bytes, cabling, cfg, want) in rows {
            assert_eq!(
                select(coll, bytes, cabling, cfg),
                want,
                "{coll:?} of {bytes} B, {:?}, {:?}",
                cabling.host_ranks(),
                cfg.backend
            );
        }
    }

    /// The forced rules, for every collective, algorithm, size and cabling: a forced algorithm
    /// runs wherever the collective has that form; elsewhere the automatic choice runs, and
    /// never moves onto the ring.
    #[test]
    fn forced_algorithms_run_where_the_collective_has_them() {
        let forms = |coll: Collective| match coll {
            AllReduce | Reduce => vec![Mesh, Doubling, Direct, Ring],
            AllGather | ReduceScatter | AllToAll | AllToAllV => vec![Direct, Ring],
            Broadcast => vec![Mesh, Direct, Ring],
            Barrier | SendRecv | Gather | Scatter => vec![Mesh],
        };
        let cablings = [
            Cabling::uniform(2),
            Cabling::uniform(3),
            Cabling::uniform(4),
            ring4(),
            Cabling::uniform(4).with_hosts(vec![0, 0, 2, 2]),
        ];
        for coll in Collective::ALL {
            for cabling in &cablings {
                for bytes in [0, 1000, 1001, 1 << 30] {
                    let cfg = |algo| Config { algo, mesh_max_bytes: 1000, ..Config::default() };
                    let auto = select(coll, bytes, cabling, &cfg(Auto));
                    for algo in [Mesh, Doubling, Direct, Ring, Hosts] {
                        let got = select(coll, bytes, cabling, &cfg(algo));
                        let why = format!("{coll:?} of {bytes} B on {cabling:?}, forced {algo:?}");
                        if forms(coll).contains(&algo) {
                            assert_eq!(got, algo, "{why}");
                        } else if coll == AllReduce || coll == Reduce {
                            assert_eq!((algo, got), (Hosts, auto), "{why}: hosts cannot be forced");
                        } else if auto == Ring {
                            assert_ne!(got, Ring, "{why}");
                        } else {
                            assert_eq!(got, auto, "{why}");
                        }
                    }
                }
            }
        }
        // The plan carries what the two-level form needs; a forced hosts without two levels
        // is the automatic choice.
        let two_by_two = Cabling::uniform(4).with_hosts(vec![0, 0, 2, 2]);
        let cfg = Config { mesh_max_bytes: 1000, ..Config::default() };
        let AllReducePlan::Hosts(plan) = all_reduce(1001, &two_by_two, 3, &cfg) else { panic!("two levels") };
        assert_eq!(plan, HostsPlan { levels: two_by_two.levels(3).unwrap(), large: true, local_chunk: 8 << 20 });
        assert_eq!(all_reduce(10, &Cabling::uniform(4), 0, &Config { algo: Hosts, ..cfg }), AllReducePlan::Doubling);
    }

    /// A reduce follows the all-reduce of the same size, cabling and rank, form for form: the
    /// root gets the bits `all_reduce` gives.
    #[test]
    fn reduce_follows_the_all_reduce() {
        let cablings = [
            Cabling::uniform(2),
            Cabling::uniform(3),
            Cabling::uniform(4),
            ring4(),
            Cabling::uniform(4).with_hosts(vec![0, 0, 2, 2]),
        ];
        for cabling in &cablings {
            for algo in [Auto, Mesh, Doubling, Direct, Ring, Hosts] {
                for bytes in [0, 1000, 1001, 1 << 30] {
                    for me in 0..cabling.size() {
                        let cfg = Config { algo, mesh_max_bytes: 1000, ..Config::default() };
                        let want = match all_reduce(bytes, cabling, me, &cfg) {
                            AllReducePlan::OneStep => ReducePlan::ToRoot,
                            AllReducePlan::Direct => ReducePlan::Direct,
                            other => ReducePlan::AllReduce(other),
                        };
                        assert_eq!(reduce(bytes, cabling, me, &cfg), want, "{bytes} B on {cabling:?}, {algo:?}");
                    }
                }
            }
        }
    }
}
