//! Python bindings for boltccl: the `boltccl._native` extension module.
//!
//! The Python package (`python/boltccl/`) re-exports [`PyGroup`] as `boltccl.Group` and
//! [`init`] as `boltccl.init`. Every data call works zero-copy on a C-contiguous buffer
//! (numpy array, memoryview, array.array, ...) and releases the GIL while it communicates.
//! Ctrl-C reaches a blocked call through the group's interrupt check.

mod buffer;

use boltccl::{Config, DType, ErrorKind, Group, ReduceOp};
use buffer::{parse_dtype, view, View};
use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::PyType;
use std::sync::Arc;
use std::time::Duration;

/// A signal exception (KeyboardInterrupt) caught by the interrupt check, raised after the call.
type Pending = Arc<Mutex<Option<PyErr>>>;

/// A group of ranks (see `boltccl.Group` in the stubs for the documentation).
#[pyclass(module = "boltccl", name = "Group", frozen, subclass)]
pub struct PyGroup {
    inner: Arc<Group>,
    pending: Pending,
}

static ERRORS: GILOnceCell<Py<PyAny>> = GILOnceCell::new();

fn error_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let module = ERRORS.get_or_try_init(py, || py.import("boltccl.errors").map(|m| m.unbind().into_any()))?;
    Ok(module.bind(py).getattr(name)?.downcast_into::<PyType>()?)
}

/// Map a boltccl error to a Python exception (a caught KeyboardInterrupt wins).
fn to_py(py: Python<'_>, e: boltccl::Error, pending: Option<&Pending>) -> PyErr {
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
    let mut cfg = Config::from_env().map_err(|e| to_py(py, e, None))?;
    let nonneg = |what: &str, v: i64| {
        usize::try_from(v).map_err(|_| PyValueError::new_err(format!("{what} must be >= 0, got {v}")))
    };
    let seconds = |what: &str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(PyValueError::new_err(format!("{what} must be a positive number of seconds, got {v}")))
        }
    };
    if let Some(r) = rank {
        cfg.rank = nonneg("rank", r)?;
    }
    if let Some(n) = world_size {
        cfg.world_size = nonneg("world_size", n)?;
    }
    if coordinator.is_some() {
        cfg.coordinator = coordinator;
    }
    if job_key.is_some() {
        cfg.job_key = job_key;
    }
    if let Some(t) = timeout {
        cfg.timeout = seconds("timeout", t)?;
    }
    if let Some(t) = init_timeout {
        cfg.init_timeout = seconds("init_timeout", t)?;
    }
    let g = py.allow_threads(|| Group::new(cfg)).map_err(|e| to_py(py, e, None))?;
    let pending = install_interrupt(&g);
    Ok(PyGroup { inner: Arc::new(g), pending })
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
    fn err(&self, py: Python<'_>, e: boltccl::Error) -> PyErr {
        to_py(py, e, Some(&self.pending))
    }

    fn reduce<'py>(
        &self,
        py: Python<'py>,
        op: ReduceOp,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dt = parse_dtype(dtype)?;
        let g = &*self.inner;
        match out {
            None => {
                let v = view(&x, true, dt, "x")?;
                let s = Span::of(&v);
                // SAFETY: `v` keeps the writable export alive for the call; nothing else borrows it.
                let r = py.allow_threads(|| g.bytes().all_reduce(op, v.dtype, None, unsafe { s.bytes_mut() }));
                drop(v);
                r.map_err(|e| self.err(py, e))?;
                Ok(x)
            }
            Some(out) => {
                let o = view(&out, true, dt, "out")?;
                if out.is(&x) {
                    let s = Span::of(&o);
                    // SAFETY: as above.
                    let r = py.allow_threads(|| g.bytes().all_reduce(op, o.dtype, None, unsafe { s.bytes_mut() }));
                    drop(o);
                    r.map_err(|e| self.err(py, e))?;
                    return Ok(out);
                }
                let v = view(&x, false, dt, "x")?;
                same_type(&v, &o)?;
                let (si, so) = (Span::of(&v), Span::of(&o));
                let r = if si.0 == so.0 && si.1 == so.1 {
                    // SAFETY: the same memory: reduce in place through the writable export.
                    py.allow_threads(|| g.bytes().all_reduce(op, o.dtype, None, unsafe { so.bytes_mut() }))
                } else if si.overlaps(so) {
                    return Err(PyValueError::new_err(
                        "x and out overlap: pass the same buffer for in place, or disjoint buffers",
                    ));
                } else {
                    py.allow_threads(|| {
                        // SAFETY: both exports are alive for the call and the memory is disjoint.
                        let (input, output) = unsafe { (si.bytes(), so.bytes_mut()) };
                        g.bytes().all_reduce(op, o.dtype, Some(input), output)
                    })
                };
                drop((v, o));
                r.map_err(|e| self.err(py, e))?;
                Ok(out)
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
        f: impl FnOnce(&Group, DType, &[u8], &mut [u8]) -> boltccl::Result<()> + Send,
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
        let g = &*self.inner;
        let d = v.dtype;
        // SAFETY: both exports are alive for the call and the memory is disjoint.
        let r = py.allow_threads(|| f(g, d, unsafe { si.bytes() }, unsafe { so.bytes_mut() }));
        drop((v, o));
        r.map_err(|e| self.err(py, e))?;
        Ok(out)
    }
}

#[pymethods]
impl PyGroup {
    /// This process's rank in the group, 0-based.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// Number of ranks in the group.
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    /// Wait until every rank has called barrier().
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let g = &*self.inner;
        py.allow_threads(|| g.barrier()).map_err(|e| self.err(py, e))
    }

    /// Elementwise sum across ranks: in place in `x`, or into `out`. Returns the result buffer.
    #[pyo3(signature = (x, out=None, *, dtype=None))]
    fn all_sum<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.reduce(py, ReduceOp::Sum, x, out, dtype)
    }

    /// Elementwise maximum across ranks; like all_sum.
    #[pyo3(signature = (x, out=None, *, dtype=None))]
    fn all_max<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.reduce(py, ReduceOp::Max, x, out, dtype)
    }

    /// Elementwise minimum across ranks; like all_sum.
    #[pyo3(signature = (x, out=None, *, dtype=None))]
    fn all_min<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.reduce(py, ReduceOp::Min, x, out, dtype)
    }

    /// Every rank's `x`, concatenated in rank order, in a new array (or in `out`).
    #[pyo3(signature = (x, out=None, *, dtype=None))]
    fn all_gather<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = self.inner.size();
        self.gather_like(py, x, out, dtype, n, 1, |g, d, i, o| g.bytes().all_gather(d, i, o))
    }

    /// Sum `x` (size blocks) across ranks; returns this rank's block (new array, or `out`).
    #[pyo3(signature = (x, out=None, *, dtype=None))]
    fn reduce_scatter<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
        dtype: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = self.inner.size();
        self.gather_like(py, x, out, dtype, 1, n, |g, d, i, o| g.bytes().reduce_scatter(ReduceOp::Sum, d, i, o))
    }

    /// Every rank's `x` gets `root`'s, in place. Returns `x`.
    #[pyo3(signature = (x, root=0, *, dtype=None))]
    fn broadcast<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        root: i64,
        dtype: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let root = peer_arg("root", root)?;
        let v = view(&x, true, parse_dtype(dtype)?, "x")?;
        let (s, d, g) = (Span::of(&v), v.dtype, &*self.inner);
        // SAFETY: the writable export is alive for the call.
        let r = py.allow_threads(|| g.bytes().broadcast(d, unsafe { s.bytes_mut() }, root));
        drop(v);
        r.map_err(|e| self.err(py, e))?;
        Ok(x)
    }

    /// Send `x` to rank `peer`, which must recv() a buffer of the same type and length.
    #[pyo3(signature = (x, peer, *, dtype=None))]
    fn send(&self, py: Python<'_>, x: Bound<'_, PyAny>, peer: i64, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let peer = peer_arg("peer", peer)?;
        let v = view(&x, false, parse_dtype(dtype)?, "x")?;
        let (s, d, g) = (Span::of(&v), v.dtype, &*self.inner);
        // SAFETY: the export is alive for the call.
        let r = py.allow_threads(|| g.bytes().send(d, unsafe { s.bytes() }, peer));
        drop(v);
        r.map_err(|e| self.err(py, e))
    }

    /// Receive into `x` from rank `peer`. Returns `x`.
    #[pyo3(signature = (x, peer, *, dtype=None))]
    fn recv<'py>(
        &self,
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        peer: i64,
        dtype: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let peer = peer_arg("peer", peer)?;
        let v = view(&x, true, parse_dtype(dtype)?, "x")?;
        let (s, d, g) = (Span::of(&v), v.dtype, &*self.inner);
        // SAFETY: the writable export is alive for the call.
        let r = py.allow_threads(|| g.bytes().recv(d, unsafe { s.bytes_mut() }, peer));
        drop(v);
        r.map_err(|e| self.err(py, e))?;
        Ok(x)
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
        let g = &*self.inner;
        let sub = py.allow_threads(|| g.split(color, key)).map_err(|e| self.err(py, e))?;
        Ok(sub.map(|s| PyGroup { inner: Arc::new(s), pending: self.pending.clone() }))
    }

    fn __repr__(&self) -> String {
        format!("<boltccl.Group rank {} of {}>", self.inner.rank(), self.inner.size())
    }
}

/// The compiled part of the boltccl package.
/// Run a job with the launcher `boltccl launch` uses (see `boltccl.launch`): `n` local ranks,
/// or one per entry of the JSON `hostfile`, started over ssh. Returns the exit code, and each rank's output
/// when `capture` is true (else nothing is captured: output is relayed with a `[rank]` prefix).
#[pyfunction]
#[pyo3(signature = (command, *, n=None, hostfile=None, port=None, env=Vec::new(), pin=true, timeout=None, capture=false))]
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
    let job = Job { placement, port, env, pin, timeout, command };
    py.allow_threads(|| {
        if capture {
            boltccl_launch::run_captured(&job).map_err(PyValueError::new_err)
        } else {
            Ok((boltccl_launch::run(&job), Vec::new()))
        }
    })
}

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGroup>()?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(launch, m)?)?;
    m.add("__version__", boltccl::VERSION)?;
    m.add("DTYPES", DType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>())?;
    Ok(())
}
