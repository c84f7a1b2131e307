//! PTX emission: every kernel for every architecture, snapshots of one
//! kernel per architecture, and the structure the GPU loader relies on.

use qsync_codegen::{emit_ptx, Arch};
use qsync_kernels::{Half, KernelSpec};

#[test]
fn every_kernel_lowers_for_every_arch() {
    let all = KernelSpec::all();
    for arch in Arch::ALL {
        let ptx = emit_ptx(&all, arch).expect("PTX");
        assert!(ptx.contains(&format!(".target {}", arch.name())), "{arch}");
        for k in &all {
            assert!(ptx.contains(&format!(".entry {}(", k.name())), "{arch}: no .entry for {k}");
        }
        // Grid-stride loop: the special registers are read.
        for reg in ["%ctaid.x", "%ntid.x", "%tid.x", "%nctaid.x"] {
            assert!(ptx.contains(reg), "{arch}: {reg} not read");
        }
        // Kernel pointer params are global memory, and full aligned chunks
        // move as 16-byte vectors.
        assert!(ptx.contains("ld.global.v4") || ptx.contains("ld.global.nc.v4"), "{arch}: no vector loads");
        assert!(ptx.contains("st.global.v4"), "{arch}: no vector stores");
        // No contraction: fma only where the reference has mul_add.
        assert!(!ptx.contains(".approx") && !ptx.contains(".ftz"), "{arch}: inexact float ops");
        // No external calls (libm, compiler-rt): everything is inline.
        assert!(!ptx.contains(".extern .func"), "{arch}: external call");
    }
}

#[test]
fn one_kernel_per_arch_snapshot() {
    let kernels = [
        (Arch::Sm70, KernelSpec::CastTo(Half::F16)),
        (Arch::Sm75, KernelSpec::CastFrom(Half::BF16)),
        (Arch::Sm80, KernelSpec::QuantizeInt8 { symmetric: true, rounding: qsync_kernels::Rounding::Nearest }),
        (Arch::Sm86, KernelSpec::DequantizeInt4),
        (Arch::Sm89, KernelSpec::UnpackBits { bits: 4 }),
        (Arch::Sm90, KernelSpec::DequantAccumulate { bits: qsync_kernels::QBits::Int8 }),
    ];
    for (arch, k) in kernels {
        let ptx = emit_ptx(&[k], arch).expect("PTX");
        insta::assert_snapshot!(format!("{}_{}", arch.name(), k.name()), ptx);
    }
}

#[test]
fn arch_names_parse() {
    assert_eq!("sm_75".parse::<Arch>().expect("arch"), Arch::Sm75);
    assert_eq!("SM90".parse::<Arch>().expect("arch"), Arch::Sm90);
    assert!("sm_61".parse::<Arch>().is_err());
    assert_eq!(Arch::from_compute_capability(8, 9), Some(Arch::Sm89));
}
