//! A byte stream in shared memory: one single-producer single-consumer ring per direction of
//! a pair, in the receiving rank's segment.
//!
//! The writer copies bytes in and publishes its `tail` (release); the reader copies them out
//! and publishes its `head` (release); each loads the other's counter with acquire before
//! touching the bytes it guards. Each side keeps its own counter privately, so a peer that
//! scribbles over the shared ones can make the stream fail (a counter that makes no sense is
//! an error) but can never make this rank read or write outside the ring.
//!
//! Waking: a rank about to sleep sets the `sleeping` word of its segment, looks once more, and
//! sleeps on its doorbell (an eventfd); whoever moves bytes for a sleeping rank rings it. A
//! sequentially consistent fence on both sides means one of them always sees the other.

use super::segment::Segment;
use rustix::fd::{AsFd, OwnedFd};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Identifies a segment laid out by this module.
const MAGIC: u64 = 0xB01C_C15A_5E61_0001;
/// Bytes of the segment header, and the alignment of every ring.
const HEADER: usize = 64;
/// Bytes of a ring's counters (each on its own cache line).
const CONTROL: usize = 128;

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
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.data, src.len() - first);
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
            std::ptr::copy_nonoverlapping(self.data, dst.as_mut_ptr().add(first), dst.len() - first);
        }
    }
}

fn corrupt(peer: usize, what: &str, mine: u64, theirs: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the shared-memory ring with rank {peer} is corrupt ({what}: ours {mine}, theirs {theirs})"),
    )
}

/// This rank's end of a pair: it writes into the peer's inbox and reads from its own.
pub(crate) struct RingPair {
    peer: usize,
    out: RingView,
    into: PeerInbox,
    /// Bytes written (ours: the shared tail is only published).
    tail: u64,
    inp: RingView,
    /// Our inbox, kept mapped while this end reads from it.
    _own: Arc<Inbox>,
    /// Bytes read (ours: the shared head is only published).
    head: u64,
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
        Ok(RingPair { peer, out, into, tail: 0, inp, _own: own, head: 0 })
    }

    /// Bytes the writer may still put in (loads the reader's head).
    fn room(&self) -> io::Result<u64> {
        let head = self.out.control().head.load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > self.out.capacity {
            return Err(corrupt(self.peer, "their read position", self.tail, head));
        }
        Ok(self.out.capacity - used)
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

    /// Something to read, or room to write: this end could progress now.
    pub(crate) fn ready(&self, read: bool) -> bool {
        if read {
            self.waiting().map_or(true, |n| n > 0)
        } else {
            self.room().map_or(true, |n| n > 0)
        }
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

impl Write for RingPair {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut room = self.room()?;
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
