//! # qsync-kernels — the element-wise kernels a precision plan needs
//!
//! Casts (f32 ↔ f16/bf16), the two-stage min/max/abs-max range reduction,
//! int8 and int4 quantization (per tensor, channel or block; symmetric or
//! asymmetric; round-to-nearest or stochastic), min/max n-bit packing for
//! gradient compression and fused dequantize-and-accumulate.
//!
//! Each kernel exists twice, with one meaning:
//! - [`reference`]: plain Rust, the specification;
//! - [`emit`]/`bodies`: LLVM IR built with inkwell, one body per kernel,
//!   wrapped either as a host loop ([`jit::HostKernels`] runs it on the CPU)
//!   or as a PTX `.entry` with a grid-stride loop (lowered to PTX by
//!   `qsync-codegen`).
//!
//! Tests hold the two equal bit for bit on edge cases and random inputs, and
//! check stochastic rounding for bias statistically. [`cpu`] is a third
//! copy of the kernels the gradient synchronization runs most, laid out for
//! speed on the CPU and held to [`reference`] bit for bit.

pub mod cpu;
#[cfg(feature = "llvm")]
pub mod emit;
#[cfg(feature = "llvm")]
pub mod jit;
pub mod reference;
pub mod rng;
pub mod spec;

#[cfg(feature = "llvm")]
mod bodies;

#[cfg(feature = "llvm")]
pub use emit::{build_module, Flavor};
#[cfg(feature = "llvm")]
pub use jit::{optimize, HostKernels};
pub use spec::{Arg, Half, KernelSpec, QBits, Rounding, PACK_HEADER_BYTES, VECTOR_WIDTH};

/// Errors of kernel construction and of the host runner.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("invalid kernel spec: {0}")]
    BadSpec(String),
    #[error("LLVM: {0}")]
    Llvm(String),
    #[error("bad kernel input: {0}")]
    BadInput(String),
}

#[cfg(feature = "llvm")]
impl From<inkwell::builder::BuilderError> for KernelError {
    fn from(e: inkwell::builder::BuilderError) -> Self {
        KernelError::Llvm(format!("IR builder: {e}"))
    }
}
