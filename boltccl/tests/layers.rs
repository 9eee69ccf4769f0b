//! The library's layering (docs/architecture.md#layers) holds: `scripts/check-layers.py` finds
//! no `crate::`/`super::` edge against the declared order and no import circle, and it does
//! fail when the order is broken.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// False (SKIPPED, or a failure in CI) where there is no `python3` to run the check with.
fn have_python(test: &str) -> bool {
    let ok = Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        common::harness::prerequisite_missing(test, "python3 not found (it runs scripts/check-layers.py)");
    }
    ok
}

fn check(extra: &[&str]) -> std::process::Output {
    Command::new("python3")
        .arg(root().join("scripts/check-layers.py"))
        .args(extra)
        .output()
        .expect("python3 runs scripts/check-layers.py")
}

#[test]
fn the_modules_follow_the_declared_layers() {
    if !have_python("the_modules_follow_the_declared_layers") {
        return;
    }
    let out = check(&[]);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn an_edge_against_the_order_fails_the_check() {
    if !have_python("an_edge_against_the_order_fails_the_check") {
        return;
    }
    // The same picture with its first and last lines swapped: every edge into `types` now
    // points up.
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let swapped =
        doc.replacen("1: types error host", "1: fuzz lib", 1).replacen("9: fuzz lib", "9: types error host", 1);
    assert_ne!(doc, swapped, "the Layers block starts with types and ends with lib");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("architecture.md");
    std::fs::write(&path, swapped).unwrap();
    let out = check(&["--layers", path.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("against the declared order"), "{err}");
}
