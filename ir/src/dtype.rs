//! Element types of tensors, with their ONNX codes and text names.

use std::fmt;

/// A tensor element type. The text name (`Display`/[`DType::from_name`]) is
/// what the IR text format uses; [`DType::onnx_code`] is `TensorProto.DataType`.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    F8E4M3,
    F8E5M2,
    /// ONNX `FLOAT8E4M3FNUZ`: no negative zero, one NaN, bias 8.
    F8E4M3Fnuz,
    /// ONNX `FLOAT8E5M2FNUZ`.
    F8E5M2Fnuz,
    /// ONNX `FLOAT4E2M1` (packed two a byte, like the 4-bit integers).
    F4E2M1,
    /// ONNX `FLOAT8E8M0`: an exponent-only scale type (MX formats).
    F8E8M0,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    I4,
    U4,
    /// ONNX `INT2`/`UINT2`, packed four a byte.
    I2,
    U2,
    Bool,
    /// ONNX `STRING` tensors: kept so such models import, never computed on.
    Str,
}

impl DType {
    pub const ALL: [DType; 24] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
        DType::F4E2M1,
        DType::F8E8M0,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U64,
        DType::U32,
        DType::U16,
        DType::U8,
        DType::I4,
        DType::U4,
        DType::I2,
        DType::U2,
        DType::Bool,
        DType::Str,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E4M3Fnuz => "f8e4m3fnuz",
            DType::F8E5M2Fnuz => "f8e5m2fnuz",
            DType::F4E2M1 => "f4e2m1",
            DType::F8E8M0 => "f8e8m0",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U64 => "u64",
            DType::U32 => "u32",
            DType::U16 => "u16",
            DType::U8 => "u8",
            DType::I4 => "i4",
            DType::U4 => "u4",
            DType::I2 => "i2",
            DType::U2 => "u2",
            DType::Bool => "bool",
            DType::Str => "str",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Str => 8,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::BF16 => 16,
            DType::F8E4M3 => 17,
            DType::F8E4M3Fnuz => 18,
            DType::F8E5M2 => 19,
            DType::F8E5M2Fnuz => 20,
            DType::U4 => 21,
            DType::I4 => 22,
            DType::F4E2M1 => 23,
            DType::F8E8M0 => 24,
            DType::U2 => 25,
            DType::I2 => 26,
        }
    }

    pub fn from_onnx_code(c: i32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.onnx_code() == c)
    }

    /// Storage size in bits of one element (`Str` has no fixed size: 0).
    pub fn bits(self) -> u32 {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 64,
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 16,
            DType::F8E4M3
            | DType::F8E5M2
            | DType::F8E4M3Fnuz
            | DType::F8E5M2Fnuz
            | DType::F8E8M0
            | DType::I8
            | DType::U8
            | DType::Bool => 8,
            DType::I4 | DType::U4 | DType::F4E2M1 => 4,
            DType::I2 | DType::U2 => 2,
            DType::Str => 0,
        }
    }

    /// Bytes taken by `n` elements in ONNX raw layout (4-bit types pack two
    /// a byte, 2-bit types four).
    pub fn storage_bytes(self, n: u64) -> u64 {
        // Saturating: `n` may come from a file's declared dims.
        n.saturating_mul(u64::from(self.bits())).div_ceil(8)
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F64
                | DType::F32
                | DType::F16
                | DType::BF16
                | DType::F8E4M3
                | DType::F8E5M2
                | DType::F8E4M3Fnuz
                | DType::F8E5M2Fnuz
                | DType::F4E2M1
                | DType::F8E8M0
        )
    }

    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I64
                | DType::I32
                | DType::I16
                | DType::I8
                | DType::U64
                | DType::U32
                | DType::U16
                | DType::U8
                | DType::I4
                | DType::U4
                | DType::I2
                | DType::U2
        )
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::I4 | DType::I2)
    }

    pub fn is_numeric(self) -> bool {
        self.is_float() || self.is_int()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_are_bijective() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(DType::from_onnx_code(d.onnx_code()), Some(d));
        }
    }
}
