//! Limits profiles and fault injection, read from the environment when a context is opened.

use std::time::Duration;

use verbs_abi::{ibv_mtu, IBV_MTU_4096};

use crate::error::Error;

/// Which set of limits the provider enforces (`SOFTVERBS_PROFILE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// Apple's Thunderbolt 5 provider as observed in the field (default).
    Apple,
    /// Generic rdma-core-like limits (`SOFTVERBS_PROFILE=rdma-core`).
    RdmaCore,
}

/// Resource limits enforced by the provider. QP and MR limits are counted per device name
/// across the whole process (a real device counts across processes; this double cannot).
#[derive(Clone, Debug)]
pub struct Limits {
    /// QPs per device; creating one more fails with `EBUSY`.
    pub max_qp: usize,
    /// MR registrations per device; one more fails with `ENOMEM`.
    pub max_mr: usize,
    /// Hard cap on outstanding receives per QP regardless of `cap.max_recv_wr`
    /// (`None`: only `cap.max_recv_wr`). One more `post_recv` fails with `ENOMEM`.
    pub max_outstanding_recv: Option<usize>,
    /// Advertised `max_qp_wr` (also the upper bound for `cap.max_*_wr`).
    pub max_qp_wr: u32,
    /// Max SGEs per work request.
    pub max_sge: u32,
    /// Max entries per CQ.
    pub max_cqe: u32,
    /// Max CQs (advertised only).
    pub max_cq: u32,
    /// Max PDs (advertised only).
    pub max_pd: u32,
    /// Max message size in bytes.
    pub max_msg: u32,
    /// Max inline data bytes.
    pub max_inline: u32,
    /// Max and active MTU of the port.
    pub mtu: ibv_mtu,
}

impl Limits {
    /// Limits of a profile.
    pub fn of(profile: Profile) -> Limits {
        match profile {
            Profile::Apple => Limits {
                max_qp: 10,
                max_mr: 100,
                max_outstanding_recv: Some(32),
                max_qp_wr: 4095,
                max_sge: 1,
                max_cqe: 4095,
                max_cq: 64,
                max_pd: 64,
                max_msg: 16_773_120,
                max_inline: 0,
                mtu: IBV_MTU_4096,
            },
            Profile::RdmaCore => Limits {
                max_qp: 256,
                max_mr: 65_536,
                max_outstanding_recv: None,
                max_qp_wr: 16_384,
                max_sge: 16,
                max_cqe: 65_536,
                max_cq: 1024,
                max_pd: 1024,
                max_msg: 1 << 30,
                max_inline: 256,
                mtu: IBV_MTU_4096,
            },
        }
    }
}

/// Fault injection settings.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Probability in `[0, 1]` that a datagram is dropped at the sender (`SOFTVERBS_DROP_RATE`).
    pub drop_rate: f64,
    /// Seed of the drop generator (`SOFTVERBS_SEED`).
    pub seed: u64,
    /// Delivery delay added at the receiver (`SOFTVERBS_DELAY_US`).
    pub delay: Duration,
    /// After this many counted verbs operations the device fails (`SOFTVERBS_FAIL_AFTER`).
    pub fail_after: Option<u64>,
    /// Every `post_recv` work request is delayed by this long before it is queued, modelling a
    /// rank that posts its receives late (`SOFTVERBS_RECV_DELAY_US`).
    pub recv_delay: Duration,
    /// Probability that a datagram is sent twice (`SOFTVERBS_DUP_RATE`).
    pub dup_rate: f64,
    /// Probability that a datagram is held back and sent after the next one on its queue pair
    /// (`SOFTVERBS_REORDER_RATE`).
    pub reorder_rate: f64,
    /// Probability that one bit of a datagram is flipped after its checksum was computed
    /// (`SOFTVERBS_CORRUPT_RATE`): the receiver drops it, as hardware drops a packet that fails
    /// its ICRC.
    pub corrupt_rate: f64,
}

/// Everything a context needs from the environment.
#[derive(Clone, Debug)]
pub struct Config {
    /// Limits profile.
    pub profile: Profile,
    /// Limits of that profile.
    pub limits: Limits,
    /// Fault injection.
    pub faults: Faults,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.trim().is_empty())
}

fn parse<T: std::str::FromStr>(name: &'static str) -> Result<Option<T>, Error> {
    match var(name) {
        None => Ok(None),
        Some(s) => s.trim().parse::<T>().map(Some).map_err(|_| Error::BadEnv(name, s)),
    }
}

impl Config {
    /// Read the configuration from `SOFTVERBS_*` environment variables.
    pub fn from_env() -> Result<Config, Error> {
        let profile = match var("SOFTVERBS_PROFILE").as_deref() {
            None | Some("apple") => Profile::Apple,
            Some("rdma-core") => Profile::RdmaCore,
            Some(other) => return Err(Error::BadEnv("SOFTVERBS_PROFILE", other.to_string())),
        };
        let rate = |name: &'static str| -> Result<f64, Error> {
            let p: f64 = parse(name)?.unwrap_or(0.0);
            if !(0.0..=1.0).contains(&p) {
                return Err(Error::BadEnv(name, p.to_string()));
            }
            Ok(p)
        };
        let drop_rate = rate("SOFTVERBS_DROP_RATE")?;
        let faults = Faults {
            drop_rate,
            seed: parse("SOFTVERBS_SEED")?.unwrap_or(0x5eed),
            delay: Duration::from_micros(parse("SOFTVERBS_DELAY_US")?.unwrap_or(0)),
            fail_after: parse("SOFTVERBS_FAIL_AFTER")?,
            recv_delay: Duration::from_micros(parse("SOFTVERBS_RECV_DELAY_US")?.unwrap_or(0)),
            dup_rate: rate("SOFTVERBS_DUP_RATE")?,
            reorder_rate: rate("SOFTVERBS_REORDER_RATE")?,
            corrupt_rate: rate("SOFTVERBS_CORRUPT_RATE")?,
        };
        Ok(Config { profile, limits: Limits::of(profile), faults })
    }
}
