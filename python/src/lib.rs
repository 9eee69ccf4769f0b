//! Python bindings for boltccl: the `boltccl._native` extension module.
//!
//! The Python package (`python/boltccl/`) re-exports [`PyGroup`] as `boltccl.Group` and
//! `init` as `boltccl.init`. Every data call works zero-copy on a C-contiguous buffer
//! (numpy array, memoryview, array.array, ...) and releases the GIL while it communicates.
//! Ctrl-C reaches a blocked call through the group's interrupt check.

mod buffer;
mod dlpack;
mod work;

use boltccl::{Config, DType, ErrorKind, Group, Op, ReduceOp};
use buffer::{parse_dtype, view, View};
use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::PyType;
use std::sync::Arc;
use std::time::Duration;

/// A signal exception (KeyboardInterrupt) caught by the interrupt check, raised after the call.
pub(crate) type Pending = Arc<Mutex<Option<PyErr>>>;

/// A group of ranks (see `boltccl.Group` in the stubs for the documentation).
#[pyclass(module = "boltccl", name = "Group", frozen, subclass)]
pub struct PyGroup {
    inner: Option<Arc<Group>>,
    pending: Pending,
}

impl Drop for PyGroup {
    fn drop(&mut self) {
        if let Some(g) = self.inner.take() {
            Python::with_gil(|py| work::release_group(py, g));
        }
    }
}

static ERRORS: GILOnceCell<Py<PyAny>> = GILOnceCell::new();

fn error_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let module = ERRORS.get_or_try_init(py, || py.import("boltccl.errors").map(|m| m.unbind().into_any()))?;
    Ok(module.bind(py).getattr(name)?.downcast_into::<PyType>()?)
}

/// A `boltccl.errors` exception of class `class` with `kind` and no rank.
pub(crate) fn raise(py: Python<'_>, class: &str, kind: &str, msg: String) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let inst = error_class(py, class)?.call1((msg.clone(),))?;
        inst.setattr("kind", kind)?;
        inst.setattr("rank", py.None())?;
        Ok(PyErr::from_value(inst))
    };
    build().unwrap_or_else(|err| err)
}

/// Map a boltccl error to a Python exception (a caught KeyboardInterrupt wins).
pub(crate) fn to_py(py: Python<'_>, e: boltccl::Error, pending: Option<&Pending>) -> PyErr {
    if let Some(p) = pending.and_then(|p| p.lock().take()) {
        return p;
    }
    let kind = e.kind();
    let msg = e.to_string();
    if kind == ErrorKind::InvalidArgument {
        return PyValueError::new_err(msg);
    }
    let class = match kind {
        ErrorKind::Timeout => "TimeoutError",
        ErrorKind::PeerLost | ErrorKind::Aborted => "PeerLostError",
        ErrorKind::Config => "ConfigError",
        _ => "Error",
    };
    let build = || -> PyResult<PyErr> {
        let cls = error_class(py, class)?;
        let inst = cls.call1((msg.clone(),))?;
        inst.setattr("kind", kind.name())?;
        inst.setattr("rank", e.rank())?;
        Ok(PyErr::from_value(inst))
    };
    build().unwrap_or_else(|err| err)
}

fn install_interrupt(g: &Group) -> Pending {
    let pending: Pending = Arc::new(Mutex::new(None));
    let slot = pending.clone();
    g.set_interrupt_check(Some(Arc::new(move || {
        Python::with_gil(|py| match py.check_signals() {
            Ok(()) => false,
            Err(e) => {
                *slot.lock() = Some(e);
                true
            }
        })
    })));
    pending
}

/// Form a group from the environment (`BOLTCCL_RANK`, `BOLTCCL_WORLD_SIZE`,
/// `BOLTCCL_COORDINATOR`, `BOLTCCL_JOB_KEY`, ...), overridden by the keyword arguments.
#[pyfunction]
#[pyo3(signature = (*, rank=None, world_size=None, coordinator=None, job_key=None, timeout=None, init_timeout=None))]
fn init(
    py: Python<'_>,
    rank: Option<i64>,
    world_size: Option<i64>,
    coordinator: Option<String>,
    job_key: Option<String>,
    timeout: Option<f64>,
    init_timeout: Option<f64>,
) -> PyResult<PyGroup> {
    // Python has no `tracing` subscriber: warnings go to stderr (BOLTCCL_LOG filters).
    boltccl::log_to_stderr();
    let nonneg = |what: &str, v: i64| {
        usize::try_from(v).map_err(|_| PyValueError::new_err(format!("{what} must be >= 0, got {v}")))
    };
    let millis = |what: &str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(((v * 1000.0).ceil() as u64).max(1))
        } else {
            Err(PyValueError::new_err(format!("{what} must be a positive number of seconds, got {v}")))
        }
    };
    // The keywords act as the BOLTCCL_* variables they stand for: they win over the
    // environment and over what a launcher's variables say.
    let mut given: Vec<(&str, String)> = Vec::new();
    if let Some(r) = rank {
        given.push((boltccl::config::RANK, nonneg("rank", r)?.to_string()));
    }
    if let Some(n) = world_size {
        given.push((boltccl::config::WORLD_SIZE, nonneg("world_size", n)?.to_string()));
    }
    if let Some(c) = coordinator {
        given.push((boltccl::config::COORDINATOR, c));
    }
    if let Some(k) = job_key {
        given.push((boltccl::config::JOB_KEY, k));
    }
    if let Some(t) = timeout {
        given.push((boltccl::config::TIMEOUT_MS, millis("timeout", t)?.to_string()));
    }
    if let Some(t) = init_timeout {
        given.push((boltccl::config::INIT_TIMEOUT_MS, millis("init_timeout", t)?.to_string()));
    }
    let cfg = Config::from_lookup(|k| {
        given.iter().find(|(name, _)| *name == k).map(|(_, v)| v.clone()).or_else(|| std::env::var(k).ok())
    })
    .map_err(|e| to_py(py, e, None))?;
    let g = py.allow_threads(|| Group::new(cfg)).map_err(|e| to_py(py, e, None))?;
    let pending = install_interrupt(&g);
    Ok(PyGroup { inner: Some(Arc::new(g)), pending })
}

/// Raw address and length of a view, passed into `allow_threads` closures (which must be Send).
#[derive(Clone, Copy)]
struct Span(usize, usize);

impl Span {
    fn of(v: &View) -> Span {
        Span(v.addr(), v.len())
    }
    fn overlaps(self, o: Span) -> bool {
        self.1 > 0 && o.1 > 0 && self.0 < o.0 + o.1 && o.0 < self.0 + self.1
    }
    /// # Safety
    /// The memory must be exported (a live `View`) and not mutably borrowed elsewhere.
    unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.1 == 0 {
            return &[];
        }
        // SAFETY: per the contract, `len` readable bytes at `addr`.
        unsafe { std::slice::from_raw_parts(self.0 as *const u8, self.1) }
    }
    /// # Safety
    /// The memory must be exported writable (a live `View`) and not borrowed elsewhere.
    unsafe fn bytes_mut<'a>(self) -> &'a mut [u8] {
        if self.1 == 0 {
            return &mut [];
        }
        // SAFETY: per the contract, `len` exclusive writable bytes at `addr`.
        unsafe { std::slice::from_raw_parts_mut(self.0 as *mut u8, self.1) }
    }
}

fn same_type(x: &View, out: &View) -> PyResult<()> {
    if x.dtype != out.dtype {
        return Err(PyTypeError::new_err(format!(
            "out has element type {} but x has {}: they must match",
            out.dtype, x.dtype
        )));
    }
    Ok(())
}

fn peer_arg(what: &str, v: i64) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| PyValueError::new_err(format!("{what} must be a rank >= 0, got {v}")))
}

impl PyGroup {
    fn g(&self) -> &Arc<Group> {
        self.inner.as_ref().expect("a group is only emptied when dropped")
    }

    fn err(&self, py: Python<'_>, e: boltccl::Error) -> PyErr {
        to_py(py, e, Some(&self.pending))
    }

    /// Run `op` (built from `views`' memory): blocking with the GIL released, or started
    /// (`async_op`) and handed back as a Work that keeps `views` and `objects` alive until
    /// the call completes. Returns `result` (or the Work).
    ///
    /// # Safety
    /// `op` must borrow only memory exported by `views`, with writes only into writable
    /// exports, and no two of its buffers may overlap unless they are the same in-place one.
    #[allow(clippy::too_many_arguments)]
    unsafe fn dispatch<'py>(
        &self,
        py: Python<'py>,
        op: Op<'_>,
        views: Vec<View>,
        objects: Vec<Py<PyAny>>,
        result: Bound<'py, PyAny>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let g = self.g();
        if !async_op {
            let r = py.allow_threads(|| g.call(op));
            drop(views);
            r.map_err(|e| self.err(py, e))?;
            return Ok(result);
        }
        // SAFETY: the views (and the objects) stay alive until the request completes: the
        // Work releases them only from its completion function.
        let req = unsafe { g.start_unchecked(op) }.map_err(|e| self.err(py, e))?;
        let keep = work::KeepAlive { views, objects, group: g.clone() };
        let w = work::PyWork::new(req, result.clone().unbind(), keep, self.pending.clone());
        Ok(Bound::new(py, w)?.into_any())
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce<'py>(
        &self,
        py: Python<'py>,
        op: ReduceOp,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dt = parse_dtype(dtype)?;
        let in_place = |v: View, result: Bound<'py, PyAny>| {
            let keep = vec![x.clone().unbind(), result.clone().unbind()];
            let s = Span::of(&v);
            // SAFETY: `v` is a writable export; the call is in place.
            let op = Op::AllReduce { op, dtype: v.dtype, input: None, output: unsafe { s.bytes_mut() } };
            // SAFETY: the op borrows only `v`'s memory.
            unsafe { self.dispatch(py, op, vec![v], keep, result, async_op) }
        };
        match out {
            None => in_place(view(&x, true, dt, "x")?, x.clone()),
            Some(out) if out.is(&x) => in_place(view(&out, true, dt, "out")?, out.clone()),
            Some(out) => {
                let o = view(&out, true, dt, "out")?;
                let v = view(&x, false, dt, "x")?;
                same_type(&v, &o)?;
                let (si, so) = (Span::of(&v), Span::of(&o));
                if si.0 == so.0 && si.1 == so.1 {
                    drop(v);
                    return in_place(o, out.clone());
                }
                if si.overlaps(so) {
                    return Err(PyValueError::new_err(
                        "x and out overlap: pass the same buffer for in place, or disjoint buffers",
                    ));
                }
                // SAFETY: both exports are alive for the call and the memory is disjoint.
                let (input, output) = unsafe { (si.bytes(), so.bytes_mut()) };
                let op = Op::AllReduce { op, dtype: o.dtype, input: Some(input), output };
                let objects = vec![x.unbind(), out.clone().unbind()];
                // SAFETY: the op borrows only the two views' disjoint memory.
                unsafe { self.dispatch(py, op, vec![v, o], objects, out, async_op) }
            }
        }
    }

    /// Allocate a result like `x` with `len * num / den` elements (boltccl._alloc.like).
    fn alloc<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        num: usize,
        den: usize,
        dtype: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        py.import("boltccl._alloc")?.getattr("like")?.call1((x, num, den, dtype))
    }

    /// Shared body of all_gather and reduce_scatter.
    #[allow(clippy::too_many_arguments)]
    fn gather_like<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
        num: usize,
        den: usize,
        async_op: bool,
        make: impl FnOnce(DType, &'static [u8], &'static mut [u8]) -> Op<'static>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dt = parse_dtype(dtype)?;
        let v = view(&x, false, dt, "x")?;
        let out = match out {
            Some(o) => o,
            None => self.alloc(py, &x, num, den, dtype)?,
        };
        let o = view(&out, true, dt.or(Some(v.dtype)), "out")?;
        same_type(&v, &o)?;
        let (si, so) = (Span::of(&v), Span::of(&o));
        if si.overlaps(so) {
            return Err(PyValueError::new_err("x and out overlap: pass disjoint buffers"));
        }
        // SAFETY: both exports are alive for the call and the memory is disjoint.
        let op = make(v.dtype, unsafe { si.bytes() }, unsafe { so.bytes_mut() });
        let objects = vec![x.unbind(), out.clone().unbind()];
        // SAFETY: the op borrows only the two views' disjoint memory.
        unsafe { self.dispatch(py, op, vec![v, o], objects, out, async_op) }
    }
}

fn parse_op(name: &str) -> PyResult<ReduceOp> {
    match name.to_ascii_lowercase().as_str() {
        "sum" => Ok(ReduceOp::Sum),
        "max" => Ok(ReduceOp::Max),
        "min" => Ok(ReduceOp::Min),
        _ => Err(PyValueError::new_err(format!("op={name:?}: boltccl reduces with \"sum\", \"max\" or \"min\""))),
    }
}

#[pymethods]
impl PyGroup {
    /// This process's rank in the group, 0-based.
    #[getter]
    fn rank(&self) -> usize {
        self.g().rank()
    }

    /// Number of ranks in the group.
    #[getter]
    fn size(&self) -> usize {
        self.g().size()
    }

    /// Wait until every rank has called barrier() (or start it: `async_op=True`).
    #[pyo3(signature = (*, async_op=false))]
    fn barrier<'py>(&self, py: Python<'py>, async_op: bool) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: a barrier borrows no memory.
        unsafe { self.dispatch(py, Op::Barrier, Vec::new(), Vec::new(), py.None().into_bound(py), async_op) }
    }

    /// Elementwise sum across ranks: in place in `x`, or into `out`. Returns the result buffer
    /// (or, with `async_op=True`, a Work whose `wait()` returns it).
    #[pyo3(signature = (x, out=None, *, dtype=None, async_op=false))]
    fn all_sum<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.reduce(py, ReduceOp::Sum, x, out, dtype, async_op)
    }

    /// Elementwise maximum across ranks; like all_sum.
    #[pyo3(signature = (x, out=None, *, dtype=None, async_op=false))]
    fn all_max<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.reduce(py, ReduceOp::Max, x, out, dtype, async_op)
    }

    /// Elementwise minimum across ranks; like all_sum.
    #[pyo3(signature = (x, out=None, *, dtype=None, async_op=false))]
    fn all_min<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.reduce(py, ReduceOp::Min, x, out, dtype, async_op)
    }

    /// Internal to `boltccl.torch`: a blocking, in-place all-reduce of `count` elements of
    /// `dtype` at address `addr`. It skips the buffer export (about 1 µs of a 4-byte call's
    /// budget under torch.distributed); the caller guarantees that `addr` is a live, writable,
    /// contiguous buffer of `count` elements that nothing else uses until this returns.
    #[pyo3(name = "_all_reduce_at")]
    fn all_reduce_at(&self, py: Python<'_>, addr: usize, count: usize, dtype: &str, op: &str) -> PyResult<()> {
        let dtype = DType::from_name(dtype).ok_or_else(|| PyTypeError::new_err(format!("unknown dtype {dtype:?}")))?;
        let op = parse_op(op)?;
        let span = Span(addr, count.checked_mul(dtype.size()).ok_or_else(|| PyValueError::new_err("count too large"))?);
        if addr == 0 && span.1 > 0 {
            return Err(PyValueError::new_err("null address"));
        }
        // SAFETY: per this method's contract, the caller holds a live writable buffer of
        // `span.1` bytes at `addr` that nothing else touches during the call.
        let output = unsafe { span.bytes_mut() };
        let g = self.g();
        py.allow_threads(|| g.call(Op::AllReduce { op, dtype, input: None, output })).map_err(|e| self.err(py, e))
    }

    /// Every rank's `x`, concatenated in rank order, in a new array (or in `out`).
    #[pyo3(signature = (x, out=None, *, dtype=None, async_op=false))]
    fn all_gather<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = self.g().size();
        self.gather_like(py, x, out, dtype, n, 1, async_op, |dtype, input, output| Op::AllGather {
            dtype,
            input,
            output,
        })
    }

    /// Reduce `x` (size blocks) across ranks with `op` ("sum", "max", "min"); returns this
    /// rank's block (new array, or `out`).
    #[pyo3(signature = (x, out=None, *, dtype=None, op="sum", async_op=false))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
        op: &str,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = self.g().size();
        let op = parse_op(op)?;
        self.gather_like(py, x, out, dtype, 1, n, async_op, move |dtype, input, output| Op::ReduceScatter {
            op,
            dtype,
            input,
            output,
        })
    }

    /// All-to-all: `x` holds `size` equal parts, part q for rank q; returns (in a new array,
    /// or in `out`) part `rank` of every rank's `x`, in rank order.
    #[pyo3(signature = (x, out=None, *, dtype=None, async_op=false))]
    fn all_to_all<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.gather_like(py, x, out, dtype, 1, 1, async_op, |dtype, input, output| Op::AllToAll {
            dtype,
            input,
            output,
        })
    }

    /// All-to-all with a count per rank (elements): `x` holds `send_counts[q]` elements for
    /// each rank q in turn; `out` gets `recv_counts[q]` from each, and is returned.
    #[pyo3(signature = (x, send_counts, out, recv_counts, *, dtype=None, async_op=false))]
    #[allow(clippy::too_many_arguments)]
    fn all_to_all_v<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        send_counts: Vec<usize>,
        out: Bound<'py, PyAny>,
        recv_counts: Vec<usize>,
        dtype: Option<&Bound<'py, PyAny>>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dt = parse_dtype(dtype)?;
        let v = view(&x, false, dt, "x")?;
        let o = view(&out, true, dt.or(Some(v.dtype)), "out")?;
        same_type(&v, &o)?;
        let (si, so) = (Span::of(&v), Span::of(&o));
        if si.overlaps(so) {
            return Err(PyValueError::new_err("x and out overlap: pass disjoint buffers"));
        }
        // The counts live in Python bytes objects kept alive with the call, as the buffers are.
        let keep = |c: &[usize]| -> PyResult<(Bound<'py, pyo3::types::PyBytes>, &'static [usize])> {
            let raw: Vec<u8> = c.iter().flat_map(|n| n.to_ne_bytes()).collect();
            let b = pyo3::types::PyBytes::new(py, &raw);
            let p = b.as_bytes().as_ptr();
            if p as usize % std::mem::align_of::<usize>() != 0 {
                return Err(PyValueError::new_err("internal: unaligned counts"));
            }
            // SAFETY: `b` holds `c.len()` native usizes at an aligned address; it is immutable
            // and kept alive (in `objects`) until the call has finished with them.
            Ok((b.clone(), unsafe { std::slice::from_raw_parts(p.cast::<usize>(), c.len()) }))
        };
        let (sb, send) = keep(&send_counts)?;
        let (rb, recv) = keep(&recv_counts)?;
        // SAFETY: both exports are alive for the call and the memory is disjoint.
        let (input, output) = unsafe { (si.bytes(), so.bytes_mut()) };
        let op = Op::AllToAllV { dtype: v.dtype, input, send_counts: send, output, recv_counts: recv };
        let objects = vec![x.unbind(), out.clone().unbind(), sb.into_any().unbind(), rb.into_any().unbind()];
        // SAFETY: the op borrows only the two views' disjoint memory and the counts kept above.
        unsafe { self.dispatch(py, op, vec![v, o], objects, out, async_op) }
    }

    /// Gather: returns on `root` every rank's `x` in rank order (a new array, or `out`); on
    /// the other ranks returns None (`out` is not used).
    #[pyo3(signature = (x, root=0, out=None, *, dtype=None, async_op=false))]
    fn gather<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        root: i64,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let root = peer_arg("root", root)?;
        if self.g().rank() == root {
            let n = self.g().size();
            return self.gather_like(py, x, out, dtype, n, 1, async_op, |dtype, input, output| Op::Gather {
                dtype,
                input,
                output,
                root,
            });
        }
        let v = view(&x, false, parse_dtype(dtype)?, "x")?;
        let s = Span::of(&v);
        // SAFETY: the export is alive for the call; nothing is written on this rank.
        let op = Op::Gather { dtype: v.dtype, input: unsafe { s.bytes() }, output: &mut [], root };
        let keep = vec![x.unbind()];
        // SAFETY: the op borrows only `v`'s memory.
        unsafe { self.dispatch(py, op, vec![v], keep, py.None().into_bound(py), async_op) }
    }

    /// Scatter: `out` gets block `rank` of `root`'s `x` (`size` blocks as long as `out`; `x`
    /// is not used elsewhere and may be None). Returns `out`.
    #[pyo3(signature = (out, x=None, root=0, *, dtype=None, async_op=false))]
    fn scatter<'py>(
        &self,
        py: Python<'py>,
        out: Bound<'py, PyAny>,
        x: Option<Bound<'py, PyAny>>,
        root: i64,
        dtype: Option<&Bound<'py, PyAny>>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let root = peer_arg("root", root)?;
        let dt = parse_dtype(dtype)?;
        let o = view(&out, true, dt, "out")?;
        let so = Span::of(&o);
        match x.filter(|_| self.g().rank() == root) {
            Some(x) => {
                let v = view(&x, false, dt.or(Some(o.dtype)), "x")?;
                same_type(&v, &o)?;
                let si = Span::of(&v);
                if si.overlaps(so) {
                    return Err(PyValueError::new_err("x and out overlap: pass disjoint buffers"));
                }
                // SAFETY: both exports are alive for the call and the memory is disjoint.
                let (input, output) = unsafe { (si.bytes(), so.bytes_mut()) };
                let op = Op::Scatter { dtype: o.dtype, input, output, root };
                let objects = vec![x.unbind(), out.clone().unbind()];
                // SAFETY: the op borrows only the two views' disjoint memory.
                unsafe { self.dispatch(py, op, vec![v, o], objects, out, async_op) }
            }
            None => {
                // SAFETY: the writable export is alive for the call.
                let op = Op::Scatter { dtype: o.dtype, input: &[], output: unsafe { so.bytes_mut() }, root };
                let objects = vec![out.clone().unbind()];
                // SAFETY: the op borrows only `o`'s memory.
                unsafe { self.dispatch(py, op, vec![o], objects, out, async_op) }
            }
        }
    }

    /// Reduce to `root` with `op` ("sum", "max", "min"): root's `x` (or `out`) gets the result,
    /// with the bits all_sum etc. give; other ranks' buffers are not changed. Returns `x` (or
    /// `out`).
    #[pyo3(name = "reduce", signature = (x, root=0, out=None, *, dtype=None, op="sum", async_op=false))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_to_root<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        root: i64,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
        op: &str,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let root = peer_arg("root", root)?;
        let op = parse_op(op)?;
        let dt = parse_dtype(dtype)?;
        match out.filter(|o| !o.is(&x)) {
            None => {
                let v = view(&x, true, dt, "x")?;
                let s = Span::of(&v);
                // SAFETY: `v` is a writable export; the call is in place.
                let call = Op::Reduce { op, dtype: v.dtype, input: None, output: unsafe { s.bytes_mut() }, root };
                let keep = vec![x.clone().unbind()];
                // SAFETY: the op borrows only `v`'s memory.
                unsafe { self.dispatch(py, call, vec![v], keep, x, async_op) }
            }
            Some(out) => {
                let o = view(&out, true, dt, "out")?;
                let v = view(&x, false, dt, "x")?;
                same_type(&v, &o)?;
                let (si, so) = (Span::of(&v), Span::of(&o));
                if si.overlaps(so) {
                    return Err(PyValueError::new_err("x and out overlap: pass disjoint buffers"));
                }
                // SAFETY: both exports are alive for the call and the memory is disjoint.
                let (input, output) = unsafe { (si.bytes(), so.bytes_mut()) };
                let call = Op::Reduce { op, dtype: o.dtype, input: Some(input), output, root };
                let objects = vec![x.unbind(), out.clone().unbind()];
                // SAFETY: the op borrows only the two views' disjoint memory.
                unsafe { self.dispatch(py, call, vec![v, o], objects, out, async_op) }
            }
        }
    }

    /// Every rank's `x` gets `root`'s, in place. Returns `x`.
    #[pyo3(signature = (x, root=0, *, dtype=None, async_op=false))]
    fn broadcast<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        root: i64,
        dtype: Option<&Bound<'py, PyAny>>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let root = peer_arg("root", root)?;
        let v = view(&x, true, parse_dtype(dtype)?, "x")?;
        let s = Span::of(&v);
        // SAFETY: the writable export is alive for the call.
        let op = Op::Broadcast { dtype: v.dtype, buf: unsafe { s.bytes_mut() }, root };
        let keep = vec![x.clone().unbind()];
        // SAFETY: the op borrows only `v`'s memory.
        unsafe { self.dispatch(py, op, vec![v], keep, x, async_op) }
    }

    /// Send `x` to rank `peer`, which must recv() a buffer of the same type and length.
    #[pyo3(signature = (x, peer, *, dtype=None, async_op=false))]
    fn send<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        peer: i64,
        dtype: Option<&Bound<'py, PyAny>>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let peer = peer_arg("peer", peer)?;
        let v = view(&x, false, parse_dtype(dtype)?, "x")?;
        let s = Span::of(&v);
        // SAFETY: the export is alive for the call.
        let op = Op::Send { dtype: v.dtype, buf: unsafe { s.bytes() }, peer };
        let keep = vec![x.unbind()];
        // SAFETY: the op borrows only `v`'s memory.
        unsafe { self.dispatch(py, op, vec![v], keep, py.None().into_bound(py), async_op) }
    }

    /// Receive into `x` from rank `peer`. Returns `x`.
    #[pyo3(signature = (x, peer, *, dtype=None, async_op=false))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        peer: i64,
        dtype: Option<&Bound<'py, PyAny>>,
        async_op: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let peer = peer_arg("peer", peer)?;
        let v = view(&x, true, parse_dtype(dtype)?, "x")?;
        let s = Span::of(&v);
        // SAFETY: the writable export is alive for the call.
        let op = Op::Recv { dtype: v.dtype, buf: unsafe { s.bytes_mut() }, peer };
        let keep = vec![x.clone().unbind()];
        // SAFETY: the op borrows only `v`'s memory.
        unsafe { self.dispatch(py, op, vec![v], keep, x, async_op) }
    }

    /// Split into sub-groups by `color` (ranks passing None join none and get None), ordered
    /// by `key` then rank. Every rank must call it.
    #[pyo3(signature = (color, key=0))]
    fn split(&self, py: Python<'_>, color: Option<i64>, key: i64) -> PyResult<Option<PyGroup>> {
        let color = match color {
            None => None,
            Some(c) => Some(u32::try_from(c).map_err(|_| {
                PyValueError::new_err(format!("color must be None or between 0 and {}, got {c}", u32::MAX))
            })?),
        };
        let g = self.g();
        let sub = py.allow_threads(|| g.split(color, key)).map_err(|e| self.err(py, e))?;
        Ok(sub.map(|s| PyGroup { inner: Some(Arc::new(s)), pending: self.pending.clone() }))
    }

    /// Abort the group: callable from any thread or a signal handler while a call is blocked
    /// on another, which then raises boltccl.PeerLostError (kind "aborted") at once; every other
    /// rank learns within moments, and the group is poisoned (shrink() makes a working one).
    /// Never blocks.
    fn abort(&self) {
        self.g().abort();
    }

    /// Go on without the lost ranks: the ranks that call shrink() within the deadline agree on
    /// who is there and each gets a new Group of them (ranks renumbered in order), reusing the
    /// links. `exclude`: ranks of this group to leave out, the same list on every survivor.
    /// This group is done afterwards. Ranks failing during the shrink make it raise on every
    /// survivor: call it again.
    #[pyo3(signature = (exclude=None))]
    fn shrink(&self, py: Python<'_>, exclude: Option<Vec<usize>>) -> PyResult<PyGroup> {
        let g = self.g();
        let exclude = exclude.unwrap_or_default();
        let next = py.allow_threads(|| g.shrink_excluding(&exclude)).map_err(|e| self.err(py, e))?;
        Ok(PyGroup { inner: Some(Arc::new(next)), pending: self.pending.clone() })
    }

    /// Form a group of `size` ranks with replacement processes, through the normal bootstrap:
    /// this group's ranks keep their order as ranks 0..self.size, and the newcomers, started
    /// with BOLTCCL_RANK self.size..size, BOLTCCL_WORLD_SIZE=size and the same `coordinator`
    /// ("host:port", where new rank 0 listens) and `key` (fresh for each generation), take the
    /// rest. Every link is made anew; this group is left as it is (drop it afterwards).
    fn grow(&self, py: Python<'_>, size: usize, coordinator: String, key: String) -> PyResult<PyGroup> {
        let g = self.g();
        let next = py.allow_threads(|| g.grow(size, &coordinator, &key)).map_err(|e| self.err(py, e))?;
        Ok(PyGroup { inner: Some(Arc::new(next)), pending: self.pending.clone() })
    }

    fn __repr__(&self) -> String {
        format!("<boltccl.Group rank {} of {}>", self.g().rank(), self.g().size())
    }
}

/// Run a job with the launcher `boltccl launch` uses (see `boltccl.launch`): `n` local ranks,
/// or one per entry of the JSON `hostfile`, started over ssh. Returns the exit code, and each rank's output
/// when `capture` is true (else nothing is captured: output is relayed with a `[rank]` prefix).
/// `mpi_library` (libboltccl_mpi) becomes every rank's `MLX_MPI_LIBNAME` unless that is set.
/// `keep_going`: a failing rank does not stop the others.
#[pyfunction]
#[pyo3(signature = (command, *, n=None, hostfile=None, port=None, env=Vec::new(), pin=true, timeout=None, capture=false, mpi_library=None, keep_going=false))]
#[allow(clippy::too_many_arguments)]
fn launch(
    py: Python<'_>,
    command: Vec<String>,
    n: Option<usize>,
    hostfile: Option<std::path::PathBuf>,
    port: Option<u16>,
    env: Vec<(String, String)>,
    pin: bool,
    timeout: Option<f64>,
    capture: bool,
    mpi_library: Option<std::path::PathBuf>,
    keep_going: bool,
) -> PyResult<(i32, Vec<String>)> {
    use boltccl_launch::{Job, Placement};
    let placement = match (hostfile, n) {
        (Some(path), _) => Placement::Hosts(boltccl_launch::load_hostfile(&path).map_err(PyValueError::new_err)?),
        (None, Some(n)) => Placement::Local(n),
        (None, None) => return Err(PyValueError::new_err("say how many ranks (n=...) or give a hostfile")),
    };
    let timeout = match timeout {
        Some(t) if !(t.is_finite() && t > 0.0) => {
            return Err(PyValueError::new_err(format!("timeout must be a positive number of seconds, got {t}")))
        }
        t => t.map(Duration::from_secs_f64),
    };
    let job = Job { placement, port, env, pin, timeout, keep_going, command }.with_mlx_mpi_library(mpi_library);
    py.allow_threads(|| {
        if capture {
            boltccl_launch::run_captured(&job).map_err(PyValueError::new_err)
        } else {
            Ok((boltccl_launch::run(&job), Vec::new()))
        }
    })
}

/// A TCP port on `ip` that is free now, for a coordinator that rank 0 binds in a moment: below
/// the kernel's ephemeral range, so that no connection made meanwhile is given it.
#[pyfunction]
fn free_coordinator_port(ip: &str) -> PyResult<u16> {
    let addr: std::net::IpAddr =
        ip.parse().map_err(|e| PyValueError::new_err(format!("not an IP address: {ip:?} ({e})")))?;
    boltccl::free_coordinator_port(addr)
        .map_err(|e| PyValueError::new_err(format!("no free port on {ip}: {e} (is it an address of this host?)")))
}

/// A port derived from `seed` the way boltccl derives coordinator ports (20000-32767, below
/// every ephemeral range), never one of `avoid`: every rank computes the same, with no exchange.
#[pyfunction]
fn derived_port(seed: &str, avoid: Vec<u16>) -> u16 {
    boltccl::config::launchers::derived_port(seed, &avoid)
}

/// The compiled part of the boltccl package.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGroup>()?;
    m.add_class::<work::PyWork>()?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(launch, m)?)?;
    m.add_function(wrap_pyfunction!(free_coordinator_port, m)?)?;
    m.add_function(wrap_pyfunction!(derived_port, m)?)?;
    m.add("__version__", boltccl::VERSION)?;
    m.add("DTYPES", DType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>())?;
    Ok(())
}
