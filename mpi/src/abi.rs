//! Open MPI's ABI, the part MLX's `mpi` backend uses: constants, the status struct, and the
//! handles.
//!
//! In Open MPI an `MPI_Comm`, `MPI_Datatype` or `MPI_Op` is a pointer to an object; the
//! predefined ones are exported data symbols (`ompi_mpi_comm_world`, `ompi_mpi_float`,
//! `ompi_mpi_op_sum`, ...) that MLX looks up with `dlsym`. Here every handle points to an
//! object that starts with a [`Head`]: a magic number and what the object is. A handle is
//! decoded by reading that head, never by comparing addresses, so a program linked against
//! the library keeps working when the dynamic linker copies a predefined object into the
//! executable (a copy relocation gives it a second address, with the same contents).

use boltccl::{DType, Group, ReduceOp};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// `MPI_SUCCESS`.
pub const MPI_SUCCESS: c_int = 0;
/// `MPI_ANY_SOURCE`: a receive from whoever sends first, which boltccl does not offer.
pub const MPI_ANY_SOURCE: c_int = -1;
/// `MPI_ANY_TAG`.
pub const MPI_ANY_TAG: c_int = -1;
/// `MPI_UNDEFINED`: the color of a rank that joins no communicator in `MPI_Comm_split`.
pub const MPI_UNDEFINED: c_int = -32766;
/// `MPI_IN_PLACE`: `(void *) 1`, an ABI value (not a dangling pointer to anything).
#[allow(clippy::manual_dangling_ptr)]
pub const MPI_IN_PLACE: *const c_void = 1 as *const c_void;
/// `MPI_MAX_LIBRARY_VERSION_STRING`, Open MPI's value.
pub const MPI_MAX_LIBRARY_VERSION_STRING: usize = 256;

/// `MPI_Status` as Open MPI lays it out (`ompi_status_public_t`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct MpiStatus {
    /// The sending rank.
    pub source: c_int,
    /// The message's tag.
    pub tag: c_int,
    /// The error code of this message.
    pub error: c_int,
    /// Open MPI's cancellation flag.
    pub cancelled: c_int,
    /// The received size in bytes.
    pub ucount: usize,
}

/// A user reduction: `inout[i] = in[i] op inout[i]` for `*len` items of `*datatype`.
pub type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut Handle);

/// `MPI_Comm`, `MPI_Datatype`, `MPI_Op`: a pointer to an object that starts with a [`Head`].
pub type Handle = *const Head;

/// "boltccl!" in ASCII: marks an object this library made.
const MAGIC: u64 = 0x2163_636c_746c_6f62;

/// The start of every object a handle points to.
#[repr(C)]
#[derive(Debug)]
pub struct Head {
    magic: u64,
    kind: Kind,
}

#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    CommWorld = 1,
    CommNull = 2,
    CommSplit = 3,
    Datatype = 4,
    Op = 5,
}

const fn head(kind: Kind) -> Head {
    Head { magic: MAGIC, kind }
}

/// Read the head of `h`.
///
/// # Safety
/// `h` must be NULL, `MPI_IN_PLACE`, or point to at least a `Head`'s worth of readable bytes
/// (as every handle an MPI program holds does).
unsafe fn kind_of(h: Handle) -> Option<Kind> {
    if h.is_null() || h as *const c_void == MPI_IN_PLACE {
        return None;
    }
    // SAFETY: non-NULL, and readable per the caller's contract.
    let head = unsafe { &*h };
    (head.magic == MAGIC).then_some(head.kind)
}

// ---------------------------------------------------------------------------------------------
// Communicators

/// A communicator object with nothing but its head (the world, the null communicator).
#[repr(C)]
pub struct PredefinedComm {
    head: Head,
}

/// A communicator made by `MPI_Comm_split`: a boltccl group over some of the world's ranks.
#[repr(C)]
pub struct SplitComm {
    head: Head,
    /// The group.
    pub group: Group,
}

impl SplitComm {
    /// A new handle for `group`, to be released with [`SplitComm::free`].
    pub fn into_handle(group: Group) -> Handle {
        Box::into_raw(Box::new(SplitComm { head: head(Kind::CommSplit), group })) as Handle
    }

    /// Drop the communicator behind `h`.
    ///
    /// # Safety
    /// `h` must come from [`SplitComm::into_handle`] and not have been freed.
    pub unsafe fn free(h: Handle) {
        // SAFETY: made by `Box::into_raw` in `into_handle`, freed once per the contract.
        drop(unsafe { Box::from_raw(h as *mut SplitComm) });
    }
}

/// What a communicator handle is.
pub enum Comm<'a> {
    /// `MPI_COMM_WORLD`.
    World,
    /// `MPI_COMM_NULL`.
    Null,
    /// A communicator from `MPI_Comm_split`.
    Split(&'a Group),
}

/// Decode a communicator handle; `Err` says what was passed instead.
///
/// # Safety
/// `h` must be NULL, `MPI_IN_PLACE` or a live handle; a split communicator must not have
/// been freed.
pub unsafe fn comm<'a>(h: Handle) -> Result<Comm<'a>, String> {
    // SAFETY: per the caller's contract.
    match unsafe { kind_of(h) } {
        Some(Kind::CommWorld) => Ok(Comm::World),
        Some(Kind::CommNull) => Ok(Comm::Null),
        // SAFETY: the head says this is a `SplitComm`, alive per the caller's contract.
        Some(Kind::CommSplit) => Ok(Comm::Split(unsafe { &(*(h as *const SplitComm)).group })),
        other => Err(format!("{h:p} is not a communicator ({})", describe(other))),
    }
}

/// `MPI_COMM_WORLD`.
#[no_mangle]
pub static ompi_mpi_comm_world: PredefinedComm = PredefinedComm { head: head(Kind::CommWorld) };
/// `MPI_COMM_NULL`: what `MPI_Comm_split` gives a rank that passed `MPI_UNDEFINED`.
#[no_mangle]
pub static ompi_mpi_comm_null: PredefinedComm = PredefinedComm { head: head(Kind::CommNull) };

/// The handle of `MPI_COMM_NULL`.
pub fn comm_null() -> Handle {
    &ompi_mpi_comm_null.head
}

// ---------------------------------------------------------------------------------------------
// Datatypes

/// What one element of a datatype is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// `MPI_C_BOOL`: one byte, 0 or 1.
    Bool,
    /// A number boltccl knows.
    Num(DType),
    /// `MPI_C_COMPLEX`: two `float`s.
    Complex64,
}

impl Elem {
    /// Size in bytes.
    pub const fn size(self) -> usize {
        match self {
            Elem::Bool => 1,
            Elem::Num(d) => d.size(),
            Elem::Complex64 => 8,
        }
    }

    /// How boltccl moves it: the element type and how many of them one element is.
    pub const fn carried_as(self) -> (DType, usize) {
        match self {
            Elem::Bool => (DType::U8, 1),
            Elem::Num(d) => (d, 1),
            Elem::Complex64 => (DType::F32, 2),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Elem::Bool => "bool",
            Elem::Num(d) => d.name(),
            Elem::Complex64 => "complex64",
        }
    }
}

/// A datatype: `count` consecutive `elem`s (1 for the predefined types).
#[repr(C)]
pub struct Datatype {
    head: Head,
    /// The element.
    pub elem: Elem,
    /// How many elements one item of this type is.
    pub count: usize,
    /// A predefined type (not made by `MPI_Type_contiguous`).
    pub predefined: bool,
    committed: AtomicBool,
}

impl Datatype {
    const fn predefined(elem: Elem) -> Datatype {
        Datatype { head: head(Kind::Datatype), elem, count: 1, predefined: true, committed: AtomicBool::new(true) }
    }

    /// A new handle for `count` consecutive `elem`s (never freed: MLX keeps its types for the
    /// life of the process, and `MPI_Type_free` is not part of the subset).
    pub fn contiguous(elem: Elem, count: usize) -> Handle {
        let ty =
            Datatype { head: head(Kind::Datatype), elem, count, predefined: false, committed: AtomicBool::new(false) };
        Box::leak(Box::new(ty)) as *const Datatype as Handle
    }

    /// `MPI_Type_commit` was called (always, for the predefined types).
    pub fn is_committed(&self) -> bool {
        self.committed.load(Ordering::Relaxed)
    }

    /// Mark it committed.
    pub fn commit(&self) {
        self.committed.store(true, Ordering::Relaxed);
    }

    /// Bytes per item.
    pub fn item_bytes(&self) -> usize {
        self.elem.size() * self.count
    }

    /// For messages: `contiguous(2, uint8)`, `float32`, ...
    pub fn name(&self) -> String {
        if self.predefined {
            self.elem.name().to_string()
        } else {
            format!("contiguous({}, {})", self.count, self.elem.name())
        }
    }
}

/// Decode a datatype handle.
///
/// # Safety
/// `h` must be NULL, `MPI_IN_PLACE` or a live handle.
pub unsafe fn datatype<'a>(h: Handle) -> Result<&'a Datatype, String> {
    // SAFETY: per the caller's contract.
    match unsafe { kind_of(h) } {
        // SAFETY: the head says this is a `Datatype`; they are static or leaked, never freed.
        Some(Kind::Datatype) => Ok(unsafe { &*(h as *const Datatype) }),
        other => Err(format!(
            "{h:p} is not a datatype this library knows ({}); the subset has MPI_C_BOOL, \
             MPI_INT8_T ... MPI_UINT64_T, MPI_FLOAT, MPI_DOUBLE, MPI_C_COMPLEX and \
             MPI_Type_contiguous of them",
            describe(other)
        )),
    }
}

macro_rules! predefined_types {
    ($($(#[$doc:meta])* $name:ident = $elem:expr;)*) => {$(
        $(#[$doc])*
        #[no_mangle]
        pub static $name: Datatype = Datatype::predefined($elem);
    )*};
}

predefined_types! {
    /// `MPI_C_BOOL`.
    ompi_mpi_c_bool = Elem::Bool;
    /// `MPI_INT8_T`.
    ompi_mpi_int8_t = Elem::Num(DType::I8);
    /// `MPI_UINT8_T`.
    ompi_mpi_uint8_t = Elem::Num(DType::U8);
    /// `MPI_INT16_T`.
    ompi_mpi_int16_t = Elem::Num(DType::I16);
    /// `MPI_UINT16_T`.
    ompi_mpi_uint16_t = Elem::Num(DType::U16);
    /// `MPI_INT32_T`.
    ompi_mpi_int32_t = Elem::Num(DType::I32);
    /// `MPI_UINT32_T`.
    ompi_mpi_uint32_t = Elem::Num(DType::U32);
    /// `MPI_INT64_T`.
    ompi_mpi_int64_t = Elem::Num(DType::I64);
    /// `MPI_UINT64_T`.
    ompi_mpi_uint64_t = Elem::Num(DType::U64);
    /// `MPI_FLOAT`.
    ompi_mpi_float = Elem::Num(DType::F32);
    /// `MPI_DOUBLE`.
    ompi_mpi_double = Elem::Num(DType::F64);
    /// `MPI_C_COMPLEX` (MLX's complex64).
    ompi_mpi_c_complex = Elem::Complex64;
}

// ---------------------------------------------------------------------------------------------
// Operations

/// A reduction operation: predefined (`MPI_SUM`, `MPI_MAX`, `MPI_MIN`) or the program's own.
#[repr(C)]
pub struct Operation {
    head: Head,
    /// The predefined operation, or `None` for a user function.
    pub builtin: Option<ReduceOp>,
    /// The user function (`MPI_Op_create`).
    pub user: Option<UserFn>,
    /// The user said it commutes.
    pub commute: bool,
    /// What the user function was recognised as, per item size (see `reduce::recognise`).
    pub recognised: OnceLock<(usize, Option<(DType, ReduceOp)>)>,
}

impl Operation {
    const fn builtin(op: ReduceOp) -> Operation {
        Operation { head: head(Kind::Op), builtin: Some(op), user: None, commute: true, recognised: OnceLock::new() }
    }

    /// A new handle for a user function (never freed: `MPI_Op_free` is not in the subset).
    pub fn user(f: UserFn, commute: bool) -> Handle {
        let op = Operation { head: head(Kind::Op), builtin: None, user: Some(f), commute, recognised: OnceLock::new() };
        Box::leak(Box::new(op)) as *const Operation as Handle
    }
}

/// Decode an operation handle.
///
/// # Safety
/// `h` must be NULL, `MPI_IN_PLACE` or a live handle.
pub unsafe fn operation<'a>(h: Handle) -> Result<&'a Operation, String> {
    // SAFETY: per the caller's contract.
    match unsafe { kind_of(h) } {
        // SAFETY: the head says this is an `Operation`; they are static or leaked, never freed.
        Some(Kind::Op) => Ok(unsafe { &*(h as *const Operation) }),
        other => Err(format!(
            "{h:p} is not an operation this library knows ({}); the subset has MPI_SUM, MPI_MAX, \
             MPI_MIN and MPI_Op_create",
            describe(other)
        )),
    }
}

/// `MPI_SUM`.
#[no_mangle]
pub static ompi_mpi_op_sum: Operation = Operation::builtin(ReduceOp::Sum);
/// `MPI_MAX`.
#[no_mangle]
pub static ompi_mpi_op_max: Operation = Operation::builtin(ReduceOp::Max);
/// `MPI_MIN`.
#[no_mangle]
pub static ompi_mpi_op_min: Operation = Operation::builtin(ReduceOp::Min);

fn describe(k: Option<Kind>) -> &'static str {
    match k {
        None => "NULL, MPI_IN_PLACE, or an object of another MPI library",
        Some(Kind::CommWorld | Kind::CommNull | Kind::CommSplit) => "a communicator",
        Some(Kind::Datatype) => "a datatype",
        Some(Kind::Op) => "an operation",
    }
}
