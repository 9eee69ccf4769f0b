//! Device discovery: one device `rdma_<iface>` per interface with an IPv4 address.

use std::ffi::CStr;
use std::net::Ipv4Addr;

use verbs_abi::{ibv_device, ibv_gid, IBV_NODE_CA, IBV_TRANSPORT_IB};

/// What a device stands for: an interface and its (first) IPv4 address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Interface name, e.g. `lo`.
    pub ifname: String,
    /// The interface's IPv4 address; QP sockets bind to it.
    pub ipv4: Ipv4Addr,
}

impl DeviceInfo {
    /// Device name: `rdma_<iface>`.
    pub fn name(&self) -> String {
        format!("rdma_{}", self.ifname)
    }

    /// The GID table: index 0 a link-local `fe80::` GID, index 1 the IPv4-mapped GID.
    pub fn gids(&self) -> [ibv_gid; 2] {
        let o = self.ipv4.octets();
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        // An EUI-64-looking interface id derived from the address (stable per interface).
        ll[8..16].copy_from_slice(&[0x02, 0x00, 0x5e, 0xff, o[0], o[1], o[2], o[3]]);
        let mapped = self.ipv4.to_ipv6_mapped().octets();
        [ibv_gid { raw: ll }, ibv_gid { raw: mapped }]
    }
}

/// A device as handed out by `ibv_get_device_list`: the ABI struct first, then our data.
#[repr(C)]
pub struct SoftDevice {
    /// The ABI-visible part; a `*mut ibv_device` points here.
    pub ibv: ibv_device,
    /// What it stands for.
    pub info: DeviceInfo,
}

fn fill_cstr(dst: &mut [libc::c_char], s: &str) {
    let max = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(max)) {
        *d = b as libc::c_char;
    }
}

impl SoftDevice {
    /// Build the ABI struct for `info`.
    pub fn new(info: DeviceInfo) -> SoftDevice {
        // SAFETY: ibv_device is plain data (ints, arrays, pointers); all-zero is valid.
        let mut ibv: ibv_device = unsafe { std::mem::zeroed() };
        ibv.node_type = IBV_NODE_CA;
        ibv.transport_type = IBV_TRANSPORT_IB;
        let name = info.name();
        fill_cstr(&mut ibv.name, &name);
        fill_cstr(&mut ibv.dev_name, &format!("softverbs_{}", info.ifname));
        fill_cstr(&mut ibv.dev_path, "/nonexistent/softverbs");
        fill_cstr(&mut ibv.ibdev_path, &format!("/nonexistent/softverbs/{name}"));
        SoftDevice { ibv, info }
    }
}

/// List the interfaces that have an IPv4 address, in `getifaddrs` order, one per interface.
pub fn discover() -> std::io::Result<Vec<DeviceInfo>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head to `head`; freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out: Vec<DeviceInfo> = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned and has not been freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr of at least sa_family's size.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        if family != libc::AF_INET {
            continue;
        }
        // SAFETY: family is AF_INET, so the address is a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        let ipv4 = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let ifname = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        if !out.iter().any(|d| d.ifname == ifname) {
            out.push(DeviceInfo { ifname, ipv4 });
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}
