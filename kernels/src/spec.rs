//! [`KernelSpec`]: which kernel, with which compile-time parameters, and its
//! ABI (the argument list every back end shares).
//!
//! Every kernel is `body(args…, index)` over a one-dimensional *domain*
//! computed from its arguments (elements, 4-element chunks, rows, groups or
//! packed bytes); see [`KernelSpec::domain`]. Pointer arguments are device (or
//! host) addresses; integer arguments are `u64`.

use std::fmt;

/// A 16-bit float format.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum Half {
    F16,
    BF16,
}

impl Half {
    pub fn name(self) -> &'static str {
        match self {
            Half::F16 => "f16",
            Half::BF16 => "bf16",
        }
    }
}

/// How a real value becomes an integer code.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum Rounding {
    /// Round half to even.
    Nearest,
    /// `floor(t) + (u < t - floor(t))` with `u` uniform in `[0, 1)` from the
    /// counter-based generator in [`crate::rng`]: unbiased up to 2^-24.
    Stochastic,
}

impl Rounding {
    fn tag(self) -> &'static str {
        match self {
            Rounding::Nearest => "rn",
            Rounding::Stochastic => "sr",
        }
    }
}

/// Integer code widths the block quantizers produce.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum QBits {
    Int8,
    /// Two codes a byte (low nibble first), symmetric in `[-7, 7]`.
    Int4,
}

impl QBits {
    /// The largest symmetric code.
    pub fn qmax(self) -> i32 {
        match self {
            QBits::Int8 => 127,
            QBits::Int4 => 7,
        }
    }
}

/// A kernel and its compile-time parameters.
///
/// Quantization is organised in contiguous *groups* of `group` elements, each
/// with one scale (and, asymmetric, one zero point): per tensor is one group
/// of `n`, per channel is `group = n / channels` over a channel-major tensor,
/// per block is `group = block`. The scales come from the two-stage range
/// reduction ([`KernelSpec::RowMinMax`] with `cols = group`, then, for one
/// group over many rows, [`KernelSpec::TensorMinMax`]) and
/// [`KernelSpec::QuantParams`].
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum KernelSpec {
    /// `f32 → f16/bf16`, round to nearest even. Args `src, dst, n`.
    CastTo(Half),
    /// `f16/bf16 → f32` (exact). Args `src, dst, n`.
    CastFrom(Half),
    /// Stage one: min and max of each row of `cols` (last row may be short),
    /// NaN ignored. Args `x, n, cols, row_min, row_max`.
    RowMinMax,
    /// Stage two: `[min, max, absmax]` of the row results. Args
    /// `row_min, row_max, rows, out3`.
    TensorMinMax,
    /// Scale (and zero point) per group from its min and max. Args
    /// `min, max, groups, scale, zero_point(i32)`.
    QuantParams { bits: QBits, symmetric: bool },
    /// `f32 → i8` per group. Args `x, scale, zero_point, n, group, seed, q`.
    QuantizeInt8 { symmetric: bool, rounding: Rounding },
    /// `i8 → f32`: `(q - zp) * scale`. Args `q, scale, zero_point, n, group, out`.
    DequantizeInt8 { symmetric: bool },
    /// `f32 → int4` (symmetric, two a byte). Args `x, scale, n, group, seed, q`.
    QuantizeInt4 { rounding: Rounding },
    /// `int4 → f32`. Args `q, scale, n, group, out`.
    DequantizeInt4,
    /// Min/max n-bit packing with the header `[bits u8][tail u8][min f32][max
    /// f32]`. Args `x, range(min, max), n, seed, out`.
    PackBits { bits: u8, rounding: Rounding },
    /// Inverse of [`KernelSpec::PackBits`]. Args `buf, n, out`.
    UnpackBits { bits: u8 },
    /// `out[i] += Σ_j dequant(chunk_j)[i]` over `k` symmetric block-quantized
    /// chunks laid end to end. Args `q, scale, n, group, k, out`.
    DequantAccumulate { bits: QBits },
}

/// The kind of one kernel argument.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Arg {
    Ptr,
    U64,
}

/// Elements per vector chunk of the element-wise kernels (16-byte f32 loads).
pub const VECTOR_WIDTH: u64 = 4;

/// Bytes of the n-bit packing header.
pub const PACK_HEADER_BYTES: usize = 10;

impl KernelSpec {
    /// Every kernel the crate provides, in a fixed order.
    pub fn all() -> Vec<KernelSpec> {
        use KernelSpec::*;
        let mut v = vec![CastTo(Half::F16), CastTo(Half::BF16), CastFrom(Half::F16), CastFrom(Half::BF16)];
        v.extend([RowMinMax, TensorMinMax]);
        for symmetric in [true, false] {
            v.push(QuantParams { bits: QBits::Int8, symmetric });
        }
        v.push(QuantParams { bits: QBits::Int4, symmetric: true });
        for symmetric in [true, false] {
            for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                v.push(QuantizeInt8 { symmetric, rounding });
            }
            v.push(DequantizeInt8 { symmetric });
        }
        for rounding in [Rounding::Nearest, Rounding::Stochastic] {
            v.push(QuantizeInt4 { rounding });
        }
        v.push(DequantizeInt4);
        for bits in [1, 2, 4, 8] {
            for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                v.push(PackBits { bits, rounding });
            }
            v.push(UnpackBits { bits });
        }
        v.extend([DequantAccumulate { bits: QBits::Int8 }, DequantAccumulate { bits: QBits::Int4 }]);
        v
    }

    /// The symbol name, e.g. `qsync_quantize_i8_asym_sr`.
    pub fn name(&self) -> String {
        let sym = |s: bool| if s { "sym" } else { "asym" };
        let qb = |b: QBits| match b {
            QBits::Int8 => "i8",
            QBits::Int4 => "i4",
        };
        match *self {
            KernelSpec::CastTo(h) => format!("qsync_cast_f32_to_{}", h.name()),
            KernelSpec::CastFrom(h) => format!("qsync_cast_{}_to_f32", h.name()),
            KernelSpec::RowMinMax => "qsync_minmax_rows".into(),
            KernelSpec::TensorMinMax => "qsync_minmax_tensor".into(),
            KernelSpec::QuantParams { bits, symmetric } => format!("qsync_qparams_{}_{}", qb(bits), sym(symmetric)),
            KernelSpec::QuantizeInt8 { symmetric, rounding } => {
                format!("qsync_quantize_i8_{}_{}", sym(symmetric), rounding.tag())
            }
            KernelSpec::DequantizeInt8 { symmetric } => format!("qsync_dequantize_i8_{}", sym(symmetric)),
            KernelSpec::QuantizeInt4 { rounding } => format!("qsync_quantize_i4_{}", rounding.tag()),
            KernelSpec::DequantizeInt4 => "qsync_dequantize_i4".into(),
            KernelSpec::PackBits { bits, rounding } => format!("qsync_pack_{bits}bit_{}", rounding.tag()),
            KernelSpec::UnpackBits { bits } => format!("qsync_unpack_{bits}bit"),
            KernelSpec::DequantAccumulate { bits } => format!("qsync_dequant_accumulate_{}", qb(bits)),
        }
    }

    /// The argument list (the same for the host entry, which receives them
    /// as an array of `u64`, and the PTX `.entry`).
    pub fn args(&self) -> &'static [Arg] {
        use Arg::*;
        match self {
            KernelSpec::CastTo(_) | KernelSpec::CastFrom(_) => &[Ptr, Ptr, U64],
            KernelSpec::RowMinMax => &[Ptr, U64, U64, Ptr, Ptr],
            KernelSpec::TensorMinMax => &[Ptr, Ptr, U64, Ptr],
            KernelSpec::QuantParams { .. } => &[Ptr, Ptr, U64, Ptr, Ptr],
            KernelSpec::QuantizeInt8 { .. } => &[Ptr, Ptr, Ptr, U64, U64, U64, Ptr],
            KernelSpec::DequantizeInt8 { .. } => &[Ptr, Ptr, Ptr, U64, U64, Ptr],
            KernelSpec::QuantizeInt4 { .. } => &[Ptr, Ptr, U64, U64, U64, Ptr],
            KernelSpec::DequantizeInt4 => &[Ptr, Ptr, U64, U64, Ptr],
            KernelSpec::PackBits { .. } => &[Ptr, Ptr, U64, U64, Ptr],
            KernelSpec::UnpackBits { .. } => &[Ptr, U64, Ptr],
            KernelSpec::DequantAccumulate { .. } => &[Ptr, Ptr, U64, U64, U64, Ptr],
        }
    }

    /// Checks the compile-time parameters.
    pub fn validate(&self) -> Result<(), crate::KernelError> {
        match *self {
            KernelSpec::PackBits { bits, .. } | KernelSpec::UnpackBits { bits } if !matches!(bits, 1 | 2 | 4 | 8) => {
                Err(crate::KernelError::BadSpec(format!("{self:?}: bit width must be 1, 2, 4 or 8")))
            }
            KernelSpec::QuantParams { bits: QBits::Int4, symmetric: false } => {
                Err(crate::KernelError::BadSpec(format!("{self:?}: int4 is symmetric only")))
            }
            _ => Ok(()),
        }
    }

    /// The size of the index domain for the given argument values (the loop
    /// trip count on the host, the grid-stride range on a GPU).
    pub fn domain(&self, args: &[u64]) -> u64 {
        let a = |i: usize| args.get(i).copied().unwrap_or(0);
        let ceil = |n: u64, d: u64| if d == 0 { 0 } else { n.div_ceil(d) };
        match *self {
            KernelSpec::CastTo(_) | KernelSpec::CastFrom(_) => ceil(a(2), VECTOR_WIDTH),
            KernelSpec::RowMinMax => ceil(a(1), a(2)),
            KernelSpec::TensorMinMax => 1,
            KernelSpec::QuantParams { .. } => a(2),
            KernelSpec::QuantizeInt8 { .. } | KernelSpec::DequantizeInt8 { .. } => ceil(a(3), VECTOR_WIDTH),
            KernelSpec::QuantizeInt4 { .. } | KernelSpec::DequantizeInt4 => ceil(a(2), 2),
            KernelSpec::PackBits { bits, .. } => ceil(a(2), u64::from(8 / bits.max(1))).max(1),
            KernelSpec::UnpackBits { .. } => a(1),
            KernelSpec::DequantAccumulate { .. } => a(2),
        }
    }
}

impl fmt::Display for KernelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
