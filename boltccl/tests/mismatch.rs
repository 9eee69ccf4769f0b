//! The mismatch matrix, with ranks as real processes at 2, 3 and 4 ranks: one rank (the odd
//! one, a different rank from case to case, rank 0 included) calls something different from
//! the others — every pair of different calls (all_sum, all_gather, reduce_scatter, broadcast,
//! barrier, split, send, recv), every pair of element types, every pair of reductions,
//! different counts (including counts that pick different algorithms), different roots,
//! different groups (a sub-group against its parent, two sub-groups of different splits) — or
//! is started with a different chunk size, algorithm, stream count or mesh threshold.
//!
//! Every rank must fail within 5 s, naming the odd rank (the odd rank names another) and both
//! values; none may hang or return data. The one exception is `send`, which returns once its
//! data is on its way, as MPI's does: a rank whose send returned must fail its next call.
//!
//! One set of rank processes runs every case in turn, each case a group of its own on its own
//! coordinator port (a failed group is poisoned). The matrix runs over TCP and over shared
//! memory; every rank checks that its links are of the kind the test names.

mod common;

use boltccl::{DType, Group, LinkKind, ReduceOp};
use common::harness::{free_port, is_worker, Job, RankOutput};
use std::time::{Duration, Instant};

/// Elements per call (per rank for all_gather, per block for reduce_scatter).
const COUNT: usize = 1000;

#[derive(Debug, Clone)]
enum Case {
    /// Different calls, by name.
    Call(&'static str, &'static str),
    DType(DType, DType),
    Op(ReduceOp, ReduceOp),
    Count(usize, usize),
    Root(usize, usize),
    /// Different roots of another rooted call (gather, scatter, reduce).
    RootOf(&'static str, usize, usize),
    /// all_to_all_v where the odd rank disagrees about the split: every rank sends and
    /// expects the first count from every rank, the odd rank sends the second to everyone.
    Split(usize, usize),
    /// "sub" (a sub-group of everyone), "parent", "sub2" (the same, from a second split).
    Group(&'static str, &'static str),
    /// A setting every rank must agree on, and the two values.
    Setting(&'static str, &'static str, &'static str),
}

const CALLS: [&str; 13] = [
    "all_sum",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "barrier",
    "split",
    "send",
    "recv",
    "all_to_all",
    "all_to_all_v",
    "gather",
    "scatter",
    "reduce",
];

fn cases(n: usize) -> Vec<Case> {
    let mut v = Vec::new();
    for (i, &a) in CALLS.iter().enumerate() {
        for &b in &CALLS[i + 1..] {
            // A send and a receive meet: that pair is no mismatch.
            if (a, b) != ("send", "recv") {
                v.push(Case::Call(a, b));
            }
        }
    }
    for (i, &a) in DType::ALL.iter().enumerate() {
        for &b in &DType::ALL[i + 1..] {
            v.push(Case::DType(a, b));
        }
    }
    let ops = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];
    for (i, &a) in ops.iter().enumerate() {
        for &b in &ops[i + 1..] {
            v.push(Case::Op(a, b));
        }
    }
    // One element less; nothing against something; the one-step mesh against the direct
    // algorithm (above BOLTCCL_MESH_MAX_BYTES).
    v.extend([Case::Count(COUNT, COUNT - 1), Case::Count(0, 1), Case::Count(COUNT, 100_000)]);
    v.extend([Case::Root(0, 1), Case::Root(n - 1, 0)]);
    for call in ["gather", "scatter", "reduce"] {
        v.extend([Case::RootOf(call, 0, 1), Case::RootOf(call, n - 1, 0)]);
    }
    v.extend([Case::Split(COUNT, COUNT - 1), Case::Split(0, 3)]);
    v.extend([Case::Group("sub", "parent"), Case::Group("sub", "sub2")]);
    v.extend([
        Case::Setting("BOLTCCL_CHUNK_BYTES", "1048576", "65536"),
        Case::Setting("BOLTCCL_ALGO", "auto", "ring"),
        Case::Setting("BOLTCCL_TCP_STREAMS", "1", "2"),
        Case::Setting("BOLTCCL_MESH_MAX_BYTES", "65536", "4096"),
    ]);
    v
}

fn case_from(s: &str) -> Case {
    // Cases travel to the workers by index: both sides build the same list.
    let (n, i) = s.split_once('/').unwrap();
    cases(n.parse().unwrap()).swap_remove(i.parse().unwrap())
}

/// The odd rank's value, or everyone else's.
fn pick<T>(mine: bool, a: T, b: T) -> T {
    if mine {
        b
    } else {
        a
    }
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// Run one call on `g` as `what` names it; `partner` is the peer of send/recv.
fn call(
    g: &Group,
    what: &str,
    dtype: DType,
    op: ReduceOp,
    count: usize,
    root: usize,
    partner: usize,
) -> boltccl::Result<()> {
    let (p, e) = (g.size(), dtype.size());
    let b = g.bytes();
    match what {
        "all_sum" => b.all_reduce(op, dtype, None, &mut vec![1u8; count * e]),
        "all_gather" => b.all_gather(dtype, &vec![1u8; count * e], &mut vec![0u8; count * e * p]),
        "reduce_scatter" => b.reduce_scatter(op, dtype, &vec![1u8; count * e * p], &mut vec![0u8; count * e]),
        "broadcast" => b.broadcast(dtype, &mut vec![1u8; count * e], root),
        "barrier" => g.barrier(),
        "split" => g.split(Some(0), g.rank() as i64).map(drop),
        "send" => b.send(dtype, &vec![1u8; count * e], partner),
        "recv" => b.recv(dtype, &mut vec![0u8; count * e], partner),
        "all_to_all" => b.all_to_all(dtype, &vec![1u8; count * e * p], &mut vec![0u8; count * e * p]),
        "all_to_all_v" => {
            let counts = vec![count; p];
            b.all_to_all_v(dtype, &vec![1u8; count * e * p], &counts, &mut vec![0u8; count * e * p], &counts)
        }
        "gather" => b.gather(dtype, &vec![1u8; count * e], &mut vec![0u8; count * e * p], root),
        "scatter" => b.scatter(dtype, &vec![1u8; count * e * p], &mut vec![0u8; count * e], root),
        "reduce" => b.reduce(op, dtype, None, &mut vec![1u8; count * e], root),
        other => panic!("no call {other}"),
    }
}

/// A rank: every case in turn. Prints `CASE i <OK|ERR|INIT_ERR|SENT> <ms> <message>`.
#[test]
fn mismatch_worker() {
    if !is_worker() {
        return;
    }
    boltccl::log_to_stderr();
    let rank: usize = env("BOLTCCL_RANK").parse().unwrap();
    let n: usize = env("BOLTCCL_WORLD_SIZE").parse().unwrap();
    let ports: Vec<String> = env("MM_PORTS").split(',').map(String::from).collect();
    for (i, port) in ports.iter().enumerate() {
        let case = case_from(&format!("{n}/{i}"));
        let odd = i % n;
        let mine = rank == odd;
        std::env::set_var("BOLTCCL_COORDINATOR", format!("127.0.0.1:{port}"));
        if let Case::Setting(name, a, b) = case {
            std::env::set_var(name, if mine { b } else { a });
        }
        let t = Instant::now();
        let g = boltccl::init();
        if let Case::Setting(name, ..) = case {
            std::env::remove_var(name);
        }
        let g = match g {
            Ok(g) => g,
            Err(e) => {
                println!("CASE {i} INIT_ERR {} {e}", t.elapsed().as_millis());
                continue;
            }
        };
        for q in (0..n).filter(|&q| q != rank) {
            let kind = format!("{:?}", g.link_kind(q).unwrap());
            assert_eq!(kind, env("EXPECT_LINK"), "case {i}: the link to rank {q} is not what the test names");
        }
        // send/recv partners: the odd rank and rank 0 (or rank 1, when the odd rank is 0).
        let other = if odd == 0 { 1 } else { 0 };
        let partner = if mine { other } else { odd };
        let (mut what, mut dtype, mut op, mut count, mut root) = ("all_sum", DType::F32, ReduceOp::Sum, COUNT, 0);
        let mut target = None; // the group to call on, for Case::Group
        match case {
            Case::Call(a, b) => what = pick(mine, a, b),
            Case::DType(a, b) => dtype = pick(mine, a, b),
            Case::Op(a, b) => op = pick(mine, a, b),
            Case::Count(a, b) => count = pick(mine, a, b),
            Case::Root(a, b) => {
                what = "broadcast";
                root = pick(mine, a, b);
            }
            Case::RootOf(call, a, b) => {
                what = call;
                root = pick(mine, a, b);
            }
            Case::Split(a, b) => {
                // The odd rank sends `b` to every rank (itself included) and expects `a` from
                // the others.
                let t = Instant::now();
                let e = dtype.size();
                let (send, recv): (Vec<usize>, Vec<usize>) = if mine {
                    ((0..n).map(|_| b).collect(), (0..n).map(|q| if q == rank { b } else { a }).collect())
                } else {
                    (vec![a; n], vec![a; n])
                };
                let input = vec![1u8; send.iter().sum::<usize>() * e];
                let mut output = vec![0u8; recv.iter().sum::<usize>() * e];
                match g.bytes().all_to_all_v(dtype, &input, &send, &mut output, &recv) {
                    Err(e) => println!("CASE {i} ERR {} {e}", t.elapsed().as_millis()),
                    Ok(()) => println!("CASE {i} OK {} returned normally", t.elapsed().as_millis()),
                }
                continue;
            }
            Case::Group(a, b) => {
                // A faster rank may finish both splits and make the mismatched call while this
                // one is still in the second: its abort then ends that split, and that is this
                // rank's outcome of the case.
                let t = Instant::now();
                let splits = g.split(Some(0), rank as i64).and_then(|s| Ok((s, g.split(Some(0), rank as i64)?)));
                let (sub, sub2) = match splits {
                    Ok((Some(sub), Some(sub2))) => (sub, sub2),
                    Ok(_) => panic!("case {i}: a split with a colour left this rank out"),
                    Err(e) => {
                        println!("CASE {i} ERR {} {e}", t.elapsed().as_millis());
                        continue;
                    }
                };
                target = Some(match pick(mine, a, b) {
                    "sub" => Some(sub),
                    "sub2" => Some(sub2),
                    _ => None,
                });
            }
            Case::Setting(..) => {}
        }
        let on: &Group = match &target {
            Some(Some(s)) => s,
            _ => &g,
        };
        // Only ranks that take part in a send or receive at all need a partner that does.
        let t = Instant::now();
        let r = call(on, what, dtype, op, count, root, partner);
        let ms = t.elapsed().as_millis();
        match r {
            Err(e) => println!("CASE {i} ERR {ms} {e}"),
            Ok(()) if what == "send" => {
                // The next call must fail. A receive from the same partner: it meets the
                // partner's own call (or its abort) and sends nothing to anyone else, who learn
                // of the mismatch from the partner.
                let t = Instant::now();
                match call(on, "recv", dtype, op, count, root, partner) {
                    Err(e) => println!("CASE {i} SENT {} {e}", t.elapsed().as_millis()),
                    Ok(()) => println!("CASE {i} OK {ms} the send and the receive after it returned"),
                }
            }
            Ok(()) => println!("CASE {i} OK {ms} returned normally"),
        }
    }
}

fn outcome(o: &RankOutput, case: usize) -> (String, u128, String) {
    let line = o
        .field(&format!("CASE {case} "))
        .unwrap_or_else(|| panic!("rank {} reported nothing for case {case}:\n{}\n{}", o.rank, o.stdout, o.stderr));
    let mut it = line.splitn(3, ' ');
    (it.next().unwrap().into(), it.next().unwrap().parse().unwrap(), it.next().unwrap_or("").into())
}

/// The strings that show each of a case's two values in an error message.
fn shown(case: &Case) -> Vec<Vec<String>> {
    let call_names = |c: &str| -> Vec<String> {
        match c {
            "all_sum" => vec!["all_sum".into()],
            "split" => vec!["all_gather of 2 int64".into()],
            "send" | "recv" => vec!["send/recv".into()],
            // Names inside others' ("all_gather", "reduce_scatter"): as the message puts them.
            "all_to_all" | "gather" | "scatter" => vec![format!("called {c} of")],
            "reduce" => vec!["called reduce(sum)".into()],
            other => vec![other.into()],
        }
    };
    match case {
        Case::Call(a, b) => vec![call_names(a), call_names(b)],
        Case::DType(a, b) => vec![vec![a.name().into()], vec![b.name().into()]],
        Case::Op(a, b) => vec![vec![format!("all_{}", a.name())], vec![format!("all_{}", b.name())]],
        Case::Count(a, b) => vec![vec![format!("of {a} ")], vec![format!("of {b} ")]],
        Case::Root(a, b) | Case::RootOf(_, a, b) => vec![
            vec![format!("root {a} but"), format!("rank used {a}")],
            vec![format!("root {b} but"), format!("rank used {b}")],
        ],
        Case::Split(a, b) => vec![vec![format!("expects {a} from")], vec![format!("sends {b} ")]],
        // Group ids are internal numbers: the message must say it is about another group.
        Case::Group(..) => vec![vec!["another group".into()], vec!["this call is on group".into()]],
        Case::Setting(name, a, b) => vec![vec![format!("{name}={a}")], vec![format!("{name}={b}")]],
    }
}

fn matrix(n: usize, backend: &str, link: LinkKind) {
    let all = cases(n);
    let ports: Vec<String> = all.iter().map(|_| free_port().to_string()).collect();
    let t = Instant::now();
    let outs = Job::new(n, "mismatch_worker")
        .env("MM_PORTS", ports.join(","))
        .env("BOLTCCL_BACKEND", backend)
        .env("EXPECT_LINK", format!("{link:?}"))
        .env("BOLTCCL_TIMEOUT_MS", "30000")
        .env("BOLTCCL_INIT_TIMEOUT_MS", "20000")
        .spawn()
        .wait(Duration::from_secs(600));
    let elapsed = t.elapsed();
    let mut slowest = 0;
    for o in &outs {
        assert!(o.status.success(), "rank {} failed:\n{}\n{}", o.rank, o.stdout, o.stderr);
    }
    for (i, case) in all.iter().enumerate() {
        let odd = i % n;
        for o in &outs {
            let (kind, ms, msg) = outcome(o, i);
            let label = format!("{n} ranks, case {i} {case:?}, odd rank {odd}, rank {}", o.rank);
            let expect_init = matches!(case, Case::Setting(..));
            match kind.as_str() {
                "INIT_ERR" if expect_init => {}
                "ERR" | "SENT" if !expect_init => {}
                _ => panic!("{label}: {kind} after {ms} ms: {msg}"),
            }
            assert!(ms < 5_000, "{label}: took {ms} ms: {msg}");
            slowest = slowest.max(ms);
            if o.rank != odd {
                assert!(msg.contains(&format!("rank {odd}")), "{label}: does not name rank {odd}: {msg}");
            } else {
                let names_another = (0..n).filter(|&q| q != odd).any(|q| msg.contains(&format!("rank {q}")));
                assert!(names_another, "{label}: names no other rank: {msg}");
            }
            for (side, forms) in shown(case).iter().enumerate() {
                assert!(
                    forms.iter().any(|f| msg.contains(f.as_str())),
                    "{label}: value {side} ({forms:?}) not shown: {msg}"
                );
            }
        }
    }
    eprintln!(
        "mismatch matrix at {n} ranks over {link:?}: {} cases in {elapsed:.1?}, slowest rank error {slowest} ms",
        all.len()
    );
}

#[test]
fn mismatch_matrix_2_ranks_over_tcp() {
    matrix(2, "tcp", LinkKind::Tcp);
}

#[test]
fn mismatch_matrix_3_ranks_over_tcp() {
    matrix(3, "tcp", LinkKind::Tcp);
}

#[test]
fn mismatch_matrix_4_ranks_over_tcp() {
    matrix(4, "tcp", LinkKind::Tcp);
}

#[test]
fn mismatch_matrix_2_ranks_over_shared_memory() {
    matrix(2, "shm", LinkKind::SharedMemory);
}

#[test]
fn mismatch_matrix_3_ranks_over_shared_memory() {
    matrix(3, "shm", LinkKind::SharedMemory);
}

#[test]
fn mismatch_matrix_4_ranks_over_shared_memory() {
    matrix(4, "shm", LinkKind::SharedMemory);
}
