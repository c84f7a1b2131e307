//! `qsyncc codegen`: MLIR and PTX for one device.
//!
//! Emission links LLVM and MLIR, so it is the `codegen` feature; without it
//! [`run`] is an error that names the feature (see [`require`]).

use anyhow::Result;

/// Ok when this build can emit MLIR and PTX; else the error saying how to
/// get one, so that `plan --emit` fails before planning.
pub fn require(what: &str) -> Result<()> {
    match cfg!(feature = "codegen") {
        true => Ok(()),
        false => Err(crate::feature_off(what, "codegen", "LLVM 22 and MLIR 22")),
    }
}

/// The plan pipeline's code emission (`plan --emit mlir,ptx`): each
/// device's `model.mlir` / `kernels.ptx`, written by [`run`] into its
/// directory of the plan being written.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlanCode;

impl qsync_pipeline::CodeEmitter for PlanCode {
    fn emit(
        &self,
        model_path: &std::path::Path,
        device: &qsync_pipeline::DevicePlan,
        kinds: &[qsync_pipeline::Emit],
        dir: &std::path::Path,
    ) -> Result<()> {
        let kinds: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
        run(model_path, &device.model, &device.name, &kinds.join(","), dir, false).map(drop)
    }
}

/// Without the `codegen` feature: the error [`require`] gives.
#[cfg(not(feature = "codegen"))]
pub fn run(
    _model_path: &std::path::Path,
    _model: &qsync_ir::Model,
    _target: &str,
    emit: &str,
    _out: &std::path::Path,
    _all_kernels: bool,
) -> Result<String> {
    Err(crate::feature_off(&format!("emitting {emit}"), "codegen", "LLVM 22 and MLIR 22"))
}

#[cfg(feature = "codegen")]
pub use emit::{resolve_arch, run};

#[cfg(feature = "codegen")]
mod emit {
    use std::fmt::Write as _;
    use std::path::Path;

    use anyhow::{bail, Context, Result};
    use qsync_codegen::{emit_mlir_model, emit_ptx, select_kernels, Arch};
    use qsync_ir::Model;

    /// The SM of a target: a device of the bundled database (its `arch`), or
    /// an `sm_XX` written directly.
    pub fn resolve_arch(target: &str) -> Result<Arch> {
        if let Ok(a) = target.parse::<Arch>() {
            return Ok(a);
        }
        let db = qsync_cost::DeviceDb::bundled().context("loading the bundled device database")?;
        let dev = db.get(target).with_context(|| format!("unknown target `{target}`"))?;
        dev.arch.parse::<Arch>().with_context(|| format!("device `{target}` has architecture `{}`", dev.arch))
    }

    /// Writes the requested artefacts and returns a summary for stderr.
    pub fn run(
        model_path: &Path,
        model: &Model,
        target: &str,
        emit: &str,
        out: &Path,
        all_kernels: bool,
    ) -> Result<String> {
        let arch = resolve_arch(target)?;
        let mut want_mlir = false;
        let mut want_ptx = false;
        for e in emit.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            match e {
                "mlir" => want_mlir = true,
                "ptx" => want_ptx = true,
                other => bail!("unknown --emit kind `{other}` (expected mlir, ptx)"),
            }
        }
        if !want_mlir && !want_ptx {
            bail!("--emit names nothing to write");
        }
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        let label = model_path.display().to_string();
        let mut summary = String::new();
        if want_mlir {
            let name = model_path.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
            let m = emit_mlir_model(model, name).with_context(|| label.clone())?;
            if let Some(w) = m.warning() {
                eprintln!("warning: {label}: {w}");
            }
            let path = out.join("model.mlir");
            std::fs::write(&path, &m.text).with_context(|| format!("cannot write {}", path.display()))?;
            let offset = match m.rng_offset {
                true => "; random ops: the function's last argument is the per-call rng_offset",
                false => "",
            };
            let _ = writeln!(
                summary,
                "wrote {} ({} generic qsync.* op types{offset})",
                path.display(),
                m.generic_ops.len()
            );
        }
        if want_ptx {
            let kernels = if all_kernels { qsync_kernels::KernelSpec::all() } else { select_kernels(&model.graph) };
            let ptx = emit_ptx(&kernels, arch).with_context(|| format!("{label}: PTX for {arch}"))?;
            let path = out.join("kernels.ptx");
            std::fs::write(&path, &ptx).with_context(|| format!("cannot write {}", path.display()))?;
            let _ = writeln!(summary, "wrote {} ({} kernels for {arch})", path.display(), kernels.len());
        }
        Ok(summary)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn every_device_name_has_an_arch() {
            let want = [
                ("v100", Arch::Sm70),
                ("t4", Arch::Sm75),
                ("a10", Arch::Sm86),
                ("a100-40gb", Arch::Sm80),
                ("a100-80gb", Arch::Sm80),
                ("h100-sxm", Arch::Sm90),
                ("h200", Arch::Sm90),
                ("l4", Arch::Sm89),
                ("rtx2080ti", Arch::Sm75),
                ("rtx4090", Arch::Sm89),
            ];
            for (name, arch) in want {
                assert_eq!(resolve_arch(name).expect(name), arch, "{name}");
            }
            assert!(resolve_arch("k80").is_err());
        }
    }
}
