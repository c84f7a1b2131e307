//! Cost formulas against hand-computed values, Tensor Core eligibility,
//! QSync's INT8 rules, calibration and fits.
#![allow(clippy::unwrap_used)]

mod common;

use common::{gemm_graph, init, t};
use qsync_cost::{fit_linear, Bindings, CostModel, DeviceDb, GraphFacts, Plan, Precision, Profile};
use qsync_ir::{Attr, DType, Dim, Graph, NodeSpec, Op, Tensor, TensorType};

fn model(dev: &str) -> CostModel {
    CostModel::new(DeviceDb::bundled().unwrap().get(dev).unwrap(), None).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
}

#[test]
fn gemm_128x768x3072_fp16_on_v100_by_hand() {
    // V100: 125 TFLOPS FP16 Tensor Cores × 0.6 = 75e12 FLOP/s; 900 GB/s × 0.85
    // = 765e9 B/s; 4 µs launch. m=128, k=768, n=3072 (all multiples of 8 → TC).
    // fwd:  flops = 2·128·768·3072 + 128·3072 (bias) = 604,372,992 → 8.058 µs
    //       elems = 98,304 (x) + 2,362,368 (W, b) + 393,216 (y) = 2,853,888
    //       bytes = 5,707,776 → 7.461 µs;  time = max + 4 µs = 12.058 µs
    // dX:   flops = 603,979,776 → 8.053 µs; elems = y + x + W,b + dx = 2,952,192
    //       → 7.718 µs; time = 12.053 µs
    // dW:   flops = 604,372,992 (with the bias reduction), elems as fwd.
    // Waves (V100: 80 SMs, one 128×128 = 16,384-output tile each, split-K
    // slices ≥ 256, split only to fill one wave):
    // fwd:  outputs 393,216 → 24 tiles; K = 604,372,992 / (2·393,216) = 768.5
    //       → ≤ 3 splits; floor(80/24) = 3 → 72 blocks, 1 wave → ×80/72:
    //       8.058 · 10/9 = 8.954 µs > 7.461 → 12.954 µs
    // dX:   outputs 98,304 (dx) → 6 tiles; K = 3072 → ≤ 12 splits;
    //       floor(80/6) = 13 → 12 → 72 blocks → ×80/72 → 12.948 µs
    // dW:   outputs 2,362,368 (W, b) → 145 tiles, no split → 2 waves →
    //       ×160/145: 8.058 · 1.1034 = 8.892 µs → 12.892 µs.
    let (g, fc) = gemm_graph(128, 768, 3072);
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    let c = model("v100").op_cost(&facts, fc, Precision::Fp16).unwrap();
    assert!(c.tensor_core);
    let (tc, bw, l): (f64, f64, f64) = (125e12 * 0.6, 900e9 * 0.85, 4e-6);
    let fwd = (604_372_992.0 / tc * 80.0 / 72.0).max(2.0 * 2_853_888.0 / bw) + l;
    let dx = (603_979_776.0 / tc * 80.0 / 72.0).max(2.0 * 2_952_192.0 / bw) + l;
    let dw = (604_372_992.0 / tc * 160.0 / 145.0).max(2.0 * 2_853_888.0 / bw) + l;
    assert!(close(c.fwd, fwd), "{} vs {fwd}", c.fwd);
    assert!(close(c.bwd_input, dx), "{} vs {dx}", c.bwd_input);
    assert!(close(c.bwd_weight, dw), "{} vs {dw}", c.bwd_weight);
    assert!((c.fwd * 1e6 - 12.954).abs() < 1e-3, "{}", c.fwd * 1e6);
    assert!((c.bwd_weight * 1e6 - 12.892).abs() < 1e-3, "{}", c.bwd_weight * 1e6);
    assert_eq!(c.fwd_flops, 604_372_992.0);
}

#[test]
fn conv3x3_fp32_on_v100_by_hand() {
    // x[32,64,56,56] → Add(b[64,1,1]) → Conv(W[64,64,3,3], pad 1) → y[32,64,56,56].
    // MACs = 32·64·56·56 (outputs) · 64·9 = 3,699,376,128; flops = 2× = 7,398,752,256.
    // FP32 on CUDA cores: 15.7e12 × 0.9 = 14.13e12 → 523.6 µs (compute-bound;
    // bytes = 4·(6,422,528 + 36,864 + 6,422,528) = 51.5 MB → 67.4 µs), + 4 µs.
    // Waves on 80 SMs (16,384-output tiles): fwd and dX write 6,422,528
    // elements → 392 tiles → 5 waves → ×400/392 → 538.31 µs; dW writes the
    // 36,864 weights → 3 tiles, K = 7,398,752,256 / (2·36,864) = 100,352
    // allows split-K, floor(80/3) = 26 splits → 78 blocks, 1 wave → ×80/78
    // → 541.05 µs.
    let mut g = Graph::new("conv");
    let x = g.add_input("x", t(&[32, 64, 56, 56]));
    let b = init(&mut g, "b", &[64, 1, 1]);
    let r = g.add_node(NodeSpec::new("shift", Op::Add).input(x).input(b).output("r", t(&[32, 64, 56, 56])));
    let rv = g.node(r).outputs()[0];
    let w = init(&mut g, "w", &[64, 64, 3, 3]);
    let spec = NodeSpec::new("conv", Op::Conv)
        .input(rv)
        .input(w)
        .attr("pads", Attr::Ints(vec![1, 1, 1, 1]))
        .output("y", t(&[32, 64, 56, 56]));
    let conv = g.add_node(spec);
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    let c = model("v100").op_cost(&facts, conv, Precision::Fp32).unwrap();
    let want = 7_398_752_256.0 / (15.7e12 * 0.9) * 400.0 / 392.0 + 4e-6;
    let want_w = 7_398_752_256.0 / (15.7e12 * 0.9) * 80.0 / 78.0 + 4e-6;
    assert!(close(c.fwd, want), "{} vs {want}", c.fwd);
    assert!(close(c.bwd_input, want) && close(c.bwd_weight, want_w), "{c:?}");
    assert!((c.fwd * 1e6 - 538.306).abs() < 1e-3 && (c.bwd_weight * 1e6 - 541.046).abs() < 1e-3);
    assert!(!c.tensor_core);
    // FP16: channels 64 are multiples of 8 → Tensor Cores.
    assert!(model("v100").op_cost(&facts, conv, Precision::Fp16).unwrap().tensor_core);
}

#[test]
fn tensor_cores_need_aligned_dims() {
    for (dev, p, ok, bad) in
        [("v100", Precision::Fp16, 768, 767), ("t4", Precision::Fp16, 776, 772), ("t4", Precision::Int8, 768, 776)]
    {
        let cm = model(dev);
        let (g, fc) = gemm_graph(128, ok, 3072);
        let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
        let aligned = cm.op_cost(&facts, fc, p).unwrap();
        let (g2, fc2) = gemm_graph(128, bad, 3072);
        let facts2 = GraphFacts::new(&g2, &Bindings::new()).unwrap();
        let unaligned = cm.op_cost(&facts2, fc2, p).unwrap();
        assert!(aligned.tensor_core, "{dev} {p} k={ok}");
        assert!(!unaligned.tensor_core, "{dev} {p} k={bad}");
        assert!(unaligned.fwd > aligned.fwd, "{dev} {p}: CUDA cores are slower");
    }
    // FP16 CUDA-core rate for the unaligned case on V100: 31.4e12 × 0.9.
    // Waves: 393,216 outputs → 24 tiles; K = flops / (2·393,216) = 767.5 →
    // ≤ 2 splits → 48 blocks on 80 SMs → ×80/48.
    let (g, fc) = gemm_graph(128, 767, 3072);
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    let c = model("v100").op_cost(&facts, fc, Precision::Fp16).unwrap();
    let flops = 2.0 * 128.0 * 767.0 * 3072.0 + 128.0 * 3072.0;
    assert!(close(c.fwd, flops / (31.4e12 * 0.9) * 80.0 / 48.0 + 4e-6), "{}", c.fwd);
}

#[test]
fn int8_quantizes_forward_and_runs_backward_in_fp16() {
    let cm = model("t4");
    let (g, fc) = gemm_graph(128, 768, 3072);
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    let i8c = cm.op_cost(&facts, fc, Precision::Int8).unwrap();
    let f16 = cm.op_cost(&facts, fc, Precision::Fp16).unwrap();
    assert!(i8c.tensor_core && i8c.quant > 0.0 && i8c.quant < i8c.fwd);
    let casts = cm.casts();
    let (x, w, y) = (128.0 * 768.0, 3072.0 * 768.0 + 3072.0, 128.0 * 3072.0);
    // Quantization: min/max + quantize of x and W, dequantize INT32 → FP32 of y.
    let dequant = 8.0 * y / (320e9 * 0.6) + 4e-6;
    assert!(close(i8c.quant, casts.quantize(Precision::Fp32, x) + casts.quantize(Precision::Fp32, w) + dequant));
    // Backward = the FP16 backward plus its casts.
    let want_dx = f16.bwd_input
        + casts.cast(Precision::Fp32, Precision::Fp16, y)
        + casts.cast(Precision::Fp32, Precision::Fp16, w);
    let want_dw = f16.bwd_weight + casts.dequantize(Precision::Fp16, x);
    assert!(close(i8c.bwd_input, want_dx) && close(i8c.bwd_weight, want_dw));
    assert_eq!(i8c.bwd_input_flops, f16.bwd_input_flops);
    // V100 has no INT8 Tensor Cores (QSync Table I): DP4A rate.
    let v = model("v100").op_cost(&facts, fc, Precision::Int8).unwrap();
    assert!(!v.tensor_core);
}

#[test]
fn fp16_beats_fp32_for_a_big_gemm() {
    let (g, fc) = gemm_graph(4096, 4096, 4096);
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    for dev in ["t4", "v100", "a100-80gb", "h100-sxm"] {
        let cm = model(dev);
        let a = cm.op_cost(&facts, fc, Precision::Fp32).unwrap().total();
        let b = cm.op_cost(&facts, fc, Precision::Fp16).unwrap().total();
        assert!(b < a / 2.0, "{dev}: fp16 {b} vs fp32 {a}");
    }
    // Precisions a device lacks are errors, not panics.
    assert!(model("v100").op_cost(&facts, fc, Precision::Bf16).is_err());
}

#[test]
fn cast_costs_are_linear_with_bandwidth_defaults() {
    // V100 fp32 → fp16: (4 + 2) bytes / (900e9 × 0.85) per element + 4 µs.
    let cm = model("v100");
    let n = 1_048_576.0;
    assert!(close(cm.cast_cost(Precision::Fp32, Precision::Fp16, n), 6.0 * n / 765e9 + 4e-6));
    // Quantize: min/max pass + quantize pass (2·4 + 1 bytes), three kernels.
    assert!(close(cm.cast_cost(Precision::Fp32, Precision::Int8, n), 9.0 * n / 765e9 + 12e-6));
    assert_eq!(cm.cast_cost(Precision::Fp16, Precision::Fp16, n), 0.0);
    assert_eq!(cm.cast_cost(Precision::Fp32, Precision::Tf32, n), 0.0);
}

#[test]
fn least_squares_recovers_r_and_c() {
    let (r, c) = (2.5e-11, 6e-6);
    let exact: Vec<(f64, f64)> = (1..=20).map(|i| (i as f64 * 1e5, r * i as f64 * 1e5 + c)).collect();
    let f = fit_linear(&exact).unwrap();
    assert!((f.model.r - r).abs() / r < 1e-9 && (f.model.c - c).abs() / c < 1e-6);
    assert!(f.r2 > 0.999_999 && f.max_rel_err < 1e-9);
    // ±3% deterministic noise: close, and the error is reported.
    let noisy: Vec<(f64, f64)> =
        exact.iter().enumerate().map(|(i, &(x, y))| (x, y * if i % 2 == 0 { 1.03 } else { 0.97 })).collect();
    let f = fit_linear(&noisy).unwrap();
    assert!((f.model.r - r).abs() / r < 0.05 && f.r2 < 1.0 && f.r2 > 0.98);
    assert!(f.max_rel_err > 0.01 && f.max_rel_err < 0.1);
    assert!(fit_linear(&[(1.0, 1.0)]).is_err());
    assert!(fit_linear(&[(1.0, 1.0), (1.0, 2.0)]).is_err());
}

#[test]
fn profile_overrides_the_analytic_model() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/t4_profile.json");
    let profile = Profile::load_file(path).unwrap();
    let t4 = DeviceDb::bundled().unwrap().get("t4").unwrap().clone();
    let cm = CostModel::new(&t4, Some(&profile)).unwrap();
    let (g, fc) = gemm_graph(128, 768, 3072);
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    let c = cm.op_cost(&facts, fc, Precision::Fp16).unwrap();
    assert!(c.measured && close(c.fwd, 41.5e-6) && close(c.bwd_input, 39.0e-6) && close(c.bwd_weight, 40.2e-6));
    // Other precisions stay analytic.
    assert!(!cm.op_cost(&facts, fc, Precision::Fp32).unwrap().measured);
    // Cast samples are fitted, with their error reported.
    let fit = cm.cast_fits().iter().find(|f| f.from == Precision::Fp32 && f.to == Precision::Fp16).unwrap();
    assert!(fit.fit.r2 > 0.99 && fit.fit.samples == 3);
    let m = cm.casts().model(Precision::Fp32, Precision::Fp16);
    assert!(close(cm.cast_cost(Precision::Fp32, Precision::Fp16, 1e6), m.r * 1e6 + m.c));
    // Bad profiles are errors naming the file.
    let err = Profile::from_json(r#"{"ops":[{"op":"Relu","inputs":[],"precision":"fp9","fwd_us":1}]}"#, "bad.json")
        .unwrap_err();
    assert!(err.to_string().contains("bad.json"), "{err}");
}

#[test]
fn precision_dependent_ops_follow_their_inputs() {
    // x → Gemm(fp16) → Relu → Add(x) : Relu follows to fp16, Add takes the wider fp32.
    let (mut g, fc) = gemm_graph(8, 16, 16);
    let y = g.node(fc).outputs()[0];
    let relu = g.add_node(NodeSpec::new("relu2", Op::Relu).input(y).output("z", t(&[8, 16])));
    let z = g.node(relu).outputs()[0];
    let x = g.inputs()[0];
    let add = g.add_node(NodeSpec::new("add", Op::Add).input(z).input(x).output("s", t(&[8, 16])));
    let mut plan = Plan::new();
    plan.set(fc, Precision::Fp16);
    let r = plan.resolve(&g);
    assert_eq!(r.compute(relu), Precision::Fp16);
    assert_eq!(r.compute(add), Precision::Fp32);
    plan.set(fc, Precision::Int8);
    // INT8 kernels write FP32.
    assert_eq!(plan.resolve(&g).compute(relu), Precision::Fp32);
}

#[test]
fn constants_and_op_parameters_do_not_widen_dependent_ops() {
    // Gemm(fp16) → Mul(·, Constant) → Dropout(·, ratio) → Add(·, Cast(x → f16)):
    // a Constant node's output is cast to the activation's precision like a
    // weight, Dropout's ratio is a parameter of the op, and a Cast writes
    // the dtype it names — so all three follow the Gemm to fp16.
    let (mut g, fc) = gemm_graph(8, 16, 16);
    let y = g.node(fc).outputs()[0];
    let scalar = || TensorType::new(DType::F32, vec![]);
    let c = g.add_node(
        NodeSpec::new("two", Op::Constant)
            .attr("value", Attr::Tensor(Tensor::from_f32(vec![], &[2.0])))
            .output("c", scalar()),
    );
    let cv = g.node(c).outputs()[0];
    let mul = g.add_node(NodeSpec::new("mul", Op::Mul).input(y).input(cv).output("m", t(&[8, 16])));
    let m = g.node(mul).outputs()[0];
    let r = g.add_node(
        NodeSpec::new("ratio", Op::Constant)
            .attr("value", Attr::Tensor(Tensor::from_f32(vec![], &[0.1])))
            .output("r", scalar()),
    );
    let rv = g.node(r).outputs()[0];
    let drop = g.add_node(NodeSpec::new("drop", Op::Dropout).input(m).input(rv).output("d", t(&[8, 16])));
    let d = g.node(drop).outputs()[0];
    let x = g.inputs()[0];
    let to16 = TensorType::new(DType::F16, vec![Dim::from(8), Dim::from(16)]);
    let cast = g.add_node(NodeSpec::new("x16", Op::Cast).attr("to", Attr::Int(10)).input(x).output("x16", to16));
    let x16 = g.node(cast).outputs()[0];
    let add = g.add_node(NodeSpec::new("add", Op::Add).input(d).input(x16).output("s", t(&[8, 16])));
    let mut plan = Plan::new();
    plan.set(fc, Precision::Fp16);
    let res = plan.resolve(&g);
    for n in [mul, drop, add] {
        assert_eq!(res.compute(n), Precision::Fp16, "{}", g.node(n).name);
    }
    // Widening still happens through real activations: FP32 Gemm → FP32 Mul.
    assert_eq!(Plan::new().resolve(&g).compute(mul), Precision::Fp32);
    assert_eq!(Plan::new().resolve(&g).compute(add), Precision::Fp32);
}

#[test]
fn unbound_symbols_name_node_value_and_symbol() {
    let mut g = Graph::new("sym");
    let shape = vec![Dim::sym("batch"), Dim::from(8)];
    let x = g.add_input("x", TensorType::new(DType::F32, shape.clone()));
    let r = g.add_node(NodeSpec::new("act", Op::Relu).input(x).output("r", TensorType::new(DType::F32, shape)));
    let err = GraphFacts::new(&g, &Bindings::new()).unwrap_err().to_string();
    assert!(err.contains("act") && err.contains("batch"), "{err}");
    let facts = GraphFacts::new(&g, &Bindings::new().with("batch", 4)).unwrap();
    assert_eq!(facts.node(r).unwrap().out, 32.0);
}

#[test]
fn attention_is_two_gemms_around_a_softmax() {
    // Q, K, V [2,8,128,64], inference (no gradients). Scores: 2·8·128·128 =
    // 262,144. fwd flops = 2·262,144·(64+64) + 8·262,144 = 69,206,016;
    // elems = 3·131,072 (Q,K,V) + 131,072 (Y) + 262,144 (scores) = 786,432.
    let mut g = Graph::new("att");
    let dims = [2, 8, 128, 64];
    let (q, k, v) = (g.add_input("q", t(&dims)), g.add_input("k", t(&dims)), g.add_input("v", t(&dims)));
    let spec = NodeSpec::new("att", Op::Attention).input(q).input(k).input(v).output("y", t(&dims));
    let att = g.add_node(spec);
    let y = g.node(att).outputs()[0];
    g.set_outputs(vec![y]);
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    let c = model("v100").op_cost(&facts, att, Precision::Fp16).unwrap();
    assert!(c.tensor_core, "head sizes and sequence are multiples of 8");
    let (tc, bw, l): (f64, f64, f64) = (125e12 * 0.6, 900e9 * 0.85, 4e-6);
    // Waves: Y's 131,072 outputs → 8 tiles; K = 69,206,016 / (2·131,072) =
    // 264 → no split-K (< 2·256) → 8 blocks on 80 SMs, one wave → ×10:
    // 0.923 µs of Tensor Core work takes 9.228 µs (> 2.056 µs of memory).
    let fwd = (69_206_016.0 / tc * 10.0).max(2.0 * 786_432.0 / bw) + l;
    assert!(close(c.fwd, fwd), "{} vs {fwd}", c.fwd);
    assert!((c.fwd * 1e6 - 13.227).abs() < 1e-3, "{}", c.fwd * 1e6);
}
