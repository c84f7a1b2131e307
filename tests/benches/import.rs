//! Import + shape inference + verification of the real training graphs.
//! Budget: under 50 ms each in release on the 2-core CI machine.

use criterion::{criterion_group, criterion_main, Criterion};
use qsync_ir::infer::{infer_shapes, InferOptions};

fn bench_import(c: &mut Criterion) {
    let dir = qsync_tests::models_dir();
    for name in ["bert_base_train.onnx", "resnet50_train.onnx"] {
        let path = dir.join(name);
        let bytes = std::fs::read(&path).expect("read model");
        c.bench_function(&format!("import+infer+verify/{name}"), |b| {
            b.iter(|| {
                let mut m = qsync_onnx::import_bytes(&bytes, Some(&dir), name).expect("import");
                let opset = m.opset();
                let r = infer_shapes(&mut m.graph, opset, &InferOptions::default());
                assert!(r.unknown.is_empty());
                qsync_ir::verify::verify(&m.graph, opset).expect("verify");
                m
            });
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench_import
}
criterion_main!(benches);
