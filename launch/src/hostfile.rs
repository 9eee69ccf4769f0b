//! The launcher's hostfile: MLX's launcher format (`[{"ssh": "mac1", "ips": ["10.0.0.1"]}, ...]`,
//! optionally inside `{"hosts": [...]}`) or a bare list of host names.

use boltccl::config::HostEntry;
use serde::Deserialize;
use std::path::Path;

/// Parse a launcher hostfile's text.
pub fn parse_hostfile(text: &str) -> Result<Vec<HostEntry>, String> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Launch {
        Names(Vec<String>),
        Hosts(Vec<HostEntry>),
        Object { hosts: Vec<HostEntry> },
    }
    let parsed: Launch = serde_json::from_str(text).map_err(|e| {
        format!("not a launcher hostfile ({e}); expected [{{\"ssh\": \"host\", \"ips\": [\"ip\"]}}, ...]")
    })?;
    let hosts = match parsed {
        Launch::Names(n) => n.into_iter().map(|ssh| HostEntry { ssh, ips: vec![] }).collect(),
        Launch::Hosts(h) | Launch::Object { hosts: h } => h,
    };
    if hosts.is_empty() {
        return Err("the hostfile lists no hosts".into());
    }
    Ok(hosts)
}

/// Read and parse a launcher hostfile; errors name the file.
pub fn load_hostfile(path: &Path) -> Result<Vec<HostEntry>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_hostfile(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn parser_never_panics(text in ".{0,200}") {
            let _ = parse_hostfile(&text);
        }
    }

    #[test]
    fn names_and_entries() {
        let l = parse_hostfile(r#"["a","b"]"#).unwrap();
        assert_eq!(l[1].ssh, "b");
        let l = parse_hostfile(r#"{"hosts":[{"ssh":"m1","ips":["1.2.3.4"]}]}"#).unwrap();
        assert_eq!(l[0].ips, vec!["1.2.3.4".to_string()]);
        assert!(parse_hostfile("[]").unwrap_err().contains("no hosts"));
        assert!(parse_hostfile("{").unwrap_err().contains("expected"));
    }
}
