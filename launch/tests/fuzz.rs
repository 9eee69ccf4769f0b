//! Fuzzing the launcher's hostfile parser (`boltccl launch --hostfile`, `python -m
//! boltccl.launch --hostfile`) with the mutators of `boltccl/tests/fuzz.rs`: valid hostfiles
//! mutated byte by byte and value by value, and raw bytes. Never a panic; accepted only with at
//! least one host, each with a name; allocation bounded by the input's size.
//! `BOLTCCL_FUZZ_CASES` cases per target (CI: 2,000; `scripts/fuzz.sh`: 100,000).

#[path = "../../boltccl/tests/common/fuzz.rs"]
mod fuzzing;

use fuzzing::*;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::json;

#[global_allocator]
static ALLOC: Counting = Counting;

fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let text = String::from_utf8_lossy(bytes);
    let (r, peak) = peak_of(|| boltccl_launch::parse_hostfile(&text));
    prop_assert!(peak <= 64 * text.len() + 65_536, "{} bytes at once for {} bytes of input", peak, text.len());
    if let Ok(hosts) = r {
        prop_assert!(!hosts.is_empty(), "an empty hostfile was accepted");
    }
    Ok(())
}

fn run<S: Strategy>(name: &str, s: S, body: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let n = std::cell::Cell::new(0u64);
    let r = TestRunner::new(config()).run(&s, |v| {
        n.set(n.get() + 1);
        body(v)
    });
    println!("fuzz {name}: {} cases", n.get());
    if let Err(e) = r {
        panic!("fuzz {name}: {e}");
    }
}

#[test]
fn launcher_hostfile() {
    let samples = vec![
        json!(["mac1", "mac2"]),
        json!([{"ssh": "m1", "ips": ["10.0.0.1"]}, {"ssh": "m2", "ips": []}]),
        json!({"backend": "jaccl", "hosts": [{"ssh": "m1", "ips": ["1.2.3.4", "5.6.7.8"]}]}),
    ];
    let pick = proptest::sample::select(samples);
    run("launch_hostfile/json", pick.clone().prop_flat_map(json_mutated), |b| check(&b));
    run("launch_hostfile/mutated", pick.prop_flat_map(|v| mutated(serde_json::to_vec(&v).unwrap())), |b| check(&b));
    run("launch_hostfile/raw", proptest::collection::vec(any::<u8>(), 0..200), |b| check(&b));
}
