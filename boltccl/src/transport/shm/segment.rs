//! Shared memory a rank owns: an anonymous memory file (`memfd` on Linux; elsewhere a POSIX
//! shared-memory object unlinked the moment it is made), mapped, that reaches other processes
//! only as a file descriptor passed over an authenticated unix socket. It has no name: nothing
//! is left behind in `/dev/shm` when a process dies, and no other process can open it by name.

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{fstat, ftruncate};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};
use std::io;
use std::ptr::NonNull;

/// A mapped shared-memory file.
pub(crate) struct Segment {
    ptr: NonNull<u8>,
    len: usize,
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    fd: OwnedFd,
}

// SAFETY: the mapping is plain memory owned by this value for its whole life; every access to
// it goes through raw pointers under the ring protocol (atomics order them across processes),
// so moving or sharing the handle between threads is as safe as for any shared buffer.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Segment {
    /// A new zeroed segment of `len` bytes.
    pub(crate) fn create(len: usize) -> io::Result<Segment> {
        let fd = anonymous()?;
        ftruncate(&fd, len as u64)?;
        Segment::map(fd, len)
    }

    // Sharing between processes: Linux only (see setup.rs).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    /// Map a segment another rank created and passed to us.
    pub(crate) fn open(fd: OwnedFd) -> io::Result<Segment> {
        let len = usize::try_from(fstat(&fd)?.st_size).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        Segment::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<Segment> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "an empty shared-memory segment"));
        }
        // SAFETY: a fresh shared mapping of the whole file, at an address the kernel picks; it
        // aliases nothing in this process and is unmapped only in Drop.
        let p =
            unsafe { mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, 0)? };
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(Segment { ptr, len, fd })
    }

    // Sharing between processes: Linux only (see setup.rs).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    /// The file, to pass to a peer.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Start of the mapping.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length of the mapping in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// A new memory file with no name, readable and writable by its owner only.
///
/// A memfd is made with mode 0777, and reachable only through this process's descriptors
/// (`/proc/<pid>/fd`, which the kernel closes to other users); the mode is narrowed anyway, so
/// that the segment itself says it is private (as on other systems) and a test can check it.
#[cfg(target_os = "linux")]
fn anonymous() -> io::Result<OwnedFd> {
    use rustix::fs::Mode;
    let fd = rustix::fs::memfd_create("boltccl", rustix::fs::MemfdFlags::CLOEXEC)?;
    rustix::fs::fchmod(&fd, Mode::RUSR | Mode::WUSR)?;
    Ok(fd)
}

/// A new memory file with no name: created under a random name, unlinked at once.
#[cfg(not(target_os = "linux"))]
fn anonymous() -> io::Result<OwnedFd> {
    use rustix::fs::Mode;
    use rustix::shm::OFlags;
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).expect("the OS random source works");
    let name = format!("/boltccl-{}", u64::from_le_bytes(b));
    let fd = rustix::shm::open(name.as_str(), OFlags::CREATE | OFlags::EXCL | OFlags::RDWR, Mode::RUSR | Mode::WUSR)?;
    let _ = rustix::shm::unlink(name.as_str());
    Ok(fd)
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; nothing borrows it past this value.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
