//! The CPU check's engine: the [`Flavor::Host`] module, optimised and
//! JIT-compiled for this machine, behind safe wrappers with the same shapes
//! as [`crate::reference`]. Every wrapper checks buffer lengths against the
//! sizes the kernel will touch before calling it, so bad input is an error.

#![allow(unsafe_code)] // calling JIT-compiled machine code cannot be safe Rust.

use inkwell::context::Context;
use inkwell::execution_engine::{ExecutionEngine, JitFunction};
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{CodeModel, InitializationConfig, RelocMode, Target, TargetMachine};
use inkwell::OptimizationLevel;

use crate::emit::{build_module, Flavor};
use crate::reference::packed_len;
use crate::spec::{Half, KernelSpec, QBits, Rounding};
use crate::KernelError;

type Entry = unsafe extern "C" fn(*const u64);

/// Every kernel compiled for the host.
pub struct HostKernels<'ctx> {
    engine: ExecutionEngine<'ctx>,
    _module: Module<'ctx>,
}

impl std::fmt::Debug for HostKernels<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostKernels")
    }
}

/// Optimises a module with LLVM's `default<O1>` pipeline for `tm`: the
/// bodies are straight-line code that needs inlining, folding and CFG
/// cleanup, not O2's loop transformations (and O1 keeps PTX emission for
/// every kernel and architecture well inside its budget).
pub fn optimize(module: &Module, tm: &TargetMachine) -> Result<(), KernelError> {
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    module
        .run_passes("default<O1>", tm, PassBuilderOptions::create())
        .map_err(|e| KernelError::Llvm(format!("optimisation failed: {e}")))
}

fn len_err(what: &str, need: usize, have: usize) -> KernelError {
    KernelError::BadInput(format!("{what}: needs {need} elements, has {have}"))
}

fn check(what: &str, need: usize, have: usize) -> Result<(), KernelError> {
    if have < need {
        Err(len_err(what, need, have))
    } else {
        Ok(())
    }
}

fn groups(n: usize, group: usize) -> usize {
    n.div_ceil(group.max(1))
}

impl<'ctx> HostKernels<'ctx> {
    /// Builds, optimises and JIT-compiles every kernel of [`KernelSpec::all`].
    pub fn new(ctx: &'ctx Context) -> Result<HostKernels<'ctx>, KernelError> {
        Target::initialize_native(&InitializationConfig::default()).map_err(KernelError::Llvm)?;
        let module = build_module(ctx, "qsync_host", &KernelSpec::all(), Flavor::Host)?;
        let triple = TargetMachine::get_default_triple();
        let target = Target::from_triple(&triple).map_err(|e| KernelError::Llvm(e.to_string()))?;
        let tm = target
            .create_target_machine(
                &triple,
                "generic",
                "",
                OptimizationLevel::Default,
                RelocMode::Default,
                CodeModel::JITDefault,
            )
            .ok_or_else(|| KernelError::Llvm("no host target machine".into()))?;
        optimize(&module, &tm)?;
        let engine = module
            .create_jit_execution_engine(OptimizationLevel::Default)
            .map_err(|e| KernelError::Llvm(format!("JIT: {e}")))?;
        Ok(HostKernels { engine, _module: module })
    }

    /// Calls a kernel. Callers have checked every buffer against `args`.
    fn call(&self, spec: KernelSpec, args: &[u64]) -> Result<(), KernelError> {
        if args.len() != spec.args().len() {
            return Err(KernelError::BadInput(format!("{spec}: {} args, expected {}", args.len(), spec.args().len())));
        }
        // SAFETY: the symbol was emitted by `build_module` with exactly this
        // signature, and the safe wrappers below checked that every buffer
        // covers the indices the kernel touches for these arguments.
        unsafe {
            let f: JitFunction<Entry> =
                self.engine.get_function(&spec.name()).map_err(|e| KernelError::Llvm(format!("{spec}: {e}")))?;
            f.call(args.as_ptr());
        }
        Ok(())
    }

    pub fn cast_to(&self, h: Half, src: &[f32]) -> Result<Vec<u16>, KernelError> {
        let mut dst = vec![0u16; src.len()];
        self.call(KernelSpec::CastTo(h), &[src.as_ptr() as u64, dst.as_mut_ptr() as u64, src.len() as u64])?;
        Ok(dst)
    }

    /// As [`HostKernels::cast_to`] into a caller's buffer (tests use
    /// misaligned slices to drive the scalar path).
    pub fn cast_to_into(&self, h: Half, src: &[f32], dst: &mut [u16]) -> Result<(), KernelError> {
        check("cast destination", src.len(), dst.len())?;
        self.call(KernelSpec::CastTo(h), &[src.as_ptr() as u64, dst.as_mut_ptr() as u64, src.len() as u64])
    }

    pub fn cast_from(&self, h: Half, src: &[u16]) -> Result<Vec<f32>, KernelError> {
        let mut dst = vec![0f32; src.len()];
        self.call(KernelSpec::CastFrom(h), &[src.as_ptr() as u64, dst.as_mut_ptr() as u64, src.len() as u64])?;
        Ok(dst)
    }

    pub fn row_min_max(&self, x: &[f32], cols: usize) -> Result<(Vec<f32>, Vec<f32>), KernelError> {
        let rows = if cols == 0 { 0 } else { x.len().div_ceil(cols) };
        let (mut mn, mut mx) = (vec![0f32; rows], vec![0f32; rows]);
        let args = [x.as_ptr() as u64, x.len() as u64, cols as u64, mn.as_mut_ptr() as u64, mx.as_mut_ptr() as u64];
        self.call(KernelSpec::RowMinMax, &args)?;
        Ok((mn, mx))
    }

    pub fn tensor_min_max(&self, row_min: &[f32], row_max: &[f32]) -> Result<[f32; 3], KernelError> {
        check("row maxima", row_min.len(), row_max.len())?;
        let mut out = [0f32; 3];
        let args = [row_min.as_ptr() as u64, row_max.as_ptr() as u64, row_min.len() as u64, out.as_mut_ptr() as u64];
        self.call(KernelSpec::TensorMinMax, &args)?;
        Ok(out)
    }

    pub fn quant_params_all(
        &self,
        mins: &[f32],
        maxs: &[f32],
        bits: QBits,
        symmetric: bool,
    ) -> Result<(Vec<f32>, Vec<i32>), KernelError> {
        check("group maxima", mins.len(), maxs.len())?;
        let g = mins.len();
        let (mut s, mut z) = (vec![0f32; g], vec![0i32; g]);
        let args = [mins.as_ptr() as u64, maxs.as_ptr() as u64, g as u64, s.as_mut_ptr() as u64, z.as_mut_ptr() as u64];
        self.call(KernelSpec::QuantParams { bits, symmetric }, &args)?;
        Ok((s, z))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn quantize_i8(
        &self,
        x: &[f32],
        scale: &[f32],
        zp: &[i32],
        group: usize,
        symmetric: bool,
        rounding: Rounding,
        seed: u64,
    ) -> Result<Vec<i8>, KernelError> {
        let g = groups(x.len(), group);
        check("scales", g, scale.len())?;
        check("zero points", g, zp.len())?;
        let mut q = vec![0i8; x.len()];
        let args = [
            x.as_ptr() as u64,
            scale.as_ptr() as u64,
            zp.as_ptr() as u64,
            x.len() as u64,
            group as u64,
            seed,
            q.as_mut_ptr() as u64,
        ];
        self.call(KernelSpec::QuantizeInt8 { symmetric, rounding }, &args)?;
        Ok(q)
    }

    pub fn dequantize_i8(
        &self,
        q: &[i8],
        scale: &[f32],
        zp: &[i32],
        group: usize,
        symmetric: bool,
    ) -> Result<Vec<f32>, KernelError> {
        let g = groups(q.len(), group);
        check("scales", g, scale.len())?;
        check("zero points", g, zp.len())?;
        let mut out = vec![0f32; q.len()];
        let args = [
            q.as_ptr() as u64,
            scale.as_ptr() as u64,
            zp.as_ptr() as u64,
            q.len() as u64,
            group as u64,
            out.as_mut_ptr() as u64,
        ];
        self.call(KernelSpec::DequantizeInt8 { symmetric }, &args)?;
        Ok(out)
    }

    pub fn quantize_i4(
        &self,
        x: &[f32],
        scale: &[f32],
        group: usize,
        rounding: Rounding,
        seed: u64,
    ) -> Result<Vec<u8>, KernelError> {
        check("scales", groups(x.len(), group), scale.len())?;
        let mut q = vec![0u8; x.len().div_ceil(2)];
        let args =
            [x.as_ptr() as u64, scale.as_ptr() as u64, x.len() as u64, group as u64, seed, q.as_mut_ptr() as u64];
        self.call(KernelSpec::QuantizeInt4 { rounding }, &args)?;
        Ok(q)
    }

    pub fn dequantize_i4(&self, q: &[u8], scale: &[f32], n: usize, group: usize) -> Result<Vec<f32>, KernelError> {
        check("int4 codes (bytes)", n.div_ceil(2), q.len())?;
        check("scales", groups(n, group), scale.len())?;
        let mut out = vec![0f32; n];
        let args = [q.as_ptr() as u64, scale.as_ptr() as u64, n as u64, group as u64, out.as_mut_ptr() as u64];
        self.call(KernelSpec::DequantizeInt4, &args)?;
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn dequant_accumulate(
        &self,
        q: &[u8],
        scale: &[f32],
        n: usize,
        group: usize,
        k: usize,
        bits: QBits,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let chunk = match bits {
            QBits::Int8 => n,
            QBits::Int4 => n.div_ceil(2),
        };
        check("quantized chunks (bytes)", chunk * k, q.len())?;
        check("scales", groups(n, group) * k, scale.len())?;
        check("accumulator", n, out.len())?;
        let args =
            [q.as_ptr() as u64, scale.as_ptr() as u64, n as u64, group as u64, k as u64, out.as_mut_ptr() as u64];
        self.call(KernelSpec::DequantAccumulate { bits }, &args)
    }

    pub fn pack(
        &self,
        x: &[f32],
        mn: f32,
        mx: f32,
        bits: u8,
        rounding: Rounding,
        seed: u64,
    ) -> Result<Vec<u8>, KernelError> {
        let spec = KernelSpec::PackBits { bits, rounding };
        spec.validate()?;
        let range = [mn, mx];
        let mut out = vec![0u8; packed_len(x.len(), bits)];
        let args = [x.as_ptr() as u64, range.as_ptr() as u64, x.len() as u64, seed, out.as_mut_ptr() as u64];
        self.call(spec, &args)?;
        Ok(out)
    }

    pub fn unpack(&self, buf: &[u8], n: usize, bits: u8) -> Result<Vec<f32>, KernelError> {
        let spec = KernelSpec::UnpackBits { bits };
        spec.validate()?;
        check("packed buffer (bytes)", packed_len(n, bits), buf.len())?;
        let mut out = vec![0f32; n];
        self.call(spec, &[buf.as_ptr() as u64, n as u64, out.as_mut_ptr() as u64])?;
        Ok(out)
    }
}
