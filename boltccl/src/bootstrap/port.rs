//! A port for a coordinator that a rank will bind a moment from now.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::ops::Range;

/// Where free coordinator ports are looked for: below the ports of [`DERIVED_PORTS`] (so a
/// job whose launcher gives no coordinator never computes a port that another job was just
/// handed) and so below the ephemeral ranges of Linux (32768–60999) and macOS (49152–65535),
/// and above the ports of well-known services.
///
/// [`DERIVED_PORTS`]: crate::config::launchers::DERIVED_PORTS
pub(crate) const FREE_PORTS: Range<u16> = 10_000..20_000;
/// Where the ephemeral range starts when the kernel does not say (macOS's default).
const EPHEMERAL_DEFAULT: u16 = 49_152;

/// A TCP port on `ip` that is free now, for a coordinator that a rank will bind in a moment
/// (what a launcher or the torch backend hands to rank 0).
///
/// The port lies in 10000–19999, below the kernel's ephemeral range and the ports boltccl
/// derives from a launcher's job id (20000–32767). A port found by binding port 0 comes from
/// the ephemeral range and is released before the rank binds it; in that moment any connection
/// on the host may be given it as its own local port, and rank 0 fails with "address in use".
/// The kernel never hands out ports below the range by itself. The search starts at a random
/// port, so that jobs started together do not try the same ones. Where a tuned kernel's range
/// starts too low to leave room, this falls back to port 0's choice.
pub fn free_coordinator_port(ip: IpAddr) -> io::Result<u16> {
    let (low, high) = (FREE_PORTS.start, FREE_PORTS.end.min(ephemeral_start()));
    if high <= low + 1_000 {
        return TcpListener::bind(SocketAddr::new(ip, 0))?.local_addr().map(|a| a.port());
    }
    let span = u32::from(high - low);
    let mut r = [0u8; 4];
    getrandom::getrandom(&mut r).expect("the OS random source works");
    let start = u32::from_le_bytes(r) % span;
    let mut last = None;
    for i in 0..span {
        let port = low + ((start + i) % span) as u16;
        match TcpListener::bind(SocketAddr::new(ip, port)) {
            Ok(_) => return Ok(port),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrInUse)))
}

/// The first port of the kernel's ephemeral range (Linux says; elsewhere macOS's default).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(EPHEMERAL_DEFAULT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// The port is free, in its range below the ephemeral one, and calls do not all give the
    /// same one.
    #[test]
    fn a_free_port_below_the_ephemeral_range() {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let ports: Vec<u16> = (0..8).map(|_| free_coordinator_port(ip).unwrap()).collect();
        for &p in &ports {
            assert!(FREE_PORTS.contains(&p) && p < ephemeral_start(), "{p}");
            TcpListener::bind((Ipv4Addr::LOCALHOST, p)).unwrap();
        }
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 1, "{ports:?}");
        // An address that is not this host's is an error, not a port.
        assert!(free_coordinator_port("192.0.2.1".parse().unwrap()).is_err());
    }
}
