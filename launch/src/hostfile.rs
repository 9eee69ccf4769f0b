//! The launcher's hostfile: MLX's launcher format (`[{"ssh": "mac1", "ips": ["10.0.0.1"]}, ...]`,
//! optionally inside `{"hosts": [...]}`) or a bare list of host names.

use boltccl::config::HostEntry;
use std::path::Path;

/// Parse a launcher hostfile's text (the library's parser, which also reads the hostfile a
/// rank is given).
pub use boltccl::config::parse_launch_hostfile as parse_hostfile;

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
