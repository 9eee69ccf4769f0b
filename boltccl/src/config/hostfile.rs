//! Hostfiles, in MLX's formats: the one MLX's launchers (and `BOLTCCL_HOSTFILE`) give a rank
//! (every rank's addresses), and the one a launcher starts ranks from (every host to ssh to).
//! One parser reads both shapes; each reader takes the ones it understands.

use serde::Deserialize;

#[derive(Deserialize)]
#[serde(untagged)]
enum HostfileText {
    /// MLX ring format: one list of "ip:port" per rank.
    Ring(Vec<Vec<String>>),
    /// A bare list of host names (launchers only).
    Names(Vec<String>),
    /// MLX launcher format: a bare list of hosts.
    Hosts(Vec<HostEntry>),
    /// MLX launcher format: `{"backend": ..., "envs": [...], "hosts": [...]}`.
    Object { hosts: Vec<HostEntry> },
}

/// One host of an MLX launcher hostfile.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct HostEntry {
    /// Host name to ssh to.
    pub ssh: String,
    /// Addresses of this host (the first one is used for boltccl traffic).
    #[serde(default)]
    pub ips: Vec<String>,
}

fn read(text: &str, what: &str, expected: &str) -> Result<HostfileText, String> {
    serde_json::from_str(text).map_err(|e| format!("not a {what} ({e}); expected {expected}"))
}

/// Parse a hostfile into the list of addresses of each rank. Accepts the MLX ring format
/// (list of lists of `"ip:port"`) and the MLX launcher format (host entries with `ssh`/`ips`).
pub fn parse_hostfile(text: &str) -> std::result::Result<Vec<Vec<String>>, String> {
    const EXPECTED: &str = "a JSON list of lists of \"ip:port\", or a list of {\"ssh\": ..., \"ips\": [...]}";
    let ranks = match read(text, "hostfile", EXPECTED)? {
        HostfileText::Ring(r) => r,
        HostfileText::Hosts(h) | HostfileText::Object { hosts: h } => {
            h.into_iter().map(|e| if e.ips.is_empty() { vec![e.ssh] } else { e.ips }).collect()
        }
        HostfileText::Names(_) => {
            return Err(format!(
                "not a hostfile (a list of host names, which only a launcher reads); expected {EXPECTED}"
            ))
        }
    };
    if ranks.is_empty() {
        return Err("the hostfile lists no ranks".into());
    }
    if let Some(i) = ranks.iter().position(|r| r.is_empty()) {
        return Err(format!("rank {i} has no address in the hostfile"));
    }
    Ok(ranks)
}

/// Parse a launcher's hostfile: MLX's launcher format (`[{"ssh": "mac1", "ips": ["10.0.0.1"]},
/// ...]`, optionally inside `{"hosts": [...]}`) or a bare list of host names.
pub fn parse_launch_hostfile(text: &str) -> Result<Vec<HostEntry>, String> {
    const EXPECTED: &str = "[{\"ssh\": \"host\", \"ips\": [\"ip\"]}, ...]";
    let hosts = match read(text, "launcher hostfile", EXPECTED)? {
        HostfileText::Names(n) => n.into_iter().map(|ssh| HostEntry { ssh, ips: vec![] }).collect(),
        HostfileText::Hosts(h) | HostfileText::Object { hosts: h } => h,
        HostfileText::Ring(r) if r.is_empty() => Vec::new(),
        HostfileText::Ring(_) => {
            return Err(format!(
                "not a launcher hostfile (lists of \"ip:port\" per rank: MLX's ring format, which a rank reads); expected {EXPECTED}"
            ))
        }
    };
    if hosts.is_empty() {
        return Err("the hostfile lists no hosts".into());
    }
    Ok(hosts)
}
