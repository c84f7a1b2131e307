//! Each precision pass (plan + materialize) on the real training graphs,
//! from an already shape-inferred model. Budget (issue 4): under 50 ms each
//! on `bert_base_train.onnx` in release.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use qsync_passes::{pipeline_from_spec, PassContext};

fn bench_precision(c: &mut Criterion) {
    let dir = qsync_tests::models_dir();
    for name in ["bert_base_train.onnx", "resnet50_train.onnx"] {
        let mut m = qsync_onnx::import_file(dir.join(name)).expect("import");
        pipeline_from_spec("infer-shapes").expect("spec").run(&mut m, &mut PassContext::default()).expect("infer");
        for spec in ["amp", "autocast", "uniform=f16", "cascade=f16"] {
            let mut pm = pipeline_from_spec(spec).expect("spec");
            pm.verify_each(false);
            c.bench_function(&format!("{spec}/{name}"), |b| {
                b.iter_batched(
                    || m.clone(),
                    |mut m| {
                        pm.run(&mut m, &mut PassContext::default()).expect("pass");
                        m
                    },
                    BatchSize::LargeInput,
                );
            });
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench_precision
}
criterion_main!(benches);
