//! Each precision pass (plan + materialize) on the real training graphs,
//! from an already shape-inferred model. Budget: under 50 ms each
//! on `bert_base_train.onnx` in release. campo and comp plan for V100 with
//! the cost model (the CLI's `--target v100`).

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use qsync_passes::{pipeline_from_spec, PassContext};

fn bench_precision(c: &mut Criterion) {
    let dir = qsync_tests::models_dir();
    for name in ["bert_base_train.onnx", "resnet50_train.onnx"] {
        let mut m = qsync_onnx::import_file(dir.join(name)).expect("import");
        pipeline_from_spec("infer-shapes").expect("spec").run(&mut m, &mut PassContext::default()).expect("infer");
        for (spec, target) in [
            ("amp", None),
            ("autocast", None),
            ("uniform=f16", None),
            ("cascade=f16", None),
            ("campo", Some("v100")),
            ("comp", Some("v100")),
        ] {
            let mut pm = pipeline_from_spec(spec).expect("spec");
            pm.verify_each(false);
            let cx = PassContext { target: target.map(str::to_string), ..PassContext::default() };
            c.bench_function(&format!("{spec}/{name}"), |b| {
                b.iter_batched(
                    || m.clone(),
                    |mut m| {
                        pm.run(&mut m, &mut cx.clone()).expect("pass");
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
