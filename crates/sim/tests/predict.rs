//! The predictor (cost model + replayer) on real models: incremental
//! updates equal fresh predictions exactly, and the monotonicity
//! properties planners rely on.

use std::collections::BTreeMap;
use std::path::PathBuf;

use qsync_cost::{Bindings, Device, DeviceDb, Optimizer, Plan, Precision, Profile};
use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_ir::{Graph, NodeId};
use qsync_sim::{PredictError, PredictOptions, Predictor, Target};

fn load(model: &str, batch: i64) -> Graph {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models").join(model);
    let mut m = qsync_onnx::import_file(&path).expect("import");
    let opset = m.opset();
    let opts = InferOptions { batch: Some(batch), dims: BTreeMap::from([("seq".to_string(), 32)]) };
    let report = infer_shapes(&mut m.graph, opset, &opts);
    assert!(report.errors.is_empty(), "{model}: {:?}", report.errors);
    m.graph
}

/// Every symbol left in the graph bound to 32 (as the CLI binds leftovers).
fn bindings(g: &Graph) -> Bindings {
    let mut b = Bindings::new();
    for v in g.live_values() {
        for d in g.ty(v).shape.iter().flatten() {
            for s in d.symbols() {
                b.set(&s, 32);
            }
        }
    }
    b
}

fn device(name: &str) -> Device {
    DeviceDb::bundled().expect("db").get(name).expect("device").clone()
}

fn opts(g: &Graph) -> PredictOptions {
    PredictOptions { bindings: bindings(g), ..PredictOptions::default() }
}

/// 16 V100 and 16 T4, batch 8 each.
fn cluster(v100: Plan, t4: Plan) -> Vec<Target> {
    vec![Target::new(device("v100"), 16, 8, v100), Target::new(device("t4"), 16, 8, t4)]
}

#[test]
fn incremental_set_precision_equals_fresh_prediction() {
    // Random precision changes, with per-iteration weight casts and with
    // refreshed copies: every cast a change adds, moves (a shared cast is
    // charged to its first reader) or removes is re-costed.
    let g = load("bert_tiny.onnx", 8);
    let all: Vec<NodeId> = g.schedule();
    let choices = [Precision::Fp16, Precision::Int8, Precision::Fp32];
    for copies in [false, true] {
        let o = PredictOptions { weight_copies: copies, ..opts(&g) };
        let mut pred = Predictor::new(&g, cluster(Plan::new(), Plan::new()), o.clone()).expect("predict");
        // Seeded LCG (Knuth's MMIX constants): reproducible without a dependency.
        let mut state: u64 = 0x5eed;
        let mut next = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        for step in 0..30 {
            let t = next() % 2;
            let n = all[next() % all.len()];
            let p = choices[next() % choices.len()];
            pred.set_precision(t, n, p).expect("change");
            let fresh_targets = cluster(pred.plan(0).expect("plan").clone(), pred.plan(1).expect("plan").clone());
            let mut fresh = Predictor::new(&g, fresh_targets, o.clone()).expect("fresh");
            assert_eq!(pred.resolved(t), fresh.resolved(t), "step {step}: resolution of {n:?} at {p}");
            assert_eq!(pred.memory(t), fresh.memory(t), "step {step}: memory");
            assert_eq!(pred.result(), fresh.result(), "copies {copies}, step {step}: {n:?} at {p} on type {t}");
        }
    }
}

#[test]
fn casts_between_precisions_are_costed_once_per_value() {
    // QSync's cost mapping: a node reading a value held at another
    // precision pays the cast and its gradient's cast back; readers sharing
    // one cast pay it once; FP32 everywhere pays none. Graph: x → Relu →
    // {Gemm1, Gemm2} (two readers of one value) → Add.
    let text = r#"
graph "g" {
  init %w1: f32[256,256] = absent
  init %w2: f32[256,256] = absent
  input %x: f32[64,256]
  %r: f32[64,256] = Relu "relu"(%x)
  %a: f32[64,256] = MatMul "mm1"(%r, %w1)
  %b: f32[64,256] = MatMul "mm2"(%r, %w2)
  %s: f32[64,256] = Add "add"(%a, %b)
  output %s
}
"#;
    let g = qsync_ir::text::parse_graph(text).expect("parse");
    let id = |name: &str| g.node_ids().into_iter().find(|&n| g.node(n).name == name).expect(name);
    let (mm1, mm2) = (id("mm1"), id("mm2"));
    let t4 = device("t4");
    let o = PredictOptions { bindings: Bindings::new(), ..PredictOptions::default() };
    let run = |plan: Plan| {
        let mut p = Predictor::new(&g, vec![Target::new(t4.clone(), 1, 64, plan)], o.clone()).expect("predict");
        p.result().devices[0].backward_end_us
    };
    let model = qsync_cost::CostModel::new(&t4, None).expect("model");
    let facts = qsync_cost::GraphFacts::new(&g, &Bindings::new()).expect("facts");
    let op = |n: NodeId, p: Precision| model.op_cost(&facts, n, p).expect("cost").total() * 1e6;
    let cast = |from: Precision, to: Precision, e: f64| model.cast_cost(from, to, e) * 1e6;
    let (act, w) = (64.0 * 256.0, 256.0 * 256.0);
    let (f32_, f16_) = (Precision::Fp32, Precision::Fp16);
    let base = run(Plan::new());
    // One GEMM low: its op time changes; it pays the cast of `r` in (no
    // gradient flows back to the input) and the FP32 Add pays the cast of
    // its output up, with the gradient's cast back; the weight is cast,
    // and its gradient cast back.
    let mut one = Plan::new();
    one.set(mm1, f16_);
    let expect_one = base - op(mm1, f32_)
        + op(mm1, f16_)
        + 2.0 * cast(f32_, f16_, act)
        + cast(f16_, f32_, act)
        + cast(f32_, f16_, w)
        + cast(f16_, f32_, w);
    let got = run(one.clone());
    assert!((got - expect_one).abs() < 1e-6, "one low GEMM: {got} µs, expected {expect_one} µs");
    // Both low: `r` is cast once for both readers; the Add (O_dep) follows
    // to FP16, and its FP16 result is cast back to the output's FP32 (with
    // the gradient's cast down); each weight is cast.
    let mut both = one;
    both.set(mm2, f16_);
    let add = id("add");
    let expect_both = base - op(mm1, f32_) - op(mm2, f32_) - op(add, f32_)
        + op(mm1, f16_)
        + op(mm2, f16_)
        + op(add, f16_)
        + 2.0 * cast(f32_, f16_, act)
        + cast(f16_, f32_, act)
        + 2.0 * (cast(f32_, f16_, w) + cast(f16_, f32_, w));
    let got = run(both);
    assert!((got - expect_both).abs() < 1e-6, "both low: {got} µs, expected {expect_both} µs");

    // The same plan written out — the casts as Cast nodes, as materializing
    // it does — predicts the same iteration: a Cast node costs what the
    // plan's accounting charged for it.
    let written = r#"
graph "g" {
  init %w1: f32[256,256] = absent
  init %w2: f32[256,256] = absent
  input %x: f32[64,256]
  %r: f32[64,256] = Relu "relu"(%x)
  %r16: f16[64,256] = Cast "r16"(%r) {to=10}
  %w16: f16[256,256] = Cast "w16"(%w1) {to=10}
  %a16: f16[64,256] = MatMul "mm1"(%r16, %w16) @f16
  %a: f32[64,256] = Cast "a32"(%a16) {to=1}
  %b: f32[64,256] = MatMul "mm2"(%r, %w2)
  %s: f32[64,256] = Add "add"(%a, %b)
  output %s
}
"#;
    let gw = qsync_ir::text::parse_graph(written).expect("parse");
    let mut plan = Plan::new();
    let mm1w = gw.node_ids().into_iter().find(|&n| gw.node(n).name == "mm1").expect("mm1");
    plan.set(mm1w, f16_);
    let mut p = Predictor::new(&gw, vec![Target::new(t4.clone(), 1, 64, plan)], o.clone()).expect("predict");
    let got = p.result().devices[0].backward_end_us;
    assert!((got - expect_one).abs() < 1e-6, "written: {got} µs, planned {expect_one} µs");
}

/// Uniform FP16 / BF16 plans need no more memory than FP32. INT8 is not
/// ordered with them, honestly: QSync's INT8 Conv/GEMM dequantize into FP32
/// outputs, so the FP32 activations their neighbours save for backward stay,
/// and the INT8 copy each quantized kernel saves is added on top (uniform
/// INT8 ResNet-50 on a T4 needs ~5% more than FP32; BERT-tiny ~0.2% more
/// than FP16). The planner, not this property, decides when INT8 pays.
#[test]
fn lowering_precision_everywhere_never_raises_memory() {
    for model in ["bert_tiny.onnx", "squeezenet1_1.onnx", "resnet50_train.onnx"] {
        let g = load(model, 8);
        for dev in ["t4", "a10"] {
            let total = |p: Precision| {
                let targets = vec![Target::new(device(dev), 1, 8, Plan::uniform(&g, p))];
                Predictor::new(&g, targets, opts(&g)).expect("predict").memory(0).expect("memory").total
            };
            let fp32 = total(Precision::Fp32);
            let fp16 = total(Precision::Fp16);
            assert!(fp16 <= fp32, "{model} on {dev}: fp16 needs {fp16} bytes, more than FP32's {fp32}");
            if device(dev).supports(Precision::Bf16) {
                assert!(total(Precision::Bf16) <= fp32, "{model} on {dev}: bf16");
            }
        }
    }
}

/// A T4 with every rate scaled by `k` <= 1.
fn slowed_t4(k: f64) -> Device {
    let mut d = device("t4");
    d.efficiency.tensor_core *= k;
    d.efficiency.cuda_core *= k;
    d.efficiency.memory *= k;
    d.memory_bandwidth_gb_s *= k;
    d.network_gbit_s *= k;
    d.intra_node.bandwidth_gb_s *= k;
    d.validate("slowed t4").expect("valid");
    d
}

#[test]
fn a_slower_device_never_makes_the_iteration_faster() {
    let g = load("squeezenet1_1.onnx", 8);
    for plan in [Plan::new(), Plan::uniform(&g, Precision::Fp16)] {
        let mut last = 0.0;
        for k in [1.0, 0.8, 0.5, 0.25] {
            let targets =
                vec![Target::new(device("v100"), 16, 8, Plan::new()), Target::new(slowed_t4(k), 16, 8, plan.clone())];
            let it = Predictor::new(&g, targets, opts(&g)).expect("predict").result().iteration_us;
            assert!(it.is_finite() && it >= last, "T4 slowed to {k}: {it} µs < {last} µs");
            last = it;
        }
        // Replacing the T4s by V100s never slows the cluster down.
        let mut second = device("v100");
        second.name = "v100b".into();
        let v100s = vec![Target::new(device("v100"), 16, 8, Plan::new()), Target::new(second, 16, 8, plan.clone())];
        let fast = Predictor::new(&g, v100s, opts(&g)).expect("predict").result().iteration_us;
        let t4s = vec![Target::new(device("v100"), 16, 8, Plan::new()), Target::new(device("t4"), 16, 8, plan)];
        let slow = Predictor::new(&g, t4s, opts(&g)).expect("predict").result().iteration_us;
        assert!(fast <= slow, "v100+v100 {fast} µs vs v100+t4 {slow} µs");
    }
}

#[test]
fn fp16_on_t4_is_faster_than_fp32() {
    let g = load("resnet50_train.onnx", 32);
    let it = |p: Plan| {
        let targets = vec![Target::new(device("t4"), 1, 32, p)];
        Predictor::new(&g, targets, opts(&g)).expect("predict").result().iteration_us
    };
    let (fp32, fp16) = (it(Plan::new()), it(Plan::uniform(&g, Precision::Fp16)));
    assert!(fp16 < fp32, "fp16 {fp16} µs, fp32 {fp32} µs");
}

#[test]
fn precision_the_device_lacks_is_an_error() {
    let g = load("bert_tiny.onnx", 8);
    let targets = vec![Target::new(device("v100"), 1, 8, Plan::uniform(&g, Precision::Bf16))];
    let e = Predictor::new(&g, targets, opts(&g)).expect_err("v100 has no bf16");
    assert!(e.to_string().contains("bf16") && e.to_string().contains("v100"), "{e}");
    let mut pred = Predictor::new(&g, vec![Target::new(device("v100"), 1, 8, Plan::new())], opts(&g)).expect("predict");
    let n = g.schedule()[0];
    let e = pred.set_precision(0, n, Precision::Bf16).expect_err("v100 has no bf16");
    assert!(matches!(e, PredictError::Target { .. }), "{e}");
    assert!(pred.set_precision(3, n, Precision::Fp16).is_err(), "no device type 3");
}

#[test]
fn fixed_batch_graphs_scale_activations_not_weights() {
    let g = load("bert_tiny.onnx", 8);
    let at = |scale: f64| {
        let o = PredictOptions { work_scale: scale, ..opts(&g) };
        let pred = Predictor::new(&g, vec![Target::new(device("t4"), 1, 8, Plan::new())], o).expect("predict");
        *pred.memory(0).expect("memory")
    };
    let (one, four) = (at(1.0), at(4.0));
    assert_eq!(one.master_weights, four.master_weights);
    assert_eq!(one.optimizer_state, four.optimizer_state);
    assert!((four.activations - 4.0 * one.activations).abs() <= 1e-6 * four.activations);
    assert!(four.workspace > one.workspace);
    let sum = four.master_weights
        + four.low_precision_weights
        + four.gradients
        + four.optimizer_state
        + four.activations
        + four.workspace;
    assert_eq!(four.total, sum);
}

#[test]
fn each_target_is_costed_at_its_own_batch() {
    // With a reference batch, a target at twice it costs what the whole
    // graph costs at work scale 2 (per-sample work and activations double,
    // launches and weights do not), while a target at the reference batch
    // is unchanged: how joint plans give each device type its own batch.
    let g = load("bert_tiny.onnx", 8);
    let t4 = |b: u32| Target::new(device("t4"), 4, b, Plan::uniform(&g, Precision::Fp16));
    let v100 = |b: u32| Target::new(device("v100"), 4, b, Plan::new());
    let per_target = PredictOptions { reference_batch: Some(8), ..opts(&g) };
    let mut split = Predictor::new(&g, vec![v100(8), t4(16)], per_target).expect("predict");
    let doubled = PredictOptions { work_scale: 2.0, ..opts(&g) };
    let mut both2 = Predictor::new(&g, vec![v100(16), t4(16)], doubled).expect("predict");
    let mut both1 = Predictor::new(&g, vec![v100(8), t4(8)], opts(&g)).expect("predict");
    let (s, d, u) = (split.result().clone(), both2.result().clone(), both1.result().clone());
    assert_eq!(s.devices[1].compute_us, d.devices[1].compute_us, "the T4 at 16 = the graph at scale 2");
    assert_eq!(split.memory(1), both2.memory(1));
    assert_eq!(s.devices[0].compute_us, u.devices[0].compute_us, "the V100 at the reference batch");
    assert_eq!(split.memory(0), both1.memory(0));
    assert_eq!(s.global_batch, 4 * 8 + 4 * 16);
    // Not proportional to the batch: launches and weight reads do not scale,
    // and small work fills the T4's 40 SMs in partial waves, so the time per
    // sample falls as the batch grows (it used to be
    // affine, which priced a T4 given 1 or 2 samples too cheaply).
    let at = |b: u32| {
        let o = PredictOptions { reference_batch: Some(8), ..opts(&g) };
        Predictor::new(&g, vec![v100(8), t4(b)], o).expect("predict").result().devices[1].compute_us
    };
    let (c1, c2, c8, c16) = (at(1), at(2), at(8), at(16));
    assert!(c16 > c8 && c16 < 2.0 * c8, "{c8} {c16}");
    assert!(c1 / 1.0 > c2 / 2.0 && c2 / 2.0 > c8 / 8.0 && c8 / 8.0 > c16 / 16.0, "{c1} {c2} {c8} {c16}");
    // BERT-tiny's GEMMs (hidden 128) stay below one wave of the T4 from
    // batch 1 to 16, so their compute is flat there: batch 1 still takes more
    // than half of batch 8's compute (the linear rule gave about an eighth
    // plus launches).
    assert!(c1 > 0.5 * c8, "{c1} vs {c8}");
}

#[test]
fn optimizer_state_shows_in_time_and_memory() {
    let g = load("bert_tiny.onnx", 8);
    let run = |opt: Optimizer| {
        let o = PredictOptions { optimizer: opt, ..opts(&g) };
        let mut pred = Predictor::new(&g, vec![Target::new(device("t4"), 1, 8, Plan::new())], o).expect("predict");
        (pred.result().iteration_us, pred.memory(0).expect("memory").total)
    };
    let (sgd, adam) = (run(Optimizer::Sgd { momentum: false }), run(Optimizer::Adam));
    assert!(adam.0 > sgd.0 && adam.1 > sgd.1, "sgd {sgd:?} adam {adam:?}");
}

#[test]
fn calibration_overrides_the_analytic_model_on_its_device_only() {
    let g = load("bert_tiny.onnx", 8);
    let base = Predictor::new(&g, vec![Target::new(device("t4"), 1, 8, Plan::new())], opts(&g))
        .expect("predict")
        .result()
        .clone();
    // A profile without data changes nothing.
    let empty = Profile { device: Some("t4".into()), ..Profile::default() };
    let mut t = Target::new(device("t4"), 1, 8, Plan::new());
    t.calibration = Some(empty);
    assert_eq!(Predictor::new(&g, vec![t], opts(&g)).expect("predict").result(), &base);
    // One measured op (1 s forward) adds exactly its excess over the analytic time.
    let facts = qsync_cost::GraphFacts::new(&g, &bindings(&g)).expect("facts");
    let n = *facts.order().iter().find(|&&n| facts.node(n).is_ok_and(|f| f.kind.is_gemm_like())).expect("a GEMM");
    let key = facts.node(n).expect("facts").profile_key.clone();
    let (op, shapes) = key.split_once('|').expect("key");
    let inputs: Vec<String> = shapes
        .split(',')
        .map(|s| if s == "_" { "null".to_string() } else { format!("[{}]", s.replace('x', ",")) })
        .collect();
    let json = format!(
        r#"{{"device": "t4", "ops": [{{"op": "{op}", "inputs": [{}], "precision": "fp32", "fwd_us": 1e6}}]}}"#,
        inputs.join(",")
    );
    let profile = Profile::from_json(&json, "test").expect("profile");
    let mut t = Target::new(device("t4"), 1, 8, Plan::new());
    t.calibration = Some(profile);
    let calibrated = Predictor::new(&g, vec![t], opts(&g)).expect("predict").result().iteration_us;
    assert!(calibrated >= base.iteration_us + 0.99e6, "{calibrated} µs vs {} µs", base.iteration_us);
    // A profile for another device is refused.
    let mut t = Target::new(device("t4"), 1, 8, Plan::new());
    t.calibration = Some(Profile { device: Some("a10".into()), ..Profile::default() });
    let e = Predictor::new(&g, vec![t], opts(&g)).expect_err("wrong device");
    assert!(e.to_string().contains("a10"), "{e}");
}

#[test]
fn refreshed_copies_move_weight_work_into_the_optimizer_step() {
    // bert_tiny in FP16 on a T4, as planned (FP32 weights read by FP16
    // GEMMs: cast every iteration) and with each GEMM weight read through a
    // refreshed f16 copy instead: the same parameters are trained and
    // all-reduced, the same memory is kept, forward and backward are
    // shorter by exactly the weight casts and their gradients' casts back,
    // and the optimizer step is longer by exactly the copies' rewrite.
    let g = load("bert_tiny.onnx", 8);
    let mut g2 = g.clone();
    let mut copy_bytes = 0.0;
    let facts = qsync_cost::GraphFacts::new(&g, &bindings(&g)).expect("facts");
    let model = qsync_cost::CostModel::new(&device("t4"), None).expect("model");
    let (f32_, f16_) = (Precision::Fp32, Precision::Fp16);
    let mut saved_us = 0.0;
    let gemms: Vec<NodeId> = g2
        .node_ids()
        .into_iter()
        .filter(|&n| matches!(g2.node(n).op, qsync_ir::Op::MatMul | qsync_ir::Op::Gemm))
        .collect();
    for n in gemms {
        for slot in 0..g2.node(n).inputs().len() {
            let Some(w) = g2.node(n).input(slot) else { continue };
            let Some(t) = g2.value(w).init().filter(|t| t.dtype == qsync_ir::DType::F32 && t.numel() > 1) else {
                continue;
            };
            let dims = t.dims.clone();
            let numel = t.numel() as f64;
            let name = format!("{}.f16", g2.value_name(w));
            let c = match g2.value_by_name(&name) {
                Some(c) => c,
                None => {
                    copy_bytes += 2.0 * numel;
                    if facts.is_param(w) {
                        saved_us += (model.cast_cost(f32_, f16_, numel) + model.cast_cost(f16_, f32_, numel)) * 1e6;
                    }
                    let tensor =
                        qsync_ir::Tensor { dtype: qsync_ir::DType::F16, dims, data: qsync_ir::TensorData::Absent };
                    g2.add_refreshed_copy(w, name, tensor)
                }
            };
            g2.set_input(n, slot, Some(c));
        }
    }
    assert!(copy_bytes > 0.0);
    let run = |g: &Graph| {
        let t = Target::new(device("t4"), 2, 8, Plan::uniform(g, Precision::Fp16));
        let mut pred = Predictor::new(g, vec![t], opts(g)).expect("predict");
        let r = pred.result().clone();
        (r, *pred.memory(0).expect("memory"))
    };
    let ((a, ma), (b, mb)) = (run(&g), run(&g2));
    assert_eq!(a.allreduce_bytes, b.allreduce_bytes);
    assert_eq!(
        (ma.master_weights, ma.gradients, ma.optimizer_state, ma.low_precision_weights),
        (mb.master_weights, mb.gradients, mb.optimizer_state, mb.low_precision_weights)
    );
    let (da, db) = (&a.devices[0], &b.devices[0]);
    assert!(saved_us > 0.0);
    let shorter = da.backward_end_us - db.backward_end_us;
    assert!((shorter - saved_us).abs() < 1e-6, "backward ends {shorter} µs sooner, weight casts {saved_us} µs");
    let refresh_us = qsync_sim::refresh_seconds(&device("t4"), copy_bytes) * 1e6;
    let (step_a, step_b) = (da.finish_us - da.backward_end_us, db.finish_us - db.backward_end_us);
    assert!((step_b - step_a - refresh_us).abs() < 1e-6, "step {step_a} -> {step_b}, refresh {refresh_us}");
}

#[test]
fn planned_weight_copies_update_incrementally_and_cost_their_rewrite() {
    // With `weight_copies`, every parameter read at FP16 is a refreshed
    // copy: forward and backward lose the weight casts, the optimizer step
    // grows by at most the rewrite of every parameter, and an incremental
    // precision change equals a fresh prediction.
    let g = load("bert_tiny.onnx", 8);
    let o = |copies: bool| PredictOptions { weight_copies: copies, ..opts(&g) };
    let fp16 = || vec![Target::new(device("t4"), 2, 8, Plan::uniform(&g, Precision::Fp16))];
    let plain = Predictor::new(&g, fp16(), o(false)).expect("predict").result().clone();
    let with = Predictor::new(&g, fp16(), o(true)).expect("predict").result().clone();
    let (a, b) = (&plain.devices[0], &with.devices[0]);
    let facts = qsync_cost::GraphFacts::new(&g, &bindings(&g)).expect("facts");
    let params: f64 = facts.params().iter().filter_map(|&v| facts.elements(v)).sum();
    let bound = qsync_sim::refresh_seconds(&device("t4"), 2.0 * params) * 1e6;
    let grown = (b.finish_us - b.backward_end_us) - (a.finish_us - a.backward_end_us);
    assert!(grown > 0.0 && grown <= bound + 1e-9, "step grew {grown} µs, bound {bound} µs");
    assert!(b.backward_end_us < a.backward_end_us, "no weight casts with copies: {b:?} vs {a:?}");
    // FP32 everywhere: no copies, nothing added.
    let fp32 = || vec![Target::new(device("t4"), 2, 8, Plan::uniform(&g, Precision::Fp32))];
    let p32 = Predictor::new(&g, fp32(), o(false)).expect("predict").result().clone();
    let c32 = Predictor::new(&g, fp32(), o(true)).expect("predict").result().clone();
    assert_eq!(p32, c32);
    // Incremental: lower one GEMM to FP16 from FP32, against a fresh run.
    let n = *facts.order().iter().find(|&&n| facts.node(n).is_ok_and(|f| f.kind.is_gemm_like())).expect("a GEMM");
    let mut inc = Predictor::new(&g, fp32(), o(true)).expect("predict");
    inc.set_precision(0, n, Precision::Fp16).expect("set");
    let mut plan = Plan::uniform(&g, Precision::Fp32);
    plan.set(n, Precision::Fp16);
    let fresh =
        Predictor::new(&g, vec![Target::new(device("t4"), 2, 8, plan)], o(true)).expect("predict").result().clone();
    assert_eq!(inc.result(), &fresh);
    assert!(
        fresh.devices[0].finish_us - fresh.devices[0].backward_end_us
            > c32.devices[0].finish_us - c32.devices[0].backward_end_us
    );
}

#[test]
fn every_parameter_tensor_reaches_ddp_with_its_gradient() {
    // DDP's work per parameter tensor (`bucket_tensor_s`) needs each op's
    // tensors: over ResNet-50 as trained (no weight read by two ops) the ops' tensors
    // add up to the graph's parameters, and their bytes to 4 bytes an
    // element of them.
    let g = load("resnet50_train.onnx", 8);
    let o = opts(&g);
    let facts = qsync_sim::GraphAnalysis::new(&g, &o).expect("analysis");
    let params = facts.facts().params();
    let elements: f64 = params.iter().filter_map(|&v| facts.facts().elements(v)).sum();
    assert!(params.len() > 100, "{} parameters", params.len());
    let pred = Predictor::new(&g, vec![Target::new(device("t4"), 2, 8, Plan::new())], o).expect("predict");
    let ops = &pred.program(0).expect("program").ops;
    let tensors: u64 = ops.iter().map(|op| op.cost.grad_tensors).sum();
    let bytes: u64 = ops.iter().map(|op| op.cost.grad_bytes).sum();
    assert_eq!(tensors, params.len() as u64);
    assert_eq!(bytes as f64, 4.0 * elements);
    // An op without gradient bytes holds no tensor.
    assert!(ops.iter().all(|op| (op.cost.grad_bytes > 0) == (op.cost.grad_tensors > 0)));
}
