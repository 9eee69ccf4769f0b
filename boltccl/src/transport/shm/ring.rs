//! A byte stream in shared memory: one single-producer single-consumer ring per direction of
//! a pair, in the receiving rank's segment.
//!
//! The writer copies bytes in and publishes its `tail` (release); the reader copies them out
//! and publishes its `head` (release); each loads the other's counter with acquire before
//! touching the bytes it guards (the writer only when the room it last saw is not enough: an
//! old head understates the room, and the line the reader writes on every read then stays
//! on the reader's core). Each side keeps its own counter privately, so a peer that
//! scribbles over the shared ones can make the stream fail (a counter that makes no sense is
//! an error) but can never make this rank read or write outside the ring.
//!
//! Waking: a rank about to sleep sets the `sleeping` word of its segment, looks once more, and
//! sleeps on its doorbell (an eventfd); whoever moves bytes for a sleeping rank rings it. A
//! sequentially consistent fence on both sides means one of them always sees the other.
//!
//! Large payloads go in one copy instead of two (Linux, where the peer may read this process's
//! memory: checked at set-up): the writer puts a descriptor of its buffer in the ring, the
//! reader copies straight from the writer's memory with `process_vm_readv` and counts the pull
//! done; only then does the writer's send complete, so its buffer is never read after the call
//! returns. A writer whose call fails withdraws the descriptor before returning, and a reader
//! that finds its pull withdrawn after copying fails instead of keeping bytes that may have
//! changed under it.

use super::segment::Segment;
use crate::transport::stream::WholeFrames;
use crate::wire::HEADER_LEN;
use rustix::fd::{AsFd, OwnedFd};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Identifies a segment laid out by this module.
const MAGIC: u64 = 0xB01C_C15A_5E61_0001;
/// Bytes of the segment header, and the alignment of every ring.
const HEADER: usize = 64;
/// Bytes of a ring's counters (each on its own cache line).
const CONTROL: usize = 256;
/// Marks a pull descriptor in the ring.
const PULL_MAGIC: u64 = 0xB01C_C150_9017_0001;
/// Bytes of a pull descriptor: magic, sequence number, address, length.
const PULL_LEN: usize = 32;

/// A segment's header: who owns it, how it is laid out, and the owner's wake-up word.
#[repr(C)]
struct SegmentHeader {
    magic: u64,
    owner: u64,
    rings: u64,
    capacity: u64,
    /// Nonzero while the owner sleeps (or is about to) on its doorbell.
    sleeping: AtomicU32,
    /// Nonzero once the owner has left the group.
    departed: AtomicU32,
}

/// A ring's counters.
#[repr(C)]
struct RingControl {
    /// Bytes ever written (by the writer).
    tail: AtomicU64,
    _pad: [u8; 56],
    /// Bytes ever read (by the reader).
    head: AtomicU64,
    _pad2: [u8; 56],
    /// Pulls completed (by the reader).
    pulled: AtomicU64,
    _pad3: [u8; 56],
    /// The last pull the writer withdrew (by the writer).
    withdrawn: AtomicU64,
    _pad4: [u8; 56],
}

const _: () = assert!(std::mem::size_of::<SegmentHeader>() <= HEADER);
const _: () = assert!(std::mem::size_of::<RingControl>() == CONTROL);

/// Bytes a segment with `rings` rings of `capacity` bytes needs.
pub(crate) fn segment_len(rings: usize, capacity: usize) -> usize {
    HEADER + rings * (CONTROL + capacity)
}

/// A rank's doorbell: an eventfd on Linux, a pipe elsewhere. Peers hold the end that rings.
struct Bell {
    /// Readable while the bell rings.
    wait: Arc<OwnedFd>,
    /// Written to ring it.
    ring: Arc<OwnedFd>,
}

impl Bell {
    #[cfg(target_os = "linux")]
    fn new() -> io::Result<Bell> {
        use rustix::event::{eventfd, EventfdFlags};
        let fd = Arc::new(eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?);
        Ok(Bell { wait: fd.clone(), ring: fd })
    }

    #[cfg(not(target_os = "linux"))]
    fn new() -> io::Result<Bell> {
        let (r, w) = rustix::pipe::pipe()?;
        for fd in [&r, &w] {
            rustix::io::ioctl_fionbio(fd, true)?;
            rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC)?;
        }
        Ok(Bell { wait: Arc::new(r), ring: Arc::new(w) })
    }
}

/// Ring a doorbell through its ringing end.
fn ring(fd: &OwnedFd) {
    // A full counter or pipe (never, in practice) or an error just means the bell already rings.
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// A rank's inbox: its segment (one ring per local peer) and its doorbell.
pub(crate) struct Inbox {
    seg: Arc<Segment>,
    bell: Bell,
}

/// A peer's inbox, as seen by a rank that writes into it.
#[derive(Clone)]
pub(crate) struct PeerInbox {
    seg: Arc<Segment>,
    /// The ringing end of its doorbell.
    bell: Arc<OwnedFd>,
}

fn header(seg: &Segment) -> &SegmentHeader {
    // SAFETY: every segment is at least HEADER bytes (checked when opened) and page-aligned;
    // the header's fields are plain integers and atomics, valid for any bit pattern.
    unsafe { &*(seg.as_ptr() as *const SegmentHeader) }
}

impl Inbox {
    /// A new inbox for rank `owner` with `rings` rings of `capacity` bytes (a multiple of 64).
    pub(crate) fn create(owner: usize, rings: usize, capacity: usize) -> io::Result<Inbox> {
        debug_assert!(capacity % 64 == 0 && capacity > 0);
        let seg = Segment::create(segment_len(rings, capacity))?;
        let bell = Bell::new()?;
        let h = seg.as_ptr() as *mut SegmentHeader;
        // SAFETY: a fresh zeroed mapping of at least HEADER bytes that no one else has yet.
        unsafe {
            (*h).owner = owner as u64;
            (*h).rings = rings as u64;
            (*h).capacity = capacity as u64;
            (*h).magic = MAGIC;
        }
        Ok(Inbox { seg: Arc::new(seg), bell })
    }

    /// This inbox as its peers in the same process see it.
    pub(crate) fn as_peer(&self) -> PeerInbox {
        PeerInbox { seg: self.seg.clone(), bell: self.bell.ring.clone() }
    }

    // Sharing between processes: Linux only (see setup.rs).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    /// The files a peer needs to write into this inbox: the segment and the doorbell.
    pub(crate) fn files(&self) -> [rustix::fd::BorrowedFd<'_>; 2] {
        [self.seg.fd(), self.bell.ring.as_fd()]
    }

    /// The doorbell this rank sleeps on.
    pub(crate) fn bell(&self) -> rustix::fd::BorrowedFd<'_> {
        self.bell.wait.as_fd()
    }

    /// The ring that rank's `slot`-th local peer writes into.
    fn ring(&self, slot: usize) -> io::Result<RingView> {
        RingView::of(&self.seg, slot)
    }

    /// Say that this rank is about to sleep (true) or awake (false).
    pub(crate) fn set_sleeping(&self, on: bool) {
        header(&self.seg).sleeping.store(on as u32, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Empty the doorbell after a wake-up.
    pub(crate) fn drain(&self) {
        let mut b = [0u8; 64];
        while matches!(rustix::io::read(&*self.bell.wait, &mut b), Ok(n) if n == b.len()) {}
    }

    /// Tell the peers this rank has left.
    pub(crate) fn depart(&self) {
        header(&self.seg).departed.store(1, Ordering::SeqCst);
    }
}

impl PeerInbox {
    // Sharing between processes: Linux only (see setup.rs).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    /// Map the inbox a peer passed us (segment and doorbell), checking its layout: it must
    /// belong to `owner` and have a ring of `capacity` bytes for each of its `rings` peers.
    pub(crate) fn open(
        seg: OwnedFd,
        bell: OwnedFd,
        owner: usize,
        rings: usize,
        capacity: usize,
    ) -> io::Result<PeerInbox> {
        let seg = Segment::open(seg)?;
        let bad = |what: &str| {
            Err(io::Error::new(io::ErrorKind::InvalidData, format!("rank {owner}'s shared memory: {what}")))
        };
        if seg.len() < segment_len(rings, capacity) {
            return bad("too small for its rings");
        }
        let h = header(&seg);
        if h.magic != MAGIC || h.owner != owner as u64 || h.rings != rings as u64 || h.capacity != capacity as u64 {
            return bad("laid out for another rank, peer count or ring size (BOLTCCL_SHM_RING_BYTES must agree)");
        }
        Ok(PeerInbox { seg: Arc::new(seg), bell: Arc::new(bell) })
    }

    /// The peer has left the group.
    pub(crate) fn departed(&self) -> bool {
        header(&self.seg).departed.load(Ordering::Acquire) != 0
    }

    /// Ring the peer's doorbell.
    pub(crate) fn wake(&self) {
        ring(&self.bell);
    }

    /// Wake the peer if it sleeps.
    fn nudge(&self) {
        fence(Ordering::SeqCst);
        if header(&self.seg).sleeping.load(Ordering::SeqCst) != 0 {
            self.wake();
        }
    }
}

/// Where one ring lives in a segment.
#[derive(Clone, Copy)]
struct RingView {
    control: *const RingControl,
    data: *mut u8,
    capacity: u64,
}

// SAFETY: the pointers are into a segment kept alive by whoever holds the view (an `Inbox` or
// a `PeerInbox`'s Arc), and are used only under the ring protocol.
unsafe impl Send for RingView {}

impl RingView {
    fn of(seg: &Segment, slot: usize) -> io::Result<RingView> {
        let h = header(seg);
        let (rings, capacity) = (h.rings as usize, h.capacity as usize);
        if slot >= rings || seg.len() < segment_len(rings, capacity) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "no such ring in the shared memory"));
        }
        let at = HEADER + slot * (CONTROL + capacity);
        // SAFETY: `at + CONTROL + capacity <= seg.len()` (checked above), so both pointers stay
        // inside the mapping; the control block is 64-aligned (HEADER, CONTROL and capacity are
        // multiples of 64).
        let (control, data) = unsafe { (seg.as_ptr().add(at) as *const RingControl, seg.as_ptr().add(at + CONTROL)) };
        Ok(RingView { control, data, capacity: capacity as u64 })
    }

    fn control(&self) -> &RingControl {
        // SAFETY: see `of`; atomics are valid for any bit pattern.
        unsafe { &*self.control }
    }

    /// Copy `src` into the ring at stream position `at` (wrapping).
    fn put(&self, at: u64, src: &[u8]) {
        let start = (at % self.capacity) as usize;
        let first = src.len().min(self.capacity as usize - start);
        // SAFETY: both copies stay inside the ring's `capacity` bytes (`start < capacity`,
        // `first <= capacity - start`, `src.len() - first <= start`); the reader does not touch
        // these bytes until the tail that covers them is published (release, after the copy).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.data.add(start), first);
            if first < src.len() {
                std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.data, src.len() - first);
            }
        }
    }

    /// Copy from the ring at stream position `at` (wrapping) into `dst`.
    fn take(&self, at: u64, dst: &mut [u8]) {
        let start = (at % self.capacity) as usize;
        let first = dst.len().min(self.capacity as usize - start);
        // SAFETY: as in `put`; the writer does not reuse these bytes until the head that frees
        // them is published (release, after the copy).
        unsafe {
            std::ptr::copy_nonoverlapping(self.data.add(start), dst.as_mut_ptr(), first);
            if first < dst.len() {
                std::ptr::copy_nonoverlapping(self.data, dst.as_mut_ptr().add(first), dst.len() - first);
            }
        }
    }
}

fn corrupt(peer: usize, what: &str, mine: u64, theirs: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the shared-memory ring with rank {peer} is corrupt ({what}: ours {mine}, theirs {theirs})"),
    )
}

/// Which pulls a pair makes: each side may read the other's memory, or not.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pulls {
    /// This rank reads large payloads from the peer's memory (the peer's process id).
    pub from_peer: Option<i32>,
    /// The peer reads large payloads from this rank's memory.
    pub by_peer: bool,
    /// Payloads at least this long go by a pull (`BOLTCCL_SHM_PULL_BYTES`, agreed); 0: none.
    pub min: usize,
}

impl Pulls {
    fn applies(&self, len: usize) -> bool {
        self.min > 0 && len >= self.min
    }
}

/// A send waiting for its payload to be pulled.
#[derive(Debug, Clone, Copy)]
struct Lent {
    seq: u64,
    addr: usize,
    len: usize,
}

/// This rank's end of a pair: it writes into the peer's inbox and reads from its own.
pub(crate) struct RingPair {
    peer: usize,
    out: RingView,
    into: PeerInbox,
    /// Bytes written (ours: the shared tail is only published).
    tail: u64,
    /// The reader's head as last loaded: loading it on every write would pull the line the
    /// reader just wrote across cores, so it is loaded again only when this says the ring
    /// is too full (an old head only ever understates the room).
    seen_head: u64,
    inp: RingView,
    /// Our inbox, kept mapped while this end reads from it.
    _own: Arc<Inbox>,
    /// Bytes read (ours: the shared head is only published).
    head: u64,
    pulls: Pulls,
    /// Pull descriptors sent, and the one whose pull is awaited.
    lent_seq: u64,
    lent: Option<Lent>,
    /// Pulls made from the peer.
    pulled: u64,
}

impl RingPair {
    /// The pair with `peer`: our ring in its inbox is `their_slot`, its ring in ours `our_slot`.
    pub(crate) fn new(
        peer: usize,
        own: Arc<Inbox>,
        our_slot: usize,
        into: PeerInbox,
        their_slot: usize,
    ) -> io::Result<RingPair> {
        let out = RingView::of(&into.seg, their_slot)?;
        let inp = own.ring(our_slot)?;
        Ok(RingPair {
            peer,
            out,
            into,
            tail: 0,
            seen_head: 0,
            inp,
            _own: own,
            head: 0,
            pulls: Pulls::default(),
            lent_seq: 0,
            lent: None,
            pulled: 0,
        })
    }

    /// Use pulls as `pulls` says (both ends must agree: set-up checks and tells).
    pub(crate) fn with_pulls(mut self, pulls: Pulls) -> RingPair {
        self.pulls = pulls;
        self
    }

    /// Bytes the writer may still put in (loads the reader's head).
    fn room(&self) -> io::Result<u64> {
        Ok(self.out.capacity - self.tail.wrapping_sub(self.head_now()?))
    }

    /// The reader's head, checked: at most a ring behind our tail and never past it.
    fn head_now(&self) -> io::Result<u64> {
        let head = self.out.control().head.load(Ordering::Acquire);
        if self.tail.wrapping_sub(head) > self.out.capacity {
            return Err(corrupt(self.peer, "their read position", self.tail, head));
        }
        Ok(head)
    }

    /// Bytes the writer may put in, looking at the reader's head again only when fewer than
    /// `want` are known to be free.
    fn room_for(&mut self, want: u64) -> io::Result<u64> {
        let room = |head: u64| self.out.capacity - self.tail.wrapping_sub(head);
        if room(self.seen_head) < want {
            self.seen_head = self.head_now()?;
        }
        Ok(room(self.seen_head))
    }

    /// Bytes waiting to be read (loads the writer's tail).
    fn waiting(&self) -> io::Result<u64> {
        let tail = self.inp.control().tail.load(Ordering::Acquire);
        let avail = tail.wrapping_sub(self.head);
        if avail > self.inp.capacity {
            return Err(corrupt(self.peer, "their write position", self.head, tail));
        }
        Ok(avail)
    }

    /// Something to read, or room to write (or a lent payload pulled): this end could
    /// progress now.
    pub(crate) fn ready(&self, read: bool) -> bool {
        if read {
            self.waiting().map_or(true, |n| n > 0)
        } else if let Some(l) = self.lent {
            self.out.control().pulled.load(Ordering::Acquire) >= l.seq
        } else {
            self.room().map_or(true, |n| n > 0)
        }
    }

    /// A send failed before the peer pulled what this rank lent it: take it back, so the
    /// peer discards whatever it copies (the caller may reuse the buffer once we return).
    pub(crate) fn withdraw(&mut self) {
        if let Some(l) = self.lent.take() {
            self.out.control().withdrawn.store(l.seq, Ordering::SeqCst);
            // Later stores to the buffer (by the caller, after we return) must not be seen
            // before this one.
            fence(Ordering::SeqCst);
        }
    }

    /// A shrink begins: whatever this end lent is withdrawn, and the peer may count every pull
    /// descriptor sent so far as done (see [`RingPair::skip_all`]).
    pub(crate) fn stop_writing(&mut self) {
        self.lent = None;
        self.out.control().withdrawn.store(self.lent_seq, Ordering::SeqCst);
    }

    /// A shrink's resync, once the peer has stopped writing (it voted): drop every byte it
    /// wrote so far, and the pulls it lent.
    pub(crate) fn skip_all(&mut self) {
        fence(Ordering::SeqCst);
        self.head = self.inp.control().tail.load(Ordering::Acquire);
        self.pulled = self.inp.control().withdrawn.load(Ordering::SeqCst).max(self.pulled);
        self.inp.control().pulled.store(self.pulled, Ordering::Release);
        self.inp.control().head.store(self.head, Ordering::Release);
        self.into.nudge();
    }

    /// Lend `payload` (the whole rest of a frame) to the peer: a descriptor now, the bytes
    /// counted written once the peer has pulled them.
    fn lend(&mut self, payload: &[u8]) -> io::Result<usize> {
        if let Some(l) = self.lent {
            if l.addr != payload.as_ptr() as usize || l.len != payload.len() {
                return Err(io::Error::other("a lent payload changed before it was pulled (a bug in boltccl)"));
            }
            if self.out.control().pulled.load(Ordering::Acquire) < l.seq {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.lent = None;
            return Ok(payload.len());
        }
        if self.room_for(PULL_LEN as u64)? < PULL_LEN as u64 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.lent_seq += 1;
        let l = Lent { seq: self.lent_seq, addr: payload.as_ptr() as usize, len: payload.len() };
        let mut d = [0u8; PULL_LEN];
        for (i, v) in [PULL_MAGIC, l.seq, l.addr as u64, l.len as u64].into_iter().enumerate() {
            d[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        self.out.put(self.tail, &d);
        self.tail += PULL_LEN as u64;
        self.out.control().tail.store(self.tail, Ordering::Release);
        self.lent = Some(l);
        self.into.nudge();
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// Pull a payload the peer lent into `dst` (the whole rest of a frame).
    fn pull(&mut self, pid: i32, dst: &mut [u8]) -> io::Result<usize> {
        if self.waiting()? < PULL_LEN as u64 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut d = [0u8; PULL_LEN];
        self.inp.take(self.head, &mut d);
        let word = |i: usize| u64::from_le_bytes(d[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let (magic, seq, addr, len) = (word(0), word(1), word(2), word(3));
        if magic != PULL_MAGIC || seq != self.pulled + 1 || len != dst.len() as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "rank {} sent a bad pull descriptor (#{seq} of {len} bytes, expected #{} of {})",
                    self.peer,
                    self.pulled + 1,
                    dst.len()
                ),
            ));
        }
        self.head += PULL_LEN as u64;
        self.inp.control().head.store(self.head, Ordering::Release);
        let copied = copy_from_process(pid, addr as usize, dst);
        // Was it withdrawn meanwhile (the peer's call failed, and its buffer may have changed
        // under the copy or been freed, failing it)?
        fence(Ordering::SeqCst);
        if self.inp.control().withdrawn.load(Ordering::SeqCst) >= seq {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("rank {} withdrew a send (its call failed) while this rank copied it", self.peer),
            ));
        }
        copied?;
        self.pulled = seq;
        self.inp.control().pulled.store(seq, Ordering::Release);
        self.into.nudge();
        Ok(dst.len())
    }

    /// The peer at the other end.
    pub(crate) fn peer(&self) -> usize {
        self.peer
    }

    /// The peer's inbox (its doorbell and departure word).
    pub(crate) fn peer_inbox(&self) -> &PeerInbox {
        &self.into
    }
}

/// Whole frames never lend: a payload that goes by a pull takes the queues.
impl WholeFrames for RingPair {
    /// Put a frame in at once, `header` and then `payload`, if the ring has room for all of
    /// it: false when it has not, or when the payload goes by a pull (nothing written).
    fn put_frame(&mut self, header: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<bool> {
        let want = (HEADER_LEN + payload.len()) as u64;
        if (self.pulls.by_peer && self.pulls.applies(payload.len())) || self.room_for(want)? < want {
            return Ok(false);
        }
        self.out.put(self.tail, header);
        self.out.put(self.tail + HEADER_LEN as u64, payload);
        self.tail += want;
        self.out.control().tail.store(self.tail, Ordering::Release);
        self.into.nudge();
        Ok(true)
    }

    /// The header of the next frame, once all of it is in (nothing is taken).
    fn peek_header(&self) -> io::Result<Option<[u8; HEADER_LEN]>> {
        if self.waiting()? < HEADER_LEN as u64 {
            return Ok(None);
        }
        let mut h = [0u8; HEADER_LEN];
        self.inp.take(self.head, &mut h);
        Ok(Some(h))
    }

    /// Take the next frame, its header (already looked at with [`RingPair::peek_header`]) and
    /// its payload into `buf`, if all of it is in: false when it is not, or when the payload
    /// comes by a pull (nothing taken).
    fn take_frame(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        let want = (HEADER_LEN + buf.len()) as u64;
        if (self.pulls.from_peer.is_some() && self.pulls.applies(buf.len())) || self.waiting()? < want {
            return Ok(false);
        }
        self.inp.take(self.head + HEADER_LEN as u64, buf);
        self.head += want;
        self.inp.control().head.store(self.head, Ordering::Release);
        self.into.nudge();
        Ok(true)
    }
}

impl Write for RingPair {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        // Frames come as [rest of the header, rest of the payload]: a large payload is lent
        // (after the header, whole).
        if let [head, payload] = bufs {
            if self.pulls.by_peer && self.pulls.applies(payload.len()) {
                if head.is_empty() {
                    return self.lend(payload);
                }
                return self.write_vectored(&[IoSlice::new(head)]);
            }
        }
        let want = bufs.iter().map(|b| b.len() as u64).sum::<u64>().max(1);
        let mut room = self.room_for(want)?;
        let mut n = 0u64;
        for b in bufs {
            let take = (b.len() as u64).min(room) as usize;
            self.out.put(self.tail + n, &b[..take]);
            n += take as u64;
            room -= take as u64;
            if room == 0 {
                break;
            }
        }
        if n == 0 && bufs.iter().any(|b| !b.is_empty()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.tail += n;
        self.out.control().tail.store(self.tail, Ordering::Release);
        self.into.nudge();
        Ok(n as usize)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for RingPair {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_vectored(&mut [IoSliceMut::new(buf)])
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        // As in write_vectored: after the header, a large payload comes by a pull.
        if let (Some(pid), [head, payload]) = (self.pulls.from_peer, &mut *bufs) {
            let pulls = self.pulls;
            if pulls.applies(payload.len()) {
                if head.is_empty() {
                    return self.pull(pid, payload);
                }
                return self.read_vectored(&mut [IoSliceMut::new(head)]);
            }
        }
        let mut avail = self.waiting()?;
        let mut n = 0u64;
        for b in bufs.iter_mut() {
            let take = (b.len() as u64).min(avail) as usize;
            self.inp.take(self.head + n, &mut b[..take]);
            n += take as u64;
            avail -= take as u64;
            if avail == 0 {
                break;
            }
        }
        if n == 0 && bufs.iter().any(|b| !b.is_empty()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.head += n;
        self.inp.control().head.store(self.head, Ordering::Release);
        // The writer may be asleep waiting for room.
        self.into.nudge();
        Ok(n as usize)
    }
}

/// Copy `dst.len()` bytes from address `addr` of process `pid` (one system call per stretch
/// the kernel copies; the whole of it or an error).
#[cfg(target_os = "linux")]
fn copy_from_process(pid: i32, addr: usize, dst: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let local = libc::iovec { iov_base: dst[done..].as_mut_ptr().cast(), iov_len: dst.len() - done };
        let remote = libc::iovec { iov_base: (addr + done) as *mut libc::c_void, iov_len: dst.len() - done };
        // SAFETY: `local` covers `dst[done..]`, which we own mutably; the kernel checks the
        // remote range against process `pid`'s mappings and fails instead of faulting.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer's buffer ended early")),
            _ => {
                let e = io::Error::last_os_error();
                return Err(match e.raw_os_error() {
                    Some(libc::ESRCH) => io::Error::new(io::ErrorKind::BrokenPipe, "the peer process is gone"),
                    _ => e,
                });
            }
        }
    }
    Ok(())
}

/// Pulls are never enabled off Linux (set-up does not offer them).
#[cfg(not(target_os = "linux"))]
fn copy_from_process(_: i32, _: usize, _: &mut [u8]) -> io::Result<()> {
    Err(io::ErrorKind::Unsupported.into())
}

/// A rank's position among the local ranks `group` (sorted) other than `owner`: its ring in
/// `owner`'s inbox.
pub(crate) fn slot(group: &[usize], owner: usize, rank: usize) -> usize {
    group.iter().filter(|&&q| q != owner).position(|&q| q == rank).expect("rank is in the local group")
}

/// Whether this process can read `len` bytes at `addr` in process `pid`, and they are
/// `expect` (set-up's check that pulls work between a pair: same user, no ptrace policy or
/// container rule in the way).
pub(crate) fn can_pull(pid: i32, addr: usize, expect: &[u8]) -> bool {
    let mut got = vec![0u8; expect.len()];
    copy_from_process(pid, addr, &mut got).is_ok() && got == expect
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ends of one pair in this process, rings of `cap` bytes, pulls of `pull`+ bytes.
    fn pair(cap: usize, pull: usize) -> (RingPair, RingPair) {
        let (a, b) = (Arc::new(Inbox::create(0, 1, cap).unwrap()), Arc::new(Inbox::create(1, 1, cap).unwrap()));
        let me = std::process::id() as i32;
        let pulls = Pulls { from_peer: Some(me), by_peer: true, min: pull };
        let ab = RingPair::new(1, a.clone(), 0, b.as_peer(), 0).unwrap().with_pulls(pulls);
        let ba = RingPair::new(0, b, 0, a.as_peer(), 0).unwrap().with_pulls(pulls);
        (ab, ba)
    }

    fn would_block<T: std::fmt::Debug>(r: io::Result<T>) -> bool {
        matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    #[test]
    fn bytes_wrap_around_and_writers_wait_for_room() {
        let (mut a, mut b) = pair(64, 0);
        let data: Vec<u8> = (0..200u8).collect();
        let (mut sent, mut got) = (0, Vec::new());
        while got.len() < data.len() {
            match a.write(&data[sent..]) {
                Ok(n) => sent += n,
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            }
            let mut buf = [0u8; 48];
            match b.read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            }
        }
        assert_eq!(got, data);
        assert!(would_block(b.read(&mut [0u8; 8])), "nothing more to read");
    }

    /// A whole frame goes in and comes out only whole: without room for all of it, or with
    /// only part of it in, nothing moves, and the byte stream carries on at the frame's start.
    #[test]
    fn whole_frames_move_whole_or_not_at_all() {
        let (mut a, mut b) = pair(4096, 1024);
        let h = [5u8; HEADER_LEN];
        let big = vec![1u8; 1000];
        for _ in 0..3 {
            assert!(a.put_frame(&h, &big).unwrap());
        }
        assert!(!a.put_frame(&h, &big).unwrap(), "1,040 bytes do not fit in the 976 left");
        assert!(!a.put_frame(&h, &[9u8; 2000]).unwrap(), "a payload that goes by a pull is not put whole");
        let mut out = vec![0u8; 1000];
        for _ in 0..3 {
            assert_eq!(b.peek_header().unwrap(), Some(h));
            assert!(b.take_frame(&mut out).unwrap());
            assert_eq!(out, big);
        }
        assert_eq!(b.peek_header().unwrap(), None);
        // A frame the streamed path writes bit by bit is taken once its last byte is in.
        a.write_all(&h[..20]).unwrap();
        assert_eq!(b.peek_header().unwrap(), None, "half a header");
        a.write_all(&h[20..]).unwrap();
        a.write_all(&[3u8; 4]).unwrap();
        assert_eq!(b.peek_header().unwrap(), Some(h));
        let mut eight = [0u8; 8];
        assert!(!b.take_frame(&mut eight).unwrap(), "4 of its 8 payload bytes are in");
        a.write_all(&[3u8; 4]).unwrap();
        assert!(b.take_frame(&mut eight).unwrap());
        assert_eq!(eight, [3u8; 8]);
        // And the streamed path reads on from a frame put whole.
        assert!(a.put_frame(&h, &[4u8; 2]).unwrap());
        let mut rest = [0u8; HEADER_LEN + 2];
        b.read_exact(&mut rest).unwrap();
        assert_eq!((&rest[..HEADER_LEN], &rest[HEADER_LEN..]), (&h[..], &[4u8, 4][..]));
    }

    #[test]
    fn scribbled_counters_are_an_error_not_an_overrun() {
        let (mut a, mut b) = pair(64, 0);
        a.write_all(b"hello").unwrap();
        // The peer claims to have written far more than the ring holds.
        b.inp.control().tail.store(1 << 40, Ordering::Release);
        let e = b.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("corrupt"), "{e}");
        // The reader claims to have read bytes never written: seen when the writer next needs
        // the reader's head, here for more than the room it knows of.
        a.out.control().head.store(1 << 40, Ordering::Release);
        assert_eq!(a.write(&[1u8; 60]).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_large_payload_is_pulled_and_the_send_completes_after() {
        let (mut a, mut b) = pair(4096, 1024);
        let payload: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let head = [7u8; 4];
        // The header goes through the ring; the payload is lent, not written.
        assert_eq!(a.write_vectored(&[IoSlice::new(&head), IoSlice::new(&payload)]).unwrap(), 4);
        assert!(would_block(a.write_vectored(&[IoSlice::new(&[]), IoSlice::new(&payload)])));
        assert!(!a.ready(false), "a lent payload is not sent until pulled");
        let (mut h, mut dst) = ([0u8; 4], vec![0u8; 5000]);
        assert_eq!(b.read_vectored(&mut [IoSliceMut::new(&mut h), IoSliceMut::new(&mut dst)]).unwrap(), 4);
        assert_eq!(b.read_vectored(&mut [IoSliceMut::new(&mut []), IoSliceMut::new(&mut dst)]).unwrap(), 5000);
        assert_eq!((h, &dst), (head, &payload));
        assert!(a.ready(false));
        assert_eq!(a.write_vectored(&[IoSlice::new(&[]), IoSlice::new(&payload)]).unwrap(), 5000);
    }

    #[test]
    fn a_withdrawn_payload_is_not_kept() {
        let (mut a, mut b) = pair(4096, 1024);
        let payload = vec![9u8; 2048];
        assert!(would_block(a.write_vectored(&[IoSlice::new(&[]), IoSlice::new(&payload)])));
        a.withdraw();
        let mut dst = vec![0u8; 2048];
        let e = b.read_vectored(&mut [IoSliceMut::new(&mut []), IoSliceMut::new(&mut dst)]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted, "{e}");
        assert!(e.to_string().contains("withdrew"), "{e}");
    }

    #[test]
    fn a_pull_descriptor_that_does_not_fit_is_refused() {
        let (mut a, mut b) = pair(4096, 1024);
        let payload = vec![1u8; 2048];
        assert!(would_block(a.write_vectored(&[IoSlice::new(&[]), IoSlice::new(&payload)])));
        // The reader expects another length: an error, not a short or long copy.
        let mut dst = vec![0u8; 4096];
        let e = b.read_vectored(&mut [IoSliceMut::new(&mut []), IoSliceMut::new(&mut dst)]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}
