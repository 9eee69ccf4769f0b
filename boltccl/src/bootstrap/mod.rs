//! Forming a group over TCP.
//!
//! 1. Rank 0 listens on the coordinator address; every other rank dials it (with retry until
//!    the init deadline) and authenticates (see [`auth`]).
//! 2. Each rank binds its data listener on its own address (never all interfaces unless told)
//!    and sends rank 0 a `Hello`: rank, world size, library version, the settings that must
//!    agree, its data address and host name.
//! 3. Rank 0 checks them all and answers with the table of every rank's address, or with a
//!    rejection that names the rank and the setting that differ, sent to every rank.
//! 4. Ranks connect the data mesh (higher ranks dial lower ones, each connection authenticated
//!    and tagged with the job id), and a control connection between every two ranks other than
//!    rank 0; the coordinator connections are rank 0's. Together they are the control mesh: a
//!    rank that fails tells every other directly, so news does not depend on any one rank
//!    (a stalled rank 0 included).
//!
//! Anything malformed, unauthenticated or oversized arriving on a listening port is logged and
//! dropped; it never stops the group from forming.

mod port;

pub use port::free_coordinator_port;

use crate::auth;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::host::PeerInfo;
use crate::wire::bootstrap::{Hello, Join, Reply};
use crossbeam_channel::{unbounded, RecvTimeoutError};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest time one incoming connection may take to authenticate and introduce itself.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// At most this many connections are being vetted at once; more are dropped.
const MAX_PENDING: usize = 64;

fn key_of(cfg: &Config) -> Vec<u8> {
    match &cfg.job_key {
        Some(k) => k.as_bytes().to_vec(),
        None => {
            tracing::warn!(
                "BOLTCCL_JOB_KEY is not set: connections are authenticated with an empty key; \
                 set the same secret on every rank (the launcher does this for you)"
            );
            Vec::new()
        }
    }
}

fn set_timeouts(s: &TcpStream, t: Duration) -> Result<()> {
    let t = Some(t.max(Duration::from_millis(1)));
    s.set_read_timeout(t).and_then(|_| s.set_write_timeout(t)).map_err(|e| Error::local_io("socket setup", e))
}

fn remaining(deadline: Instant, what: &str) -> Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::Timeout { op: what.into(), rank: 0, after: Duration::ZERO });
    }
    Ok(left)
}

/// Dial `addr` until it answers or the deadline passes, then authenticate as client.
fn dial(addr: SocketAddr, key: &[u8], deadline: Instant, who: &str) -> Result<TcpStream> {
    let mut wait = Duration::from_millis(10);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::InitTimeout(format!(
                "could not reach {who} at {addr} after {attempts} attempts: is it running, and is the \
                 address right and reachable from this host?"
            )));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))) {
            Ok(mut s) => {
                set_timeouts(&s, left.min(HANDSHAKE_TIMEOUT))?;
                s.set_nodelay(true).ok();
                auth::client(&mut s, key)?;
                return Ok(s);
            }
            Err(e) => {
                tracing::debug!(%addr, attempts, error = %e, "dial failed, retrying");
                std::thread::sleep(wait.min(left));
                wait = (wait * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// Connections that authenticated and passed vetting; on failure, the error and those that did.
type Vetted<T> = std::result::Result<Vec<(TcpStream, T)>, (Error, Vec<(TcpStream, T)>)>;

/// Rejections named in the error when the group does not form in time (the rest are counted).
const REJECTIONS_NAMED: usize = 3;

/// Accept connections until `want` of them have authenticated and passed `vet`, or the deadline.
/// Each candidate is vetted on its own thread, so a silent or hostile client cannot hold up
/// the others. At the deadline the error says how many connected and why the connections that
/// were turned away were (a wrong key, a malformed message ...), naming their addresses.
fn accept_vetted<T: Send + 'static>(
    listener: &TcpListener,
    key: &[u8],
    deadline: Instant,
    want: usize,
    what: &str,
    vet: impl Fn(&mut TcpStream) -> Result<T> + Send + Sync + 'static,
) -> Vetted<T> {
    let (tx, rx) = unbounded();
    let vet = Arc::new(vet);
    let key: Arc<[u8]> = key.into();
    let pending = Arc::new(AtomicUsize::new(0));
    let rejected: Arc<parking_lot::Mutex<(usize, Vec<String>)>> = Arc::default();
    let mut got = Vec::with_capacity(want);
    if let Err(e) = listener.set_nonblocking(true) {
        return Err((Error::local_io("listen", e), got));
    }
    while got.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let (n, named) = &*rejected.lock();
            let why = match n {
                0 => String::new(),
                _ if *n > named.len() => format!("; {n} connections were rejected, among them: {}", named.join("; ")),
                _ => format!("; rejected: {}", named.join("; ")),
            };
            let e = Error::InitTimeout(format!(
                "{what}: only {} of the {want} expected connections arrived{why}",
                got.len()
            ));
            return Err((e, got));
        }
        match listener.accept() {
            Ok((mut s, from)) => {
                if pending.load(Ordering::SeqCst) >= MAX_PENDING {
                    tracing::warn!(%from, "too many connections being vetted; dropping one");
                    continue;
                }
                s.set_nonblocking(false).ok();
                if let Err(e) = set_timeouts(&s, left.min(HANDSHAKE_TIMEOUT)) {
                    return Err((e, got));
                }
                let (tx, vet, key, pending) = (tx.clone(), vet.clone(), key.clone(), pending.clone());
                let rejected = rejected.clone();
                pending.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let r = auth::server(&mut s, &key).and_then(|_| vet(&mut s));
                    pending.fetch_sub(1, Ordering::SeqCst);
                    match r {
                        Ok(v) => {
                            let _ = tx.send((s, v));
                        }
                        Err(e) => {
                            tracing::warn!(%from, "rejected a connection: {e}");
                            let mut r = rejected.lock();
                            r.0 += 1;
                            if r.1.len() < REJECTIONS_NAMED {
                                r.1.push(format!("{from} ({e})"));
                            }
                        }
                    }
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => match rx.recv_timeout(Duration::from_millis(2)) {
                Ok(v) => got.push(v),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => unreachable!("we hold a sender"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => tracing::warn!("accept failed: {e}"),
        }
        while got.len() < want {
            match rx.try_recv() {
                Ok(v) => got.push(v),
                Err(_) => break,
            }
        }
    }
    Ok(got)
}

fn bind_listener(addr: SocketAddr, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                "the port is in use: set BOLTCCL_COORDINATOR=ip:port to a free port, or wait for the old job to exit"
            }
            std::io::ErrorKind::AddrNotAvailable => "that address does not belong to this host",
            _ => "check the address",
        };
        Error::Config(format!("cannot listen for {what} on {addr}: {e} ({hint})"))
    })
}

/// The address this rank's data listener binds to: `BOLTCCL_BIND`, else this rank's hostfile
/// host, else the address that reaches the coordinator; always on a port the OS picks. A
/// hostfile's ports are never bound: MLX's ring backend listens on them (and the coordinator
/// may be derived next to them), so taking one could collide with either.
fn data_bind_addr(cfg: &Config, toward_coordinator: Option<IpAddr>) -> Result<SocketAddr> {
    if let Some(ip) = cfg.bind {
        return Ok(SocketAddr::new(ip, 0));
    }
    if let Some(hosts) = &cfg.hosts {
        let (host, _) = crate::config::launchers::split_host_port(&hosts[cfg.rank][0]);
        let resolved = (host.as_str(), 0)
            .to_socket_addrs()
            .map_err(|e| Error::Config(format!("rank {}'s hostfile address {host} does not resolve: {e}", cfg.rank)))?;
        if let Some(a) = resolved.into_iter().next() {
            return Ok(SocketAddr::new(a.ip(), 0));
        }
    }
    let ip = toward_coordinator.ok_or_else(|| Error::Internal("no local address known".into()))?;
    Ok(SocketAddr::new(ip, 0))
}

/// A formed group: authenticated connections, ready for the transports.
pub(crate) struct Rendezvous {
    /// `links[peer][stream]`: the data connections (`BOLTCCL_TCP_STREAMS` per peer; none to
    /// this rank).
    pub links: Vec<Vec<TcpStream>>,
    /// `control[peer]`: the control connection to every other rank (none to this rank).
    pub control: Vec<Option<TcpStream>>,
    /// Every rank, in rank order.
    pub peers: Vec<PeerInfo>,
    /// Identifies the job (the same on every rank).
    pub job: u64,
}

/// Form the group described by `cfg` over TCP. `links` names the links this rank will use
/// (agreed like every setting); `shm` is where it takes shared-memory links, if it offers them.
/// Blocks until done or the init deadline passes.
pub(crate) fn connect(cfg: &Config, links: &str, shm: Option<&str>) -> Result<Rendezvous> {
    let deadline = Instant::now() + cfg.init_timeout;
    let key = key_of(cfg);
    let coord = cfg.coordinator_addr()?;
    let (rank, size) = (cfg.rank, cfg.world_size);

    // Step 1-2: reach the coordinator, bind the data listener, say hello.
    let (coord_listener, mut to_coord, local_ip) = if rank == 0 {
        // The coordinator binds exactly the coordinator address; when the mesh is also
        // described by a hostfile, rank 0's data listener uses its own port.
        let l = bind_listener(coord, "the coordinator (BOLTCCL_COORDINATOR)")?;
        (Some(l), None, coord.ip())
    } else {
        let s = dial(coord, &key, deadline, "the coordinator (rank 0)")?;
        let ip = s.local_addr().map_err(|e| Error::io(0, "local address", e))?.ip();
        (None, Some(s), ip)
    };
    let data_listener = bind_listener(data_bind_addr(cfg, Some(local_ip))?, "peer connections")?;
    let data_addr = data_listener.local_addr().map_err(|e| Error::io(rank, "local address", e))?;
    let hello = Hello {
        rank,
        world_size: size,
        version: crate::wire::VERSION.to_string(),
        settings: cfg.agreed_settings(links),
        peer: PeerInfo::here(data_addr, shm.map(String::from)),
    };
    tracing::debug!(rank, %data_addr, "bootstrap: hello");

    // Step 3: the coordinator gathers and checks; everyone learns the table.
    let (job, peers, control) = match (coord_listener, to_coord.as_mut()) {
        (Some(l), _) => coordinate(&l, &key, deadline, hello)?,
        (None, Some(s)) => {
            auth::send(s, &hello)?;
            set_timeouts(s, remaining(deadline, "waiting for the coordinator")?)?;
            let (job, peers) = table(auth::recv::<Reply>(s)?, size)?;
            (job, peers, Vec::new())
        }
        (None, None) => unreachable!("either coordinator or client"),
    };

    // Step 4: the data mesh, and the control connections between ranks other than 0 (stream
    // `streams` of a pair). Accept from higher ranks on a helper thread while dialling lower.
    let streams = cfg.tcp_streams;
    let want = (size - 1 - rank) * pair_streams(streams, rank);
    let key_for_accept = key.clone();
    let acceptor = std::thread::spawn(move || {
        accept_vetted(&data_listener, &key_for_accept, deadline, want, "connecting the data mesh", move |s| {
            vet_join(auth::recv(s)?, job, rank, size, streams)
        })
        .map_err(|(e, _)| e)
    });
    // `slots[peer][stream]`, the control connection last.
    let mut slots: Vec<Vec<Option<TcpStream>>> = (0..size).map(|_| (0..=streams).map(|_| None).collect()).collect();
    for (peer, (info, pair)) in peers.iter().zip(slots.iter_mut()).enumerate().take(rank) {
        for (stream, slot) in pair.iter_mut().enumerate().take(pair_streams(streams, peer)) {
            let mut s = dial(info.data_addr, &key, deadline, &format!("rank {peer}"))?;
            auth::send(&mut s, &Join { job, rank, stream })?;
            *slot = Some(s);
        }
    }
    let accepted = acceptor.join().map_err(|_| Error::Internal("acceptor thread panicked".into()))??;
    for (s, j) in accepted {
        if slots[j.rank][j.stream].replace(s).is_some() {
            return Err(Error::Protocol { from: format!("rank {}", j.rank), detail: "duplicate connection".into() });
        }
    }
    let control: Vec<Option<TcpStream>> = if rank == 0 {
        control
    } else {
        (0..size).map(|peer| if peer == 0 { to_coord.take() } else { slots[peer][streams].take() }).collect()
    };
    let links: Vec<Vec<TcpStream>> =
        slots.into_iter().map(|l| l.into_iter().take(streams).flatten().collect()).collect();
    Ok(Rendezvous { links, control, peers, job })
}

/// What a rank makes of the coordinator's reply: the job id and every rank's address, or the
/// rejection (naming the rank and the setting that differ) as this rank's error.
fn table(reply: Reply, size: usize) -> Result<(u64, Vec<PeerInfo>)> {
    match reply {
        Reply::Table { job, peers } if peers.len() == size => Ok((job, peers)),
        Reply::Table { peers, .. } => Err(Error::Protocol {
            from: "the coordinator".into(),
            detail: format!("table of {} ranks for a world of {size}", peers.len()),
        }),
        Reply::Reject { rank: Some(r), what, .. } => Err(Error::Mismatch { rank: r, what }),
        Reply::Reject { rank: None, what, timed_out: true } => Err(Error::InitTimeout(what)),
        Reply::Reject { rank: None, what, timed_out: false } => Err(Error::Config(what)),
    }
}

/// The connections between rank `lower` and each higher rank: `streams` data streams, and a
/// control connection unless `lower` is rank 0 (whose control connections are the
/// coordinator's).
fn pair_streams(streams: usize, lower: usize) -> usize {
    streams + usize::from(lower != 0)
}

/// Whether a connection's `Join` belongs here: this job, a higher rank of this world (lower
/// ranks are dialled, not accepted), one of its data streams or, unless this is rank 0 (whose
/// control connections are the coordinator's), the pair's control stream.
fn vet_join(j: Join, job: u64, rank: usize, size: usize, streams: usize) -> Result<Join> {
    if j.job != job || j.rank <= rank || j.rank >= size || j.stream >= pair_streams(streams, rank) {
        return Err(Error::Protocol {
            from: format!("rank {}", j.rank),
            detail: "connection for another job or slot".into(),
        });
    }
    Ok(j)
}

/// Rank 0's side of step 3. Returns the job id, the table and the control connections.
fn coordinate(
    listener: &TcpListener,
    key: &[u8],
    deadline: Instant,
    mine: Hello,
) -> Result<(u64, Vec<PeerInfo>, Vec<Option<TcpStream>>)> {
    let size = mine.world_size;
    let hellos =
        match accept_vetted(listener, key, deadline, size - 1, "waiting for ranks to join", auth::recv::<Hello>) {
            Ok(h) => h,
            Err((e, joined)) => {
                // Name the ranks that never joined; the ranks that did learn why the group did
                // not form, instead of a closed connection.
                let e = match e {
                    Error::InitTimeout(w) => {
                        let missing: Vec<String> = (1..size)
                            .filter(|r| !joined.iter().any(|(_, h)| h.rank == *r))
                            .map(|r| r.to_string())
                            .collect();
                        Error::InitTimeout(format!("{w}; never joined: rank {}", missing.join(", rank ")))
                    }
                    other => other,
                };
                let (what, timed_out) = match &e {
                    Error::InitTimeout(w) => (format!("rank 0 (the coordinator) gave up {w}"), true),
                    other => (format!("rank 0 (the coordinator) failed: {other}"), false),
                };
                for (mut s, _) in joined {
                    let _ = auth::send(&mut s, &Reply::Reject { rank: None, what: what.clone(), timed_out });
                }
                return Err(e);
            }
        };
    let mut slots: Vec<Option<(Option<TcpStream>, Hello)>> = (0..size).map(|_| None).collect();
    let mut problem: Option<(Option<usize>, String)> = None;
    let reference = (mine.version.clone(), mine.settings.clone());
    slots[0] = Some((None, mine));
    for (s, h) in hellos {
        let r = h.rank;
        if problem.is_none() {
            problem = check_hello(&h, &reference, size, &slots);
        }
        if r < size && slots[r].is_none() {
            slots[r] = Some((Some(s), h));
        } else {
            let mut s = s;
            let _ = auth::send(
                &mut s,
                &Reply::Reject {
                    rank: None,
                    what: format!("rank {r} joined twice or is out of range"),
                    timed_out: false,
                },
            );
        }
    }
    let mut conns: Vec<Option<TcpStream>> = Vec::with_capacity(size);
    let mut peers = Vec::with_capacity(size);
    for slot in slots {
        let (s, h) = slot.ok_or_else(|| Error::Internal("missing rank after gather".into()))?;
        conns.push(s);
        peers.push(h.peer);
    }
    if let Some((rank, what)) = problem {
        for s in conns.iter_mut().flatten() {
            let _ = auth::send(s, &Reply::Reject { rank, what: what.clone(), timed_out: false });
        }
        return Err(match rank {
            Some(rank) => Error::Mismatch { rank, what },
            None => Error::Config(what),
        });
    }
    let mut job = [0u8; 8];
    getrandom::getrandom(&mut job).expect("the OS random source works");
    let job = u64::from_le_bytes(job);
    for s in conns.iter_mut().flatten() {
        auth::send(s, &Reply::Table { job, peers: peers.clone() })?;
    }
    Ok((job, peers, conns))
}

type Slots = [Option<(Option<TcpStream>, Hello)>];

fn check_hello(
    h: &Hello,
    (version, settings): &(String, Vec<(String, String)>),
    size: usize,
    slots: &Slots,
) -> Option<(Option<usize>, String)> {
    let r = h.rank;
    if r >= size {
        return Some((
            None,
            format!("a rank joined as rank {r}, out of range for world size {size}: check BOLTCCL_RANK"),
        ));
    }
    if slots[r].is_some() {
        return Some((None, format!("two processes joined as rank {r}: check BOLTCCL_RANK on every node")));
    }
    if &h.version != version {
        return Some((
            Some(r),
            format!(
                "rank {r} runs boltccl {} but rank 0 runs {version}: install the same version everywhere",
                h.version
            ),
        ));
    }
    for ((name, theirs), (_, ours)) in h.settings.iter().zip(settings) {
        if theirs != ours {
            return Some((
                Some(r),
                format!("rank {r} has {name}={theirs} but rank 0 has {name}={ours}: set the same value on every rank"),
            ));
        }
    }
    if h.settings.len() != settings.len() {
        return Some((Some(r), format!("rank {r} sent {} settings, rank 0 has {}", h.settings.len(), settings.len())));
    }
    None
}

/// The bootstrap's messages and decisions without sockets, for the fuzz harnesses and the
/// hostile-peer tests (through `crate::fuzz`): valid messages to start from, and what a rank
/// makes of any bytes it is sent.
#[cfg(feature = "testing")]
pub(crate) mod sans_io {
    use super::*;

    /// A valid `Hello` body.
    pub fn hello(rank: usize, world_size: usize, settings: Vec<(String, String)>, data_addr: SocketAddr) -> Vec<u8> {
        let h = Hello { rank, world_size, version: crate::wire::VERSION.into(), settings, peer: peer(data_addr) };
        serde_json::to_vec(&h).expect("a Hello encodes")
    }

    /// A rank of no known host or CPUs.
    fn peer(data_addr: SocketAddr) -> PeerInfo {
        PeerInfo { data_addr, host: "fuzz".into(), host_id: "fuzz".into(), shm: None, cpus: Vec::new(), parallelism: 0 }
    }

    /// A valid `Table` reply body.
    pub fn table_reply(job: u64, addrs: &[SocketAddr]) -> Vec<u8> {
        let peers = addrs.iter().map(|&data_addr| peer(data_addr)).collect();
        serde_json::to_vec(&Reply::Table { job, peers }).expect("a Table encodes")
    }

    /// A valid `Reject` reply body.
    pub fn reject_reply(rank: Option<usize>, what: &str) -> Vec<u8> {
        serde_json::to_vec(&Reply::Reject { rank, what: what.into(), timed_out: false }).expect("a Reject encodes")
    }

    /// A valid `Join` body.
    pub fn join(job: u64, rank: usize, stream: usize) -> Vec<u8> {
        serde_json::to_vec(&Join { job, rank, stream }).expect("a Join encodes")
    }

    /// What rank 0 makes of a `Hello` body from a world of `size` whose rank 0 has `settings`
    /// (ranks `taken` already joined): the rank it joins as, or why it is refused.
    pub fn vet_hello(body: &[u8], size: usize, settings: &[(String, String)], taken: &[usize]) -> Result<usize> {
        let h: Hello = auth::decode("fuzz", body)?;
        let mut slots: Vec<Option<(Option<TcpStream>, Hello)>> = (0..size).map(|_| None).collect();
        for &t in taken.iter().filter(|&&t| t < size) {
            slots[t] = Some((None, Hello { rank: t, ..h.clone() }));
        }
        let reference = (crate::wire::VERSION.to_string(), settings.to_vec());
        match check_hello(&h, &reference, size, &slots) {
            Some((rank, what)) => Err(match rank {
                Some(rank) => Error::Mismatch { rank, what },
                None => Error::Config(what),
            }),
            None => Ok(h.rank),
        }
    }

    /// What a rank of a world of `size` makes of the coordinator's reply body: the job id and
    /// the ranks' data addresses.
    pub fn vet_reply(body: &[u8], size: usize) -> Result<(u64, Vec<SocketAddr>)> {
        let (job, peers) = table(auth::decode("the coordinator", body)?, size)?;
        Ok((job, peers.into_iter().map(|p| p.data_addr).collect()))
    }

    /// What rank `rank` of a world of `size` with `streams` streams per peer makes of a `Join`
    /// body for job `job`: the (rank, stream) slot it fills.
    pub fn vet_join(body: &[u8], job: u64, rank: usize, size: usize, streams: usize) -> Result<(usize, usize)> {
        let j = super::vet_join(auth::decode("fuzz", body)?, job, rank, size, streams)?;
        Ok((j.rank, j.stream))
    }
}
