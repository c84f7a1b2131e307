//! Compute precisions: what a device multiplies in, as opposed to the
//! [`DType`] a tensor is stored in (TF32 is stored as FP32).

use std::fmt;
use std::str::FromStr;

use qsync_ir::DType;
use serde::{Deserialize, Serialize};

use crate::CostError;

/// A compute precision. Text names (`fp32`, `tf32`, `fp16`, `bf16`, `int8`,
/// `fp8e4m3`, `fp8e5m2`) are what device files, profiles and the CLI use.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Tf32,
    Fp16,
    Bf16,
    Int8,
    Fp8e4m3,
    Fp8e5m2,
}

impl Precision {
    pub const ALL: [Precision; 7] = [
        Precision::Fp32,
        Precision::Tf32,
        Precision::Fp16,
        Precision::Bf16,
        Precision::Int8,
        Precision::Fp8e4m3,
        Precision::Fp8e5m2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Int8 => "int8",
            Precision::Fp8e4m3 => "fp8e4m3",
            Precision::Fp8e5m2 => "fp8e5m2",
        }
    }

    /// Dense index in [`Precision::ALL`], for per-precision arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Bytes per stored element.
    pub fn bytes(self) -> f64 {
        match self {
            Precision::Fp32 | Precision::Tf32 => 4.0,
            Precision::Fp16 | Precision::Bf16 => 2.0,
            Precision::Int8 | Precision::Fp8e4m3 | Precision::Fp8e5m2 => 1.0,
        }
    }

    /// Effective bits, used to order precisions: wider first.
    pub fn bits(self) -> u32 {
        match self {
            Precision::Fp32 => 32,
            Precision::Tf32 => 19,
            Precision::Fp16 | Precision::Bf16 => 16,
            Precision::Int8 | Precision::Fp8e4m3 | Precision::Fp8e5m2 => 8,
        }
    }

    /// Fixed-point precisions need scales (quantize / dequantize work).
    pub fn is_fixed_point(self) -> bool {
        self == Precision::Int8
    }

    /// The dtype a tensor computed at this precision is stored in.
    pub fn storage_dtype(self) -> DType {
        match self {
            Precision::Fp32 | Precision::Tf32 => DType::F32,
            Precision::Fp16 => DType::F16,
            Precision::Bf16 => DType::BF16,
            Precision::Int8 => DType::I8,
            Precision::Fp8e4m3 => DType::F8E4M3,
            Precision::Fp8e5m2 => DType::F8E5M2,
        }
    }

    /// The precision a dtype computes in, for the dtypes that have one.
    pub fn from_dtype(d: DType) -> Option<Precision> {
        Some(match d {
            DType::F32 | DType::F64 => Precision::Fp32,
            DType::F16 => Precision::Fp16,
            DType::BF16 => Precision::Bf16,
            DType::I8 | DType::U8 => Precision::Int8,
            DType::F8E4M3 => Precision::Fp8e4m3,
            DType::F8E5M2 => Precision::Fp8e5m2,
            _ => return None,
        })
    }

    /// The wider of two precisions (ties keep `self`): QSync's rule for
    /// precision-dependent operators, which run at their widest input.
    pub fn widest(self, o: Precision) -> Precision {
        if o.bits() > self.bits() {
            o
        } else {
            self
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = CostError;

    /// Accepts the canonical names plus the common aliases `f32`, `f16`,
    /// `half`, `float`, `i8`.
    fn from_str(s: &str) -> Result<Precision, CostError> {
        let l = s.trim().to_ascii_lowercase();
        let p = match l.as_str() {
            "fp32" | "f32" | "float" | "float32" => Precision::Fp32,
            "tf32" => Precision::Tf32,
            "fp16" | "f16" | "half" | "float16" => Precision::Fp16,
            "bf16" | "bfloat16" => Precision::Bf16,
            "int8" | "i8" => Precision::Int8,
            "fp8e4m3" | "fp8" | "f8e4m3" | "e4m3" => Precision::Fp8e4m3,
            "fp8e5m2" | "f8e5m2" | "e5m2" => Precision::Fp8e5m2,
            _ => return Err(CostError::UnknownPrecision(s.to_string())),
        };
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_map_to_dtypes() {
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>().ok(), Some(p));
            assert_eq!(Precision::ALL[p.index()], p);
            let back = Precision::from_dtype(p.storage_dtype());
            let expect = if p == Precision::Tf32 { Precision::Fp32 } else { p };
            assert_eq!(back, Some(expect));
        }
        assert!("fp12".parse::<Precision>().is_err());
        assert_eq!(Precision::Fp16.widest(Precision::Fp32), Precision::Fp32);
        assert_eq!(Precision::Int8.widest(Precision::Fp16), Precision::Fp16);
    }
}
