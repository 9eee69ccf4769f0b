//! Zero-copy access to buffer-protocol objects (numpy arrays, memoryview, array.array, ...).
//!
//! The buffer protocol joined the stable ABI in Python 3.11 with the `Py_buffer` layout it has
//! had since 3.3, and `PyObject_GetBuffer`/`PyBuffer_Release` are exported by every CPython
//! 3.x. pyo3 only declares them for 3.11+ under abi3, so this module declares them itself to
//! keep one abi3 wheel for 3.9+.

use boltccl::DType;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void, CStr};

/// `Py_buffer`, as laid out by CPython 3.3 and later.
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

const PYBUF_WRITABLE: c_int = 0x0001;
const PYBUF_FORMAT: c_int = 0x0004;
const PYBUF_STRIDES: c_int = 0x0010 | 0x0008;
const PYBUF_C_CONTIGUOUS: c_int = 0x0020 | PYBUF_STRIDES;

/// A buffer-protocol export, released (with the GIL held) when dropped.
struct BufferExport(Box<RawBuffer>);

impl Drop for BufferExport {
    fn drop(&mut self) {
        // SAFETY: filled by a successful `PyObject_GetBuffer` and released once. Views are
        // dropped where the GIL is held (pymethods, or a Work holding them).
        unsafe { PyBuffer_Release(&mut *self.0) }
    }
}

enum Export {
    Buffer(BufferExport),
    DlPack(crate::dlpack::Managed),
}

/// An exported array: its memory stays put and alive while this is held.
pub struct View {
    export: Export,
    /// The element type, from the format or the caller's `dtype`.
    pub dtype: DType,
}

// SAFETY: the exporter keeps the memory alive and in place until the export is released;
// the pointer is only dereferenced (by boltccl) while the view is held. A buffer-protocol
// export is released in `Drop`, which runs with the GIL held (views are dropped in
// pymethods or by a Work, both holding the GIL).
unsafe impl Send for View {}

impl View {
    /// Start address.
    pub fn addr(&self) -> usize {
        match &self.export {
            Export::Buffer(b) => b.0.buf as usize,
            Export::DlPack(m) => m.addr,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match &self.export {
            Export::Buffer(b) => b.0.len as usize,
            Export::DlPack(m) => m.len,
        }
    }
}

fn try_get(obj: &Bound<'_, PyAny>, flags: c_int) -> Option<Box<RawBuffer>> {
    // SAFETY: an all-zero `Py_buffer` is a valid out-parameter for `PyObject_GetBuffer`.
    let mut raw: Box<RawBuffer> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: `obj` is a live object (we hold the GIL) and `raw` is writable.
    let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *raw, flags) };
    if rc == 0 {
        Some(raw)
    } else {
        // SAFETY: GIL held; discard the exporter's error, the caller raises its own.
        unsafe { ffi::PyErr_Clear() };
        None
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// Export `obj` as a C-contiguous buffer (writable if asked) and decide its element type.
/// `what` names the argument in messages (`"x"`, `"out"`).
pub fn view(obj: &Bound<'_, PyAny>, writable: bool, dtype: Option<DType>, what: &str) -> PyResult<View> {
    let w = if writable { PYBUF_WRITABLE } else { 0 };
    if let Some(raw) = try_get(obj, PYBUF_C_CONTIGUOUS | PYBUF_FORMAT | w) {
        return finish(obj, raw, dtype, what);
    }
    // Slow path: find out what is wrong, or fall back to an export without a format
    // (numpy refuses a format for ml_dtypes' bfloat16).
    let Some(raw) = try_get(obj, PYBUF_STRIDES | PYBUF_FORMAT).or_else(|| try_get(obj, PYBUF_STRIDES)) else {
        // No buffer protocol: DLPack (torch CPU tensors).
        if let Some(m) = crate::dlpack::export(obj, what)? {
            return from_dlpack(obj, m, writable, dtype, what);
        }
        return Err(PyTypeError::new_err(format!(
            "{what} must be an array in CPU memory, with the buffer protocol or DLPack (a numpy array, \
             torch CPU tensor, mlx.core array, JAX array, memoryview, array.array or bytearray); got {}",
            type_name(obj)
        )));
    };
    let name = type_name(obj);
    if writable && raw.readonly != 0 {
        // Release the probe view (GIL held).
        drop(BufferExport(raw));
        return Err(read_only(what, &name));
    }
    if !is_c_contiguous(&raw) {
        drop(BufferExport(raw));
        return Err(PyValueError::new_err(format!(
            "{what} ({name}) is not C-contiguous: boltccl works in place on contiguous memory; \
             pass numpy.ascontiguousarray({what}) (and copy the result back if needed)"
        )));
    }
    finish(obj, raw, dtype, what)
}

fn read_only(what: &str, name: &str) -> PyErr {
    PyValueError::new_err(format!(
        "{what} ({name}) is read-only (JAX arrays are immutable), but this call writes into it: pass \
         out= a writable array (numpy.empty_like({what})) to reduce out of place, or a writable copy"
    ))
}

fn from_dlpack(
    obj: &Bound<'_, PyAny>,
    m: crate::dlpack::Managed,
    writable: bool,
    dtype: Option<DType>,
    what: &str,
) -> PyResult<View> {
    if writable && m.readonly {
        return Err(read_only(what, &type_name(obj)));
    }
    let dt = match dtype {
        Some(d) if d.size() != m.dtype.size() => {
            return Err(PyTypeError::new_err(format!(
                "dtype={} has {}-byte elements but {what} has {}-byte elements ({})",
                d.name(),
                d.size(),
                m.dtype.size(),
                m.dtype
            )))
        }
        Some(d) => d,
        None => m.dtype,
    };
    Ok(View { export: Export::DlPack(m), dtype: dt })
}

fn is_c_contiguous(raw: &RawBuffer) -> bool {
    if raw.strides.is_null() || raw.ndim <= 1 && raw.strides.is_null() {
        return true;
    }
    let n = raw.ndim as usize;
    // SAFETY: with PYBUF_STRIDES the exporter provides `ndim` shape and stride entries.
    let (shape, strides) =
        unsafe { (std::slice::from_raw_parts(raw.shape, n), std::slice::from_raw_parts(raw.strides, n)) };
    let mut expect = raw.itemsize;
    for i in (0..n).rev() {
        if shape[i] > 1 && strides[i] != expect {
            return false;
        }
        expect *= shape[i];
    }
    true
}

fn finish(obj: &Bound<'_, PyAny>, raw: Box<RawBuffer>, dtype: Option<DType>, what: &str) -> PyResult<View> {
    let itemsize = raw.itemsize as usize;
    let format = if raw.format.is_null() {
        None
    } else {
        // SAFETY: a non-NULL format is a NUL-terminated string owned by the export.
        Some(unsafe { CStr::from_ptr(raw.format) }.to_string_lossy().into_owned())
    };
    let mut view = View { export: Export::Buffer(BufferExport(raw)), dtype: DType::U8 };
    let from_format = match &format {
        Some(f) => from_format(f, itemsize),
        None if itemsize == 2 && is_bfloat16_array(obj) => Ok(DType::BF16),
        None => Err(format!("{what} ({}) does not say its element type", type_name(obj))),
    };
    view.dtype = match (dtype, from_format) {
        (None, Ok(d)) => d,
        (None, Err(e)) => {
            return Err(PyTypeError::new_err(format!(
                "{e}; if the memory holds one of those, say which with dtype=\"float32\", \"bfloat16\", ..."
            )))
        }
        (Some(d), _) if d.size() == itemsize => d,
        (Some(d), _) if itemsize == 1 && matches!(format.as_deref(), None | Some("B" | "b" | "c")) => {
            if view.len() % d.size() != 0 {
                return Err(PyValueError::new_err(format!(
                    "{what} has {} bytes, not a whole number of {d} elements",
                    view.len()
                )));
            }
            d
        }
        (Some(d), _) => {
            return Err(PyTypeError::new_err(format!(
                "dtype={} has {}-byte elements but {what} has {itemsize}-byte items (format {:?}); \
                 pass a view with matching items (for numpy, x.view(numpy.uint16) for bfloat16)",
                d.name(),
                d.size(),
                format.as_deref().unwrap_or("none")
            )))
        }
    };
    Ok(view)
}

fn is_bfloat16_array(obj: &Bound<'_, PyAny>) -> bool {
    obj.getattr("dtype")
        .and_then(|d| d.getattr("name"))
        .and_then(|n| n.extract::<String>())
        .is_ok_and(|n| n == "bfloat16")
}

/// The element type of a struct-module format string with items of `itemsize` bytes.
pub fn from_format(format: &str, itemsize: usize) -> Result<DType, String> {
    if format == "bfloat16" && itemsize == 2 {
        return Ok(DType::BF16); // mlx.core arrays name it so
    }
    let code = match format.as_bytes() {
        [b'@' | b'=' | b'<', c] | [c] => *c,
        [b'>' | b'!', _] if cfg!(target_endian = "little") => {
            return Err(format!(
                "big-endian data (format {format:?}) is not supported; convert it to native byte order"
            ))
        }
        _ => return Err(unsupported(format, itemsize)),
    };
    let int = |signed: bool| match (signed, itemsize) {
        (true, 1) => Some(DType::I8),
        (true, 2) => Some(DType::I16),
        (true, 4) => Some(DType::I32),
        (true, 8) => Some(DType::I64),
        (false, 1) => Some(DType::U8),
        (false, 2) => Some(DType::U16),
        (false, 4) => Some(DType::U32),
        (false, 8) => Some(DType::U64),
        _ => None,
    };
    let d = match code {
        b'f' if itemsize == 4 => Some(DType::F32),
        b'd' if itemsize == 8 => Some(DType::F64),
        b'e' if itemsize == 2 => Some(DType::F16),
        b'b' | b'h' | b'i' | b'l' | b'q' | b'n' => int(true),
        b'B' | b'H' | b'I' | b'L' | b'Q' | b'N' | b'c' => int(false),
        _ => None,
    };
    d.ok_or_else(|| unsupported(format, itemsize))
}

fn unsupported(format: &str, itemsize: usize) -> String {
    format!(
        "unsupported element type (buffer format {format:?}, {itemsize}-byte items); boltccl reduces \
         float16/32/64, bfloat16 and 8- to 64-bit integers"
    )
}

/// Parse a `dtype=` argument: a name (`"bfloat16"`, `"f32"`), a numpy dtype or scalar type.
pub fn parse_dtype(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<DType>> {
    let Some(obj) = obj else { return Ok(None) };
    if obj.is_none() {
        return Ok(None);
    }
    let name: String = if let Ok(s) = obj.extract::<String>() {
        s
    } else if let Ok(n) = obj.getattr("name").and_then(|n| n.extract::<String>()) {
        n // numpy dtype
    } else if let Ok(n) = obj.getattr("__name__").and_then(|n| n.extract::<String>()) {
        n // numpy scalar type such as numpy.float32
    } else {
        obj.str()?.to_string()
    };
    let name = name.strip_prefix("torch.").unwrap_or(&name).to_string();
    DType::from_name(&name).map(Some).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "unknown dtype {name:?}: use one of float32, float64, float16, bfloat16, int8..int64, uint8..uint64"
        ))
    })
}
