//! The collectives are declared once (`boltccl::CALLS`, `TYPED_CALLS`, `BYTE_CALLS`), and every
//! surface offers exactly those: `Group` and `Scope` (typed), `Bytes` (byte-level), the C header
//! (blocking and `_async`) and the Python stubs. A call added to one surface and not the others
//! fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `pub fn` names of the impl block that starts with `start` in `text`.
fn methods(text: &str, start: &str) -> BTreeSet<String> {
    let from = text.find(start).unwrap_or_else(|| panic!("no `{start}`"));
    let body = &text[from..];
    let body = &body[..body.find("\n}\n").expect("the impl block ends")];
    body.lines()
        .filter_map(|l| l.trim().strip_prefix("pub fn "))
        .map(|l| l.split(['<', '(']).next().unwrap().to_string())
        .collect()
}

fn set(names: &[&[&str]]) -> BTreeSet<String> {
    names.iter().flat_map(|n| n.iter().map(|s| s.to_string())).collect()
}

#[test]
fn group_and_scope_offer_every_call() {
    let typed = set(&[boltccl::CALLS, boltccl::TYPED_CALLS]);
    let group = methods(&read("boltccl/src/group/mod.rs"), "impl Group {");
    let missing: Vec<_> = typed.difference(&group).collect();
    assert!(missing.is_empty(), "Group lacks {missing:?}");
    let scope = methods(&read("boltccl/src/request.rs"), "impl<'scope> Scope<'scope, '_> {");
    let mut expected = typed.clone();
    expected.insert("start".into());
    assert_eq!(scope, expected, "Scope's calls differ from boltccl::CALLS + TYPED_CALLS (+ start)");
}

#[test]
fn bytes_offers_the_byte_level_calls() {
    let bytes = methods(&read("boltccl/src/group/bytes.rs"), "impl Bytes<'_> {");
    assert_eq!(bytes, set(&[boltccl::BYTE_CALLS]));
}

#[test]
fn c_and_python_offer_every_call() {
    let header = read("include/boltccl.h");
    let stubs = read("python/boltccl/_native.pyi");
    for name in boltccl::CALLS {
        for c in [format!("boltccl_{name}("), format!("boltccl_{name}_async(")] {
            assert!(header.contains(&c), "include/boltccl.h lacks {c}");
        }
        assert!(stubs.contains(&format!("    def {name}(")), "python/boltccl/_native.pyi lacks Group.{name}");
    }
    // And nothing beyond them: every C call that starts a collective is in the list.
    let c_calls: BTreeSet<String> = header
        .split("boltccl_")
        .skip(1)
        .filter_map(|s| s.split('(').next().filter(|n| n.ends_with("_async")))
        .map(|n| n.trim_end_matches("_async").to_string())
        .collect();
    assert_eq!(c_calls, set(&[boltccl::CALLS]), "the C header's _async calls differ from boltccl::CALLS");
}
