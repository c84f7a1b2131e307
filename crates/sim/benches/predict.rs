//! Predictor budgets, with the real cost model: a full prediction
//! of `bert_base_train.onnx` (batch 32, seq 128) on 16 V100 + 16 T4 —
//! graph facts, every node costed on both types, memory, simulation —
//! under 5 ms; one `set_precision` then a fresh `result()` under 0.5 ms.
//!
//! Measured once (release, a shared 2-core machine, criterion medians):
//! full 1.07 ms, incremental 31 µs.

use std::collections::BTreeMap;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use qsync_cost::{Bindings, DeviceDb, Plan, Precision};
use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_ir::Graph;
use qsync_sim::{PredictOptions, Predictor, Target};

fn setup() -> (Graph, Vec<Target>, PredictOptions) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/bert_base_train.onnx");
    let mut m = qsync_onnx::import_file(&path).expect("import bert_base_train.onnx");
    let opset = m.opset();
    let opts = InferOptions { batch: Some(32), dims: BTreeMap::from([("seq".to_string(), 128)]) };
    infer_shapes(&mut m.graph, opset, &opts);
    let db = DeviceDb::bundled().expect("devices");
    let targets = vec![
        Target::new(db.get("v100").expect("v100").clone(), 16, 32, Plan::new()),
        Target::new(db.get("t4").expect("t4").clone(), 16, 32, Plan::new()),
    ];
    let mut bindings = Bindings::new();
    bindings.set("seq", 128);
    (m.graph, targets, PredictOptions { bindings, ..PredictOptions::default() })
}

fn bench_predict(c: &mut Criterion) {
    let (g, targets, opts) = setup();
    let mut pred = Predictor::new(&g, targets.clone(), opts.clone()).expect("predict");
    let r = pred.result();
    eprintln!(
        "bert_base_train on v100:16,t4:16 (fp32): {} nodes, iteration {:.1} ms, {:.0} samples/s",
        g.node_count(),
        r.iteration_us / 1e3,
        r.samples_per_s
    );

    c.bench_function("predict/full/bert_base_train", |b| {
        b.iter(|| {
            let mut p = Predictor::new(&g, targets.clone(), opts.clone()).expect("predict");
            p.result().iteration_us
        });
    });

    // Worst case: the first MatMul of the graph on the T4s, toggled between
    // FP16 and FP32: re-costs it and its precision-dependent successors and
    // shifts nearly the whole T4 timeline.
    let first = *g.schedule().iter().find(|&&n| g.node(n).op.op_type() == "MatMul").expect("a MatMul");
    let mut flip = false;
    c.bench_function("predict/incremental/one_change", |b| {
        b.iter(|| {
            flip = !flip;
            let p = if flip { Precision::Fp16 } else { Precision::Fp32 };
            pred.set_precision(1, first, p).expect("change");
            pred.result().iteration_us
        });
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench_predict
}
criterion_main!(benches);
