//! The conformance workload.
//!
//! It runs every collective over every element type and a set of lengths, checks
//! each result against a sequential reference computed here (not with boltccl's kernels),
//! and folds every output into a digest. Ranks compare digests, so bitwise identity across
//! ranks is checked by the test, not by the library under test.
use boltccl::{bf16, f16, DType, Element, Group, ReduceOp};

/// Element types with an exact conversion for small integers, for reference results.
pub trait TestElem: Element + PartialEq + std::fmt::Debug {
    fn from_i64(v: i64) -> Self;
    fn to_f64(self) -> f64;
    const SIGNED: bool;
}

macro_rules! int_elem {
    ($($t:ty => $s:expr),*) => {$(
        impl TestElem for $t {
            fn from_i64(v: i64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
            const SIGNED: bool = $s;
        }
    )*};
}
int_elem!(i8 => true, i16 => true, i32 => true, i64 => true, u8 => false, u16 => false, u32 => false, u64 => false, f32 => true, f64 => true);

impl TestElem for f16 {
    fn from_i64(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    const SIGNED: bool = true;
}

impl TestElem for bf16 {
    fn from_i64(v: i64) -> Self {
        bf16::from_f64(v as f64)
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    const SIGNED: bool = true;
}

/// Small integers: exact in every type, sums of 8 ranks stay exact.
fn value<T: TestElem>(rank: usize, i: usize, salt: usize) -> i64 {
    let x = ((rank * 7 + i * 3 + salt * 5) % 17) as i64;
    if T::SIGNED {
        x - 8
    } else {
        x % 9
    }
}

fn input<T: TestElem>(rank: usize, n: usize, salt: usize) -> Vec<T> {
    (0..n).map(|i| T::from_i64(value::<T>(rank, i, salt))).collect()
}

fn reference(op: ReduceOp, vals: impl Iterator<Item = i64>) -> f64 {
    let v: Vec<i64> = vals.collect();
    (match op {
        ReduceOp::Sum => v.iter().sum::<i64>(),
        ReduceOp::Max => *v.iter().max().unwrap(),
        ReduceOp::Min => *v.iter().min().unwrap(),
    }) as f64
}

/// FNV-1a over everything the workload produced.
#[derive(Default)]
pub struct Digest(u64);

impl Digest {
    pub fn new() -> Digest {
        Digest(0xcbf2_9ce4_8422_2325)
    }
    pub fn add(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x100_0000_01b3);
        }
    }
    pub fn value(&self) -> u64 {
        self.0
    }
}

fn check<T: TestElem>(what: &str, got: &[T], want: impl Fn(usize) -> f64) {
    for (i, g) in got.iter().enumerate() {
        let w = want(i);
        assert!(g.to_f64() == w, "{what}: element {i} is {g:?}, expected {w}");
    }
}

/// Lengths tried for every collective: empty, one, a prime, and more than 3 chunks per shard
/// at 8 ranks with 64-byte chunks.
pub const LENGTHS: [usize; 4] = [0, 1, 13, 2053];

/// Run every collective on `g` for element type `T`; panics with a precise message on any
/// wrong element. Returns after folding all outputs into `d`.
pub fn suite_for<T: TestElem>(g: &Group, d: &mut Digest) {
    let (r, p) = (g.rank(), g.size());
    let name = T::DTYPE.name();
    for (salt, &n) in LENGTHS.iter().enumerate() {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            // In place.
            let mut buf = input::<T>(r, n, salt);
            g.all_reduce(op, &mut buf).unwrap_or_else(|e| panic!("all_{} {name} n={n}: {e}", op.name()));
            check(&format!("all_{} {name} n={n} rank {r}/{p}", op.name()), &buf, |i| {
                reference(op, (0..p).map(|q| value::<T>(q, i, salt)))
            });
            d.add(bytemuck::cast_slice(&buf));
            // Out of place, into a dirty buffer.
            let src = input::<T>(r, n, salt + 1);
            let mut out = vec![T::from_i64(3); n];
            g.all_reduce_into(op, &src, &mut out)
                .unwrap_or_else(|e| panic!("all_{}_into {name} n={n}: {e}", op.name()));
            check(&format!("all_{}_into {name} n={n}", op.name()), &out, |i| {
                reference(op, (0..p).map(|q| value::<T>(q, i, salt + 1)))
            });
            assert_eq!(src, input::<T>(r, n, salt + 1), "all_reduce_into modified its input");
            d.add(bytemuck::cast_slice(&out));
        }
        // all_gather
        let src = input::<T>(r, n, salt + 2);
        let mut out = vec![T::from_i64(1); n * p];
        g.all_gather(&src, &mut out).unwrap_or_else(|e| panic!("all_gather {name} n={n}: {e}"));
        check(&format!("all_gather {name} n={n}"), &out, |i| value::<T>(i / n.max(1), i % n.max(1), salt + 2) as f64);
        d.add(bytemuck::cast_slice(&out));
        // reduce_scatter
        let src = input::<T>(r, n * p, salt + 3);
        let mut out = vec![T::from_i64(2); n];
        g.reduce_scatter(&src, &mut out).unwrap_or_else(|e| panic!("reduce_scatter {name} n={n}: {e}"));
        check(&format!("reduce_scatter {name} n={n} rank {r}"), &out, |i| {
            reference(ReduceOp::Sum, (0..p).map(|q| value::<T>(q, r * n + i, salt + 3)))
        });
        // Each rank holds a different block: checked above, not part of the shared digest.
        // broadcast from a root that moves with the length
        let root = (salt * 3 + 1) % p;
        let mut buf = if r == root { input::<T>(r, n, salt + 4) } else { vec![T::from_i64(0); n] };
        g.broadcast(&mut buf, root).unwrap_or_else(|e| panic!("broadcast {name} n={n} root {root}: {e}"));
        check(&format!("broadcast {name} n={n} root {root}"), &buf, |i| value::<T>(root, i, salt + 4) as f64);
        d.add(bytemuck::cast_slice(&buf));
        // send/recv around the ring (even ranks send first, so large messages cannot deadlock)
        if p > 1 {
            let (to, from) = ((r + 1) % p, (r + p - 1) % p);
            let mine = input::<T>(r, n, salt + 5);
            let mut got = vec![T::from_i64(0); n];
            if r % 2 == 0 {
                g.send(&mine, to).unwrap_or_else(|e| panic!("send {name} n={n}: {e}"));
                g.recv(&mut got, from).unwrap_or_else(|e| panic!("recv {name} n={n}: {e}"));
            } else {
                g.recv(&mut got, from).unwrap_or_else(|e| panic!("recv {name} n={n}: {e}"));
                g.send(&mine, to).unwrap_or_else(|e| panic!("send {name} n={n}: {e}"));
            }
            check(&format!("recv {name} n={n}"), &got, |i| value::<T>(from, i, salt + 5) as f64);
        }
        all_to_all_and_rooted::<T>(g, d, n, salt);
    }
}

/// Elements rank `q` sends rank `p` in the all-to-all-v case (`n` per part): a third of the
/// pairs send nothing, the others differ in length.
pub fn split_count(q: usize, p: usize, n: usize) -> usize {
    if (q + 2 * p) % 3 == 0 {
        0
    } else {
        n + q + 2 * p
    }
}

/// all_to_all, all_to_all_v (with empty parts), gather, scatter and reduce (every reduction,
/// in place and not) for `n` elements a part, the root moving with `salt`. Each rank's
/// results differ, so they are checked here and none goes into the shared digest but the
/// all_to_all of a part every rank sends alike.
pub fn all_to_all_and_rooted<T: TestElem>(g: &Group, d: &mut Digest, n: usize, salt: usize) {
    let (r, p) = (g.rank(), g.size());
    let name = T::DTYPE.name();
    let bytes = g.bytes();
    // all_to_all: part q of rank r's input is element block q of input(r, n * p).
    let src = input::<T>(r, n * p, salt + 6);
    let mut out = vec![T::from_i64(5); n * p];
    g.all_to_all(&src, &mut out).unwrap_or_else(|e| panic!("all_to_all {name} n={n}: {e}"));
    check(&format!("all_to_all {name} n={n} rank {r}/{p}"), &out, |i| {
        let (q, k) = (i / n.max(1), i % n.max(1));
        value::<T>(q, r * n + k, salt + 6) as f64
    });
    d.add(&[p as u8]);
    // all_to_all_v: the part from q to r is value(q, 1000 r + k).
    let send: Vec<usize> = (0..p).map(|q| split_count(r, q, n)).collect();
    let recv: Vec<usize> = (0..p).map(|q| split_count(q, r, n)).collect();
    let src: Vec<T> =
        (0..p).flat_map(|q| (0..send[q]).map(move |k| T::from_i64(value::<T>(r, 1000 * q + k, salt)))).collect();
    let mut out = vec![T::from_i64(5); recv.iter().sum()];
    g.all_to_all_v(&src, &send, &mut out, &recv).unwrap_or_else(|e| panic!("all_to_all_v {name} n={n}: {e}"));
    let want: Vec<f64> =
        (0..p).flat_map(|q| (0..recv[q]).map(move |k| value::<T>(q, 1000 * r + k, salt) as f64)).collect();
    check(&format!("all_to_all_v {name} n={n} rank {r}/{p}"), &out, |i| want[i]);
    // gather and scatter, the root moving with the length.
    let root = (salt * 5 + 2) % p;
    let src = input::<T>(r, n, salt + 7);
    let mut out = if r == root { vec![T::from_i64(5); n * p] } else { Vec::new() };
    g.gather(&src, &mut out, root).unwrap_or_else(|e| panic!("gather {name} n={n} root {root}: {e}"));
    check(&format!("gather {name} n={n} root {root}"), &out, |i| {
        value::<T>(i / n.max(1), i % n.max(1), salt + 7) as f64
    });
    let src = if r == root { input::<T>(r, n * p, salt + 8) } else { Vec::new() };
    let mut out = vec![T::from_i64(5); n];
    g.scatter(&src, &mut out, root).unwrap_or_else(|e| panic!("scatter {name} n={n} root {root}: {e}"));
    check(&format!("scatter {name} n={n} root {root} rank {r}"), &out, |i| {
        value::<T>(root, r * n + i, salt + 8) as f64
    });
    // reduce: in place, then into a dirty buffer; other ranks' buffers stay as they were.
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        let what = format!("reduce({}) {name} n={n} root {root} rank {r}", op.name());
        let mut buf = input::<T>(r, n, salt + 9);
        g.reduce(&mut buf, op, root).unwrap_or_else(|e| panic!("{what}: {e}"));
        if r == root {
            check(&what, &buf, |i| reference(op, (0..p).map(|q| value::<T>(q, i, salt + 9))));
        } else {
            assert_eq!(buf, input::<T>(r, n, salt + 9), "{what}: a rank other than the root had its buffer changed");
        }
        let src = input::<T>(r, n, salt + 10);
        let mut out = vec![T::from_i64(3); n];
        bytes
            .reduce(op, T::DTYPE, Some(bytemuck::cast_slice(&src)), bytemuck::cast_slice_mut(&mut out), root)
            .unwrap_or_else(|e| panic!("{what} out of place: {e}"));
        if r == root {
            check(&what, &out, |i| reference(op, (0..p).map(|q| value::<T>(q, i, salt + 10))));
        } else {
            assert!(
                out.iter().all(|x| *x == T::from_i64(3)),
                "{what}: a rank other than the root had its output changed"
            );
        }
    }
}

/// The sum of `p` terms in recursive doubling's order, computed here: the lowest
/// 2·(p - 2^k) ranks folded in pairs, then a balanced tree, lower half first.
fn doubling_order(p: usize, term: impl Fn(usize) -> f32) -> f32 {
    let paired = 2 * (p - (1 << p.ilog2()));
    let mut level: Vec<f32> =
        (0..paired / 2).map(|i| term(2 * i) + term(2 * i + 1)).chain((paired..p).map(&term)).collect();
    while level.len() > 1 {
        level = level.chunks(2).map(|pair| pair[0] + pair[1]).collect();
    }
    level[0]
}

/// Random f32 inputs: every rank must get the same bits, equal to the fold the algorithm
/// documents (rank order for mesh and direct, a balanced tree for doubling).
pub fn determinism(g: &Group, d: &mut Digest) {
    let (r, p) = (g.rank(), g.size());
    let gen = |q: usize, n: usize| -> Vec<f32> {
        let mut s = 0x9E37_79B9u64 ^ (q as u64 * 0x1234_5677);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1e3_f32.powi(((s >> 20) % 3) as i32)
            })
            .collect()
    };
    for n in [7usize, 3001] {
        let mut a = gen(r, n);
        let mut b = gen(r, n);
        g.all_sum(&mut a).unwrap();
        g.all_sum(&mut b).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<f32, u8>(&a),
            bytemuck::cast_slice::<f32, u8>(&b),
            "same inputs gave different bits"
        );
        // Auto runs the ring on a ring-cabled group; the ring folds in ring order. The two-level
        // algorithm folds each host's ranks in rank order, then the hosts' totals in order.
        let algo = g.algorithm(boltccl::Collective::AllReduce, 4 * n);
        if algo != boltccl::Algo::Ring {
            let inputs: Vec<Vec<f32>> = (0..p).map(|q| gen(q, n)).collect();
            let fold =
                |ranks: &[usize], i: usize| ranks[1..].iter().fold(inputs[ranks[0]][i], |acc, &q| acc + inputs[q][i]);
            let levels = if algo == boltccl::Algo::Hosts { g.hosts() } else { vec![(0..p).collect()] };
            for (i, got) in a.iter().enumerate() {
                let acc = if algo == boltccl::Algo::Doubling {
                    doubling_order(p, |q| inputs[q][i])
                } else {
                    let totals: Vec<f32> = levels.iter().map(|h| fold(h, i)).collect();
                    totals[1..].iter().fold(totals[0], |acc, t| acc + t)
                };
                assert_eq!(got.to_bits(), acc.to_bits(), "element {i} is not the {algo:?} order sum");
            }
        }
        d.add(bytemuck::cast_slice(&a));
        // reduce gives its root the bits all_sum gives, whatever the algorithm, on every root.
        for root in [0, p - 1] {
            let mut c = gen(r, n);
            g.reduce(&mut c, ReduceOp::Sum, root).unwrap();
            if r == root {
                assert_eq!(
                    bytemuck::cast_slice::<f32, u8>(&c),
                    bytemuck::cast_slice::<f32, u8>(&a),
                    "reduce to root {root} gave other bits than all_sum"
                );
            }
        }
    }
}

/// Split into even and odd ranks (ordered by descending rank) and reduce within each half.
pub fn split(g: &Group, d: &mut Digest) {
    let (r, p) = (g.rank(), g.size());
    let sub = g.split(Some((r % 2) as u32), -(r as i64)).unwrap().expect("every rank has a color");
    let members: Vec<usize> = (0..p).rev().filter(|q| q % 2 == r % 2).collect();
    assert_eq!(sub.size(), members.len());
    assert_eq!(members[sub.rank()], r);
    let mut x = vec![r as i32 + 1; 100];
    sub.all_sum(&mut x).unwrap();
    let want: i32 = members.iter().map(|&q| q as i32 + 1).sum();
    assert!(x.iter().all(|&v| v == want), "split all_sum gave {} instead of {want}", x[0]);
    let mut both = [0u8];
    g.all_sum(&mut both).unwrap(); // the parent still works
    d.add(&both);
}

/// The whole workload for one group. Returns the digest.
pub fn suite(g: &Group) -> u64 {
    let mut d = Digest::new();
    suite_for::<f32>(g, &mut d);
    suite_for::<f64>(g, &mut d);
    suite_for::<f16>(g, &mut d);
    suite_for::<bf16>(g, &mut d);
    suite_for::<i8>(g, &mut d);
    suite_for::<i16>(g, &mut d);
    suite_for::<i32>(g, &mut d);
    suite_for::<i64>(g, &mut d);
    suite_for::<u8>(g, &mut d);
    suite_for::<u16>(g, &mut d);
    suite_for::<u32>(g, &mut d);
    suite_for::<u64>(g, &mut d);
    determinism(g, &mut d);
    split(g, &mut d);
    g.barrier().unwrap();
    assert_eq!(DType::ALL.len(), 12, "the suite covers every element type");
    d.value()
}

/// The new collectives alone (all_to_all, all_to_all_v, gather, scatter, reduce) over a few
/// element types and every length, and reduce's bits against all_sum's. Returns the digest.
pub fn all_to_all_and_rooted_suite(g: &Group) -> u64 {
    let mut d = Digest::new();
    for (salt, &n) in LENGTHS.iter().enumerate() {
        all_to_all_and_rooted::<f32>(g, &mut d, n, salt);
        all_to_all_and_rooted::<bf16>(g, &mut d, n, salt);
        all_to_all_and_rooted::<i8>(g, &mut d, n, salt);
        all_to_all_and_rooted::<u64>(g, &mut d, n, salt);
    }
    determinism(g, &mut d);
    g.barrier().unwrap();
    d.value()
}
