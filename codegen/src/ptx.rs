//! PTX through LLVM's NVPTX back end: the kernels' [`Flavor::Ptx`] module
//! (`ptx_kernel` entries, grid-stride loops, 16-byte vector loads on aligned
//! full chunks) optimised at O2 and printed as PTX assembly for one SM.

use std::fmt;
use std::str::FromStr;

use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::Module;
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple};
use inkwell::OptimizationLevel;
use qsync_kernels::{build_module, optimize, Flavor, KernelSpec};

use crate::CodegenError;

/// NVIDIA GPU architectures qsync emits for.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Arch {
    Sm70,
    Sm75,
    Sm80,
    Sm86,
    Sm89,
    Sm90,
}

impl Arch {
    pub const ALL: [Arch; 6] = [Arch::Sm70, Arch::Sm75, Arch::Sm80, Arch::Sm86, Arch::Sm89, Arch::Sm90];

    /// `sm_75` etc.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm70 => "sm_70",
            Arch::Sm75 => "sm_75",
            Arch::Sm80 => "sm_80",
            Arch::Sm86 => "sm_86",
            Arch::Sm89 => "sm_89",
            Arch::Sm90 => "sm_90",
        }
    }

    /// The oldest PTX ISA that knows the SM (CUDA 10.0 … 11.8 era), so the
    /// PTX loads on any driver that supports the GPU.
    pub fn ptx_feature(self) -> &'static str {
        match self {
            Arch::Sm70 => "+ptx60",
            Arch::Sm75 => "+ptx63",
            Arch::Sm80 => "+ptx70",
            Arch::Sm86 => "+ptx71",
            Arch::Sm89 | Arch::Sm90 => "+ptx78",
        }
    }

    /// The architecture of a compute capability, e.g. `(7, 5)`.
    pub fn from_compute_capability(major: u32, minor: u32) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == format!("sm_{major}{minor}"))
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Arch {
    type Err = CodegenError;
    fn from_str(s: &str) -> Result<Arch, CodegenError> {
        let t = s.trim().to_ascii_lowercase().replace("sm", "sm_").replace("sm__", "sm_");
        Arch::ALL.into_iter().find(|a| a.name() == t).ok_or_else(|| CodegenError::UnknownArch(s.to_string()))
    }
}

/// Instruction selection at `Less`: ptxas does the register allocation and
/// scheduling that matter, and the cheaper setting keeps emission fast.
fn target_machine(arch: Arch) -> Result<TargetMachine, CodegenError> {
    Target::initialize_nvptx(&InitializationConfig::default());
    let triple = TargetTriple::create("nvptx64-nvidia-cuda");
    let target = Target::from_triple(&triple).map_err(|e| CodegenError::Ptx(e.to_string()))?;
    target
        .create_target_machine(
            &triple,
            arch.name(),
            arch.ptx_feature(),
            OptimizationLevel::Less,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| CodegenError::Ptx(format!("no NVPTX target machine for {arch}")))
}

/// PTX assembly holding one `.entry` per spec, for `arch`.
pub fn emit_ptx(specs: &[KernelSpec], arch: Arch) -> Result<String, CodegenError> {
    let mut one = emit_ptx_archs(specs, &[arch])?;
    one.pop().map(|(_, p)| p).ok_or_else(|| CodegenError::Ptx("no PTX produced".into()))
}

/// [`emit_ptx`] for several architectures: the module is built and
/// optimised once (the NVPTX data layout and IR-level target information do
/// not depend on the SM), then instruction selection runs per architecture
/// on threads, each parsing the optimised bitcode into its own LLVM context.
/// Same output as calling [`emit_ptx`] per arch, in `archs` order.
pub fn emit_ptx_archs(specs: &[KernelSpec], archs: &[Arch]) -> Result<Vec<(Arch, String)>, CodegenError> {
    let Some(&first) = archs.first() else { return Ok(Vec::new()) };
    let bitcode = {
        let ctx = Context::create();
        let module = build_module(&ctx, "qsync_kernels", specs, Flavor::Ptx)?;
        optimize(&module, &target_machine(first)?)?;
        module.write_bitcode_to_memory().as_slice().to_vec()
    };
    let lower = |arch: Arch| -> Result<(Arch, String), CodegenError> {
        let ctx = Context::create();
        let buf = MemoryBuffer::create_from_memory_range_copy(&bitcode, "qsync_kernels");
        let m = Module::parse_bitcode_from_buffer(&buf, &ctx).map_err(|e| CodegenError::Ptx(e.to_string()))?;
        m.set_name(&format!("qsync_{}", arch.name()));
        let tm = target_machine(arch)?;
        let out = tm.write_to_memory_buffer(&m, FileType::Assembly).map_err(|e| CodegenError::Ptx(e.to_string()))?;
        let ptx = String::from_utf8(out.as_slice().to_vec())
            .map_err(|e| CodegenError::Ptx(format!("PTX is not UTF-8: {e}")))?;
        Ok((arch, ptx))
    };
    if archs.len() == 1 {
        return Ok(vec![lower(first)?]);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = archs.iter().map(|&a| s.spawn(move || lower(a))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(CodegenError::Ptx("PTX emission thread panicked".into()))))
            .collect()
    })
}
