//! Log output for programs that have no `tracing` subscriber of their own.
//!
//! The library only emits `tracing` events; it never installs a subscriber, because that is
//! global state its host owns. Hosts that want boltccl's usual stderr output (the `boltccl`
//! command, the C library, the Python module) call [`log_to_stderr`], which needs the
//! `stderr-log` feature.

/// Print boltccl's log to stderr, filtered by `BOLTCCL_LOG` (`warn` unless set; a level such as
/// `debug`, or per target: `boltccl=debug,warn`). Does nothing when the process already has a
/// global subscriber.
pub fn log_to_stderr() {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = std::env::var(crate::config::LOG)
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::WARN));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let _ = tracing_subscriber::registry().with(fmt).with(filter).try_init();
}
