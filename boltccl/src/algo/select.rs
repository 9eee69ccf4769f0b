//! Which algorithm a call runs: a pure function of the collective, its size, the cabling and
//! the agreed settings, so every rank picks the same one (and `boltccl doctor` can say which).

use super::SCRATCH_BUDGET;
use crate::config::{Algo, Config, NET_CHUNK_BYTES, SHM_CHUNK_BYTES};
use crate::types::Collective;

/// Which pairs of a group's ranks have a fast direct link (RDMA cables), in group order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cabling {
    /// `links[i][j]`; `None` when every pair is alike (TCP, shared memory, in process).
    links: Option<Vec<Vec<bool>>>,
    size: usize,
}

/// What the fast links of a group form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Every pair is linked alike.
    Mesh,
    /// Each rank is linked to its ring neighbours in group order (at least 3 ranks), but not
    /// every pair is: large collectives go around the ring, so bulk data stays on fast links.
    Ring,
    /// Neither: some pairs use slower links.
    Partial,
}

impl Cabling {
    /// `size` ranks, every pair alike.
    pub fn uniform(size: usize) -> Cabling {
        Cabling { links: None, size }
    }

    /// `links[i][j]`: ranks `i` and `j` have a fast link (`links[i][i]` is ignored).
    pub fn from_links(links: Vec<Vec<bool>>) -> Cabling {
        Cabling { size: links.len(), links: Some(links) }
    }

    /// The cabling among `members` (ranks of this cabling), in that order.
    pub fn subset(&self, members: &[usize]) -> Cabling {
        Cabling {
            links: self
                .links
                .as_ref()
                .map(|l| members.iter().map(|&a| members.iter().map(|&b| l[a][b]).collect()).collect()),
            size: members.len(),
        }
    }

    /// What the links form.
    pub fn shape(&self) -> Shape {
        let Some(l) = &self.links else { return Shape::Mesh };
        let n = self.size;
        let linked = |a: usize, b: usize| a == b || l[a][b];
        if (0..n).all(|a| (0..n).all(|b| linked(a, b))) {
            Shape::Mesh
        } else if n >= 3 && (0..n).all(|a| linked(a, (a + 1) % n)) {
            Shape::Ring
        } else {
            Shape::Partial
        }
    }
}

/// The algorithm `coll` runs on `bytes` (the whole buffer: for all-gather the output, for
/// reduce-scatter the input), over `cabling`, with the agreed settings `cfg`.
///
/// - all-reduce: `BOLTCCL_ALGO` when forced; else mesh up to `BOLTCCL_MESH_MAX_BYTES` (one round
///   trip: decode-sized messages), the ring on a ring-cabled group, direct otherwise;
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
            Algo::Auto if !large => Algo::Mesh,
            Algo::Auto if ring => Algo::Ring,
            Algo::Auto => Algo::Direct,
            forced => forced,
        },
        Collective::AllGather | Collective::ReduceScatter if around_ring => Algo::Ring,
        Collective::AllGather | Collective::ReduceScatter => Algo::Direct,
        Collective::Broadcast if around_ring => Algo::Ring,
        Collective::Broadcast if large && cabling.size > 2 => Algo::Direct,
        Collective::Broadcast | Collective::Barrier | Collective::SendRecv => Algo::Mesh,
    }
}

/// The pipelining unit of a group of `size` ranks: `BOLTCCL_CHUNK_BYTES` when set; under
/// `auto`, 1 MiB when any pair crosses a network (smaller pieces keep the links busy while
/// earlier ones are reduced), and the largest piece up to 8 MiB that keeps one piece per peer
/// within [`SCRATCH_BUDGET`] when every pair is shared memory: there each piece costs a
/// hand-off between two processes (the receiver's copy, then the sender's next turn) that
/// nothing on a wire hides. Measured 2026-11-30, 2 ranks, 16 MiB all_sum: 6.0-6.4 GB/s bus
/// bandwidth with 8 MiB pieces against 2.9-3.7 with 1 MiB.
///
/// Every member computes the same: a pair's link kind follows from what bootstrap told every
/// rank, and a rank whose links to all other members are shared memory shares their host.
pub fn chunk_bytes(cfg: &Config, size: usize, all_shared_memory: bool) -> usize {
    match cfg.chunk_bytes {
        Some(chunk) => chunk,
        None if all_shared_memory && size > 1 => {
            (SCRATCH_BUDGET / (size - 1) / 4096 * 4096).clamp(NET_CHUNK_BYTES, SHM_CHUNK_BYTES)
        }
        None => NET_CHUNK_BYTES,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Algo::{Auto, Direct, Mesh, Ring};
    use Collective::*;

    fn ring4() -> Cabling {
        let l = (0..4).map(|i| (0..4).map(|j| i == j || (i + 1) % 4 == j || (j + 1) % 4 == i).collect()).collect();
        Cabling::from_links(l)
    }

    #[test]
    fn chunks() {
        let auto = Config::default();
        let set = Config { chunk_bytes: Some(4096), ..Config::default() };
        // A set chunk holds everywhere; auto: 1 MiB with a network link, 8 MiB for 2 or 3
        // ranks on shared memory, then the scratch budget over the peers, never under 1 MiB.
        assert_eq!(chunk_bytes(&set, 4, true), 4096);
        assert_eq!(chunk_bytes(&auto, 2, false), 1 << 20);
        assert_eq!(chunk_bytes(&auto, 2, true), 8 << 20);
        assert_eq!(chunk_bytes(&auto, 3, true), 8 << 20);
        assert_eq!(chunk_bytes(&auto, 4, true), 5_591_040);
        assert_eq!(chunk_bytes(&auto, 8, true), 2_396_160);
        assert_eq!(chunk_bytes(&auto, 32, true), 1 << 20);
        assert_eq!(chunk_bytes(&auto, 1, true), 1 << 20);
        for n in 2..=64 {
            let c = chunk_bytes(&auto, n, true);
            assert!(c % 4096 == 0 && (n - 1) * c <= SCRATCH_BUDGET.max((n - 1) << 20), "{n} ranks: {c}");
        }
    }

    #[test]
    fn shapes() {
        assert_eq!(Cabling::uniform(4).shape(), Shape::Mesh);
        assert_eq!(ring4().shape(), Shape::Ring);
        assert_eq!(Cabling::from_links(vec![vec![true; 4]; 4]).shape(), Shape::Mesh);
        // Two ranks linked, two not: partial; its sub-group of the two linked ones: a mesh.
        let mut l = vec![vec![false; 4]; 4];
        (l[0][1], l[1][0]) = (true, true);
        let c = Cabling::from_links(l);
        assert_eq!(c.shape(), Shape::Partial);
        assert_eq!(c.subset(&[1, 0]).shape(), Shape::Mesh);
        // A ring in another order is not a ring in group order.
        assert_eq!(ring4().subset(&[0, 2, 1, 3]).shape(), Shape::Partial);
        // Three ranks of a 4-ring: 2 and 0 are not neighbours there.
        assert_eq!(ring4().subset(&[0, 1, 2]).shape(), Shape::Partial);
        assert_eq!(ring4().subset(&[3, 0, 1]).shape(), Shape::Partial);
    }

    #[test]
    fn table() {
        let cfg = |algo| Config { algo, mesh_max_bytes: 1000, ..Config::default() };
        let (small, big) = (1000, 1001);
        let mesh = Cabling::uniform(4);
        let two = Cabling::uniform(2);
        let ring = ring4();
        #[rustfmt::skip]
        let rows: &[(Collective, usize, &Cabling, Algo, Algo)] = &[
            // collective, bytes, cabling, BOLTCCL_ALGO, chosen
            (AllReduce, small, &mesh, Auto, Mesh),
            (AllReduce, big, &mesh, Auto, Direct),
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
