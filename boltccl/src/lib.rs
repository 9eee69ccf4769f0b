//! # boltccl
//!
//! Collective communication for small clusters (2–8 machines, such as Apple-silicon Macs
//! joined by Thunderbolt): `all_sum`/`all_max`/`all_min`, `all_gather`, `reduce_scatter`,
//! `broadcast`, `barrier`, `send`/`recv` and `split`, over TCP (any network) with
//! deterministic mesh, doubling, direct and ring algorithms.
//!
//! Built to never hang and never corrupt: every wait has a deadline, a dead or stalled peer
//! becomes an error naming the rank on every rank, mismatched calls are detected from the
//! header every message carries, and every rank gets bitwise-identical results.
//!
//! ```no_run
//! // Run under `boltccl launch -n 4 -- ./my_program`, which sets the environment.
//! let g = boltccl::init()?;
//! let mut x = vec![g.rank() as f32; 1024];
//! g.all_sum(&mut x)?;
//! assert!(x.iter().all(|&v| v == (0..g.size()).sum::<usize>() as f32));
//! # Ok::<(), boltccl::Error>(())
//! ```
#![warn(missing_docs)]

mod algo;
mod auth;
mod bootstrap;
pub mod config;
mod connect;
mod error;
mod group;
mod host;
#[cfg(feature = "stderr-log")]
mod log;
pub mod probe;
mod reduce;
mod request;
mod topology;
mod transport;
mod types;
mod wire;

pub use algo::select::select as select_algorithm;
pub use bootstrap::free_coordinator_port;
pub use config::{Algo, Backend, Config};
pub use error::{Error, ErrorKind, Result};
pub use group::{init, Bytes, Group, Op};
pub use half::{bf16, f16};
pub use host::cpus;
#[cfg(feature = "stderr-log")]
pub use log::log_to_stderr;
pub use request::{OnComplete, RawRequest, Request, Scope};
pub use topology::{Cabling, Shape};
pub use transport::{InterruptCheck, LinkKind};
pub use types::{Collective, DType, Element, ReduceOp, BYTE_CALLS, CALLS, TYPED_CALLS};
pub use wire::VERSION;

/// The reduction kernels, for the criterion benchmarks only: not part of the API (feature
/// `testing`).
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod bench {
    pub use crate::reduce::{combine, fold, Order};
}

/// The parsers of bytes from other processes and the bootstrap steps, for the fuzz harnesses
/// and hostile-peer tests only: not part of the API (feature `testing`).
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod fuzz;
