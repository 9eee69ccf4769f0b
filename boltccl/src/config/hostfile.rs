//! The hostfile MLX's launchers (and `BOLTCCL_HOSTFILE`) give a rank: every rank's addresses.

use serde::Deserialize;

#[derive(Deserialize)]
#[serde(untagged)]
enum HostfileText {
    /// MLX ring format: one list of "ip:port" per rank.
    Ring(Vec<Vec<String>>),
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

/// Parse a hostfile into the list of addresses of each rank. Accepts the MLX ring format
/// (list of lists of `"ip:port"`) and the MLX launcher format (host entries with `ssh`/`ips`).
pub fn parse_hostfile(text: &str) -> std::result::Result<Vec<Vec<String>>, String> {
    let parsed: HostfileText = serde_json::from_str(text).map_err(|e| {
        format!("not a hostfile ({e}); expected a JSON list of lists of \"ip:port\", or a list of {{\"ssh\": ..., \"ips\": [...]}}")
    })?;
    let ranks = match parsed {
        HostfileText::Ring(r) => r,
        HostfileText::Hosts(h) | HostfileText::Object { hosts: h } => {
            h.into_iter().map(|e| if e.ips.is_empty() { vec![e.ssh] } else { e.ips }).collect()
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
