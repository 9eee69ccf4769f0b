//! Which algorithm a call runs: a pure function of the collective, its size, the cabling and
//! the agreed settings, so every rank picks the same one (and `boltccl doctor` can say which).

use crate::config::{Algo, Config};
use crate::topology::{Cabling, Shape};
use crate::types::Collective;

/// The algorithm `coll` runs on `bytes` (the whole buffer: for all-gather the output, for
/// reduce-scatter the input), over `cabling`, with the agreed settings `cfg`.
///
/// - all-reduce: `BOLTCCL_ALGO` when forced; else two levels on a group spread over hosts with
///   several ranks each ([`Cabling::levels`]: shared memory inside hosts, host totals over the
///   network); up to `BOLTCCL_MESH_MAX_BYTES` (decode-sized messages), recursive doubling on
///   4, 8, 16, ... ranks without RDMA links (fewer messages where each costs system calls)
///   and the mesh (one round trip) otherwise; above it the ring on a ring-cabled group, direct
///   otherwise;
/// - all-gather and reduce-scatter: the ring when forced, or when large on a ring-cabled group;
///   direct otherwise (they have no mesh form);
/// - broadcast: the ring as above; otherwise, above `BOLTCCL_MESH_MAX_BYTES` on more than two
///   ranks, direct (scatter then all-gather, so the root's link is not the bottleneck); the
///   root sending to everyone (mesh) otherwise;
/// - barrier and send/recv: mesh (they have one form).
pub fn select(coll: Collective, bytes: usize, cabling: &Cabling, cfg: &Config) -> Algo {
    let ring = cabling.shape() == Shape::Ring;
    let large = bytes > cfg.mesh_max_bytes;
    let around_ring = cfg.algo == Algo::Ring || (cfg.algo == Algo::Auto && ring && large);
    match coll {
        Collective::AllReduce => match cfg.algo {
            Algo::Auto if cabling.two_level_hosts().is_some() => Algo::Hosts,
            Algo::Auto if !large && cabling.doubles() => Algo::Doubling,
            Algo::Auto if !large => Algo::Mesh,
            Algo::Auto if ring => Algo::Ring,
            Algo::Auto => Algo::Direct,
            forced => forced,
        },
        Collective::AllGather | Collective::ReduceScatter if around_ring => Algo::Ring,
        Collective::AllGather | Collective::ReduceScatter => Algo::Direct,
        Collective::Broadcast if around_ring => Algo::Ring,
        Collective::Broadcast if large && cabling.size() > 2 => Algo::Direct,
        Collective::Broadcast | Collective::Barrier | Collective::SendRecv => Algo::Mesh,
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
            (Broadcast, big, &mesh, Mesh, Direct),
            (Broadcast, big, &ring, Auto, Ring),
            (Broadcast, small, &mesh, Ring, Ring),
            (Broadcast, small, &mesh, Doubling, Mesh),
            (AllGather, small, &mesh, Doubling, Direct),
            (Barrier, 0, &ring, Ring, Mesh),
            (SendRecv, big, &ring, Ring, Mesh),
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
}
