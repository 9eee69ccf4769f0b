//! The registration cache for zero-copy sends: which caller memory is registered with one
//! protection domain, bounded so the device's registration limit (about 100 per device on
//! Apple's provider, staging included) is never reached.
//!
//! Entries are evicted least recently used first, but never one used in the current exchange:
//! its sends may still be in flight, and deregistering memory the device is reading is
//! undefined. When every entry is in use, or registration fails, the piece is simply sent
//! through the staging slots instead — the cache can slow a transfer down, never fail it.

/// One cached registration of `[start, start + len)`.
struct Entry<R> {
    start: usize,
    len: usize,
    region: R,
    /// The exchange that used it last.
    used: u64,
}

/// Counters for the log line at teardown.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered by an existing registration.
    pub hits: u64,
    /// Registrations made.
    pub registered: u64,
    /// Registrations dropped to make room.
    pub evicted: u64,
    /// Pieces sent through staging because no registration could be had.
    pub fallbacks: u64,
}

/// At most `capacity` registrations (`R` deregisters on drop).
pub struct RegCache<R> {
    capacity: usize,
    entries: Vec<Entry<R>>,
    epoch: u64,
    /// Counters, for the log.
    pub stats: CacheStats,
}

impl<R> RegCache<R> {
    /// An empty cache holding at most `capacity` registrations.
    pub fn new(capacity: usize) -> RegCache<R> {
        RegCache { capacity: capacity.max(1), entries: Vec::new(), epoch: 0, stats: CacheStats::default() }
    }

    /// A new exchange begins: entries used before it may be evicted again.
    pub fn next_exchange(&mut self) {
        self.epoch += 1;
    }

    /// The registration covering `[addr, addr + len)`; on a miss, registers `extent()` (which
    /// must contain it, and is only worked out then) with `register`. `None`: send this piece
    /// through staging.
    pub fn lookup(
        &mut self,
        addr: usize,
        len: usize,
        extent: impl FnOnce() -> (usize, usize),
        register: impl FnOnce(usize, usize) -> Option<R>,
    ) -> Option<&R> {
        let epoch = self.epoch;
        if let Some(i) = self.position(addr, len) {
            self.stats.hits += 1;
            self.entries[i].used = epoch;
            return Some(&self.entries[i].region);
        }
        if self.entries.len() >= self.capacity {
            let idle = self.entries.iter().enumerate().filter(|(_, e)| e.used < epoch).min_by_key(|(_, e)| e.used);
            let Some((i, _)) = idle else {
                self.stats.fallbacks += 1;
                return None;
            };
            self.entries.swap_remove(i);
            self.stats.evicted += 1;
        }
        let extent = extent();
        debug_assert!(extent.0 <= addr && addr + len <= extent.0 + extent.1, "extent must contain the piece");
        let Some(region) = register(extent.0, extent.1) else {
            self.stats.fallbacks += 1;
            return None;
        };
        self.stats.registered += 1;
        self.entries.push(Entry { start: extent.0, len: extent.1, region, used: epoch });
        self.entries.last().map(|e| &e.region)
    }

    /// The registration covering `[addr, addr + len)`, if any (no registering, no evicting).
    pub fn find(&self, addr: usize, len: usize) -> Option<&R> {
        self.position(addr, len).map(|i| &self.entries[i].region)
    }

    /// The entry whose registration covers `[addr, addr + len)`.
    fn position(&self, addr: usize, len: usize) -> Option<usize> {
        self.entries.iter().position(|e| addr >= e.start && addr + len <= e.start + e.len)
    }

    /// Registrations held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The extent around `[addr, addr + len)` formed by `ranges` (start, len) that touch it,
/// transitively: pieces of one buffer sent in one exchange become one registration.
pub fn extent_of(ranges: &[(usize, usize)], addr: usize, len: usize) -> (usize, usize) {
    let mut sorted: Vec<(usize, usize)> = ranges.iter().copied().filter(|r| r.1 > 0).collect();
    sorted.sort_unstable();
    let (mut lo, mut hi) = (addr, addr + len);
    // Grow to the right, then to the left, over ranges that touch the current extent.
    for &(s, l) in &sorted {
        if s <= hi && s + l > hi && s + l > lo {
            hi = hi.max(s + l);
        }
    }
    for &(s, l) in sorted.iter().rev() {
        if s + l >= lo && s < lo {
            lo = s;
        }
    }
    (lo, hi - lo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hits_reuse_and_misses_register_the_extent() {
        let mut c: RegCache<u32> = RegCache::new(2);
        let mut made = 0;
        let mut reg = |_s: usize, _l: usize| {
            made += 1;
            Some(made)
        };
        assert_eq!(c.lookup(100, 10, || (100, 50), &mut reg), Some(&1));
        assert_eq!(c.lookup(120, 30, || (100, 50), &mut reg), Some(&1), "inside the registered extent");
        assert_eq!(c.stats, CacheStats { hits: 1, registered: 1, evicted: 0, fallbacks: 0 });
    }

    #[test]
    fn never_evicts_what_this_exchange_uses_and_falls_back_instead() {
        let mut c: RegCache<u32> = RegCache::new(2);
        let mut n = 0;
        let mut reg = |_s: usize, _l: usize| {
            n += 1;
            Some(n)
        };
        c.lookup(0, 10, || (0, 10), &mut reg);
        c.lookup(100, 10, || (100, 10), &mut reg);
        // Full, both used in this exchange: the third piece goes through staging.
        assert_eq!(c.lookup(200, 10, || (200, 10), &mut reg), None);
        assert_eq!(c.stats.fallbacks, 1);
        c.next_exchange();
        c.lookup(100, 10, || (100, 10), &mut reg); // touch: now the entry at 0 is the oldest
        assert_eq!(c.lookup(200, 10, || (200, 10), &mut reg), Some(&3));
        assert_eq!(c.stats.evicted, 1);
        assert!(c.lookup(0, 10, || (0, 10), |_, _| None).is_none(), "evicted, and registration now fails");
        assert_eq!(c.len(), 2);
    }

    proptest! {
        #[test]
        fn extent_contains_the_piece_and_only_touching_ranges(
            ranges in proptest::collection::vec((0usize..1000, 0usize..100), 0..12),
            pick in 0usize..12,
        ) {
            prop_assume!(!ranges.is_empty());
            let (a, l) = ranges[pick % ranges.len()];
            let (s, n) = extent_of(&ranges, a, l);
            prop_assert!(s <= a && a + l <= s + n);
            // Every byte of the extent belongs to the piece or to some range.
            for x in (s..s + n).step_by(7) {
                prop_assert!((a..a + l).contains(&x) || ranges.iter().any(|&(rs, rl)| (rs..rs + rl).contains(&x)));
            }
        }
    }
}
