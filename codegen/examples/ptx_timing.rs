//! Where PTX emission time goes: `cargo run --release -p qsync-codegen --example ptx_timing`.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::time::Instant;

use qsync_codegen::{emit_ptx, emit_ptx_archs, Arch};
use qsync_kernels::KernelSpec;

fn main() {
    let specs = KernelSpec::all();
    if std::env::args().any(|a| a == "--once") {
        // For `time`: one emission of every kernel for every architecture.
        emit_ptx_archs(&specs, &Arch::ALL).unwrap();
        return;
    }
    emit_ptx(&specs, Arch::Sm80).unwrap();
    for arch in Arch::ALL {
        let t = Instant::now();
        let p = emit_ptx(&specs, arch).unwrap();
        println!("{arch}: {:.1} ms, {} bytes", t.elapsed().as_secs_f64() * 1e3, p.len());
    }
    let t = Instant::now();
    let all = emit_ptx_archs(&specs, &Arch::ALL).unwrap();
    println!("all archs, shared optimisation: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    for (arch, p) in all {
        assert_eq!(p, emit_ptx(&specs, arch).unwrap(), "{arch}");
    }
    let t = Instant::now();
    for _ in 0..5 {
        let ctx = inkwell::context::Context::create();
        qsync_kernels::build_module(&ctx, "m", &specs, qsync_kernels::Flavor::Ptx).unwrap();
    }
    println!("IR build only: {:.1} ms", t.elapsed().as_secs_f64() * 1e3 / 5.0);
    let t = Instant::now();
    for _ in 0..5 {
        let ctx = inkwell::context::Context::create();
        let m = qsync_kernels::build_module(&ctx, "m", &specs, qsync_kernels::Flavor::Ptx).unwrap();
        inkwell::targets::Target::initialize_nvptx(&Default::default());
        let triple = inkwell::targets::TargetTriple::create("nvptx64-nvidia-cuda");
        let tm = inkwell::targets::Target::from_triple(&triple)
            .unwrap()
            .create_target_machine(
                &triple,
                "sm_80",
                "+ptx70",
                inkwell::OptimizationLevel::Less,
                Default::default(),
                Default::default(),
            )
            .unwrap();
        qsync_kernels::optimize(&m, &tm).unwrap();
    }
    println!("IR build + O1: {:.1} ms", t.elapsed().as_secs_f64() * 1e3 / 5.0);
}
