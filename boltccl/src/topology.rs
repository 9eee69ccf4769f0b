//! What a group's links form, as the algorithms see it: which pairs have fast direct links
//! ([`Cabling`]), which ranks share a host ([`Levels`]), the [`Shape`] of the fast links, and
//! the pipelining unit ([`chunk_bytes`]) with the scratch budget it fits in. Plain data: the
//! transports report it, the algorithm choice reads it.

use crate::config::{Config, NET_CHUNK_BYTES, SHM_CHUNK_BYTES};

/// Scratch memory an algorithm may use for in-flight pieces, per call.
pub const SCRATCH_BUDGET: usize = 16 << 20;

/// Which pairs of a group's ranks have a fast direct link (RDMA cables), and which ranks
/// share a host's memory, in group order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cabling {
    /// `links[i][j]`; `None` when every pair is alike (TCP, shared memory, in process).
    links: Option<Vec<Vec<bool>>>,
    /// The ranks of each host (linked by shared memory), in group order, hosts in the order of
    /// their first ranks; `None` when nothing is known of hosts (TCP only, in process).
    hosts: Option<Vec<Vec<usize>>>,
    size: usize,
}

/// A rank's two levels in a group spread over hosts (see [`Cabling::levels`]): group ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Levels {
    /// The ranks of this rank's host, in group order (this rank among them).
    pub local: Vec<usize>,
    /// One rank per host, each at this rank's position among its host's ranks, in the order
    /// of the hosts' first ranks (this rank among them).
    pub across: Vec<usize>,
}

/// What the fast links of a group form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Every pair is linked alike (a full mesh).
    AllPairs,
    /// Each rank is linked to its ring neighbours in group order (at least 3 ranks), but not
    /// every pair is: large collectives go around the ring, so bulk data stays on fast links.
    Ring,
    /// Neither: some pairs use slower links.
    Partial,
}

impl Cabling {
    /// `size` ranks, every pair alike.
    pub fn uniform(size: usize) -> Cabling {
        Cabling { links: None, hosts: None, size }
    }

    /// `links[i][j]`: ranks `i` and `j` have a fast link (`links[i][i]` is ignored).
    pub fn from_links(links: Vec<Vec<bool>>) -> Cabling {
        Cabling { size: links.len(), links: Some(links), hosts: None }
    }

    /// The same links, with `hosts[i]` labelling rank i's host (equal labels: shared memory).
    pub fn with_hosts(self, hosts: Vec<usize>) -> Cabling {
        assert_eq!(hosts.len(), self.size, "one host label per rank");
        let mut labels: Vec<usize> = Vec::new();
        let mut ranks: Vec<Vec<usize>> = Vec::new();
        for (r, label) in hosts.into_iter().enumerate() {
            match labels.iter().position(|&l| l == label) {
                Some(i) => ranks[i].push(r),
                None => {
                    labels.push(label);
                    ranks.push(vec![r]);
                }
            }
        }
        Cabling { hosts: Some(ranks), ..self }
    }

    /// The cabling among `members` (ranks of this cabling), in that order.
    pub fn subset(&self, members: &[usize]) -> Cabling {
        let sub = Cabling {
            links: self
                .links
                .as_ref()
                .map(|l| members.iter().map(|&a| members.iter().map(|&b| l[a][b]).collect()).collect()),
            hosts: None,
            size: members.len(),
        };
        match &self.hosts {
            Some(hosts) => {
                let host_of = |a: usize| hosts.iter().position(|h| h.contains(&a)).expect("every rank has a host");
                sub.with_hosts(members.iter().map(|&a| host_of(a)).collect())
            }
            None => sub,
        }
    }

    /// The ranks of each host (sharing memory), in group order, hosts in the order of their
    /// first ranks; one rank per "host" when nothing is known of hosts.
    pub fn host_ranks(&self) -> Vec<Vec<usize>> {
        self.hosts.clone().unwrap_or_else(|| (0..self.size).map(|r| vec![r]).collect())
    }

    /// The hosts, when the group spans two or more with the same number (two or more) of ranks
    /// on each, and every pair across hosts at the same local position is linked alike (TCP
    /// everywhere, or an RDMA cable for each). Checked on every all-reduce: allocates nothing.
    fn two_level_hosts(&self) -> Option<&[Vec<usize>]> {
        let hosts = self.hosts.as_deref()?;
        let per_host = hosts[0].len();
        if hosts.len() < 2 || per_host < 2 || hosts.iter().any(|h| h.len() != per_host) {
            return None;
        }
        if let Some(l) = &self.links {
            let cabled = (0..per_host).all(|i| hosts.iter().all(|a| hosts.iter().all(|b| a == b || l[a[i]][b[i]])));
            if !cabled {
                return None;
            }
        }
        Some(hosts)
    }

    /// Rank `me`'s two levels when the group spans two or more hosts with the same number (two
    /// or more) of ranks on each, every pair across hosts at the same position linked alike:
    /// then an all-reduce can reduce inside each host over shared memory and send only host
    /// totals over the network. `None` otherwise, the same on every rank.
    pub fn levels(&self, me: usize) -> Option<Levels> {
        let hosts = self.two_level_hosts()?;
        let local = hosts.iter().find(|h| h.contains(&me))?.clone();
        let at = local.iter().position(|&r| r == me)?;
        Some(Levels { across: hosts.iter().map(|h| h[at]).collect(), local })
    }

    /// Number of ranks.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// How many hosts the ranks sit on, when known (shared memory told which ranks share one).
    pub(crate) fn known_hosts(&self) -> Option<usize> {
        self.hosts.as_ref().map(Vec::len)
    }

    /// Whether an RDMA device matrix cables the group.
    pub(crate) fn has_device_matrix(&self) -> bool {
        self.links.is_some()
    }

    /// Whether small all-reduces double rather than mesh: on 4, 8, 16, ... ranks linked alike by
    /// TCP, shared memory or in process. There each message costs system calls and a wake-up, and
    /// doubling sends log2(P) where the mesh sends P-1 (measured 2026-12-01 on one host: at 4
    /// ranks, 1 KiB, 29-36 µs against 50-60 over TCP, 5.9 against 7.5 over shared memory; at 8
    /// ranks over TCP 97 against 235). Not at two ranks (the same one exchange), not on other
    /// counts (the pairs folded first add two steps to the mesh's one: on a network, two more
    /// latencies), and not on RDMA cablings, whose messages cost little CPU, so the mesh's one step
    /// should win there; not measured on hardware.
    pub(crate) fn doubles(&self) -> bool {
        self.size >= 4 && self.size.is_power_of_two() && self.links.is_none()
    }

    /// What the links form.
    pub fn shape(&self) -> Shape {
        let Some(l) = &self.links else { return Shape::AllPairs };
        let n = self.size;
        let linked = |a: usize, b: usize| a == b || l[a][b];
        if (0..n).all(|a| (0..n).all(|b| linked(a, b))) {
            Shape::AllPairs
        } else if n >= 3 && (0..n).all(|a| linked(a, (a + 1) % n)) {
            Shape::Ring
        } else {
            Shape::Partial
        }
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
pub(crate) mod tests {
    use super::*;

    pub(crate) fn ring4() -> Cabling {
        let l = (0..4).map(|i| (0..4).map(|j| i == j || (i + 1) % 4 == j || (j + 1) % 4 == i).collect()).collect();
        Cabling::from_links(l)
    }

    #[test]
    fn levels_need_several_hosts_of_equal_size() {
        let two_by_two = Cabling::uniform(4).with_hosts(vec![0, 0, 2, 2]);
        assert_eq!(two_by_two.host_ranks(), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(two_by_two.levels(3), Some(Levels { local: vec![2, 3], across: vec![1, 3] }));
        // Hosts interleaved in rank order: each host's ranks in order, hosts by first rank.
        let interleaved = Cabling::uniform(6).with_hosts(vec![5, 9, 5, 9, 5, 9]);
        assert_eq!(interleaved.levels(2), Some(Levels { local: vec![0, 2, 4], across: vec![2, 3] }));
        // One host, one rank per host, unequal hosts, nothing known: no two levels.
        for hosts in [vec![0, 0, 0, 0], vec![0, 1, 2, 3], vec![0, 0, 0, 3]] {
            assert_eq!(Cabling::uniform(4).with_hosts(hosts.clone()).levels(0), None, "{hosts:?}");
        }
        assert_eq!(Cabling::uniform(4).levels(0), None);
        // RDMA cables between hosts: every pair at the same local position must be cabled.
        let cross = |i: usize, j: usize| i / 2 != j / 2;
        let links: Vec<Vec<bool>> = (0..4).map(|i| (0..4).map(|j| i == j || cross(i, j)).collect()).collect();
        assert!(Cabling::from_links(links.clone()).with_hosts(vec![0, 0, 2, 2]).levels(0).is_some());
        let mut missing = links;
        (missing[1][3], missing[3][1]) = (false, false);
        assert_eq!(Cabling::from_links(missing).with_hosts(vec![0, 0, 2, 2]).levels(0), None);
        // A sub-group keeps the hosts of its members.
        assert_eq!(two_by_two.subset(&[0, 2]).levels(0), None);
        assert_eq!(two_by_two.subset(&[3, 2, 1, 0]).host_ranks(), vec![vec![0, 1], vec![2, 3]]);
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
        assert_eq!(Cabling::uniform(4).shape(), Shape::AllPairs);
        assert_eq!(ring4().shape(), Shape::Ring);
        assert_eq!(Cabling::from_links(vec![vec![true; 4]; 4]).shape(), Shape::AllPairs);
        // Two ranks linked, two not: partial; its sub-group of the two linked ones: a mesh.
        let mut l = vec![vec![false; 4]; 4];
        (l[0][1], l[1][0]) = (true, true);
        let c = Cabling::from_links(l);
        assert_eq!(c.shape(), Shape::Partial);
        assert_eq!(c.subset(&[1, 0]).shape(), Shape::AllPairs);
        // A ring in another order is not a ring in group order.
        assert_eq!(ring4().subset(&[0, 2, 1, 3]).shape(), Shape::Partial);
        // Three ranks of a 4-ring: 2 and 0 are not neighbours there.
        assert_eq!(ring4().subset(&[0, 1, 2]).shape(), Shape::Partial);
        assert_eq!(ring4().subset(&[3, 0, 1]).shape(), Shape::Partial);
    }
}
