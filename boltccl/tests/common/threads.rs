//! Ranks as threads of the test process.

use boltccl::Group;
use std::sync::Arc;

/// Run `f(rank, group)` for every group on its own thread; the results in rank order. A
/// panicking rank fails the test.
pub fn on_threads<T: Send + 'static>(
    groups: Vec<Group>,
    f: impl Fn(usize, &Group) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let hs: Vec<_> = groups
        .into_iter()
        .enumerate()
        .map(|(r, g)| {
            let f = f.clone();
            std::thread::spawn(move || f(r, &g))
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("a rank thread panicked")).collect()
}

/// Run `f(rank)` for ranks `0..n`, each on its own thread (for ranks that form their own
/// group, e.g. over TCP with `Group::new`); the results in rank order.
pub fn ranks_on_threads<T: Send + 'static>(n: usize, f: impl Fn(usize) -> T + Send + Sync + 'static) -> Vec<T> {
    let f = Arc::new(f);
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let f = f.clone();
            std::thread::spawn(move || f(r))
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("a rank thread panicked")).collect()
}
