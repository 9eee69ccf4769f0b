//! `boltccl doctor` through a real verbs library (softverbs, the software provider built for
//! the tests): devices, port state, IPv4-mapped GID, and no errors.

use std::path::PathBuf;
use std::process::Command;

fn softverbs_lib() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_boltccl"));
    let dir = exe.parent().unwrap();
    for p in [dir.join("libsoftverbs.so"), dir.join("deps/libsoftverbs.so")] {
        if p.exists() {
            return p;
        }
    }
    panic!("libsoftverbs.so not found next to {}: build the workspace first", exe.display());
}

#[test]
fn doctor_sees_the_software_devices() {
    let lib = softverbs_lib();
    let o =
        Command::new(env!("CARGO_BIN_EXE_boltccl")).args(["doctor", "--json", "--library"]).arg(&lib).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let lo = r["devices"].as_array().unwrap().iter().find(|d| d["name"] == "rdma_lo").expect("rdma_lo listed");
    assert_eq!(lo["active"], true);
    assert_eq!(lo["ipv4_gid"], serde_json::json!([1, "127.0.0.1"]), "softverbs puts the mapped GID at index 1");
    assert_eq!(lo["prefix"], 8);
    let o = Command::new(env!("CARGO_BIN_EXE_boltccl")).args(["doctor", "--library"]).arg(&lib).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && !text.contains("[FAIL]"), "{text}");
    println!("{text}");
}
