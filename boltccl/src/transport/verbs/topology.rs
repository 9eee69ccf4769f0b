//! The N×N device matrix (MLX's `MLX_IBV_DEVICES` format): row `i`, column `j` names the
//! device(s) rank `i` uses to reach rank `j` — `null` (no cable), a name, or a list of names
//! when several cables join the pair.

use crate::error::{Error, Result};
use serde_json::Value;
use std::net::Ipv4Addr;

/// Most cables boltccl uses between two ranks (a Mac has at most 4 Thunderbolt 5 ports per
/// side of a pair in practice).
pub const MAX_CABLES: usize = 4;

/// Whether `a` and `b` share the first `prefix` bits.
pub fn same_subnet(a: Ipv4Addr, b: Ipv4Addr, prefix: u8) -> bool {
    let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix.min(32))) };
    u32::from(a) & mask == u32::from(b) & mask
}

/// Which of the peer's cables each of ours is plugged into, from addresses: our cable `x`
/// (its IPv4 address and, when known, the interface's prefix length) joins the peer's cable
/// `y` whose address is on the same subnet. `Some(perm)` (our index -> the peer's) only when
/// that pairs the cables one to one; `None` when the addresses cannot tell (every link on
/// one subnet, such as 169.254/16 everywhere, or prefixes unknown).
pub fn match_cables(mine: &[(Ipv4Addr, Option<u8>)], theirs: &[Ipv4Addr]) -> Option<Vec<usize>> {
    if mine.len() != theirs.len() {
        return None;
    }
    let mut perm = Vec::with_capacity(mine.len());
    for &(ip, prefix) in mine {
        let prefix = prefix?;
        let mut hits = theirs.iter().enumerate().filter(|(_, &t)| t != ip && same_subnet(ip, t, prefix));
        let (y, _) = hits.next()?;
        if hits.next().is_some() || perm.contains(&y) {
            return None;
        }
        perm.push(y);
    }
    Some(perm)
}

/// Parsed matrix: `cells[i][j]` is the list of devices rank `i` uses toward rank `j`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMatrix {
    /// Devices per (rank, peer); empty when there is no RDMA link.
    pub cells: Vec<Vec<Vec<String>>>,
}

impl DeviceMatrix {
    /// Parse the JSON text of a matrix for `world` ranks.
    pub fn parse(text: &str, world: usize) -> std::result::Result<DeviceMatrix, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
        let rows = v.as_array().ok_or("expected a JSON list of rows")?;
        if rows.len() != world {
            return Err(format!("{} rows for a world of {world} ranks", rows.len()));
        }
        let mut cells = Vec::with_capacity(world);
        for (i, row) in rows.iter().enumerate() {
            let row = row.as_array().ok_or_else(|| format!("row {i} is not a list"))?;
            if row.len() != world {
                return Err(format!("row {i} has {} cells for a world of {world} ranks", row.len()));
            }
            let mut out = Vec::with_capacity(world);
            for (j, c) in row.iter().enumerate() {
                let names: Vec<String> = match c {
                    Value::Null => vec![],
                    Value::String(s) if s.is_empty() => vec![],
                    Value::String(s) => vec![s.clone()],
                    Value::Array(a) => a
                        .iter()
                        .map(|x| {
                            x.as_str().map(str::to_string).ok_or_else(|| format!("cell [{i}][{j}] lists a non-string"))
                        })
                        .collect::<std::result::Result<_, _>>()?,
                    _ => return Err(format!("cell [{i}][{j}] must be null, a device name or a list of names")),
                };
                if i == j && !names.is_empty() {
                    return Err(format!("cell [{i}][{i}] (a rank to itself) must be null"));
                }
                out.push(names);
            }
            cells.push(out);
        }
        for (i, row) in cells.iter().enumerate() {
            for (j, cell) in row.iter().enumerate() {
                if cell.is_empty() != cells[j][i].is_empty() {
                    return Err(format!(
                        "cell [{i}][{j}] and cell [{j}][{i}] disagree on whether ranks {i} and {j} are cabled"
                    ));
                }
            }
        }
        Ok(DeviceMatrix { cells })
    }

    /// Read the matrix from `path`.
    pub fn load(path: &std::path::Path, world: usize) -> Result<DeviceMatrix> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("BOLTCCL_IBV_DEVICES={}: cannot read: {e}", path.display())))?;
        DeviceMatrix::parse(&text, world)
            .map_err(|e| Error::Config(format!("BOLTCCL_IBV_DEVICES={}: {e}", path.display())))
    }

    /// A full mesh using `device` everywhere (tests, single-device hosts).
    pub fn uniform(world: usize, device: &str) -> DeviceMatrix {
        let cells = (0..world)
            .map(|i| (0..world).map(|j| if i == j { vec![] } else { vec![device.to_string()] }).collect())
            .collect();
        DeviceMatrix { cells }
    }

    /// Peers of `rank` without an RDMA device.
    pub fn uncabled(&self, rank: usize) -> Vec<usize> {
        (0..self.cells.len()).filter(|&j| j != rank && self.cells[rank][j].is_empty()).collect()
    }

    /// `cabled[i][j]`: ranks `i` and `j` have an RDMA link (`i == j` counts as linked).
    pub fn cabled(&self) -> Vec<Vec<bool>> {
        let n = self.cells.len();
        (0..n).map(|i| (0..n).map(|j| i == j || !self.cells[i][j].is_empty()).collect()).collect()
    }

    /// A digest of the cabling (cable counts per pair; device names differ per node and do
    /// not count), which all ranks compare: they pick algorithms from it, so they must agree.
    pub fn digest(&self) -> u32 {
        let mut h = 0x811c_9dc5u32;
        for row in &self.cells {
            for cell in row {
                h = (h ^ cell.len() as u32).wrapping_mul(0x0100_0193);
            }
        }
        h
    }
}

/// The first IPv4 address and prefix length of interface `iface`.
pub fn interface_ipv4(iface: &str) -> Option<(Ipv4Addr, u8)> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() && found.is_none() {
        // SAFETY: a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        // SAFETY: ifa_name is a NUL-terminated string.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
        if name == iface && !ifa.ifa_addr.is_null() && !ifa.ifa_netmask.is_null() {
            // SAFETY: non-null sockaddr; its family says which struct it is.
            if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) == libc::AF_INET {
                // SAFETY: AF_INET addresses are sockaddr_in (the netmask too).
                let (a, m) = unsafe {
                    (*(ifa.ifa_addr as *const libc::sockaddr_in), *(ifa.ifa_netmask as *const libc::sockaddr_in))
                };
                let addr = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                found = Some((addr, u32::from_be(m.sin_addr.s_addr).count_ones() as u8));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlx_format_with_nulls_names_and_lists() {
        let m = DeviceMatrix::parse(
            r#"[[null,"rdma_en3",["rdma_en4","rdma_en5"]],["rdma_en3",null,null],[["a","b"],null,null]]"#,
            3,
        )
        .unwrap();
        assert_eq!(m.cells[0][2], vec!["rdma_en4", "rdma_en5"]);
        assert_eq!(m.uncabled(1), vec![2]);
        assert!(DeviceMatrix::parse("[[null]]", 2).unwrap_err().contains("1 rows"));
        assert!(DeviceMatrix::parse(r#"[["x"]]"#, 1).unwrap_err().contains("must be null"));
        assert!(DeviceMatrix::parse(r#"[[null,"a"],[null,null]]"#, 2).unwrap_err().contains("disagree"));
        assert_eq!(DeviceMatrix::uniform(2, "rdma_lo").cells[1][0], vec!["rdma_lo"]);
    }

    #[test]
    fn cables_are_matched_by_subnet_whatever_the_order() {
        let ip = |c: u8, h: u8| Ipv4Addr::new(10, 9, c, h);
        let mine = [(ip(1, 1), Some(24)), (ip(2, 1), Some(24)), (ip(3, 1), Some(24))];
        assert_eq!(match_cables(&mine, &[ip(3, 2), ip(1, 2), ip(2, 2)]), Some(vec![1, 2, 0]));
        assert_eq!(match_cables(&mine, &[ip(1, 2), ip(2, 2), ip(3, 2)]), Some(vec![0, 1, 2]));
        // Link-local /16 on every port: the addresses cannot tell.
        let ll = |h: u8| Ipv4Addr::new(169, 254, 0, h);
        assert_eq!(match_cables(&[(ll(1), Some(16)), (ll(2), Some(16))], &[ll(3), ll(4)]), None);
        assert_eq!(match_cables(&[(ip(1, 1), None)], &[ip(1, 2)]), None);
        assert_eq!(match_cables(&mine[..2], &[ip(1, 2)]), None);
    }
}
