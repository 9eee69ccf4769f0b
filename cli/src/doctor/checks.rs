//! The doctor's checks: the library's probe of this node (verbs library, devices, ports) and
//! the system's own tools (`sw_vers`, `rdma_ctl`, `ifconfig`, `ssh`), turned into findings.
//!
//! Plain functions returning [`Finding`]s, so the command only prints them and tests can feed
//! in captured command outputs. macOS-specific checks are chosen at run time (never with
//! `cfg(target_os)`), so their parsers compile and are tested on Linux too.

use boltccl::probe::{install_hint, open_device_hint, same_subnet, DeviceInfo, DeviceMatrix, RdmaProbe};
use boltccl::{Cabling, Shape};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Severity {
    /// Works.
    Ok,
    /// Works, but something is likely to bite.
    Warn,
    /// Broken: RDMA will not work until fixed.
    Error,
}

/// One thing doctor found, with its fix when something is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// How bad.
    pub severity: Severity,
    /// What was checked ("verbs library", "rdma_en3 port", ...).
    pub topic: String,
    /// What was seen.
    pub detail: String,
    /// What to do (empty when all is well).
    pub fix: String,
}

impl Finding {
    fn ok(topic: impl Into<String>, detail: impl Into<String>) -> Finding {
        Finding { severity: Severity::Ok, topic: topic.into(), detail: detail.into(), fix: String::new() }
    }
    fn bad(sev: Severity, topic: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding { severity: sev, topic: topic.into(), detail: detail.into(), fix: fix.into() }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tag = match self.severity {
            Severity::Ok => "ok  ",
            Severity::Warn => "WARN",
            Severity::Error => "FAIL",
        };
        write!(f, "[{tag}] {}: {}", self.topic, self.detail)?;
        if !self.fix.is_empty() {
            write!(f, "\n       fix: {}", self.fix)?;
        }
        Ok(())
    }
}

/// Everything doctor learns about one node; `--json` prints it for `--hosts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    /// Host name.
    pub host: String,
    /// `linux`, `macos`, ...
    pub os: String,
    /// OS version (macOS product version; kernel release elsewhere).
    pub os_version: String,
    /// boltccl version.
    pub version: String,
    /// The verbs library loaded, if any.
    pub library: Option<String>,
    /// Devices found.
    pub devices: Vec<DeviceInfo>,
    /// Findings, worst first.
    pub findings: Vec<Finding>,
}

/// Runs a command and returns its stdout, or `None` when it cannot run. Injected so tests
/// can replay captured outputs.
pub type Runner<'a> = &'a dyn Fn(&str, &[&str]) -> Option<String>;

/// Run a real command.
pub fn run_command(cmd: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(cmd).args(args).output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// Check this node: library, devices, ports, GIDs, limits, and on macOS the system settings.
pub fn check_local(library: Option<&Path>, run: Runner<'_>) -> NodeReport {
    let os = std::env::consts::OS.to_string();
    let mut findings = Vec::new();
    let os_version = if os == "macos" {
        let v = run("sw_vers", &["-productVersion"]).map(|s| s.trim().to_string()).unwrap_or_default();
        findings.extend(macos_findings(&v, run));
        v
    } else {
        rustix::system::uname().release().to_string_lossy().into_owned()
    };
    findings.push(match boltccl::probe::shared_memory() {
        Ok(id) => Finding::ok("shared memory", format!("ranks on this host share memory (host identity {id})")),
        Err(e) => Finding::bad(
            Severity::Warn,
            "shared memory",
            e.to_string(),
            "ranks on this host talk over TCP; check that memfd and unix sockets are allowed (containers, seccomp)",
        ),
    });
    findings.extend(huge_pages_finding(boltccl::probe::transparent_huge_pages().as_deref()));
    let mut devices = Vec::new();
    let mut lib_name = None;
    let probe = RdmaProbe::load(library);
    match probe.library() {
        Err(e) => findings.push(Finding::bad(Severity::Error, "verbs library", e.to_string(), install_hint())),
        Ok(path) => {
            lib_name = Some(path.display().to_string());
            findings.push(Finding::ok("verbs library", format!("{} loaded, all 16 verbs present", path.display())));
            match probe.device_names() {
                Err(e) => {
                    let fix = if e.to_string().contains("no RDMA support") {
                        "load the RDMA kernel modules for your device (or use BOLTCCL_BACKEND=tcp)"
                    } else {
                        install_hint()
                    };
                    findings.push(Finding::bad(Severity::Error, "devices", e.to_string(), fix))
                }
                Ok(names) if names.is_empty() => findings.push(Finding::bad(
                    Severity::Error,
                    "devices",
                    "the library lists no RDMA device",
                    "connect a Thunderbolt 5 cable and enable RDMA (`rdma_ctl enable` in Recovery on a Mac), or load \
                     the provider for your NIC",
                )),
                Ok(names) => {
                    for name in names {
                        match probe.device(&name) {
                            Ok(info) => {
                                findings.append(&mut device_findings(&info));
                                devices.push(info);
                            }
                            Err(e) => {
                                findings.push(Finding::bad(Severity::Error, name, e.to_string(), open_device_hint()))
                            }
                        }
                    }
                }
            }
        }
    }
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity as u8));
    NodeReport {
        host: boltccl::probe::host_name(),
        os,
        os_version,
        version: boltccl::VERSION.to_string(),
        library: lib_name,
        devices,
        findings,
    }
}

/// What one opened device's port, GID and limits mean.
fn device_findings(d: &DeviceInfo) -> Vec<Finding> {
    let name = &d.name;
    let mut f = Vec::new();
    if d.active {
        f.push(Finding::ok(format!("{name} port"), "active"));
    } else {
        f.push(Finding::bad(
            Severity::Error,
            format!("{name} port"),
            format!("port 1 is not active (state {})", d.port_state),
            "plug in the cable (Thunderbolt 5 on both ends) and check that the peer is awake (disable idle sleep)",
        ));
    }
    match d.ipv4_gid {
        Some((i, a)) => f.push(Finding::ok(format!("{name} GID"), format!("IPv4-mapped GID at index {i} ({a})"))),
        None => f.push(Finding::bad(
            Severity::Error,
            format!("{name} GID"),
            "no IPv4-mapped GID (every queue pair's RTR would fail with errno 22)",
            "give the interface an IPv4 address, e.g. `sudo ifconfig <iface> inet 169.254.0.1 netmask 255.255.0.0 \
             alias` on a Mac; and disable the Thunderbolt Bridge",
        )),
    }
    let limits = match (d.max_qp, d.max_mr) {
        (Some(q), Some(m)) => format!("device reports {q} QPs, {m} MRs"),
        _ => "ibv_query_device not exported; assuming Apple's limits".into(),
    };
    f.push(Finding::ok(
        format!("{name} limits"),
        format!("{limits}; boltccl uses 1 QP and 2 MRs per peer (Apple allows 10 QPs and ~100 MRs per device)"),
    ));
    f
}

/// macOS checks: OS version, `rdma_ctl status`, Thunderbolt Bridge.
pub fn macos_findings(version: &str, run: Runner<'_>) -> Vec<Finding> {
    let mut f = vec![check_macos_version(version)];
    f.push(match run("rdma_ctl", &["status"]) {
        Some(out) => parse_rdma_ctl_status(&out),
        None => Finding::bad(
            Severity::Error,
            "rdma_ctl",
            "`rdma_ctl` is not available",
            "RDMA over Thunderbolt needs macOS 26.2 or later",
        ),
    });
    f.push(parse_bridge(run("ifconfig", &["bridge0"]).as_deref()));
    f
}

/// How the kernel's huge page mode serves shared-memory transfers (none where the kernel has
/// no such mode, as on macOS).
pub fn huge_pages_finding(mode: Option<&str>) -> Option<Finding> {
    const TOPIC: &str = "huge pages";
    Some(match mode? {
        "always" => Finding::ok(TOPIC, "transparent huge pages always: large buffers get them"),
        "madvise" => Finding::ok(
            TOPIC,
            "transparent huge pages on request: numpy's arrays get them; torch's tensors only with \
             THP_MEM_ALLOC_ENABLE=1 (large shared-memory transfers run up to twice as fast on them)",
        ),
        other => Finding::bad(
            Severity::Warn,
            TOPIC,
            format!("transparent huge pages {other}: large shared-memory transfers run up to twice as slow"),
            "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (as root)",
        ),
    })
}

/// macOS 26.2 is the first with RDMA over Thunderbolt; 26.3 allows larger frames.
pub fn check_macos_version(v: &str) -> Finding {
    let mut parts = v.trim().split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) < (26, 2) {
        Finding::bad(
            Severity::Error,
            "macOS version",
            format!("macOS {v}: RDMA over Thunderbolt needs 26.2 or later"),
            "update macOS on every node, to the same version (mixed versions break RDMA discovery)",
        )
    } else if (major, minor) < (26, 3) {
        Finding::bad(
            Severity::Warn,
            "macOS version",
            format!("macOS {v}: only 4 KiB RDMA frames"),
            "update to 26.3 or later for larger frames; keep every node on the same version",
        )
    } else {
        Finding::ok("macOS version", format!("macOS {v} (all nodes must run the same version)"))
    }
}

/// Parse `rdma_ctl status` output ("RDMA is enabled" / "disabled").
pub fn parse_rdma_ctl_status(out: &str) -> Finding {
    let l = out.to_ascii_lowercase();
    if l.contains("disabled") || l.contains("not enabled") {
        Finding::bad(
            Severity::Error,
            "rdma_ctl",
            format!("RDMA is disabled ({})", out.trim()),
            "boot into Recovery, open Terminal, run `rdma_ctl enable`, reboot (or use the System Settings toggle on \
             newer macOS)",
        )
    } else if l.contains("enabled") {
        Finding::ok("rdma_ctl", "RDMA is enabled")
    } else {
        Finding::bad(
            Severity::Warn,
            "rdma_ctl",
            format!("unrecognised output: {}", out.trim()),
            "run `rdma_ctl status` by hand",
        )
    }
}

/// Parse `ifconfig bridge0`: an active bridge with Thunderbolt members breaks RTR (errno 22).
pub fn parse_bridge(out: Option<&str>) -> Finding {
    let Some(out) = out.filter(|o| o.contains("flags=")) else {
        return Finding::ok("Thunderbolt Bridge", "no bridge0 interface");
    };
    let up = out.lines().next().is_some_and(|l| l.contains("<UP") || l.contains(",UP"));
    let members: Vec<&str> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("member: "))
        .map(|m| m.split_whitespace().next().unwrap_or(""))
        .collect();
    if up && !members.is_empty() {
        Finding::bad(
            Severity::Error,
            "Thunderbolt Bridge",
            format!("bridge0 is up with members {}: every queue pair's RTR fails with errno 22", members.join(", ")),
            "System Settings > Network > Thunderbolt Bridge > Disable (or `sudo ifconfig bridge0 down`; macOS \
             re-enables it after updates)",
        )
    } else {
        Finding::ok("Thunderbolt Bridge", "bridge0 is down or has no members")
    }
}

/// Checks across nodes: versions (boltccl and OS) must match.
pub fn check_versions(reports: &[NodeReport]) -> Vec<Finding> {
    let mut f = Vec::new();
    let first = &reports[0];
    for r in &reports[1..] {
        if r.version != first.version {
            f.push(Finding::bad(
                Severity::Error,
                "boltccl version",
                format!("{} runs {} but {} runs {}", r.host, r.version, first.host, first.version),
                "install the same boltccl version on every node",
            ));
        }
        if r.os != first.os || r.os_version != first.os_version {
            f.push(Finding::bad(
                Severity::Error,
                "OS version",
                format!(
                    "{} runs {} {} but {} runs {} {}",
                    r.host, r.os, r.os_version, first.host, first.os, first.os_version
                ),
                "update every node to the same OS version (mixed macOS versions break RDMA discovery)",
            ));
        }
    }
    if f.is_empty() {
        f.push(Finding::ok(
            "versions",
            format!("all {} nodes run boltccl {} on {} {}", reports.len(), first.version, first.os, first.os_version),
        ));
    }
    f
}

/// Infer which devices are cabled together: two devices on different nodes whose IPv4
/// addresses share a subnet (each cable gets its own subnet, e.g. a /30). Returns the device
/// matrix and the shape its cables form.
pub fn infer_matrix(reports: &[NodeReport]) -> (DeviceMatrix, Shape) {
    let n = reports.len();
    let mut cells = vec![vec![Vec::<String>::new(); n]; n];
    for i in 0..n {
        for j in 0..n {
            if i == j {
                continue;
            }
            for a in &reports[i].devices {
                let Some((_, ip_a)) = a.ipv4_gid else { continue };
                let prefix = a.prefix.unwrap_or(30);
                let cabled = reports[j]
                    .devices
                    .iter()
                    .any(|b| b.ipv4_gid.is_some_and(|(_, ip_b)| ip_b != ip_a && same_subnet(ip_a, ip_b, prefix)));
                if cabled {
                    cells[i][j].push(a.name.clone());
                }
            }
        }
    }
    let matrix = DeviceMatrix { cells };
    // The same classification the library's algorithm choice uses.
    let shape = Cabling::from_links(matrix.cabled()).shape();
    (matrix, shape)
}

/// The device matrix as JSON (MLX format: null, a name, or a list of names).
pub fn matrix_json(m: &DeviceMatrix) -> String {
    let rows: Vec<serde_json::Value> = m
        .cells
        .iter()
        .map(|row| {
            serde_json::Value::Array(
                row.iter()
                    .map(|c| match c.len() {
                        0 => serde_json::Value::Null,
                        1 => serde_json::Value::String(c[0].clone()),
                        _ => serde_json::Value::Array(c.iter().cloned().map(serde_json::Value::String).collect()),
                    })
                    .collect(),
            )
        })
        .collect();
    serde_json::to_string_pretty(&rows).expect("JSON of strings")
}

/// Ask each host for its report over ssh (`ssh HOST boltccl doctor --json`).
pub fn gather(hosts: &[String], run: Runner<'_>) -> Vec<Result<NodeReport, String>> {
    hosts
        .iter()
        .map(|h| {
            let out = run("ssh", &["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", h, "boltccl", "doctor", "--json"])
                .ok_or_else(|| format!("{h}: cannot run ssh"))?;
            let start =
                out.find('{').ok_or_else(|| format!("{h}: no report (is boltccl installed there?): {}", out.trim()))?;
            serde_json::from_str(&out[start..]).map_err(|e| format!("{h}: unreadable report ({e})"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn rdma_ctl_outputs() {
        assert_eq!(parse_rdma_ctl_status("RDMA is enabled\n").severity, Severity::Ok);
        let f = parse_rdma_ctl_status("RDMA is disabled\n");
        assert_eq!(f.severity, Severity::Error);
        assert!(f.fix.contains("rdma_ctl enable"));
        assert_eq!(parse_rdma_ctl_status("weird").severity, Severity::Warn);
    }

    /// Captured `ifconfig bridge0` output of a Mac with the Thunderbolt Bridge on.
    const BRIDGE_ON: &str = "bridge0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500
\toptions=63<RXCSUM,TXCSUM,TSO4,TSO6>
\tether 36:2d:0b:4a:1c:00
\tConfiguration:
\t\tid 0:0:0:0:0:0 priority 0 hellotime 0 fwddelay 0
\tmember: en2 flags=3<LEARNING,DISCOVER>
\t        ifmaxaddr 0 port 9 priority 0 path cost 0
\tmember: en3 flags=3<LEARNING,DISCOVER>
\t        ifmaxaddr 0 port 10 priority 0 path cost 0
\tstatus: active
";

    #[test]
    fn thunderbolt_bridge() {
        let f = parse_bridge(Some(BRIDGE_ON));
        assert_eq!(f.severity, Severity::Error);
        assert!(f.detail.contains("en2, en3") && f.detail.contains("errno 22"), "{f}");
        let off = BRIDGE_ON.replace("flags=8863<UP,", "flags=8822<");
        assert_eq!(parse_bridge(Some(&off)).severity, Severity::Ok);
        assert_eq!(parse_bridge(Some("ifconfig: interface bridge0 does not exist")).severity, Severity::Ok);
        assert_eq!(parse_bridge(None).severity, Severity::Ok);
    }

    #[test]
    fn huge_page_modes() {
        assert_eq!(huge_pages_finding(None), None);
        assert_eq!(huge_pages_finding(Some("always")).unwrap().severity, Severity::Ok);
        let m = huge_pages_finding(Some("madvise")).unwrap();
        assert!(m.severity == Severity::Ok && m.detail.contains("THP_MEM_ALLOC_ENABLE=1"), "{m}");
        let n = huge_pages_finding(Some("never")).unwrap();
        assert!(n.severity == Severity::Warn && n.fix.contains("madvise"), "{n}");
    }

    #[test]
    fn macos_versions() {
        assert_eq!(check_macos_version("15.6.1").severity, Severity::Error);
        assert_eq!(check_macos_version("26.2").severity, Severity::Warn);
        assert_eq!(check_macos_version("26.3.1").severity, Severity::Ok);
    }

    #[test]
    fn macos_checks_through_a_replayed_runner() {
        let run = |cmd: &str, _: &[&str]| -> Option<String> {
            match cmd {
                "rdma_ctl" => Some("RDMA is disabled".into()),
                "ifconfig" => Some(BRIDGE_ON.into()),
                _ => None,
            }
        };
        let f = macos_findings("26.2", &run);
        assert_eq!(f.iter().filter(|f| f.severity == Severity::Error).count(), 2, "{f:?}");
    }

    fn node(host: &str, devs: &[(&str, [u8; 4])]) -> NodeReport {
        NodeReport {
            host: host.into(),
            os: "macos".into(),
            os_version: "26.3".into(),
            version: "0.1.0".into(),
            library: None,
            devices: devs
                .iter()
                .map(|(n, ip)| DeviceInfo {
                    name: n.to_string(),
                    active: true,
                    port_state: 4,
                    mtu: 4096,
                    ipv4_gid: Some((1, Ipv4Addr::from(*ip))),
                    prefix: Some(30),
                    max_qp: None,
                    max_mr: None,
                })
                .collect(),
            findings: vec![],
        }
    }

    #[test]
    fn cabling_mesh_ring_and_versions() {
        // Three Macs fully meshed, one /30 per cable.
        let a = node("a", &[("rdma_en2", [10, 0, 0, 1]), ("rdma_en3", [10, 0, 0, 5])]);
        let b = node("b", &[("rdma_en3", [10, 0, 0, 2]), ("rdma_en2", [10, 0, 0, 9])]);
        let c = node("c", &[("rdma_en2", [10, 0, 0, 6]), ("rdma_en4", [10, 0, 0, 10])]);
        let (m, shape) = infer_matrix(&[a.clone(), b.clone(), c.clone()]);
        assert_eq!(shape, Shape::AllPairs);
        assert_eq!(m.cells[0][1], vec!["rdma_en2"]);
        assert_eq!(m.cells[1][0], vec!["rdma_en3"]);
        assert_eq!(m.cells[2][1], vec!["rdma_en4"]);
        let json = matrix_json(&m);
        assert_eq!(DeviceMatrix::parse(&json, 3).unwrap(), m);
        // Four in a ring: 0-1, 1-2, 2-3, 3-0.
        let r = [
            node("a", &[("rdma_en2", [10, 0, 1, 1]), ("rdma_en3", [10, 0, 4, 2])]),
            node("b", &[("rdma_en2", [10, 0, 1, 2]), ("rdma_en3", [10, 0, 2, 1])]),
            node("c", &[("rdma_en2", [10, 0, 2, 2]), ("rdma_en3", [10, 0, 3, 1])]),
            node("d", &[("rdma_en2", [10, 0, 3, 2]), ("rdma_en3", [10, 0, 4, 1])]),
        ];
        assert_eq!(infer_matrix(&r).1, Shape::Ring);
        let mut old = c.clone();
        old.os_version = "26.2".into();
        let f = check_versions(&[a, b, old]);
        assert!(f.iter().any(|f| f.severity == Severity::Error && f.detail.contains("26.2")), "{f:?}");
    }

    #[test]
    fn gather_reads_each_hosts_json_over_ssh() {
        let a = node("a", &[("rdma_en2", [10, 0, 0, 1])]);
        let json = serde_json::to_string(&a).unwrap();
        let run = move |cmd: &str, args: &[&str]| -> Option<String> {
            assert_eq!(cmd, "ssh");
            match args.iter().find(|x| x.starts_with("host-")) {
                Some(&"host-a") => Some(format!("motd banner\n{json}\n")),
                Some(&"host-b") => Some("bash: boltccl: command not found".into()),
                _ => None,
            }
        };
        let r = gather(&["host-a".into(), "host-b".into()], &run);
        assert_eq!(r[0].as_ref().unwrap(), &a);
        let e = r[1].as_ref().unwrap_err();
        assert!(e.contains("host-b") && e.contains("is boltccl installed there"), "{e}");
    }

    #[test]
    fn local_check_without_a_library_says_what_to_install() {
        let r = check_local(Some(Path::new("/nonexistent/libibverbs.so.1")), &|_, _| None);
        assert_eq!(r.findings[0].severity, Severity::Error);
        assert_eq!(r.findings[0].topic, "verbs library");
        assert!(!r.findings[0].fix.is_empty());
    }
}
