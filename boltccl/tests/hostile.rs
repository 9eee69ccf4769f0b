//! A hostile peer that holds the job key: it joins the group as a real rank (handshake,
//! agreed settings, data mesh: `boltccl::fuzz::rendezvous`), takes part correctly in a few
//! all_sums, then, mid-collective, sends on its data connections or on its control connection:
//! random bytes; a valid header with each field changed in turn; truncated frames (left open,
//! or closed); lengths up to `u32::MAX` and counts up to `u64::MAX`; a data frame on the
//! control connection; an oversized and an undecodable control frame; aborts that lie about
//! rank 0 (that it crashed or aborted), told to rank 0, to every honest rank, or to all but
//! rank 0. Before the group forms it sends malformed bootstrap messages instead (as a joining
//! rank, and as the coordinator).
//!
//! The honest ranks are real processes; every one must fail (no wrong answer, no panic, no
//! hang) with an error naming the hostile rank, promptly (or at `BOLTCCL_TIMEOUT_MS` for a frame
//! that stops halfway), and its memory must stay bounded (peak RSS). A lie must not get rank 0
//! blamed: rank 0 and every rank that heard the lie blame the liar (`Error::rank()`).
//!
//! One set of honest processes runs every case in turn, each case a new group on its own port,
//! while the hostile runs the same cases here.

mod common;

use boltccl::fuzz::{self as f, Header, Phase, HEADER_LEN};
use boltccl::{Backend, Collective, Config, DType, ReduceOp};
use common::harness::{free_port, is_worker, one_job_at_a_time, Job, RankOutput};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Elements of every all_sum: one mesh piece (4 KiB) per peer.
const COUNT: usize = 1024;
/// All_sums the hostile takes part in correctly before it attacks.
const HONEST_ROUNDS: u32 = 3;
/// The honest ranks' BOLTCCL_TIMEOUT_MS: the deadline for a frame that stops halfway.
const TIMEOUT_MS: u64 = 2_000;
/// The honest ranks' BOLTCCL_INIT_TIMEOUT_MS: the deadline for a group to form.
const INIT_TIMEOUT_MS: u64 = 4_000;
/// Longer than every case takes on the honest side: the hostile gives up waiting then.
const CASE_LIMIT: Duration = Duration::from_secs(20);

/// What the hostile does, in the order the honest ranks meet the cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attack {
    /// Data connections, mid-collective.
    RandomBytes,
    Field(&'static str),
    TruncatedHeaderOpen,
    TruncatedPayloadOpen,
    TruncatedPayloadClosed,
    MaxLen,
    MaxCount,
    /// Control connection (to rank 0), mid-collective.
    DataOnControl,
    OversizedControl,
    GarbageControl,
    UnknownKindOnControl,
    /// An abort that says an honest rank (rank 0) crashed: to rank 0 only; to every honest
    /// rank (rank 0 last); and one that says rank 0 aborted, to every honest rank. At 3 ranks
    /// also to every honest rank but rank 0, which hears nothing of it.
    LyingAbort,
    LyingAbortToAll,
    LyingAbortedToAll,
    LyingAbortBehindItsBack,
    /// Bootstrap, before the group forms.
    GarbageHello,
    OversizedHello,
    GarbageJoin,
    /// As the coordinator.
    GarbageReply,
    WrongSizeTable,
}

const FIELDS: [&str; 12] =
    ["magic", "kind", "coll", "dtype", "op", "aux", "group", "seq", "count", "part", "len", "padding"];

fn attacks(n: usize) -> Vec<Attack> {
    let mut v = vec![Attack::RandomBytes];
    v.extend(FIELDS.iter().map(|&n| Attack::Field(n)));
    v.extend([
        Attack::TruncatedHeaderOpen,
        Attack::TruncatedPayloadOpen,
        Attack::TruncatedPayloadClosed,
        Attack::MaxLen,
        Attack::MaxCount,
        Attack::DataOnControl,
        Attack::OversizedControl,
        Attack::GarbageControl,
        Attack::UnknownKindOnControl,
        Attack::LyingAbort,
        Attack::LyingAbortToAll,
        Attack::LyingAbortedToAll,
    ]);
    if n >= 3 {
        v.push(Attack::LyingAbortBehindItsBack);
    }
    v.extend([
        Attack::GarbageHello,
        Attack::OversizedHello,
        Attack::GarbageJoin,
        Attack::GarbageReply,
        Attack::WrongSizeTable,
    ]);
    v
}

impl Attack {
    /// The hostile plays rank 0 (the coordinator) for these, the last rank otherwise.
    fn as_coordinator(self) -> bool {
        matches!(self, Attack::GarbageReply | Attack::WrongSizeTable)
    }

    fn before_forming(self) -> bool {
        matches!(self, Attack::GarbageHello | Attack::OversizedHello | Attack::GarbageJoin) || self.as_coordinator()
    }

    /// A frame that stops halfway with the connection open: found at the deadline.
    fn stalls(self) -> bool {
        matches!(self, Attack::TruncatedHeaderOpen | Attack::TruncatedPayloadOpen)
    }

    /// An abort blaming rank 0 for what it never did.
    fn lies(self) -> bool {
        matches!(
            self,
            Attack::LyingAbort | Attack::LyingAbortToAll | Attack::LyingAbortedToAll | Attack::LyingAbortBehindItsBack
        )
    }
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// Peak resident memory of this process, KiB.
fn peak_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// An honest rank: every case in turn, a new group each. Prints `CASE i <outcome> <ms> <error>`,
/// an error followed by ` [rank() = <the rank it blames>]`.
#[test]
fn hostile_worker() {
    if !is_worker() {
        return;
    }
    boltccl::log_to_stderr();
    let ports: Vec<String> = env("HOSTILE_PORTS").split(',').map(String::from).collect();
    let hostile: usize = env("HOSTILE_RANK").parse().unwrap();
    for (i, port) in ports.iter().enumerate() {
        std::env::set_var("BOLTCCL_COORDINATOR", format!("127.0.0.1:{port}"));
        let t = Instant::now();
        let g = match boltccl::init() {
            Ok(g) => g,
            Err(e) => {
                println!("CASE {i} INIT_ERR {} {e}", t.elapsed().as_millis());
                continue;
            }
        };
        let (r, p) = (g.rank(), g.size());
        let mut outcome = None;
        for round in 0..HONEST_ROUNDS + 5 {
            let mut x: Vec<f32> = (0..COUNT).map(|k| ((k + round as usize + r) % 13) as f32).collect();
            let t = Instant::now();
            match g.all_sum(&mut x) {
                Ok(()) => {
                    // The hostile contributes zeros: the answer is the honest ranks' sum.
                    for (k, v) in x.iter().enumerate() {
                        let want: f32 =
                            (0..p).filter(|&q| q != hostile).map(|q| ((k + round as usize + q) % 13) as f32).sum();
                        assert_eq!(*v, want, "WRONG ANSWER: case {i} round {round} element {k}");
                    }
                }
                Err(e) => {
                    // The round is part of the outcome: the attack's, not a later one.
                    outcome =
                        Some(format!("ERR {} round {round}: {e} [rank() = {:?}]", t.elapsed().as_millis(), e.rank()));
                    break;
                }
            }
        }
        println!("CASE {i} {}", outcome.unwrap_or_else(|| "NO_ERROR 0 -".into()));
        drop(g);
    }
    println!("PEAK_RSS_KIB {}", peak_rss_kib());
}

fn cfg(rank: usize, n: usize, port: u16) -> Config {
    Config {
        rank,
        world_size: n,
        coordinator: Some(format!("127.0.0.1:{port}")),
        job_key: Some("test-key".into()),
        backend: Backend::Tcp,
        init_timeout: Duration::from_secs(20),
        ..Config::default()
    }
}

/// The header of this rank's piece in round `round` (1-based sequence number) of the all_sums.
fn piece_header(round: u32) -> Header {
    Header::data(Collective::AllReduce, 0, round, DType::F32, ReduceOp::Sum, COUNT as u64, 0)
        .piece(f::part(Phase::Reduce, 0, 0).unwrap(), COUNT * 4)
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<()> {
    let mut b = vec![0u8; HEADER_LEN + COUNT * 4];
    s.read_exact(&mut b)
}

/// Wait until every honest peer has closed its connection to us (it failed and let go), or
/// the case limit.
fn until_closed(streams: &mut [TcpStream], limit: Duration) {
    let until = Instant::now() + limit;
    for s in streams.iter_mut() {
        let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
        let mut b = [0u8; 4096];
        while Instant::now() < until {
            match s.read(&mut b) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
    }
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// The attack frame for a header field: the right header for the piece due, one field changed.
fn mutated_field(field: &str, h: Header) -> Vec<u8> {
    let mut b = h.encode();
    let set = |b: &mut [u8; HEADER_LEN], at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
    match field {
        "magic" => set(&mut b, 0, &[0x42, 0x42]),
        "kind" => b[2] = 9,
        "coll" => b[3] = Collective::AllGather as u8,
        "dtype" => b[4] = DType::I32 as u8,
        "op" => b[5] = ReduceOp::Max as u8,
        "aux" => set(&mut b, 6, &7u16.to_le_bytes()),
        "group" => set(&mut b, 8, &0xdead_beefu32.to_le_bytes()),
        "seq" => set(&mut b, 12, &(h.seq + 1).to_le_bytes()),
        "count" => set(&mut b, 16, &(h.count + 1).to_le_bytes()),
        "part" => set(&mut b, 24, &f::part(Phase::Reduce, 0, 1).unwrap().to_le_bytes()),
        "len" => set(&mut b, 32, &(h.len - 4).to_le_bytes()),
        "padding" => b[36] = 1,
        other => panic!("no field {other}"),
    }
    let mut v = b.to_vec();
    v.extend(vec![0u8; COUNT * 4]);
    v
}

/// The hostile side of one case (`rank` of `n`, coordinator on `port`). Returns the addresses
/// it connected from, by which the honest ranks can name it before it has a rank.
fn hostile(attack: Attack, rank: usize, n: usize, port: u16) -> Vec<String> {
    let key = b"test-key";
    match attack {
        Attack::GarbageHello | Attack::OversizedHello => {
            let mut s = dial(port);
            f::auth::client(&mut s, key).expect("the hostile holds the key");
            if attack == Attack::GarbageHello {
                send_body(&mut s, br#"{"rank": 1, "world_size": "#);
            } else {
                s.write_all(&u32::MAX.to_le_bytes()).unwrap();
                let _ = s.write_all(&random_bytes(64 << 10, 7));
            }
            let me = vec![s.local_addr().unwrap().to_string()];
            // Stay connected until the coordinator gives up on us.
            until_closed(&mut [s], CASE_LIMIT);
            return me;
        }
        Attack::GarbageReply | Attack::WrongSizeTable => {
            let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
            l.set_nonblocking(true).unwrap();
            let mut conns = Vec::new();
            let until = Instant::now() + CASE_LIMIT;
            while conns.len() < n - 1 && Instant::now() < until {
                match l.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                        f::auth::server(&mut s, key).unwrap();
                        let _hello: serde_json::Value = f::auth::recv(&mut s).unwrap();
                        conns.push(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            for s in &mut conns {
                let body = if attack == Attack::GarbageReply {
                    br#"{"Table": {"job": -1, "peers": 17}}"#.to_vec()
                } else {
                    f::table_reply(1, &[s.local_addr().unwrap()])
                };
                send_body(s, &body);
            }
            until_closed(&mut conns, CASE_LIMIT);
            return vec![format!("127.0.0.1:{port}")];
        }
        Attack::GarbageJoin => {
            // A correct Hello (so the group expects this rank), then garbage instead of a Join on
            // every data connection it must open.
            let mut s = dial(port);
            f::auth::client(&mut s, key).unwrap();
            let me = TcpListener::bind("127.0.0.1:0").unwrap();
            let c = cfg(rank, n, port);
            send_body(&mut s, &f::hello(rank, n, f::agreed_settings(&c), me.local_addr().unwrap()));
            let reply: serde_json::Value = f::auth::recv(&mut s).unwrap();
            let (_, addrs) = f::vet_reply(&serde_json::to_vec(&reply).unwrap(), n).expect("a table");
            let mut conns = vec![s];
            for a in addrs.iter().take(rank) {
                let mut d = TcpStream::connect(a).unwrap();
                d.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                f::auth::client(&mut d, key).unwrap();
                send_body(&mut d, b"[1, 2, 3]");
                conns.push(d);
            }
            let me = conns.iter().map(|c| c.local_addr().unwrap().to_string()).collect();
            until_closed(&mut conns, CASE_LIMIT);
            return me;
        }
        _ => {}
    }
    let joined = f::rendezvous(&cfg(rank, n, port)).expect("the hostile joins");
    let mut links: Vec<TcpStream> = joined.links.into_iter().flatten().collect();
    let mut control: Vec<TcpStream> = joined.control.into_iter().flatten().collect();
    for s in links.iter().chain(control.iter()) {
        s.set_read_timeout(Some(CASE_LIMIT)).unwrap();
    }
    // Honest rounds: zeros from us, the honest frames read and dropped.
    for round in 1..=HONEST_ROUNDS {
        for s in &mut links {
            let mut frame = piece_header(round).encode().to_vec();
            frame.extend(vec![0u8; COUNT * 4]);
            s.write_all(&frame).unwrap();
        }
        for s in &mut links {
            read_frame(s).expect("an honest frame");
        }
    }
    let h = piece_header(HONEST_ROUNDS + 1);
    let on_data: Option<Vec<u8>> = match attack {
        Attack::RandomBytes => Some(random_bytes(4096, 99)),
        Attack::Field(name) => Some(mutated_field(name, h)),
        Attack::TruncatedHeaderOpen => Some(h.encode()[..20].to_vec()),
        Attack::TruncatedPayloadOpen | Attack::TruncatedPayloadClosed => {
            let mut v = h.encode().to_vec();
            v.extend(vec![0u8; COUNT * 2]);
            Some(v)
        }
        Attack::MaxLen => Some(Header { len: u32::MAX, ..h }.encode().to_vec()),
        Attack::MaxCount => Some(Header { count: u64::MAX, ..h }.encode().to_vec()),
        _ => None,
    };
    match on_data {
        Some(bytes) => {
            for s in &mut links {
                let _ = s.write_all(&bytes);
            }
        }
        None => {
            let bytes = match attack {
                Attack::DataOnControl => h.encode().to_vec(),
                Attack::OversizedControl => Header { len: u32::MAX, ..Header::abort(rank, false, 0) }.encode().to_vec(),
                Attack::GarbageControl => random_bytes(8192, 5),
                Attack::UnknownKindOnControl => {
                    let mut b = Header::goodbye().encode();
                    b[2] = 77;
                    b.to_vec()
                }
                // An abort that blames an honest rank (rank 0) for a crash, or an abort, that
                // never happened.
                Attack::LyingAbort
                | Attack::LyingAbortToAll
                | Attack::LyingAbortedToAll
                | Attack::LyingAbortBehindItsBack => {
                    let reason = b"segmentation fault";
                    let lost = attack != Attack::LyingAbortedToAll;
                    let mut v = Header::abort(0, lost, reason.len()).encode().to_vec();
                    v.extend_from_slice(reason);
                    v
                }
                other => unreachable!("{other:?}"),
            };
            // To rank 0; for the lies to all, to the others first, so that they hear the lie
            // before rank 0 can answer it.
            if matches!(attack, Attack::LyingAbortToAll | Attack::LyingAbortedToAll | Attack::LyingAbortBehindItsBack) {
                for s in control.iter_mut().skip(1) {
                    let _ = s.write_all(&bytes);
                }
            }
            if attack != Attack::LyingAbortBehindItsBack {
                let _ = control[0].write_all(&bytes);
            }
        }
    }
    if attack == Attack::TruncatedPayloadClosed {
        return Vec::new(); // every connection drops with the hostile's streams
    }
    let limit = if attack.stalls() { Duration::from_millis(TIMEOUT_MS * 4) } else { CASE_LIMIT };
    until_closed(&mut links, limit);
    drop(control);
    Vec::new()
}

/// A bootstrap message as the wire carries it: a 4-byte length, then the body.
fn send_body(s: &mut TcpStream, body: &[u8]) {
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(body);
    s.write_all(&frame).unwrap();
}

fn dial(port: u16) -> TcpStream {
    let until = Instant::now() + CASE_LIMIT;
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                return s;
            }
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("no coordinator on {port}: {e}"),
        }
    }
}

/// One outcome line of an honest rank: (kind, ms, message).
fn outcome(o: &RankOutput, case: usize) -> (String, u128, String) {
    let line = o
        .field(&format!("CASE {case} "))
        .unwrap_or_else(|| panic!("rank {} reported nothing for case {case}:\n{}\n{}", o.rank, o.stdout, o.stderr));
    let mut it = line.splitn(3, ' ');
    let kind = it.next().unwrap().to_string();
    let ms = it.next().unwrap().parse().unwrap();
    (kind, ms, it.next().unwrap_or("").to_string())
}

fn hostile_world(n: usize) {
    // One world at a time: the cases are timed against the deadlines, and two worlds at once
    // on a 2-core machine starve each other's ranks.
    let _one = one_job_at_a_time();
    let cases = attacks(n);
    let ports: Vec<u16> = cases.iter().map(|_| free_port()).collect();
    let last = n - 1;
    // The honest ranks: all but the hostile's. The hostile is rank `last`, except where it is
    // the coordinator (rank 0): those cases run in a second job of the other ranks.
    let (rank_cases, coord_cases): (Vec<_>, Vec<_>) = (0..cases.len()).partition(|&i| !cases[i].as_coordinator());
    for (hostile_rank, which) in [(last, rank_cases), (0, coord_cases)] {
        let ports_of = which.iter().map(|&i| ports[i].to_string()).collect::<Vec<_>>().join(",");
        let honest: Vec<usize> = (0..n).filter(|&r| r != hostile_rank).collect();
        let t = Instant::now();
        let ranks = Job::new(n, "hostile_worker")
            .env("HOSTILE_PORTS", &ports_of)
            .env("HOSTILE_RANK", hostile_rank.to_string())
            .env("BOLTCCL_TIMEOUT_MS", TIMEOUT_MS.to_string())
            .env("BOLTCCL_INIT_TIMEOUT_MS", INIT_TIMEOUT_MS.to_string())
            // The hostile speaks TCP only (it writes the frames itself), so the honest ranks
            // must not agree on shared memory among themselves.
            .env("BOLTCCL_BACKEND", "tcp")
            .env("BOLTCCL_LOG", "warn")
            .start(honest.clone());
        let mut addrs = Vec::new();
        for &i in &which {
            let attack = cases[i];
            let started = Instant::now();
            addrs.push(hostile(attack, hostile_rank, n, ports[i]));
            eprintln!("hostile {n} ranks, {attack:?}: hostile side done in {:.1?}", started.elapsed());
        }
        let outs = ranks.wait(Duration::from_secs(120 + 10 * which.len() as u64));
        let elapsed = t.elapsed();
        for (o, &rank) in outs.iter().zip(&honest) {
            assert!(
                o.status.success(),
                "honest rank {rank} failed (a panic or a wrong answer):\n{}\n{}",
                o.stdout,
                o.stderr
            );
            let peak: u64 = o.field("PEAK_RSS_KIB ").and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
            assert!(peak < 256 * 1024, "honest rank {rank}: peak RSS {peak} KiB");
            for (k, &i) in which.iter().enumerate() {
                let attack = cases[i];
                let (kind, ms, msg) = outcome(o, k);
                println!("{n} ranks, {attack:?}, honest rank {rank}: {kind} after {ms} ms: {msg}");
                let who = format!("rank {hostile_rank}");
                if attack.before_forming() {
                    assert_eq!(kind, "INIT_ERR", "{attack:?}: rank {rank} formed a group with a hostile peer: {msg}");
                    // Before it has a rank, the hostile is named by its address (as a
                    // coordinator, also as "the coordinator").
                    let named = addrs[k].iter().any(|a| msg.contains(a.as_str()))
                        || (attack.as_coordinator() && msg.contains("the coordinator"));
                    assert!(named, "{attack:?}: rank {rank} does not name the hostile ({:?}): {msg}", addrs[k]);
                    // At the init deadline at the latest (and a margin of three quarters of it).
                    let limit = INIT_TIMEOUT_MS as u128 * 7 / 4;
                    assert!(ms < limit, "{attack:?}: rank {rank} took {ms} ms (limit {limit}): {msg}");
                } else {
                    assert_eq!(kind, "ERR", "{attack:?}: rank {rank}: {kind} {msg}");
                    // In the attacked call; or, at 3 ranks, in the call before when another
                    // honest rank's abort overtakes this one's last frames. Never later: a
                    // call that returned after the attack would have taken the bad frame.
                    let ok_rounds = [format!("round {HONEST_ROUNDS}: "), format!("round {}: ", HONEST_ROUNDS - 1)];
                    let in_time = ok_rounds.iter().any(|r| msg.starts_with(r.as_str()));
                    assert!(in_time, "{attack:?}: rank {rank} did not fail in the attacked call: {msg}");
                    assert!(msg.contains(&who), "{attack:?}: rank {rank} does not name {who}: {msg}");
                    // Only a frame that stops halfway may take until the deadline (and a margin
                    // of one and a half deadlines); the others fail without waiting for it (the
                    // message says so), within one and a half deadlines of the call's start.
                    assert_eq!(msg.contains("timed out"), attack.stalls(), "{attack:?}: rank {rank}: {msg}");
                    let t = TIMEOUT_MS as u128;
                    let limit = if attack.stalls() { t * 5 / 2 } else { t * 3 / 2 };
                    assert!(ms < limit, "{attack:?}: rank {rank} took {ms} ms: {msg}");
                    // A lie blames the liar: on rank 0, whom it accuses, and on every rank that
                    // heard it, `Error::rank()` names the hostile rank, not rank 0 (a rank whose
                    // connection to rank 0 stays open and silent decides so after 1 s). A rank
                    // that did not hear it learns that the rank that caught it aborted, and why,
                    // naming the liar (checked above): rank 0 for the lie told to rank 0 alone,
                    // rank 1 for the lie told behind rank 0's back.
                    if attack.lies() {
                        let blamed = match attack {
                            Attack::LyingAbort if rank != 0 => 0,
                            Attack::LyingAbortBehindItsBack if rank == 0 => 1,
                            _ => hostile_rank,
                        };
                        let want = format!("[rank() = Some({blamed})]");
                        assert!(msg.ends_with(&want), "{attack:?}: rank {rank} does not blame rank {blamed}: {msg}");
                    }
                }
            }
        }
        eprintln!("hostile {n} ranks, hostile rank {hostile_rank}: {} cases in {elapsed:.1?}", which.len());
    }
}

#[test]
fn hostile_peer_at_2_ranks() {
    hostile_world(2);
}

#[test]
fn hostile_peer_at_3_ranks() {
    hostile_world(3);
}
