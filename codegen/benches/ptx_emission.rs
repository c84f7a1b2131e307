//! Budget: PTX for every kernel and every architecture in under a second.

use criterion::{criterion_group, criterion_main, Criterion};
use qsync_codegen::{emit_ptx, emit_ptx_archs, Arch};
use qsync_kernels::KernelSpec;

fn all_kernels_all_archs(c: &mut Criterion) {
    let specs = KernelSpec::all();
    let mut g = c.benchmark_group("ptx");
    g.sample_size(10);
    g.bench_function("all_kernels_all_archs_serial", |b| {
        b.iter(|| {
            for arch in Arch::ALL {
                let ptx = emit_ptx(&specs, arch).expect("PTX");
                std::hint::black_box(ptx);
            }
        })
    });
    g.bench_function("all_kernels_all_archs_shared", |b| {
        b.iter(|| std::hint::black_box(emit_ptx_archs(&specs, &Arch::ALL).expect("PTX")))
    });
    g.finish();
}

criterion_group!(benches, all_kernels_all_archs);
criterion_main!(benches);
