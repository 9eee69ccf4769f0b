//! Zero-copy access to arrays that export DLPack but not the buffer protocol (torch CPU
//! tensors, bfloat16 included): `x.__dlpack__()` hands over a capsule with a
//! `DLManagedTensor` (or, from DLPack 1.0, `DLManagedTensorVersioned`, which also says whether
//! the memory is read-only); we take ownership of it (renaming the capsule `used_...`, as the
//! protocol asks), read its pointer, and call its deleter when done.

use boltccl::DType;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyTuple};
use std::ffi::{c_void, CStr};

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

const KDL_CPU: i32 = 1;
const FLAG_READ_ONLY: u64 = 1;

/// A DLPack export we own: released (its deleter called) on drop.
pub struct Managed {
    ptr: *mut c_void,
    versioned: bool,
    /// Start address and length in bytes.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Element type.
    pub dtype: DType,
    /// The exporter says the memory must not be written.
    pub readonly: bool,
}

// SAFETY: the exporter keeps the memory alive until the deleter runs; the pointer is only
// used by boltccl while this value is held, and the deleter may run on any thread (DLPack).
unsafe impl Send for Managed {}

impl Drop for Managed {
    fn drop(&mut self) {
        // SAFETY: we own the managed tensor (the capsule was renamed "used_..."), and call its
        // deleter exactly once.
        unsafe {
            if self.versioned {
                let m = self.ptr as *mut DLManagedTensorVersioned;
                if let Some(d) = (*m).deleter {
                    d(m);
                }
            } else {
                let m = self.ptr as *mut DLManagedTensor;
                if let Some(d) = (*m).deleter {
                    d(m);
                }
            }
        }
    }
}

fn dtype_of(t: &DLDataType) -> Option<DType> {
    if t.lanes != 1 {
        return None;
    }
    Some(match (t.code, t.bits) {
        (0, 8) => DType::I8,
        (0, 16) => DType::I16,
        (0, 32) => DType::I32,
        (0, 64) => DType::I64,
        (1, 8) => DType::U8,
        (1, 16) => DType::U16,
        (1, 32) => DType::U32,
        (1, 64) => DType::U64,
        (2, 16) => DType::F16,
        (2, 32) => DType::F32,
        (2, 64) => DType::F64,
        (4, 16) => DType::BF16,
        _ => return None,
    })
}

/// Export `obj` through `__dlpack__` (`None` if it has none). `what` names the argument.
pub fn export(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<Managed>> {
    let py = obj.py();
    if !obj.hasattr("__dlpack__")? {
        return Ok(None);
    }
    let name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    if obj.getattr("requires_grad").and_then(|r| r.extract::<bool>()).unwrap_or(false) {
        return Err(PyValueError::new_err(format!(
            "{what} ({name}) requires grad: boltccl would change it behind autograd's back; pass {what}.detach() \
             (it shares memory), or reduce gradients through torch.distributed with backend \"boltccl\""
        )));
    }
    let kwargs = [("max_version", PyTuple::new(py, [1u32, 0])?)].into_py_dict(py)?;
    let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<PyTypeError>(py) => obj.call_method0("__dlpack__")?,
        Err(e) => return Err(PyValueError::new_err(format!("{what} ({name}) cannot be shared without a copy: {e}"))),
    };
    let cap = capsule.as_ptr();
    // SAFETY: `cap` is a live object (we hold a reference); the capsule calls only read it.
    let versioned = unsafe { ffi::PyCapsule_IsValid(cap, c"dltensor_versioned".as_ptr()) } == 1;
    // SAFETY: as above.
    if !versioned && unsafe { ffi::PyCapsule_IsValid(cap, c"dltensor".as_ptr()) } != 1 {
        return Err(PyTypeError::new_err(format!("{what}.__dlpack__() did not return a DLPack capsule")));
    }
    let (cname, used): (&CStr, &CStr) =
        if versioned { (c"dltensor_versioned", c"used_dltensor_versioned") } else { (c"dltensor", c"used_dltensor") };
    // SAFETY: validated above; the pointer is the managed tensor the capsule carries.
    let ptr = unsafe { ffi::PyCapsule_GetPointer(cap, cname.as_ptr()) };
    if ptr.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: we take ownership, as the protocol asks: rename so the capsule's destructor
    // leaves the tensor to us.
    if unsafe { ffi::PyCapsule_SetName(cap, used.as_ptr()) } != 0 {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a managed tensor of the kind the capsule name says, alive until its deleter.
    let (t, flags): (&DLTensor, u64) = unsafe {
        if versioned {
            let m = &*(ptr as *const DLManagedTensorVersioned);
            (&m.dl_tensor, m.flags)
        } else {
            (&(*(ptr as *const DLManagedTensor)).dl_tensor, 0)
        }
    };
    let mut m = Managed { ptr, versioned, addr: 0, len: 0, dtype: DType::U8, readonly: flags & FLAG_READ_ONLY != 0 };
    if t.device.device_type != KDL_CPU {
        return Err(PyTypeError::new_err(format!(
            "{what} ({name}) is not in CPU memory (DLPack device type {}): boltccl works on CPU memory; \
             move it with {what}.cpu()",
            t.device.device_type
        )));
    }
    m.dtype = dtype_of(&t.dtype).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{what} ({name}) has an unsupported element type (DLPack code {}, {} bits, {} lanes); boltccl reduces \
             float16/32/64, bfloat16 and 8- to 64-bit integers",
            t.dtype.code, t.dtype.bits, t.dtype.lanes
        ))
    })?;
    let n = usize::try_from(t.ndim).unwrap_or(0);
    // SAFETY: DLPack gives `ndim` shape entries (and strides, when not NULL).
    let shape = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(t.shape, n) } };
    let count: i64 = shape.iter().product();
    if !t.strides.is_null() && n > 0 {
        // SAFETY: as above.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, n) };
        let mut expect = 1i64;
        for i in (0..n).rev() {
            if shape[i] > 1 && strides[i] != expect {
                return Err(PyValueError::new_err(format!(
                    "{what} ({name}) is not contiguous: boltccl works in place on contiguous memory; pass \
                     {what}.contiguous() (and copy the result back if needed)"
                )));
            }
            expect *= shape[i];
        }
    }
    m.len = usize::try_from(count).unwrap_or(0) * m.dtype.size();
    m.addr = t.data as usize + t.byte_offset as usize;
    Ok(Some(m))
}
