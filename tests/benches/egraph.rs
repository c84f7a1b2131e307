//! `egraph-casts` on `bert_base_train.onnx` after `amp` and after `campo`
//! (training mode, target t4), from an already planned model. Budget:
//! under 1 s in release.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use qsync_passes::{pipeline_from_spec, PassContext};

fn bench_egraph(c: &mut Criterion) {
    let dir = qsync_tests::models_dir();
    for (name, plan) in [("bert_base_train.onnx", "amp"), ("bert_base_train.onnx", "campo")] {
        let mut m = qsync_onnx::import_file(dir.join(name)).expect("import");
        let cx = || PassContext { target: Some("t4".into()), ..PassContext::default() };
        pipeline_from_spec(&format!("infer-shapes,{plan}")).expect("spec").run(&mut m, &mut cx()).expect("plan");
        let mut pm = pipeline_from_spec("egraph-casts").expect("spec");
        pm.verify_each(false);
        c.bench_function(&format!("egraph-casts/{name}/after-{plan}"), |b| {
            b.iter_batched(
                || m.clone(),
                |mut m| {
                    pm.run(&mut m, &mut cx()).expect("pass");
                    m
                },
                BatchSize::LargeInput,
            );
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench_egraph
}
criterion_main!(benches);
