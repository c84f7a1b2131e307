//! Device files and the memory model.
#![allow(clippy::unwrap_used)]

use qsync_cost::{estimate_memory, Bindings, Device, DeviceDb, GraphFacts, Optimizer, Plan, Precision};
use qsync_ir::{Attr, DType, Dim, Graph, NodeSpec, Op, Tensor, TensorType};

#[test]
fn every_bundled_device_loads_and_cites_sources() {
    let db = DeviceDb::bundled().unwrap();
    let names = db.names();
    for want in ["v100", "t4", "a10", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "l4", "rtx2080ti", "rtx4090"] {
        assert!(names.iter().any(|n| n == want), "{want} missing");
    }
    for d in db.iter() {
        assert!(d.arch.starts_with("sm_"));
        for p in d.cuda_core_tflops.keys() {
            assert!(!d.sources[&format!("cuda_core_tflops.{p}")].is_empty());
        }
        for p in d.tensor_core_tflops.keys() {
            assert!(d.sources[&format!("tensor_core_tflops.{p}")].contains("NVIDIA"), "{} {p}", d.name);
        }
    }
    // QSync Table I.
    let t4 = db.get("t4").unwrap();
    assert_eq!(
        (t4.cuda_peak(Precision::Fp32), t4.tensor_peak(Precision::Fp16), t4.tensor_peak(Precision::Int8)),
        (8.1e12, 65e12, 130e12)
    );
    assert_eq!(t4.memory_bytes, 16 << 30);
    let v100 = db.get("V100").unwrap();
    assert_eq!(
        (v100.cuda_peak(Precision::Fp32), v100.tensor_peak(Precision::Fp16), v100.tensor_peak(Precision::Int8)),
        (15.7e12, 125e12, 0.0)
    );
    assert_eq!(v100.memory_bytes, 32 << 30);
    assert_eq!((v100.alignment(Precision::Fp16), t4.alignment(Precision::Int8)), (8, 16));
    assert!(!v100.supports(Precision::Bf16));
    assert!(db.get("k80").unwrap_err().to_string().contains("t4"));
}

#[test]
fn bad_device_files_name_file_and_field() {
    let text = DeviceDb::bundled_files()[0].1;
    let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
    v["memory_bandwidth_gb_s"] = serde_json::json!(-1.0);
    let err = Device::from_json(&v.to_string(), "mine.json").unwrap_err().to_string();
    assert!(err.contains("mine.json") && err.contains("memory_bandwidth_gb_s"), "{err}");
    let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
    v["sources"].as_object_mut().unwrap().remove("cuda_core_tflops.fp16");
    let err = Device::from_json(&v.to_string(), "mine.json").unwrap_err().to_string();
    assert!(err.contains("sources.cuda_core_tflops.fp16"), "{err}");
    let err = Device::from_json(r#"{"name": "x"}"#, "mine.json").unwrap_err().to_string();
    assert!(err.contains("mine.json") && err.contains("missing field"), "{err}");
    // A valid custom file loads through load_file.
    let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
    v["name"] = serde_json::json!("v100-custom");
    let path = std::env::temp_dir().join(format!("qsync-cost-dev-{}.json", std::process::id()));
    std::fs::write(&path, v.to_string()).unwrap();
    let mut db = DeviceDb::bundled().unwrap();
    assert_eq!(db.load_file(&path).unwrap().name, "v100-custom");
    let _ = std::fs::remove_file(&path);
    assert!(db.load_file("/no/such/device.json").is_err());
}

fn t(dims: &[i64]) -> TensorType {
    TensorType::new(DType::F32, dims.iter().map(|&d| Dim::from(d)).collect())
}

/// x[4,8] → Gemm(W1[16,8]ᵀ, b1[16]) → Relu → Gemm(W2[2,16]ᵀ) → y[4,2].
fn tiny() -> (Graph, Vec<qsync_ir::NodeId>) {
    let mut g = Graph::new("tiny");
    let x = g.add_input("x", t(&[4, 8]));
    let w1 = g.add_init("w1", Tensor::from_f32(vec![16, 8], &[0.0; 128]));
    let b1 = g.add_init("b1", Tensor::from_f32(vec![16], &[0.0; 16]));
    let w2 = g.add_init("w2", Tensor::from_f32(vec![2, 16], &[0.0; 32]));
    let fc1 = g.add_node(
        NodeSpec::new("fc1", Op::Gemm)
            .input(x)
            .input(w1)
            .input(b1)
            .attr("transB", Attr::Int(1))
            .output("h", t(&[4, 16])),
    );
    let h = g.node(fc1).outputs()[0];
    let relu = g.add_node(NodeSpec::new("relu", Op::Relu).input(h).output("r", t(&[4, 16])));
    let r = g.node(relu).outputs()[0];
    let fc2 = g.add_node(
        NodeSpec::new("fc2", Op::Gemm).input(r).input(w2).attr("transB", Attr::Int(1)).output("y", t(&[4, 2])),
    );
    (g, vec![fc1, relu, fc2])
}

#[test]
fn memory_of_a_tiny_graph_by_hand() {
    let (g, _) = tiny();
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    let v100 = DeviceDb::bundled().unwrap().get("v100").unwrap().clone();
    let ws = v100.workspace_bytes as f64;
    let sgd = Optimizer::Sgd { momentum: true };
    // FP32. Parameters 128 + 16 + 32 = 176 → 704 B each for master weights,
    // gradients, momentum. Saved: fc1 keeps x (32), relu keeps r (64), fc2
    // keeps r again (same tensor, same precision: counted once) → 96 · 4 = 384 B.
    // Transient: the largest (out + in) of one backward node: relu 64 + 64 → 512 B.
    let m = estimate_memory(&g, &facts, &Plan::new().resolve(&g), &v100, sgd, None).unwrap();
    assert_eq!((m.master_weights, m.gradients, m.optimizer_state, m.low_precision_weights), (704.0, 704.0, 704.0, 0.0));
    assert_eq!(m.activations, 384.0);
    assert_eq!(m.workspace, ws + 512.0);
    assert_eq!(m.total, 3.0 * 704.0 + 384.0 + ws + 512.0);
    assert!(m.fits());
    // FP16 everywhere (relu follows fc1): FP16 weight copies (144 + 32) · 2 = 352 B;
    // x, r kept in FP16 → 96 · 2 = 192 B; transient 128 · 2 = 256 B.
    let m16 = estimate_memory(&g, &facts, &Plan::uniform(&g, Precision::Fp16).resolve(&g), &v100, sgd, None).unwrap();
    assert_eq!((m16.low_precision_weights, m16.activations, m16.workspace), (352.0, 192.0, ws + 256.0));
    assert!(m16.total < m.total);
    // INT8: 1-byte copies plus a 4-byte scale each: 144 + 2·4 + 32 + 4 = 188... per
    // (parameter, precision): w1 128+4, b1 16+4, w2 32+4 = 188 B. fc1 keeps x as
    // INT8 (32 + 4); relu runs FP32 (INT8 kernels write FP32) and keeps r (64 · 4);
    // fc2 keeps its INT8 copy of r (64 + 4) → 36 + 256 + 68 = 360 B.
    let m8 = estimate_memory(&g, &facts, &Plan::uniform(&g, Precision::Int8).resolve(&g), &v100, sgd, None).unwrap();
    assert_eq!((m8.low_precision_weights, m8.activations), (188.0, 360.0));
    // Adam keeps two copies; a 30% memory fraction shrinks the capacity.
    let adam = estimate_memory(&g, &facts, &Plan::new().resolve(&g), &v100, Optimizer::Adam, Some(0.3)).unwrap();
    assert_eq!(adam.optimizer_state, 1408.0);
    assert_eq!(adam.capacity, 0.3 * v100.memory_bytes as f64);
}

#[test]
fn refreshed_copies_are_weights_of_their_masters() {
    // The tiny graph in FP16 with w1 and w2 read through refreshed f16
    // copies: the masters stay the trained parameters (master weights,
    // gradients, optimizer state unchanged: 176 parameters), the copies are
    // low-precision weights, as the per-use casts' copies were (352 B in all
    // with b1's FP16 copy), so the total is unchanged.
    let (mut g, nodes) = tiny();
    let (w1, w2) = (g.value_by_name("w1").unwrap(), g.value_by_name("w2").unwrap());
    let c1 = g.add_refreshed_copy(w1, "w1.f16", Tensor::from_f64s(DType::F16, vec![16, 8], &[0.0; 128]).unwrap());
    let c2 = g.add_refreshed_copy(w2, "w2.f16", Tensor::from_f64s(DType::F16, vec![2, 16], &[0.0; 32]).unwrap());
    g.set_input(nodes[0], 1, Some(c1));
    g.set_input(nodes[2], 1, Some(c2));
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    let mut params: Vec<_> = facts.params().to_vec();
    params.sort();
    let mut want = vec![w1, g.value_by_name("b1").unwrap(), w2];
    want.sort();
    assert_eq!(params, want, "masters are the parameters, read or not; copies are not");
    assert!(facts.is_param(c1) && facts.requires_grad(c1), "a copy is read as a weight and gets its gradient");
    assert_eq!(facts.copies(), &[(c1, DType::F16), (c2, DType::F16)]);
    let v100 = DeviceDb::bundled().unwrap().get("v100").unwrap().clone();
    let sgd = Optimizer::Sgd { momentum: true };
    let plan = Plan::uniform(&g, Precision::Fp16).resolve(&g);
    let m = estimate_memory(&g, &facts, &plan, &v100, sgd, None).unwrap();
    assert_eq!((m.master_weights, m.gradients, m.optimizer_state), (704.0, 704.0, 704.0));
    assert_eq!(m.low_precision_weights, 352.0);
    let (plain, _) = tiny();
    let pf = GraphFacts::new(&plain, &Bindings::new()).unwrap();
    let m16 = estimate_memory(&plain, &pf, &Plan::uniform(&plain, Precision::Fp16).resolve(&plain), &v100, sgd, None)
        .unwrap();
    assert_eq!(m.total, m16.total);
}

#[test]
fn lowering_precision_uniformly_never_raises_memory_on_real_models() {
    let base = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models");
    let db = DeviceDb::bundled().unwrap();
    for name in ["resnet50_train.onnx", "bert_base_train.onnx"] {
        let mut m = qsync_onnx::import_file(base.join(name)).unwrap();
        let opset = m.opset();
        let mut dims = std::collections::BTreeMap::new();
        dims.insert("batch".to_string(), 32);
        dims.insert("seq".to_string(), 128);
        let _ =
            qsync_ir::infer::infer_shapes(&mut m.graph, opset, &qsync_ir::infer::InferOptions { batch: None, dims });
        let g = &m.graph;
        let facts = GraphFacts::new(g, &Bindings::new().with("batch", 32).with("seq", 128)).unwrap();
        let t4 = db.get("t4").unwrap();
        let mem = |p| estimate_memory(g, &facts, &Plan::uniform(g, p).resolve(g), t4, Optimizer::Adam, None).unwrap();
        let (m32, m16) = (mem(Precision::Fp32), mem(Precision::Fp16));
        assert!(m16.total <= m32.total, "{name}: fp16 {} > fp32 {}", m16.total, m32.total);
        assert!(m16.activations < m32.activations);
        // Per node: lowering one Conv/GEMM never raises the activation memory
        // beyond the low-precision copy of its input it adds.
        assert!(m32.fits());
    }
}

/// An exporter's erf-GELU, `Mul(Mul(h, Add(Erf(Div(h, √2)), 1)), 0.5)`,
/// keeps only `h` (PyTorch trains the fused GELU), and a Mul by a tensor
/// that needs no gradient keeps only that tensor.
#[test]
fn decomposed_gelu_and_constant_operands_keep_what_autograd_keeps() {
    let mut g = Graph::new("gelu");
    let x = g.add_input("x", t(&[4, 8]));
    let mask = g.add_input("mask", t(&[4, 16]));
    let w1 = g.add_init("w1", Tensor::from_f32(vec![16, 8], &[0.0; 128]));
    let w2 = g.add_init("w2", Tensor::from_f32(vec![2, 16], &[0.0; 32]));
    let sqrt2 = g.add_init("sqrt2", Tensor::from_f32(vec![], &[std::f32::consts::SQRT_2]));
    let one = g.add_init("one", Tensor::from_f32(vec![], &[1.0]));
    let half = g.add_init("half", Tensor::from_f32(vec![], &[0.5]));
    let val = |g: &mut Graph, name: &str, op: Op, ins: &[qsync_ir::ValueId]| {
        let mut s = NodeSpec::new(name, op);
        for &i in ins {
            s = s.input(i);
        }
        let n = g.add_node(s.output(format!("{name}_out"), t(&[4, 16])));
        g.node(n).outputs()[0]
    };
    let fc1 = g.add_node(
        NodeSpec::new("fc1", Op::Gemm).input(x).input(w1).attr("transB", Attr::Int(1)).output("h", t(&[4, 16])),
    );
    let h = g.node(fc1).outputs()[0];
    let d = val(&mut g, "div", Op::Div, &[h, sqrt2]);
    let e = val(&mut g, "erf", Op::Erf, &[d]);
    let a = val(&mut g, "add", Op::Add, &[e, one]);
    let m = val(&mut g, "mul", Op::Mul, &[h, a]);
    let gl = val(&mut g, "mul_half", Op::Mul, &[m, half]);
    let masked = val(&mut g, "mask_mul", Op::Mul, &[gl, mask]);
    g.add_node(
        NodeSpec::new("fc2", Op::Gemm).input(masked).input(w2).attr("transB", Attr::Int(1)).output("y", t(&[4, 2])),
    );
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    let v100 = DeviceDb::bundled().unwrap().get("v100").unwrap().clone();
    let m = estimate_memory(&g, &facts, &Plan::new().resolve(&g), &v100, Optimizer::Adam, None).unwrap();
    // fc1 keeps x (32); the GELU keeps h (64); mask_mul keeps only the mask
    // (64), not its input; fc2 keeps its input (64) → 224 · 4 B. Before:
    // Div, Erf and both Muls kept their float inputs too (+ 3 · 64 · 4 B).
    assert_eq!(m.activations, 224.0 * 4.0);
}
