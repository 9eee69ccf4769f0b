//! What the fuzz harnesses share: byte-level mutation of valid inputs, random JSON values,
//! case counts from the environment, and an allocator that measures each case's peak.
//!
//! `BOLTCCL_FUZZ_CASES` sets the cases per target (CI runs the default, `scripts/fuzz.sh` runs
//! 100,000). Every target counts the cases it ran and prints `fuzz <target>: N cases`.

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Cases per target: `BOLTCCL_FUZZ_CASES`, else 2,000.
pub fn cases() -> u32 {
    std::env::var("BOLTCCL_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000)
}

/// The proptest configuration of every target: the case count above, failures printed (with
/// the shrunk input) rather than saved to the source tree.
pub fn config() -> Config {
    Config { cases: cases(), failure_persistence: Some(Box::new(FileFailurePersistence::Off)), ..Config::default() }
}

/// One mutation of a byte string.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Flip bit `bit` of the byte at (position mod length).
    Flip(usize, u8),
    /// Set the byte at (position mod length) to a value parsers tend to get wrong.
    Set(usize, u8),
    /// Insert bytes at (position mod length + 1).
    Insert(usize, Vec<u8>),
    /// Remove up to `n` bytes from (position mod length).
    Remove(usize, usize),
    /// Repeat up to `n` bytes from (position mod length) in place.
    Repeat(usize, usize),
    /// Cut the input at (position mod length + 1).
    Truncate(usize),
    /// Overwrite 1, 2, 4 or 8 bytes at (position mod length) with an extreme little-endian
    /// integer (0, max, max/2 + 1, or a small negative).
    Integer(usize, u8, u8),
}

fn interesting() -> impl Strategy<Value = u8> {
    prop_oneof![
        Just(0u8),
        Just(0xff),
        Just(0x7f),
        Just(0x80),
        Just(b'"'),
        Just(b'['),
        Just(b'{'),
        Just(b'-'),
        any::<u8>()
    ]
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(p, b)| Mutation::Flip(p, b)),
        (any::<usize>(), interesting()).prop_map(|(p, v)| Mutation::Set(p, v)),
        (any::<usize>(), proptest::collection::vec(interesting(), 1..16)).prop_map(|(p, v)| Mutation::Insert(p, v)),
        (any::<usize>(), 1usize..64).prop_map(|(p, n)| Mutation::Remove(p, n)),
        (any::<usize>(), 1usize..64).prop_map(|(p, n)| Mutation::Repeat(p, n)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 0u8..4, 0u8..4).prop_map(|(p, w, v)| Mutation::Integer(p, w, v)),
    ]
}

/// `base` after `muts`, in order.
pub fn mutate(base: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = base.to_vec();
    for m in muts {
        let at = |p: usize, b: &Vec<u8>| if b.is_empty() { 0 } else { p % b.len() };
        match m {
            Mutation::Flip(p, bit) if !b.is_empty() => {
                let i = at(*p, &b);
                b[i] ^= 1 << bit;
            }
            Mutation::Set(p, v) if !b.is_empty() => {
                let i = at(*p, &b);
                b[i] = *v;
            }
            Mutation::Insert(p, v) => {
                let i = if b.is_empty() { 0 } else { at(*p, &b) + 1 };
                b.splice(i..i, v.iter().copied());
            }
            Mutation::Remove(p, n) if !b.is_empty() => {
                let i = at(*p, &b);
                let end = (i + n).min(b.len());
                b.drain(i..end);
            }
            Mutation::Repeat(p, n) if !b.is_empty() => {
                let i = at(*p, &b);
                let end = (i + n).min(b.len());
                let dup: Vec<u8> = b[i..end].to_vec();
                b.splice(i..i, dup);
            }
            Mutation::Truncate(p) if !b.is_empty() => {
                let i = at(*p, &b) + 1;
                b.truncate(i);
            }
            Mutation::Integer(p, w, v) if !b.is_empty() => {
                let width = 1usize << w;
                let value: u64 = match v {
                    0 => 0,
                    1 => u64::MAX,
                    2 => 1 << (8 * width - 1),
                    _ => (-2i64) as u64,
                };
                let i = at(*p, &b);
                for (k, byte) in value.to_le_bytes()[..width].iter().enumerate() {
                    if let Some(x) = b.get_mut(i + k) {
                        *x = *byte;
                    }
                }
            }
            _ => {}
        }
    }
    b
}

/// A valid input with 1–8 mutations applied.
pub fn mutated(base: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(mutation(), 1..8).prop_map(move |m| mutate(&base, &m))
}

/// A JSON value: scalars of every kind (huge, negative and fractional numbers included),
/// strings, arrays and objects, nested a few levels.
pub fn json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{json, Value};
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|v| json!(v)),
        any::<u64>().prop_map(|v| json!(v)),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        Just(json!(1.5)),
        Just(json!(1e300)),
        (0u64..8).prop_map(|v| json!(v)),
        "[a-z_0-9.:]{0,12}".prop_map(Value::String),
        Just(json!("127.0.0.1:1")),
        Just(json!("rdma_lo")),
        Just(json!("")),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec(("[a-z_]{1,10}", inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// `v` with the value at a random path replaced by `with` (or `v` itself when the path runs out).
pub fn replace_at(v: &serde_json::Value, path: &[usize], with: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    let Some((&first, rest)) = path.split_first() else { return with };
    match v {
        Value::Array(a) if !a.is_empty() => {
            let i = first % a.len();
            let mut a = a.clone();
            a[i] = replace_at(&a[i], rest, with);
            Value::Array(a)
        }
        Value::Object(o) if !o.is_empty() => {
            let i = first % o.len();
            let mut o = o.clone();
            let key = o.keys().nth(i).expect("in range").clone();
            let inner = replace_at(&o[&key], rest, with);
            o.insert(key, inner);
            Value::Object(o)
        }
        _ => with,
    }
}

/// A valid JSON document with one sub-value (picked by a random path) replaced by a random
/// value, or one key dropped: structure-aware mutation.
pub fn json_mutated(base: serde_json::Value) -> impl Strategy<Value = Vec<u8>> {
    (proptest::collection::vec(any::<usize>(), 0..5), json(), any::<bool>()).prop_map(move |(path, with, drop_key)| {
        let mut v = replace_at(&base, &path, with);
        if drop_key {
            if let serde_json::Value::Object(o) = &mut v {
                if let Some(k) = o.keys().next().cloned() {
                    o.remove(&k);
                }
            }
        }
        serde_json::to_vec(&v).expect("a Value encodes")
    })
}

/// A counting allocator: each thread's live bytes and their peak, so a case's allocations are
/// measured apart from other tests running on other threads.
pub struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

/// Largest single allocation seen by any thread (a harness can bound it too).
pub static LARGEST: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are kept
// (thread-local cells with constant initialisers, which never allocate).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note_alloc(l.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note_alloc(l.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let _ = LIVE.try_with(|c| c.set(c.get().saturating_sub(l.size())));
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let _ = LIVE.try_with(|c| c.set(c.get().saturating_sub(l.size())));
        note_alloc(new);
        // SAFETY: forwarded with the caller's pointer, layout and new size.
        unsafe { System.realloc(p, l, new) }
    }
}

fn note_alloc(n: usize) {
    let _ = LIVE.try_with(|c| {
        let v = c.get() + n;
        c.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
    LARGEST.fetch_max(n as u64, Ordering::Relaxed);
}

/// Run `f`, returning its result and the most bytes it had allocated at once (on this thread).
pub fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    let peak = PEAK.with(Cell::get);
    (r, peak.saturating_sub(base))
}
