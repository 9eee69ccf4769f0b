//! Result codes and the thread-local last-error message.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::sync::OnceLock;

/// The outcome of every fallible boltccl call. `BOLTCCL_RESULT_OK` (0) is success; every
/// other value is an error. The numbers are stable: a value is never renumbered or reused
/// (retired values stay listed as reserved). Errors from the library are in the 9100 range,
/// errors about how the C API was called in the 9000 range.
///
/// After any error, `boltccl_last_error()` on the same thread gives the full message.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum boltccl_result {
    /// Success.
    Ok = 0,
    /// A required pointer argument was NULL.
    NullParameter = 9000,
    /// A bug in boltccl: Rust code panicked. The panic was caught at the API boundary.
    Panic = 9001,
    /// A C-level argument was invalid (unknown dtype, negative rank, overlapping buffers,
    /// size overflow, non-UTF-8 string). The group is still usable.
    InvalidParameter = 9002,
    /// The library rejected an argument (length, rank out of range, ...) before sending
    /// anything. The group is still usable.
    InvalidArgument = 9100,
    /// The configuration (environment or `boltccl_config`) is wrong or incomplete.
    Config = 9101,
    /// Ranks disagree on something they must agree on (version, settings, call arguments).
    Mismatch = 9102,
    /// A peer process went away. The group is unusable.
    PeerLost = 9103,
    /// Another rank hit an error and aborted the group. The group is unusable.
    Aborted = 9104,
    /// No progress within the deadline (`BOLTCCL_TIMEOUT_MS`): the group is unusable. From
    /// `boltccl_init`: the group did not form within `BOLTCCL_INIT_TIMEOUT_MS`.
    Timeout = 9105,
    /// An operating-system I/O error on a link. The group is unusable.
    Io = 9106,
    /// Malformed or unauthenticated traffic (wrong `BOLTCCL_JOB_KEY`, version skew).
    Protocol = 9107,
    /// The feature is not available in this build or on this machine.
    Unsupported = 9108,
    /// Another thread is running a call on this group; calls on one group must not overlap.
    /// The group is still usable.
    Busy = 9109,
    /// A waiting call was interrupted. The group is unusable.
    Interrupted = 9110,
    /// An internal error in boltccl (please report it).
    Internal = 9111,
}

impl boltccl_result {
    /// Every code (for the tests).
    #[cfg(test)]
    pub(crate) const ALL: [boltccl_result; 16] = [
        boltccl_result::Ok,
        boltccl_result::NullParameter,
        boltccl_result::Panic,
        boltccl_result::InvalidParameter,
        boltccl_result::InvalidArgument,
        boltccl_result::Config,
        boltccl_result::Mismatch,
        boltccl_result::PeerLost,
        boltccl_result::Aborted,
        boltccl_result::Timeout,
        boltccl_result::Io,
        boltccl_result::Protocol,
        boltccl_result::Unsupported,
        boltccl_result::Busy,
        boltccl_result::Interrupted,
        boltccl_result::Internal,
    ];

    /// The code for a library error.
    pub(crate) fn from_error(e: &boltccl::Error) -> boltccl_result {
        boltccl_result::from_kind(e.kind())
    }

    /// The code for a kind of library error: these numbers are ABI, never renumbered.
    fn from_kind(kind: boltccl::ErrorKind) -> boltccl_result {
        use boltccl::ErrorKind as K;
        match kind {
            K::InvalidArgument => boltccl_result::InvalidArgument,
            K::Config => boltccl_result::Config,
            K::Mismatch => boltccl_result::Mismatch,
            K::PeerLost => boltccl_result::PeerLost,
            K::Aborted => boltccl_result::Aborted,
            K::Timeout => boltccl_result::Timeout,
            K::Io => boltccl_result::Io,
            K::Protocol => boltccl_result::Protocol,
            K::Unsupported => boltccl_result::Unsupported,
            K::Busy => boltccl_result::Busy,
            K::Interrupted => boltccl_result::Interrupted,
            K::Internal => boltccl_result::Internal,
            // `ErrorKind` is non-exhaustive; a kind added later maps here until it gets a code.
            _ => boltccl_result::Internal,
        }
    }

    /// A static, NUL-terminated description of the code.
    pub(crate) fn describe(code: u32) -> &'static CStr {
        static KINDS: OnceLock<Vec<(u32, CString)>> = OnceLock::new();
        let kinds = KINDS.get_or_init(|| {
            boltccl::ErrorKind::ALL
                .iter()
                .map(|&k| (boltccl_result::from_kind(k) as u32, CString::new(k.description()).expect("no NUL")))
                .collect()
        });
        match code {
            0 => c"success",
            9000 => c"a required pointer argument was NULL",
            9001 => c"panic inside boltccl (a bug, please report it)",
            9002 => c"invalid parameter",
            _ => kinds.iter().find(|(c, _)| *c == code).map_or(c"unknown result code", |(_, d)| d.as_c_str()),
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Record `msg` as this thread's last error.
pub(crate) fn set_last_error(msg: impl Into<String>) {
    let mut bytes = msg.into().into_bytes();
    bytes.retain(|&b| b != 0);
    // No interior NUL remains, so this cannot fail.
    let c = CString::new(bytes).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(c));
}

/// Clear this thread's last error (done at the start of every call).
pub(crate) fn clear_last_error() {
    LAST_ERROR.with(|e| *e.borrow_mut() = None);
}

/// Pointer to this thread's last error message, or an empty string.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| match &*e.borrow() {
        Some(c) => c.as_ptr(),
        None => c"".as_ptr(),
    })
}

/// Turn a library error into its code, recording the message.
pub(crate) fn fail(e: boltccl::Error) -> boltccl_result {
    let code = boltccl_result::from_error(&e);
    set_last_error(e.to_string());
    code
}

/// Record `msg` and return `code`.
pub(crate) fn fail_with(code: boltccl_result, msg: impl Into<String>) -> boltccl_result {
    set_last_error(msg);
    code
}
