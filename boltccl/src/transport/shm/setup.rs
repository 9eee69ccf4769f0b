//! Shared-memory links between rank processes on one host.
//!
//! Before the group forms, each rank that offers shared memory listens on an abstract unix
//! socket with a random name (no file: it vanishes with the process; abstract sockets are per
//! network namespace) and announces the name in its bootstrap hello, with its host identity.
//! Ranks whose identities match then connect (the higher rank dials the lower), prove the job
//! key over the socket (the same HMAC handshake as TCP: a process of another job cannot
//! attach), and pass each other their inbox — a memory file and a doorbell — as file
//! descriptors. The sockets stay open: their end of file says a peer process died.

use super::ring::{can_pull, slot, Inbox, PeerInbox, Pulls, RingPair};
use super::ShmChannel;
use crate::auth;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::host::{local_peers, PeerInfo};
use crate::transport::links::Links;
use crate::transport::Transport;
use crate::wire::shm::{Hello, HELLO_LEN};
use rustix::fd::{AsFd, OwnedFd};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a connecting peer may take to prove the key and pass its inbox.
const HANDSHAKE: Duration = Duration::from_secs(5);

/// A rank's offer of shared memory: its listening socket, bound before the group forms.
pub(crate) struct Offer {
    listener: UnixListener,
    name: String,
}

impl Offer {
    /// Listen on a fresh abstract unix socket.
    pub(crate) fn bind() -> Result<Offer> {
        let name = socket_name();
        let addr =
            SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| Error::local_io("shared-memory set-up", e))?;
        let listener = UnixListener::bind_addr(&addr).map_err(|e| Error::local_io("shared-memory set-up", e))?;
        Ok(Offer { listener, name })
    }

    /// The name peers connect to.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

/// A random name for a rank's set-up socket.
fn socket_name() -> String {
    let mut b = [0u8; 16];
    getrandom::getrandom(&mut b).expect("the OS random source works");
    format!("boltccl-{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>())
}

/// Connect `mesh`'s ranks on this host with shared memory, moving those pairs off TCP.
pub(crate) fn attach(mesh: &mut Links, offer: Offer, peers: &[PeerInfo], job: u64, cfg: &Config) -> Result<()> {
    let rank = cfg.rank;
    let local = local_peers(peers, rank);
    if local.is_empty() {
        return Ok(());
    }
    let deadline = Instant::now() + cfg.init_timeout;
    let mut group = local.clone();
    group.push(rank);
    group.sort_unstable();
    let key = cfg.job_key.as_deref().unwrap_or("").as_bytes().to_vec();
    let failed = |e: Error, mesh: &mut Links| {
        mesh.abort(&e);
        e
    };
    let setup = || -> Result<ShmChannel> {
        let inbox = Arc::new(
            Inbox::create(rank, local.len(), cfg.shm_ring_bytes)
                .map_err(|e| Error::io(rank, "creating shared memory", e))?,
        );
        let mut sockets: Vec<Option<UnixStream>> = (0..peers.len()).map(|_| None).collect();
        let mut theirs: Vec<Option<PeerInbox>> = (0..peers.len()).map(|_| None).collect();
        let mut hellos: Vec<Option<Hello>> = (0..peers.len()).map(|_| None).collect();
        // A word of our memory the peers read to check they can pull from this process.
        let probe = Box::new(job.to_le_bytes());
        let hello = Hello { job, rank: rank as u32, pid: std::process::id(), probe: probe.as_ptr() as u64 };
        // Dial the lower ranks, then take the higher ones' calls.
        for &q in local.iter().filter(|&&q| q < rank) {
            let name = peers[q].shm.as_deref().expect("local peers offer shared memory");
            let mut s = dial(name, deadline).map_err(|e| Error::io(q, "connecting shared memory", e))?;
            auth::client_over(&mut s, format!("rank {q} (shared memory)"), &key)?;
            send_inbox(&s, &inbox, hello).map_err(|e| Error::io(q, "passing shared memory", e))?;
            let (got, files) = recv_inbox(&s).map_err(|e| Error::io(q, "receiving shared memory", e))?;
            got.check(job, q)?;
            theirs[q] = Some(open(files, q, &local, cfg)?);
            hellos[q] = Some(got);
            sockets[q] = Some(s);
        }
        // Take the higher ranks' calls. Anything else that connects (it can see the socket's
        // name in /proc/net/unix) is logged and dropped: it cannot prove the key.
        let mut higher = local.iter().filter(|&&q| q > rank).count();
        while higher > 0 {
            let s = accept(&offer.listener, deadline).map_err(|e| Error::io(rank, "shared-memory set-up", e))?;
            match vet(s, &key, job, rank, &local, &theirs) {
                Ok((got, s, files)) => {
                    let q = got.rank as usize;
                    theirs[q] = Some(open(files, q, &local, cfg)?);
                    hellos[q] = Some(got);
                    send_inbox(&s, &inbox, hello).map_err(|e| Error::io(q, "passing shared memory", e))?;
                    sockets[q] = Some(s);
                    higher -= 1;
                }
                Err(e) => tracing::warn!("rejected a shared-memory connection: {e}"),
            }
        }
        let pulls = agree_on_pulls(&local, &hellos, &sockets, job, cfg.shm_pull_bytes)?;
        drop(probe);
        let mut pairs: Vec<Option<RingPair>> = (0..peers.len()).map(|_| None).collect();
        for &q in &local {
            let into = theirs[q].take().expect("every local peer passed its inbox");
            let pair = RingPair::new(q, inbox.clone(), slot(&group, rank, q), into, slot(&group, q, rank))
                .map_err(|e| Error::Protocol { from: format!("rank {q}"), detail: e.to_string() })?;
            pairs[q] = Some(pair.with_pulls(pulls[q]));
        }
        for s in sockets.iter().flatten() {
            s.set_nonblocking(true).map_err(|e| Error::io(rank, "shared-memory set-up", e))?;
        }
        Ok(ShmChannel::new(inbox, pairs, sockets))
    };
    let channel = setup().map_err(|e| failed(e, mesh))?;
    tracing::info!(rank, ?local, ring = cfg.shm_ring_bytes, "shared-memory links ready");
    mesh.attach(Box::new(channel), &local, None);
    Ok(())
}

/// Which pulls each pair makes: this rank tries to read each peer's probe word, and the two
/// tell each other what worked (a pull needs both ends to agree).
fn agree_on_pulls(
    local: &[usize],
    hellos: &[Option<Hello>],
    sockets: &[Option<UnixStream>],
    job: u64,
    min: usize,
) -> Result<Vec<Pulls>> {
    let mut pulls = vec![Pulls { min, ..Pulls::default() }; hellos.len()];
    for &q in local {
        let h = hellos[q].expect("every local peer said hello");
        let ok = can_pull(h.pid as i32, h.probe as usize, &job.to_le_bytes());
        pulls[q].from_peer = ok.then_some(h.pid as i32);
        let mut s = sockets[q].as_ref().expect("every local peer has a socket");
        s.write_all(&[ok as u8]).map_err(|e| Error::io(q, "shared-memory set-up", e))?;
    }
    for &q in local {
        let mut s = sockets[q].as_ref().expect("every local peer has a socket");
        let mut b = [0u8];
        s.read_exact(&mut b).map_err(|e| Error::io(q, "shared-memory set-up", e))?;
        pulls[q].by_peer = b[0] == 1;
    }
    if local.iter().any(|&q| pulls[q].from_peer.is_none() || !pulls[q].by_peer) {
        tracing::info!("some local ranks cannot read each other's memory (ptrace policy or containers): their large messages are copied twice");
    }
    Ok(pulls)
}

/// An incoming set-up connection: it must prove the key and be a higher local rank that has
/// not connected yet. Returns its hello, the socket and its inbox's files.
fn vet(
    mut s: UnixStream,
    key: &[u8],
    job: u64,
    rank: usize,
    local: &[usize],
    seen: &[Option<PeerInbox>],
) -> Result<(Hello, UnixStream, [OwnedFd; 2])> {
    auth::server_over(&mut s, "a local process (shared memory)".into(), key)?;
    let (got, files) = recv_inbox(&s).map_err(|e| Error::io(rank, "receiving shared memory", e))?;
    let q = got.rank as usize;
    got.check(job, q)?;
    if q <= rank || !local.contains(&q) || seen[q].is_some() {
        return Err(Error::Protocol {
            from: format!("rank {q}"),
            detail: "a shared-memory connection from a rank that should not make one".into(),
        });
    }
    Ok((got, s, files))
}

fn open(files: [OwnedFd; 2], q: usize, local: &[usize], cfg: &Config) -> Result<PeerInbox> {
    let [seg, bell] = files;
    PeerInbox::open(seg, bell, q, local.len(), cfg.shm_ring_bytes)
        .map_err(|e| Error::Protocol { from: format!("rank {q}"), detail: e.to_string() })
}

fn dial(name: &str, deadline: Instant) -> std::io::Result<UnixStream> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    let s = UnixStream::connect_addr(&addr)?;
    let t = Some(deadline.saturating_duration_since(Instant::now()).clamp(Duration::from_millis(1), HANDSHAKE));
    s.set_read_timeout(t)?;
    s.set_write_timeout(t)?;
    Ok(s)
}

fn accept(listener: &UnixListener, deadline: Instant) -> std::io::Result<UnixStream> {
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(HANDSHAKE))?;
                s.set_write_timeout(Some(HANDSHAKE))?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "a local rank did not connect its shared memory before BOLTCCL_INIT_TIMEOUT_MS",
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

/// Send our hello and inbox (its memory file and doorbell) in one message.
fn send_inbox(s: &UnixStream, inbox: &Inbox, h: Hello) -> std::io::Result<()> {
    let msg = h.encode();
    let files = inbox.files();
    let mut space = [0u8; rustix::cmsg_space!(ScmRights(2))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !cmsg.push(SendAncillaryMessage::ScmRights(&files)) {
        return Err(std::io::Error::other("no room for two file descriptors"));
    }
    let n = rustix::net::sendmsg(s.as_fd(), &[IoSlice::new(&msg)], &mut cmsg, SendFlags::NOSIGNAL)?;
    if n != msg.len() {
        return Err(std::io::Error::other("short shared-memory hello"));
    }
    Ok(())
}

/// Receive a peer's hello and inbox files.
fn recv_inbox(s: &UnixStream) -> std::io::Result<(Hello, [OwnedFd; 2])> {
    let mut msg = [0u8; HELLO_LEN];
    let mut space = [0u8; rustix::cmsg_space!(ScmRights(2))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(s.as_fd(), &mut [IoSliceMut::new(&mut msg)], &mut cmsg, RecvFlags::CMSG_CLOEXEC)?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if r.bytes != msg.len() || fds.len() != 2 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a malformed shared-memory hello"));
    }
    let h = Hello::decode(&msg);
    let bell = fds.pop().expect("two fds");
    let seg = fds.pop().expect("two fds");
    Ok((h, [seg, bell]))
}
