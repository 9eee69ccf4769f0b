//! Splitting the CPU kernels' work across threads (`pool`).

use super::pool;

pub use pool::{set_threads, threads};

/// Work items per task for `n` items: about four tasks per thread (so an uneven finish costs
/// little), a multiple of `align` (the kernels' row groups, or whole quantisation blocks), and
/// at least `min` (a task must pay for its hand-off).
pub fn per_task(n: usize, align: usize, min: usize) -> usize {
    let t = threads();
    if t <= 1 {
        return n.max(1);
    }
    n.div_ceil(4 * t).max(min).next_multiple_of(align)
}

/// A pointer that may cross to the pool's threads, for handing out disjoint pieces of a slice.
struct Base<T>(*mut T);
impl<T> Clone for Base<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Base<T> {}
// SAFETY: only used to rebuild disjoint sub-slices of a `&mut [T]` with `T: Send`, each handed
// to exactly one task (see `piece`).
unsafe impl<T: Send> Sync for Base<T> {}

impl<T> Base<T> {
    /// Piece `i` of `len` items cut in pieces of `chunk`.
    ///
    /// # Safety
    /// `self` comes from a live `&mut [T]` of `len` items, and each `i` is used once at a time.
    unsafe fn piece<'a>(self, i: usize, chunk: usize, len: usize) -> &'a mut [T] {
        let start = i * chunk;
        // SAFETY: the caller keeps this function's contract (a live `&mut [T]` of `len` items,
        // each piece handed out once at a time), and `start < len` for every piece index.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), chunk.min(len - start)) }
    }
}

/// `f(index, piece)` for every `chunk`-sized piece of `out` (the last may be shorter), spread
/// over the pool's threads.
pub fn for_each_chunk<T: Send>(out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let chunk = chunk.max(1);
    let (len, base) = (out.len(), Base(out.as_mut_ptr()));
    pool::global().run(len.div_ceil(chunk), |i| {
        // SAFETY: `out` is borrowed mutably for this whole call; pieces are disjoint and the
        // pool runs each index once.
        f(i, unsafe { base.piece(i, chunk, len) })
    });
}

/// [`for_each_chunk`] over two slices cut in step: piece `i` is `a[i * ca..]` (`ca` long) with
/// `b[i * cb..]` (`cb` long); both must hold the same number of pieces.
pub fn for_each_chunk2<A: Send, B: Send>(
    a: &mut [A],
    ca: usize,
    b: &mut [B],
    cb: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
) {
    let (ca, cb) = (ca.max(1), cb.max(1));
    let n = a.len().div_ceil(ca);
    assert_eq!(n, b.len().div_ceil(cb), "pieces do not line up");
    let (la, pa, lb, pb) = (a.len(), Base(a.as_mut_ptr()), b.len(), Base(b.as_mut_ptr()));
    pool::global().run(n, |i| {
        // SAFETY: as in `for_each_chunk`, for each of the two slices.
        f(i, unsafe { pa.piece(i, ca, la) }, unsafe { pb.piece(i, cb, lb) })
    });
}
