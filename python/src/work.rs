//! `boltccl.Work`: a call started with `async_op=True`. It keeps the arrays the call uses
//! alive (and their exports held) until the call completes, whatever happens to the Work
//! object, and hands back the call's result buffer from `wait()`.

use crate::buffer::View;
use boltccl::{Group, RawRequest};
use parking_lot::Mutex;
use pyo3::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a started call uses; released (with the GIL) when it completes.
pub struct KeepAlive {
    pub views: Vec<View>,
    pub objects: Vec<Py<PyAny>>,
    /// The group, so it outlives its started calls.
    pub group: Arc<Group>,
}

/// Drop a group reference without holding the GIL: the last one stops the progress thread,
/// which may be waiting for the GIL to run a completion function.
pub fn release_group(py: Python<'_>, g: Arc<Group>) {
    py.allow_threads(move || drop(g));
}

struct Callbacks {
    done: bool,
    fns: Vec<Py<PyAny>>,
}

/// A started call (see `boltccl.Work` in the stubs).
#[pyclass(module = "boltccl", name = "Work", frozen)]
pub struct PyWork {
    req: RawRequest,
    result: Py<PyAny>,
    callbacks: Arc<Mutex<Callbacks>>,
    pending: crate::Pending,
}

impl PyWork {
    /// Wrap a started call; `keep` is released when it completes.
    pub fn new(req: RawRequest, result: Py<PyAny>, keep: KeepAlive, pending: crate::Pending) -> PyWork {
        let callbacks = Arc::new(Mutex::new(Callbacks { done: false, fns: Vec::new() }));
        let cbs = callbacks.clone();
        let keep = Mutex::new(Some(keep));
        req.on_complete(Box::new(move |_| {
            Python::with_gil(|py| {
                if let Some(k) = keep.lock().take() {
                    drop(k.views);
                    drop(k.objects);
                    release_group(py, k.group);
                }
                let fns = {
                    let mut c = cbs.lock();
                    c.done = true;
                    std::mem::take(&mut c.fns)
                };
                for f in fns {
                    if let Err(e) = f.call0(py) {
                        e.write_unraisable(py, Some(f.bind(py)));
                    }
                }
            })
        }));
        PyWork { req, result, callbacks, pending }
    }
}

#[pymethods]
impl PyWork {
    /// Wait for the call (releasing the GIL) and return its result buffer; raises the call's
    /// error. `timeout` (seconds) bounds this wait only: the call goes on, and raises
    /// `boltccl.TimeoutError` here.
    #[pyo3(signature = (timeout=None))]
    fn wait<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let until = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        loop {
            let step = Duration::from_millis(50);
            match py.allow_threads(|| self.req.wait_for(step)) {
                Some(Ok(())) => return Ok(self.result.bind(py).clone()),
                Some(Err(e)) => return Err(crate::to_py(py, e, Some(&self.pending))),
                None => {
                    py.check_signals()?;
                    if until.is_some_and(|u| Instant::now() >= u) {
                        let msg = format!(
                            "Work.wait: the call has not finished after {} s (it goes on; wait again)",
                            timeout.unwrap_or(0.0)
                        );
                        return Err(crate::raise(py, "TimeoutError", "timeout", msg));
                    }
                }
            }
        }
    }

    /// Whether the call has finished (successfully or not). Never blocks.
    fn is_completed(&self) -> bool {
        self.req.test().is_some()
    }

    /// Like `is_completed()`, raising the call's error if it failed (MPI's `test`).
    fn test(&self, py: Python<'_>) -> PyResult<bool> {
        match self.req.test() {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(crate::to_py(py, e, Some(&self.pending))),
        }
    }

    /// Call `fn()` (no arguments) once the call completes: at once if it has, else on the
    /// group's progress thread (with the GIL). It must not make a blocking boltccl call on
    /// the same group (start one with async_op=True instead). Exceptions are reported as
    /// unraisable.
    fn add_done_callback(&self, py: Python<'_>, f: Py<PyAny>) -> PyResult<()> {
        {
            let mut c = self.callbacks.lock();
            if !c.done {
                c.fns.push(f);
                return Ok(());
            }
        }
        f.call0(py).map(|_| ())
    }

    fn __repr__(&self) -> String {
        format!("<boltccl.Work {}>", if self.req.test().is_some() { "completed" } else { "pending" })
    }
}
