//! Real models: every node gets a finite positive cost on V100 and T4, and
//! predicted ResNet-50 / BERT-base training throughput is compared with
//! published NVIDIA figures (printed; run with `--nocapture`).
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use qsync_cost::{estimate_memory, Bindings, CostModel, DeviceDb, GraphFacts, Kind, Optimizer, Plan, Precision};
use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_ir::Graph;

fn load(name: &str) -> Graph {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models").join(name);
    let mut model = qsync_onnx::import_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let opset = model.opset();
    let mut dims = BTreeMap::new();
    dims.insert("batch".to_string(), 32);
    dims.insert("seq".to_string(), 128);
    let _ = infer_shapes(&mut model.graph, opset, &InferOptions { batch: None, dims });
    model.graph
}

fn bindings() -> Bindings {
    Bindings::new().with("batch", 32).with("seq", 128)
}

/// Seconds of one forward+backward under a uniform plan (node costs summed;
/// the simulator adds overlap and communication).
fn iteration(graph: &Graph, facts: &GraphFacts, cm: &CostModel, p: Precision) -> (f64, BTreeMap<String, f64>) {
    let plan = Plan::uniform(graph, p).resolve(graph);
    let mut total = 0.0;
    let mut by_kind: BTreeMap<String, f64> = BTreeMap::new();
    for &n in facts.order() {
        let c = cm.op_cost(facts, n, plan.compute(n)).unwrap_or_else(|e| panic!("{}: {e}", graph.node(n).name));
        assert!(c.total().is_finite() && c.total() > 0.0, "{}: {:?}", graph.node(n).name, c);
        total += c.total();
        *by_kind.entry(format!("{:?}", facts.node(n).unwrap().kind)).or_default() += c.total();
    }
    (total, by_kind)
}

#[test]
fn every_node_has_a_finite_positive_cost_and_throughput_is_plausible() {
    let db = DeviceDb::bundled().unwrap();
    let v100 = CostModel::new(db.get("v100").unwrap(), None).unwrap();
    let t4 = CostModel::new(db.get("t4").unwrap(), None).unwrap();
    // (model, device, precision, published samples/s, source)
    let published = [
        (
            "resnet50_train.onnx",
            "v100",
            Precision::Fp32,
            380.0,
            "NVIDIA DeepLearningExamples ResNet-50 v1.5 PyTorch, 1x V100 32GB FP32 ~ 360-400 img/s",
        ),
        (
            "resnet50_train.onnx",
            "v100",
            Precision::Fp16,
            1100.0,
            "NVIDIA DeepLearningExamples ResNet-50 v1.5 PyTorch, 1x V100 AMP ~ 1000-1200 img/s",
        ),
        (
            "resnet50_train.onnx",
            "t4",
            Precision::Fp16,
            250.0,
            "NVIDIA DeepLearningExamples ResNet-50 v1.5, 1x T4 AMP ~ 250 img/s",
        ),
        ("resnet50_train.onnx", "t4", Precision::Fp32, 0.0, "-"),
        ("bert_base_train.onnx", "v100", Precision::Fp32, 0.0, "-"),
        ("bert_base_train.onnx", "v100", Precision::Fp16, 0.0, "-"),
        ("bert_base_train.onnx", "t4", Precision::Fp16, 0.0, "-"),
    ];
    let mut graphs = BTreeMap::new();
    for (model, dev, p, want, src) in published {
        let g = graphs.entry(model).or_insert_with(|| load(model));
        let facts = GraphFacts::new(g, &bindings()).unwrap_or_else(|e| panic!("{model}: {e}"));
        let cm = if dev == "v100" { &v100 } else { &t4 };
        let (secs, by_kind) = iteration(g, &facts, cm, p);
        let tput = 32.0 / secs;
        let mem = estimate_memory(
            g,
            &facts,
            &Plan::uniform(g, p).resolve(g),
            cm.device(),
            Optimizer::Sgd { momentum: true },
            None,
        )
        .unwrap();
        print!(
            "{model} {dev} {p}: fwd+bwd {:.1} ms/iter at batch 32 = {tput:.0} samples/s; memory {:.2} GiB",
            secs * 1e3,
            mem.total / (1u64 << 30) as f64
        );
        if want > 0.0 {
            print!("; published {want:.0} ({src}); ratio {:.2}", tput / want);
        }
        println!();
        let kinds: Vec<String> = by_kind.iter().map(|(k, v)| format!("{k} {:.1}ms", v * 1e3)).collect();
        println!("    by kind: {}", kinds.join(", "));
    }
}

#[test]
fn unbound_symbols_are_reported() {
    let g = load("bert_base_train.onnx");
    let mut g2 = g.clone();
    // Re-import without binding: the graph keeps symbolic dims.
    g2.name = "unbound".into();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/bert_base_train.onnx");
    let mut m = qsync_onnx::import_file(&path).unwrap();
    let opset = m.opset();
    let _ = infer_shapes(&mut m.graph, opset, &InferOptions::default());
    let err = GraphFacts::new(&m.graph, &Bindings::new().with("batch", 32)).unwrap_err().to_string();
    assert!(err.contains("seq"), "{err}");
    assert!(GraphFacts::new(&g2, &bindings()).is_ok());
    let _ = Kind::Conv;
}
