//! Fuzzing every parser of bytes that another process (or a file) controls: the frame header
//! and the frame reader, control frames, the handshake's opening and the bootstrap messages
//! (Hello, Reply, Join) with the decisions made on them, the RDMA endpoint records, the device
//! matrix and the hostfile. Each target gets structure-aware inputs (valid input, then
//! mutated: bits, extreme integers, inserted, removed, repeated and truncated bytes, or a JSON
//! sub-value swapped for a random one) and raw bytes.
//!
//! Every case must: not panic; allocate at most a bound fixed by the protocol (measured by a
//! counting allocator, per thread); and satisfy the target's own invariants (a header that
//! decodes re-encodes to the same bytes; a mutated header never passes the check against the
//! original; an accepted rank, stream or table is in range; a parsed matrix is square and
//! symmetric ...). Case counts: `BOLTCCL_FUZZ_CASES` per target (CI: the default 2,000;
//! `scripts/fuzz.sh`: 100,000, in release).
//!
//! (`cargo fuzz` needs a nightly compiler for its sanitizers; these run on stable.)

#[path = "common/fuzz.rs"]
mod fuzzing;

use boltccl::fuzz::{self as f, Control, ControlDecoder, Header, Incoming, Kind, Phase, HEADER_LEN};
use boltccl::{Collective, Config, DType, ReduceOp};
use fuzzing::*;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

#[global_allocator]
static ALLOC: Counting = Counting;

/// Run `cases()` cases of `strategy` through `body`, counting them; prints the count.
fn run<S: Strategy>(name: &str, strategy: S, body: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let count = AtomicU64::new(0);
    let mut runner = TestRunner::new(config());
    let r = runner.run(&strategy, |v| {
        count.fetch_add(1, Ordering::Relaxed);
        body(v)
    });
    println!("fuzz {name}: {} cases", count.load(Ordering::Relaxed));
    if let Err(e) = r {
        panic!("fuzz {name}: {e}");
    }
}

/// Bound for parsers that should allocate nothing but an error message (a mismatch message
/// names both calls: a few hundred bytes, and the formatting's temporaries).
const SMALL: usize = 4096;

/// Fail the case unless `f` allocated at most `limit` bytes at its peak.
fn bounded<T>(what: &str, limit: usize, f: impl FnOnce() -> T) -> Result<T, TestCaseError> {
    let (r, peak) = peak_of(f);
    prop_assert!(peak <= limit, "{what}: {peak} bytes allocated at once, bound {limit}");
    Ok(r)
}

fn a_header() -> impl Strategy<Value = Header> {
    (1u8..=6, 0u8..12, 0u8..3, any::<u16>(), any::<u32>(), any::<u32>(), any::<u64>(), 0usize..11, any::<u32>())
        .prop_flat_map(|(coll, dtype, op, aux, group, seq, count, phase, len)| {
            (any::<u32>(), any::<u32>()).prop_map(move |(step, piece)| {
                let phase = PHASES[phase];
                let part = f::part(phase, (step >> 8) as usize, piece as usize).expect("in range");
                let mut h = Header::data(
                    Collective::from_u8(coll).expect("a collective"),
                    group,
                    seq,
                    DType::from_u8(dtype).expect("a dtype"),
                    ReduceOp::from_u8(op).expect("an op"),
                    count,
                    aux,
                );
                h.part = part;
                h.len = len;
                h
            })
        })
}

const PHASES: [Phase; 11] = [
    Phase::Barrier,
    Phase::Reduce,
    Phase::Gather,
    Phase::Scatter,
    Phase::RingReduce,
    Phase::RingGather,
    Phase::PointToPoint,
    Phase::RingAllGather,
    Phase::RingReduceScatter,
    Phase::RingBroadcast,
    Phase::Roots,
];

/// The frame header: raw bytes decode only to a header that encodes back to the same bytes
/// (nothing is silently ignored), and a valid header with any mutation either fails to decode
/// or fails the check against the original (naming the peer) — except the mutation that
/// changed nothing.
#[test]
fn frame_header() {
    run("frame_header/raw", proptest::collection::vec(any::<u8>(), HEADER_LEN), |b| {
        let arr: [u8; HEADER_LEN] = b.clone().try_into().expect("40 bytes");
        if let Ok(h) = bounded("decode", SMALL, || Header::decode(&arr))? {
            prop_assert_eq!(h.encode().to_vec(), b, "decode accepted bytes it does not re-encode");
        }
        Ok(())
    });
    // Raw bytes almost never pass the magic: start from the magic and a valid kind too.
    run("frame_header/raw-after-magic", proptest::collection::vec(any::<u8>(), HEADER_LEN - 3), |b| {
        let mut arr = [0u8; HEADER_LEN];
        arr[..2].copy_from_slice(&Header::goodbye().encode()[..2]);
        arr[2] = 1 + b[0] % 3;
        arr[3..].copy_from_slice(&b[..HEADER_LEN - 3]);
        if let Ok(h) = Header::decode(&arr) {
            prop_assert_eq!(h.encode(), arr);
        }
        Ok(())
    });
    let muts = proptest::collection::vec(mutation(), 1..6);
    run("frame_header/mutated", (a_header(), muts), |(h, m)| {
        let good = h.encode();
        let bad = mutate(&good, &m);
        let Ok(arr) = <[u8; HEADER_LEN]>::try_from(bad.as_slice()) else {
            return Ok(()); // another length never reaches decode (the reader takes 40 bytes)
        };
        match Header::decode(&arr) {
            Err(_) => {}
            Ok(got) if arr == good => prop_assert_eq!(got, h),
            Ok(got) => {
                let e = f::check(&h, &got, 7);
                prop_assert!(e.is_err(), "a changed header passed the check: {:?} vs {:?}", got, h);
                let e = e.unwrap_err();
                prop_assert!(e.to_string().contains("rank 7"), "{}", e);
            }
        }
        Ok(())
    });
}

/// The frame reader on a byte stream: frames with payloads, cut at random points, with bytes
/// mutated anywhere. A changed header byte is always an error before its payload counts; the
/// reader never takes a byte beyond the frame it reads and never allocates.
#[test]
fn frame_reader() {
    let strategy = (
        proptest::collection::vec((a_header(), 0usize..200), 1..4),
        proptest::collection::vec(mutation(), 0..4),
        1usize..97,
    );
    run("frame_reader/mutated", strategy, |(frames, m, cut)| {
        let frames: Vec<(Header, Vec<u8>)> = frames
            .into_iter()
            .map(|(h, n)| {
                let h = h.piece(h.part, n);
                (h, (0..n).map(|i| (i * 7 + n) as u8).collect())
            })
            .collect();
        let mut stream = Vec::new();
        for (h, p) in &frames {
            stream.extend_from_slice(&h.encode());
            stream.extend_from_slice(p);
        }
        let bad = mutate(&stream, &m);
        bounded("read", SMALL, || -> Result<(), TestCaseError> {
            let mut at = 0;
            for (h, p) in &frames {
                let mut buf = vec![0u8; p.len()];
                let mut inc = Incoming::default();
                let frame_start = at;
                let outcome = loop {
                    let [mut a, mut b] = inc.pending(&mut buf);
                    let room = a.len() + b.len();
                    let take = room.min(cut).min(bad.len() - at);
                    if take == 0 {
                        break Ok(false); // the stream ended: a real reader sees EOF here
                    }
                    let na = take.min(a.len());
                    a[..na].copy_from_slice(&bad[at..at + na]);
                    b[..take - na].copy_from_slice(&bad[at + na..at + take]);
                    at += take;
                    match inc.advance(take, h, 3) {
                        Ok(true) => break Ok(true),
                        Ok(false) => {}
                        Err(e) => break Err(e),
                    }
                };
                prop_assert!(at - frame_start <= HEADER_LEN + p.len(), "read past its frame");
                match outcome {
                    Err(e) => {
                        prop_assert!(e.to_string().contains("rank 3"), "{}", e);
                        return Ok(());
                    }
                    Ok(false) => return Ok(()),
                    Ok(true) => {
                        // Accepted: the header bytes were exactly the expected ones.
                        prop_assert_eq!(&bad[frame_start..frame_start + HEADER_LEN], &h.encode()[..]);
                    }
                }
            }
            Ok(())
        })??;
        Ok(())
    });
    // Lengths a peer may claim, up to u32::MAX (len) and u64::MAX (count): an error at the
    // header, nothing allocated for them.
    run("frame_reader/huge-lengths", (a_header(), any::<u32>(), any::<u64>()), |(h, len, count)| {
        let expect = h.piece(h.part, 16);
        let claimed = Header { len, count, ..expect };
        let mut buf = [0u8; 16];
        let mut inc = Incoming::default();
        let r = bounded("advance", SMALL, || {
            let [mut a, _] = inc.pending(&mut buf);
            a.copy_from_slice(&claimed.encode());
            inc.advance(HEADER_LEN, &expect, 1)
        })?;
        prop_assert_eq!(r.is_ok(), len == 16 && count == expect.count);
        Ok(())
    });
}

fn control_stream() -> impl Strategy<Value = Vec<u8>> {
    let frame = prop_oneof![
        Just(Header::goodbye().encode().to_vec()),
        (0usize..70_000).prop_map(|on| Header::waiting(on).encode().to_vec()),
        (0usize..70_000, any::<bool>(), 0usize..5000).prop_map(|(culprit, lost, n)| {
            let reason = "x".repeat(n);
            let mut v = Header::abort(culprit, lost, reason.len()).encode().to_vec();
            v.extend_from_slice(&reason.as_bytes()[..n.min(f::MAX_REASON)]);
            v
        }),
        a_header().prop_map(|h| h.piece(h.part, 0).encode().to_vec()),
    ];
    proptest::collection::vec(frame, 1..5).prop_map(|v| v.concat())
}

/// Control frames (abort, waiting note, goodbye) as the control connection delivers them, in
/// reads of up to 1 KiB: never more than one frame's worth buffered, a data frame or an
/// oversized one an error, an abort's reason cut at the limit.
#[test]
fn control_frames() {
    let check_stream = |bytes: Vec<u8>, read: usize| -> Result<(), TestCaseError> {
        // The decoder's buffer (one frame, grown by doubling), one reason and its message.
        bounded("control decoder", 4 * ControlDecoder::CAPACITY + 8192, || -> Result<(), TestCaseError> {
            let mut d = ControlDecoder::default();
            for chunk in bytes.chunks(read.max(1)) {
                if d.push(chunk).is_err() {
                    return Ok(());
                }
                loop {
                    match d.next() {
                        Ok(Some(Control::Abort(e))) => {
                            prop_assert!(e.to_string().len() <= f::MAX_REASON + 200, "reason not bounded");
                        }
                        Ok(Some(Control::Shrink(v))) => {
                            prop_assert!(v.members.len() <= 8 * f::MAX_REASON, "shrink members not bounded");
                        }
                        Ok(Some(Control::Goodbye | Control::Waiting { .. })) => {}
                        Ok(None) => break,
                        Err(_) => return Ok(()),
                    }
                }
            }
            Ok(())
        })?
    };
    run("control_frames/structured", (control_stream(), 1usize..1025), |(b, r)| check_stream(b, r));
    run(
        "control_frames/mutated",
        (control_stream(), proptest::collection::vec(mutation(), 1..6), 1usize..1025),
        |(b, m, r)| check_stream(mutate(&b, &m), r),
    );
    run("control_frames/raw", (proptest::collection::vec(any::<u8>(), 0..6000), 1usize..1025), |(b, r)| {
        check_stream(b, r)
    });
}

/// The handshake's opening bytes: accepted exactly when magic and version are right.
#[test]
fn handshake_opening() {
    let mut good = *b"BOLTCCL\0\0\0";
    good[8..].copy_from_slice(&f::auth::PROTOCOL_VERSION.to_le_bytes());
    run("handshake_opening", proptest::collection::vec(mutation(), 0..4), |m| {
        let b = mutate(&good, &m);
        let Ok(arr) = <[u8; 10]>::try_from(b.as_slice()) else { return Ok(()) };
        prop_assert_eq!(f::auth::check_opening("peer", &arr).is_ok(), arr == good);
        Ok(())
    });
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn settings() -> Vec<(String, String)> {
    f::agreed_settings(&Config::default())
}

/// Bound for parsing `n` bytes of JSON: what serde_json builds from them (strings and lists
/// no longer than the input) and its working memory, never anything sized by a number in it.
fn json_bound(n: usize) -> usize {
    64 * n + 65_536
}

fn hello_checks(body: &[u8], size: usize, taken: &[usize]) -> Result<(), TestCaseError> {
    let r = bounded("vet_hello", json_bound(body.len()), || f::vet_hello(body, size, &settings(), taken))?;
    if let Ok(rank) = r {
        prop_assert!(rank < size && !taken.contains(&rank), "accepted rank {} of {} (taken {:?})", rank, size, taken);
    }
    Ok(())
}

/// Bootstrap messages: the length prefix (refused above the limit before anything is
/// allocated), then each message body and the decision made on it. Structure-aware: valid
/// messages with byte mutations, and with one JSON sub-value swapped for a random value.
#[test]
fn bootstrap_messages() {
    run("bootstrap/length-prefix", any::<[u8; 4]>(), |p| {
        let r = bounded("body_len", SMALL, || f::auth::body_len("peer", p))?;
        prop_assert_eq!(r.is_ok(), u32::from_le_bytes(p) as usize <= f::auth::MAX_MESSAGE);
        Ok(())
    });
    let hello = |rank: usize, size: usize| f::hello(rank, size, settings(), addr(5000));
    let as_json = |b: Vec<u8>| serde_json::from_slice::<serde_json::Value>(&b).expect("valid JSON");
    let sizes = (1usize..9, proptest::collection::vec(0usize..9, 0..3));
    run(
        "bootstrap/hello-mutated",
        (0usize..9, sizes.clone())
            .prop_flat_map(move |(r, (size, taken))| (mutated(hello(r, size)), Just(size), Just(taken))),
        |(b, size, taken)| hello_checks(&b, size, &taken),
    );
    run(
        "bootstrap/hello-json",
        (0usize..9, sizes.clone())
            .prop_flat_map(move |(r, (size, taken))| (json_mutated(as_json(hello(r, size))), Just(size), Just(taken))),
        |(b, size, taken)| hello_checks(&b, size, &taken),
    );
    run("bootstrap/hello-raw", (proptest::collection::vec(any::<u8>(), 0..300), sizes), |(b, (size, taken))| {
        hello_checks(&b, size, &taken)
    });
    let table = |n: usize| f::table_reply(42, &(0..n).map(|i| addr(6000 + i as u16)).collect::<Vec<_>>());
    let reply_checks = |b: Vec<u8>, size: usize| -> Result<(), TestCaseError> {
        if let Ok((_, addrs)) = bounded("vet_reply", json_bound(b.len()), || f::vet_reply(&b, size))? {
            prop_assert_eq!(addrs.len(), size, "a table of the wrong size was accepted");
        }
        Ok(())
    };
    run(
        "bootstrap/reply-mutated",
        (1usize..9, 1usize..9).prop_flat_map(move |(n, size)| {
            (
                prop_oneof![
                    mutated(table(n)),
                    mutated(f::reject_reply(Some(n), "x")),
                    mutated(f::reject_reply(None, "y"))
                ],
                Just(size),
            )
        }),
        |(b, size)| reply_checks(b, size),
    );
    run(
        "bootstrap/reply-json",
        (1usize..9, 1usize..9).prop_flat_map(move |(n, size)| (json_mutated(as_json(table(n))), Just(size))),
        |(b, size)| reply_checks(b, size),
    );
    run("bootstrap/reply-raw", (proptest::collection::vec(any::<u8>(), 0..300), 1usize..9), |(b, size)| {
        reply_checks(b, size)
    });
    let join_checks = |b: Vec<u8>, rank: usize, size: usize, streams: usize| -> Result<(), TestCaseError> {
        if let Ok((r, s)) = bounded("vet_join", json_bound(b.len()), || f::vet_join(&b, 42, rank, size, streams))? {
            // Data streams, and the pair's control stream one past them (rank 0 takes none:
            // its control connections are the coordinator's).
            let slots = streams + usize::from(rank != 0);
            prop_assert!(r > rank && r < size && s < slots, "accepted rank {} stream {}", r, s);
        }
        Ok(())
    };
    let world = (0usize..8, 1usize..9, 1usize..5);
    run(
        "bootstrap/join-mutated",
        (world.clone(), 0usize..9, 0usize..5).prop_flat_map(|((rank, size, streams), jr, js)| {
            (mutated(f::join(42, jr, js)), Just(rank), Just(size), Just(streams))
        }),
        |(b, rank, size, streams)| join_checks(b, rank, size, streams),
    );
    run(
        "bootstrap/join-json",
        (world.clone(), 0usize..9, 0usize..5).prop_flat_map(move |((rank, size, streams), jr, js)| {
            (json_mutated(as_json(f::join(42, jr, js))), Just(rank), Just(size), Just(streams))
        }),
        |(b, rank, size, streams)| join_checks(b, rank, size, streams),
    );
    run("bootstrap/join-raw", (proptest::collection::vec(any::<u8>(), 0..100), world), |(b, (rank, size, streams))| {
        join_checks(b, rank, size, streams)
    });
}

fn an_endpoint() -> impl Strategy<Value = f::Endpoint> {
    (
        any::<[u8; 16]>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u16>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(gid, qpn, psn, mtu, lid, recv_depth, slot, reserved)| f::Endpoint {
            gid,
            qpn,
            psn,
            mtu,
            lid,
            recv_depth,
            slot,
            reserved,
        })
}

/// RDMA endpoint records as a peer sends them (one per cable, 48 bytes each): a record that
/// decodes re-encodes to the same bytes but for its two padding bytes; a list is accepted only
/// with one record per cable, each for our packet size.
#[test]
fn verbs_endpoints() {
    run("endpoint/round-trip", an_endpoint(), |e| {
        prop_assert_eq!(f::Endpoint::decode(&e.encode()), Some(e));
        Ok(())
    });
    run("endpoint/mutated", (an_endpoint(), proptest::collection::vec(mutation(), 1..6)), |(e, m)| {
        let b = mutate(&e.encode(), &m);
        if let Some(d) = bounded("decode", SMALL, || f::Endpoint::decode(&b))? {
            let mut back = d.encode();
            back[34..36].copy_from_slice(&b[34..36]);
            prop_assert_eq!(back.to_vec(), b);
        }
        Ok(())
    });
    let lists =
        (proptest::collection::vec(an_endpoint(), 0..5), proptest::collection::vec(mutation(), 0..4), 1usize..5);
    run("endpoint/lists", lists, |(eps, m, cables)| {
        let slot = eps.first().map_or(4096, |e| e.slot as usize);
        let blob = mutate(&eps.iter().flat_map(|e| e.encode()).collect::<Vec<u8>>(), &m);
        if let Ok(got) = bounded("parse", 64 * f::ENDPOINT_LEN * 4, || f::parse_endpoints(3, &blob, cables, slot))? {
            prop_assert_eq!(got.len(), cables);
            prop_assert!(got.iter().all(|e| e.slot as usize == slot));
        } else if let Err(e) = f::parse_endpoints(3, &blob, cables, slot) {
            prop_assert!(e.to_string().contains("rank 3"), "{}", e);
        }
        Ok(())
    });
}

fn matrix_json(n: usize) -> serde_json::Value {
    use serde_json::json;
    let rows: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let cells: Vec<serde_json::Value> = (0..n)
                .map(|j| match (i == j, (i + j) % 3) {
                    (true, _) => json!(null),
                    (false, 0) => json!("rdma_en3"),
                    (false, 1) => json!(["rdma_en4", "rdma_en5"]),
                    _ => json!(null),
                })
                .collect();
            json!(cells)
        })
        .collect();
    json!(rows)
}

fn matrix_checks(text: &str, world: usize) -> Result<(), TestCaseError> {
    let limit = json_bound(text.len());
    if let Ok(m) = bounded("DeviceMatrix::parse", limit, || f::DeviceMatrix::parse(text, world))? {
        prop_assert_eq!(m.cells.len(), world);
        for (i, row) in m.cells.iter().enumerate() {
            prop_assert_eq!(row.len(), world);
            prop_assert!(row[i].is_empty(), "a rank cabled to itself");
            for (j, c) in row.iter().enumerate() {
                prop_assert_eq!(c.is_empty(), m.cells[j][i].is_empty(), "asymmetric cabling accepted");
            }
        }
        let _ = m.cabled();
    }
    Ok(())
}

/// The device matrix (`BOLTCCL_IBV_DEVICES`): accepted only square, world-sized, symmetric in
/// which pairs are cabled, with no rank cabled to itself.
#[test]
fn device_matrix() {
    let world = 1usize..7;
    run(
        "device_matrix/json",
        (1usize..7, world.clone()).prop_flat_map(|(n, w)| (json_mutated(matrix_json(n)), Just(w))),
        |(b, w)| matrix_checks(&String::from_utf8_lossy(&b), w),
    );
    run(
        "device_matrix/mutated",
        (1usize..7, world.clone())
            .prop_flat_map(|(n, w)| (mutated(serde_json::to_vec(&matrix_json(n)).unwrap()), Just(w))),
        |(b, w)| matrix_checks(&String::from_utf8_lossy(&b), w),
    );
    run("device_matrix/raw", (proptest::collection::vec(any::<u8>(), 0..200), world), |(b, w)| {
        matrix_checks(&String::from_utf8_lossy(&b), w)
    });
}

fn hostfile_checks(text: &str) -> Result<(), TestCaseError> {
    let limit = json_bound(text.len());
    if let Ok(ranks) = bounded("parse_hostfile", limit, || boltccl::config::parse_hostfile(text))? {
        prop_assert!(!ranks.is_empty() && ranks.iter().all(|r| !r.is_empty()), "{:?}", ranks);
    }
    Ok(())
}

/// The hostfile (`BOLTCCL_HOSTFILE`, MLX's ring and launcher formats): accepted only with at
/// least one rank, each with an address.
#[test]
fn hostfile() {
    use serde_json::json;
    let samples = vec![
        json!([["10.0.0.1:5000", "10.0.1.1:5000"], ["10.0.0.2:5000"]]),
        json!([{"ssh": "m1", "ips": ["1.2.3.4"]}, {"ssh": "m2"}]),
        json!({"backend": "jaccl", "envs": [], "hosts": [{"ssh": "m1", "ips": ["1.2.3.4"]}]}),
    ];
    let pick = proptest::sample::select(samples);
    run("hostfile/json", pick.clone().prop_flat_map(json_mutated), |b| hostfile_checks(&String::from_utf8_lossy(&b)));
    run("hostfile/mutated", pick.prop_flat_map(|v| mutated(serde_json::to_vec(&v).unwrap())), |b| {
        hostfile_checks(&String::from_utf8_lossy(&b))
    });
    run("hostfile/raw", proptest::collection::vec(any::<u8>(), 0..200), |b| {
        hostfile_checks(&String::from_utf8_lossy(&b))
    });
}

/// The allocator really counts (a bound of 0 above would otherwise prove nothing).
#[test]
fn allocation_bounds_are_measured() {
    let ((), peak) = peak_of(|| drop(vec![0u8; 1 << 20]));
    assert!(peak >= 1 << 20, "{peak}");
    let kinds = [Kind::Data, Kind::Abort, Kind::Goodbye];
    assert_eq!(kinds.len(), 3);
}
