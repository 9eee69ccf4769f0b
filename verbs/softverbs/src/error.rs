//! Internal error type; every variant maps to the errno a real provider would report.

/// Why a verbs call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid argument, bad transition or bad attribute mask (`EINVAL`).
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// Resource limit reached (`ENOMEM`).
    #[error("out of resources: {0}")]
    NoMem(&'static str),
    /// Device busy: QP limit reached or object still in use (`EBUSY`).
    #[error("busy: {0}")]
    Busy(&'static str),
    /// Unsupported operation, e.g. an RC QP (`EOPNOTSUPP`).
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    /// Injected device failure (`EIO`).
    #[error("device failed (SOFTVERBS_FAIL_AFTER reached)")]
    DeviceFailed,
    /// Socket error (`EIO` unless the OS gave a code).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Bad environment variable (`EINVAL`).
    #[error("bad value for {0}: {1:?}")]
    BadEnv(&'static str, String),
}

impl Error {
    /// The errno value reported to C callers.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Invalid(_) | Error::BadEnv(..) => libc::EINVAL,
            Error::NoMem(_) => libc::ENOMEM,
            Error::Busy(_) => libc::EBUSY,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::DeviceFailed => libc::EIO,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// Set the calling thread's `errno`.
pub fn set_errno(value: i32) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    // SAFETY: __errno_location returns a valid pointer to this thread's errno.
    unsafe {
        *libc::__errno_location() = value;
    }
    #[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
    // SAFETY: __error returns a valid pointer to this thread's errno.
    unsafe {
        *libc::__error() = value;
    }
}
