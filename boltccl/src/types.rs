//! The vocabulary of a call: element types, reduction operators and collectives.

use half::{bf16, f16};

/// The element types boltccl can reduce and move. The numeric values are part of the wire
/// format and of the C ABI: never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// 32-bit IEEE float.
    F32 = 0,
    /// 64-bit IEEE float.
    F64 = 1,
    /// 16-bit IEEE float.
    F16 = 2,
    /// bfloat16.
    BF16 = 3,
    /// Signed 8-bit integer.
    I8 = 4,
    /// Signed 16-bit integer.
    I16 = 5,
    /// Signed 32-bit integer.
    I32 = 6,
    /// Signed 64-bit integer.
    I64 = 7,
    /// Unsigned 8-bit integer.
    U8 = 8,
    /// Unsigned 16-bit integer.
    U16 = 9,
    /// Unsigned 32-bit integer.
    U32 = 10,
    /// Unsigned 64-bit integer.
    U64 = 11,
}

impl DType {
    /// Every element type, in wire order.
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Lower-case name, as used in messages and in Python (`"float32"`, `"bfloat16"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
        }
    }

    /// Decode the wire/ABI number.
    pub fn from_u8(v: u8) -> Option<DType> {
        DType::ALL.get(v as usize).copied()
    }

    /// Parse a name as produced by [`DType::name`] (also accepts `f32`, `bf16`, `i32`, ...).
    pub fn from_name(s: &str) -> Option<DType> {
        let short = |d: DType| match d {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
        };
        DType::ALL.into_iter().find(|&d| d.name() == s || short(d) == s)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operator. Numbers are part of the wire format: never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Elementwise sum (integers wrap around).
    Sum = 0,
    /// Elementwise maximum.
    Max = 1,
    /// Elementwise minimum.
    Min = 2,
}

impl ReduceOp {
    /// Every operator, in wire order.
    pub const ALL: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];

    /// Decode the wire number.
    pub fn from_u8(v: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(v as usize).copied()
    }

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// The calls every surface offers, declared once: `Group` and `Scope` (typed, Rust), the C
/// API (`boltccl_NAME` and `boltccl_NAME_async`) and Python (`Group.NAME`). `tests/surfaces.rs`
/// checks each surface against this list, so adding a collective starts here.
#[doc(hidden)]
pub const CALLS: &[&str] = &[
    "all_sum",
    "all_max",
    "all_min",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "send",
    "recv",
    "barrier",
    "all_to_all",
    "all_to_all_v",
    "gather",
    "scatter",
    "reduce",
];

/// The further typed forms `Group` and `Scope` offer (an explicit reduction, a separate
/// output), checked like [`CALLS`].
#[doc(hidden)]
pub const TYPED_CALLS: &[&str] = &["all_reduce", "all_reduce_into", "all_sum_into", "reduce_scatter_with"];

/// The byte-level calls of `Bytes`: one per [`crate::Op`] with buffers.
#[doc(hidden)]
pub const BYTE_CALLS: &[&str] = &[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "send",
    "recv",
    "all_to_all",
    "all_to_all_v",
    "gather",
    "scatter",
    "reduce",
];

/// A call on a group. Numbers are part of the wire format (every message names its call):
/// never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Collective {
    /// all_sum / all_max / all_min
    AllReduce = 1,
    /// all_gather
    AllGather = 2,
    /// reduce_scatter
    ReduceScatter = 3,
    /// broadcast
    Broadcast = 4,
    /// barrier
    Barrier = 5,
    /// send / recv
    SendRecv = 6,
    /// all_to_all: equal parts
    AllToAll = 7,
    /// all_to_all_v: a count per peer and direction
    AllToAllV = 8,
    /// gather to a root
    Gather = 9,
    /// scatter from a root
    Scatter = 10,
    /// reduce to a root
    Reduce = 11,
}

impl Collective {
    /// Every collective, in wire order.
    pub const ALL: [Collective; 11] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Barrier,
        Collective::SendRecv,
        Collective::AllToAll,
        Collective::AllToAllV,
        Collective::Gather,
        Collective::Scatter,
        Collective::Reduce,
    ];

    /// Decode the wire number.
    pub fn from_u8(v: u8) -> Option<Collective> {
        Collective::ALL.into_iter().find(|c| *c as u8 == v)
    }

    /// The call's name, with the reduction for all-reduce and reduce-scatter (`all_max`,
    /// `reduce_scatter(min)`, ...).
    pub fn describe(self, op: Option<ReduceOp>) -> String {
        match (self, op) {
            (Collective::AllReduce, Some(r)) => format!("all_{}", r.name()),
            (Collective::ReduceScatter, Some(r)) => format!("reduce_scatter({})", r.name()),
            (Collective::Reduce, Some(r)) => format!("reduce({})", r.name()),
            (c, _) => c.name().to_string(),
        }
    }

    /// The call's name without its reduction.
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Barrier => "barrier",
            Collective::SendRecv => "send/recv",
            Collective::AllToAll => "all_to_all",
            Collective::AllToAllV => "all_to_all_v",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::Reduce => "reduce",
        }
    }
}

/// A Rust type that boltccl can send and reduce. Implemented for `f32`, `f64`,
/// [`half::f16`], [`half::bf16`] and the fixed-size integers.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DTYPE: DType = DType::$d; })*
    };
}

element!(
    f32 => F32, f64 => F64, f16 => F16, bf16 => BF16,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_u8(d as u8), Some(d));
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_u8(12), None);
        assert_eq!(DType::from_name("bf16"), Some(DType::BF16));
        assert_eq!(DType::from_name("float128"), None);
    }

    #[test]
    fn collectives_and_ops_round_trip() {
        for c in Collective::ALL {
            assert_eq!(Collective::from_u8(c as u8), Some(c));
        }
        for r in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_u8(r as u8), Some(r));
        }
        assert_eq!(Collective::AllReduce.describe(Some(ReduceOp::Max)), "all_max");
        assert_eq!(Collective::ReduceScatter.describe(Some(ReduceOp::Min)), "reduce_scatter(min)");
        assert_eq!(Collective::Broadcast.describe(None), "broadcast");
    }

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::BF16.size(), std::mem::size_of::<bf16>());
        assert_eq!(DType::U64.size(), std::mem::size_of::<u64>());
    }
}
