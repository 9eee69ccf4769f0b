//! One error type for the whole library.
//!
//! Every variant says what went wrong *and* what to do about it, because the people who read
//! these messages are debugging a cluster at 2 a.m. The C and Python layers map from
//! [`Error::kind`], a small stable classification, so they never parse message text.

use std::time::Duration;

/// Result alias used throughout boltccl.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in boltccl.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something wrong (length, rank, dtype, buffer). Caught locally before
    /// anything was sent, so the group stays usable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The configuration (environment, hostfile, `Config`) is wrong or incomplete.
    #[error("configuration error: {0}")]
    Config(String),

    /// Ranks disagree on something they must agree on (version, settings, collective
    /// arguments). Reported on every rank.
    #[error("mismatch with rank {rank}: {what}")]
    Mismatch {
        /// The other rank involved.
        rank: usize,
        /// What differed, with both values.
        what: String,
    },

    /// A peer process went away (connection closed or reset).
    #[error("rank {rank} is gone ({detail}); the group is unusable: shrink() it to go on without that rank, or restart the job")]
    PeerLost {
        /// The rank that disappeared.
        rank: usize,
        /// How it was noticed.
        detail: String,
    },

    /// Another rank hit an error and told everyone to stop.
    #[error("rank {rank} aborted the group: {reason}")]
    Aborted {
        /// The rank that aborted.
        rank: usize,
        /// The original cause as that rank reported it.
        reason: String,
    },

    /// The group did not form within `BOLTCCL_INIT_TIMEOUT_MS`: the step, and who was
    /// missing (ranks that never joined, connections turned away and why).
    #[error("the group did not form within BOLTCCL_INIT_TIMEOUT_MS: {0}")]
    InitTimeout(String),

    /// No progress within the deadline (`BOLTCCL_TIMEOUT_MS`).
    #[error(
        "{op} timed out after {after:?} without progress while waiting for rank {rank}; \
         that rank is stalled or slow (raise BOLTCCL_TIMEOUT_MS if it is expected)"
    )]
    Timeout {
        /// The operation that was waiting.
        op: String,
        /// The rank it was waiting on.
        rank: usize,
        /// How long it waited since the last progress.
        after: Duration,
    },

    /// An operating-system level I/O error on a link.
    #[error("I/O error{} during {op}: {source}", talking_to(*.rank))]
    Io {
        /// The peer rank; `None` when no peer is involved (a local socket or poll failed).
        rank: Option<usize>,
        /// What was being done.
        op: String,
        /// The OS error.
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },

    /// A frame failed validation (bad magic, oversized, wrong protocol version, bad auth).
    #[error("protocol error from {from}: {detail}")]
    Protocol {
        /// Who sent it (an address or a rank).
        from: String,
        /// What was wrong.
        detail: String,
    },

    /// Authentication with the job key failed.
    #[error("authentication failed with {peer}: {detail} (all ranks must share BOLTCCL_JOB_KEY)")]
    Auth {
        /// The peer address or rank.
        peer: String,
        /// What failed.
        detail: String,
    },

    /// The requested feature is not available here (no verbs library, no device, ...).
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// An RDMA verb or completion failed; `what` names the verb, the errno or status, the
    /// likely cause and the fix.
    #[error("RDMA device {device}: {what}")]
    Verbs {
        /// The device name (e.g. `rdma_en3`).
        device: String,
        /// What failed, why, and what to do.
        what: String,
    },

    /// An earlier communication error broke this group; every later call reports it.
    #[error("group is unusable after an earlier error: {0}")]
    Poisoned(Box<Error>),

    /// Another thread is already running a call on this group.
    #[error(
        "another call is in progress on this group; calls on one group must not overlap \
         (use one group per thread, or split() one)"
    )]
    Busy,

    /// The caller's interrupt check (for example Ctrl-C in Python) stopped a waiting call.
    /// The call was cut off midway, so the group is unusable afterwards.
    #[error("interrupted while waiting in {op}; the group is unusable after an interrupted call")]
    Interrupted {
        /// The call that was interrupted.
        op: String,
    },

    /// A bug in boltccl. Please report it.
    #[error("internal error (a bug in boltccl, please report): {0}")]
    Internal(String),
}

/// A small, stable classification of [`Error`] for the C and Python layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad argument; the group is still usable.
    InvalidArgument,
    /// Bad configuration.
    Config,
    /// Ranks disagreed.
    Mismatch,
    /// A peer died.
    PeerLost,
    /// A peer aborted.
    Aborted,
    /// A deadline passed.
    Timeout,
    /// Operating-system I/O error.
    Io,
    /// Malformed or unauthenticated traffic.
    Protocol,
    /// Not available on this machine.
    Unsupported,
    /// Concurrent use of one group.
    Busy,
    /// Stopped by the caller's interrupt check.
    Interrupted,
    /// A bug.
    Internal,
}

impl ErrorKind {
    /// Every kind.
    pub const ALL: [ErrorKind; 12] = [
        ErrorKind::InvalidArgument,
        ErrorKind::Config,
        ErrorKind::Mismatch,
        ErrorKind::PeerLost,
        ErrorKind::Aborted,
        ErrorKind::Timeout,
        ErrorKind::Io,
        ErrorKind::Protocol,
        ErrorKind::Unsupported,
        ErrorKind::Busy,
        ErrorKind::Interrupted,
        ErrorKind::Internal,
    ];

    /// The stable name bindings expose (`"peer_lost"`, `"timeout"`, ...): never renamed.
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Config => "config",
            ErrorKind::Mismatch => "mismatch",
            ErrorKind::PeerLost => "peer_lost",
            ErrorKind::Aborted => "aborted",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Io => "io",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Busy => "busy",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::Internal => "internal",
        }
    }

    /// A short description for people (`"peer lost"`, `"timed out"`, ...).
    pub const fn description(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Config => "configuration error",
            ErrorKind::Mismatch => "ranks disagree",
            ErrorKind::PeerLost => "peer lost",
            ErrorKind::Aborted => "aborted by another rank",
            ErrorKind::Timeout => "timed out",
            ErrorKind::Io => "I/O error",
            ErrorKind::Protocol => "protocol error",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Busy => "another call is in progress on this group",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::Internal => "internal error",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Error {
    /// The stable classification of this error. A poisoned group reports the kind of the
    /// original cause.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::Config(_) => ErrorKind::Config,
            Error::Mismatch { .. } => ErrorKind::Mismatch,
            Error::PeerLost { .. } => ErrorKind::PeerLost,
            Error::Aborted { .. } => ErrorKind::Aborted,
            Error::Timeout { .. } | Error::InitTimeout(_) => ErrorKind::Timeout,
            Error::Io { .. } => ErrorKind::Io,
            Error::Protocol { .. } | Error::Auth { .. } => ErrorKind::Protocol,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::Verbs { .. } => ErrorKind::Io,
            Error::Poisoned(inner) => inner.kind(),
            Error::Busy => ErrorKind::Busy,
            Error::Interrupted { .. } => ErrorKind::Interrupted,
            Error::Internal(_) => ErrorKind::Internal,
        }
    }

    /// The rank this error blames, if any.
    pub fn rank(&self) -> Option<usize> {
        match self {
            Error::Mismatch { rank, .. }
            | Error::PeerLost { rank, .. }
            | Error::Aborted { rank, .. }
            | Error::Timeout { rank, .. } => Some(*rank),
            Error::Io { rank, .. } => *rank,
            Error::Poisoned(inner) => inner.rank(),
            _ => None,
        }
    }

    /// True for errors caught before anything was sent: they leave the group usable.
    pub fn is_local(&self) -> bool {
        matches!(self, Error::InvalidArgument(_) | Error::Busy)
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }

    pub(crate) fn io(rank: usize, op: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { rank: Some(rank), op: op.into(), source: std::sync::Arc::new(source) }
    }

    /// An I/O error of this rank's own, with no peer to blame (a local socket, `poll`).
    pub(crate) fn local_io(op: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { rank: None, op: op.into(), source: std::sync::Arc::new(source) }
    }
}

/// " talking to rank N" for an I/O error with a peer, nothing without one.
fn talking_to(rank: Option<usize>) -> String {
    rank.map(|r| format!(" talking to rank {r}")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_without_a_peer_blames_no_rank() {
        let e = Error::local_io("poll", std::io::Error::from(std::io::ErrorKind::Other));
        assert_eq!(e.rank(), None);
        assert!(e.to_string().starts_with("I/O error during poll: "), "{e}");
        let e = Error::io(3, "socket setup", std::io::Error::from(std::io::ErrorKind::Other));
        assert_eq!(e.rank(), Some(3));
        assert!(e.to_string().starts_with("I/O error talking to rank 3 during socket setup: "), "{e}");
        assert_eq!(Error::Poisoned(Box::new(e)).rank(), Some(3));
    }
}
