//! Sans-I/O planning: which bytes go where, in which step. Pure functions, property-tested.

use std::ops::Range;

/// Split `n` items into `parts` contiguous ranges whose sizes differ by at most one (the
/// first ranges get the extra items). Every item lands in exactly one range.
pub fn partition(n: usize, parts: usize) -> Vec<Range<usize>> {
    assert!(parts > 0, "partition into zero parts");
    let (base, extra) = (n / parts, n % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

/// Cut `r` into pieces of at most `max` items. An empty range still yields one empty piece:
/// every planned message is sent, so ranks that disagree on sizes always meet a header to
/// compare instead of waiting for a message that never comes.
pub fn pieces(r: Range<usize>, max: usize) -> impl Iterator<Item = Range<usize>> + Clone {
    assert!(max > 0, "pieces of size zero");
    let n = r.len().div_ceil(max).max(1);
    (0..n).map(move |i| {
        let s = r.start + i * max;
        s.min(r.end)..(s + max).min(r.end)
    })
}

/// Number of pieces [`pieces`] yields.
pub fn piece_count(len: usize, max: usize) -> usize {
    len.div_ceil(max).max(1)
}

/// Scale a range of elements to bytes.
pub fn bytes(r: &Range<usize>, elem: usize) -> Range<usize> {
    r.start * elem..r.end * elem
}

/// Ring direction: `1` sends to the next rank, `-1` to the previous one.
pub type Dir = isize;

fn wrap(x: isize, size: usize) -> usize {
    x.rem_euclid(size as isize) as usize
}

/// (rank this rank sends to, rank it receives from) in direction `dir`.
pub fn ring_neighbors(rank: usize, size: usize, dir: Dir) -> (usize, usize) {
    (wrap(rank as isize + dir, size), wrap(rank as isize - dir, size))
}

/// Reduce-scatter step `step` (0..size-1) of a ring in direction `dir`: (block sent, block
/// received and reduced). After `size - 1` steps rank `r` holds the full reduction of block
/// [`ring_owned`]`(r, size, dir, 1)`.
pub fn ring_reduce_scatter_step(rank: usize, size: usize, dir: Dir, step: usize) -> (usize, usize) {
    let (r, s) = (rank as isize, step as isize);
    (wrap(r - dir * s, size), wrap(r - dir * (s + 1), size))
}

/// The block rank `rank` owns at the start of a ring all-gather: `offset` is 1 after a ring
/// reduce-scatter and 0 for a plain all-gather (each rank starts with its own block).
pub fn ring_owned(rank: usize, size: usize, dir: Dir, offset: usize) -> usize {
    wrap(rank as isize + dir * offset as isize, size)
}

/// All-gather step `step` (0..size-1) of a ring: (block sent, block received).
pub fn ring_all_gather_step(rank: usize, size: usize, dir: Dir, step: usize, offset: usize) -> (usize, usize) {
    let o = ring_owned(rank, size, dir, offset) as isize;
    let s = step as isize;
    (wrap(o - dir * s, size), wrap(o - dir * (s + 1), size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn partition_covers_every_item_once(n in 0usize..10_000, parts in 1usize..33) {
            let p = partition(n, parts);
            prop_assert_eq!(p.len(), parts);
            prop_assert_eq!(p[0].start, 0);
            prop_assert_eq!(p[parts - 1].end, n);
            for w in p.windows(2) {
                prop_assert_eq!(w[0].end, w[1].start);
                prop_assert!(w[0].len() >= w[1].len() && w[0].len() - w[1].len() <= 1);
            }
        }

        #[test]
        fn pieces_tile_the_range(start in 0usize..1000, len in 0usize..5000, max in 1usize..700) {
            let ps: Vec<_> = pieces(start..start + len, max).collect();
            prop_assert_eq!(ps.len(), piece_count(len, max));
            prop_assert_eq!(ps[0].start, start);
            prop_assert_eq!(ps.last().unwrap().end, start + len);
            for w in ps.windows(2) { prop_assert_eq!(w[0].end, w[1].start); }
            prop_assert!(ps.iter().all(|p| p.len() <= max && (len == 0 || !p.is_empty())));
        }

        #[test]
        fn ring_reduce_scatter_visits_every_rank_once(size in 1usize..17, fwd: bool) {
            let dir = if fwd { 1 } else { -1 };
            // Follow each block: who adds to it, in which order.
            let mut contributors: Vec<Vec<usize>> = vec![Vec::new(); size];
            for r in 0..size {
                let (sent, _) = ring_reduce_scatter_step(r, size, dir, 0);
                contributors[sent].push(r);
            }
            for step in 0..size.saturating_sub(1) {
                for r in 0..size {
                    let (to, from) = ring_neighbors(r, size, dir);
                    let (_, recv) = ring_reduce_scatter_step(r, size, dir, step);
                    // What `from` sent at this step is what `r` receives.
                    let (sent_by_from, _) = ring_reduce_scatter_step(from, size, dir, step);
                    prop_assert_eq!(sent_by_from, recv);
                    prop_assert_eq!(ring_neighbors(to, size, dir).1, r);
                    contributors[recv].push(r);
                }
            }
            for (block, c) in contributors.iter().enumerate() {
                let mut sorted = c.clone();
                sorted.sort();
                prop_assert_eq!(sorted, (0..size).collect::<Vec<_>>(), "block {} contributors {:?}", block, c);
                // The last contributor owns the block.
                let owner = *c.last().unwrap();
                prop_assert_eq!(ring_owned(owner, size, dir, 1), block);
            }
        }

        #[test]
        fn ring_all_gather_delivers_every_block(size in 1usize..17, fwd: bool, offset in 0usize..2) {
            let dir = if fwd { 1 } else { -1 };
            let mut have: Vec<Vec<bool>> = (0..size).map(|r| {
                let mut v = vec![false; size];
                v[ring_owned(r, size, dir, offset)] = true;
                v
            }).collect();
            for step in 0..size.saturating_sub(1) {
                let sent: Vec<usize> = (0..size).map(|r| ring_all_gather_step(r, size, dir, step, offset).0).collect();
                for (r, h) in have.iter().enumerate() {
                    prop_assert!(h[sent[r]], "rank {} sends block {} it does not have", r, sent[r]);
                }
                for (r, h) in have.iter_mut().enumerate() {
                    let (_, from) = ring_neighbors(r, size, dir);
                    let (_, recv) = ring_all_gather_step(r, size, dir, step, offset);
                    prop_assert_eq!(sent[from], recv);
                    prop_assert!(!h[recv], "block received twice");
                    h[recv] = true;
                }
            }
            prop_assert!(have.iter().all(|h| h.iter().all(|&b| b)));
        }
    }
}
