//! # qsync-codegen — the code each device runs for its plan
//!
//! - [`ptx`]: the [`qsync_kernels`] IR lowered through LLVM's NVPTX back end
//!   to PTX for one [`Arch`] (`sm_70` … `sm_90`), no CUDA toolkit needed;
//! - [`select`]: which kernels a planned graph needs on a device (the rule
//!   is documented there);
//! - [`mlir`]: a planned graph as an MLIR `func.func` of linalg, tensor, tosa
//!   and arith ops, verified in-process by MLIR (through melior); ops with no
//!   lowering become generic `qsync.*` operations, never dropped.
//!
//! Reads the IR only; knows nothing of passes or files.

pub mod mlir;
pub mod ptx;
pub mod select;

pub use mlir::{emit_mlir, emit_mlir_model, MlirOutput};
pub use ptx::{emit_ptx, emit_ptx_archs, Arch};
pub use select::select_kernels;

/// Errors of code generation.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    #[error("unknown GPU architecture `{0}` (known: sm_70, sm_75, sm_80, sm_86, sm_89, sm_90)")]
    UnknownArch(String),
    #[error("kernel construction: {0}")]
    Kernel(#[from] qsync_kernels::KernelError),
    #[error("NVPTX back end: {0}")]
    Ptx(String),
    #[error("MLIR for graph `{graph}` does not verify: {message}")]
    Mlir { graph: String, message: String },
}
