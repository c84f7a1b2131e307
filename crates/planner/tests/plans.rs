//! The planner end to end on small text-IR graphs: a V100 and a T4 (the
//! bundled device facts), planned through the crate's public API, each
//! outcome snapshotted (every method's batches, precisions and predicted
//! figures, rounded to four significant digits) beside the properties that
//! can be worked out by hand.

use std::fmt::Write as _;

use qsync_cost::{Bindings, DeviceDb, GraphFacts, Plan, Precision};
use qsync_ir::{Graph, NodeId};
use qsync_planner::{allocate, candidates, AllocOptions, Eval, Indicator, Method, Objective, Outcome, PlanError, TMin};
use qsync_sim::{PredictOptions, Predictor, Target};

/// `layers` × (MatMul by a `width`² weight, Relu) on a `batch` × `width`
/// input: compute grows with the batch, parameters do not.
fn mlp(batch: u32, width: u32, layers: usize) -> Graph {
    let mut s = String::from("opset \"\" 17\ngraph \"mlp\" {\n");
    for i in 0..layers {
        writeln!(s, "  init %w{i}: f32[{width},{width}] = absent").expect("a String grows");
    }
    writeln!(s, "  input %x: f32[{batch},{width}]").expect("a String grows");
    let mut prev = "x".to_string();
    for i in 0..layers {
        writeln!(s, "  %h{i}: f32[{batch},{width}] = MatMul \"fc{i}\"(%{prev}, %w{i})").expect("a String grows");
        writeln!(s, "  %r{i}: f32[{batch},{width}] = Relu \"relu{i}\"(%h{i})").expect("a String grows");
        prev = format!("r{i}");
    }
    writeln!(s, "  output %{prev}\n}}").expect("a String grows");
    qsync_ir::text::parse_graph(&s).expect("the graph parses")
}

/// One device of `name`, at `batch`, with `memory` of its capacity (`None`:
/// all of it).
fn target(name: &str, batch: u32, memory: Option<f64>) -> Target {
    let device = DeviceDb::bundled().expect("bundled devices").get(name).expect("a bundled device").clone();
    Target { memory_fraction: memory, ..Target::new(device, 1, batch, Plan::new()) }
}

/// A V100 and a T4, each at `batch`; the T4 with `t4_memory` of its capacity.
fn v100_t4(batch: u32, t4_memory: Option<f64>) -> Vec<Target> {
    vec![target("v100", batch, None), target("t4", batch, t4_memory)]
}

/// The graph's work costed at `batch` (the batch its shapes hold), no
/// calibration file (activations estimated from shapes, so no INT8).
fn predict_options(batch: u32) -> PredictOptions {
    PredictOptions { reference_batch: Some(batch), ..PredictOptions::default() }
}

fn plan(g: &Graph, batch: u32, targets: Vec<Target>, opts: &AllocOptions) -> Result<Outcome, PlanError> {
    let facts = GraphFacts::new(g, &Bindings::new()).expect("facts");
    let cands = candidates(g, &facts);
    let ind = Indicator::new(g, &facts, &cands, None);
    allocate(g, &facts, targets, predict_options(batch), &ind, opts, &mut |_| {})
}

/// Four significant digits: stable in a snapshot, still readable.
fn sig(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let decimals = 3 - x.abs().log10().floor() as i32;
    if decimals >= 0 {
        format!("{x:.*}", decimals as usize)
    } else {
        let unit = 10f64.powi(-decimals);
        format!("{:.0}", (x / unit).round() * unit)
    }
}

fn node(g: &Graph, name: &str) -> NodeId {
    g.node_ids().into_iter().find(|&n| g.node(n).name == name).expect("a node of that name")
}

/// Every method's figures, then the chosen plan operator by operator.
fn render(g: &Graph, out: &Outcome) -> String {
    let mut s = String::new();
    writeln!(s, "chosen: {}", out.chosen).expect("a String grows");
    writeln!(s, "floor: {} samples/s ({:?})", sig(out.t_min), out.t_min_rule).expect("a String grows");
    for (key, e) in out.methods() {
        writeln!(
            s,
            "{key}: {} ms, {} samples/s, indicator {}",
            sig(e.iteration_ms),
            sig(e.samples_per_s),
            sig(e.indicator_sum)
        )
        .expect("a String grows");
        for t in &e.types {
            let fits = if t.fits { "fits" } else { "DOES NOT FIT" };
            let hist: Vec<String> = t.precision_histogram.iter().map(|(p, c)| format!("{c} {p}")).collect();
            writeln!(
                s,
                "  {} x{} {}: batch {}, {}, {} of {} GiB, {}",
                t.name,
                t.count,
                t.role,
                t.local_batch,
                hist.join(" + "),
                sig(gib(t.peak_memory_bytes)),
                sig(gib(t.memory_capacity_bytes)),
                fits
            )
            .expect("a String grows");
        }
    }
    writeln!(s, "chosen plan per operator:").expect("a String grows");
    let mut nodes: Vec<NodeId> = out.chosen_eval.types.iter().flat_map(|t| t.plan.iter().map(|(n, _)| n)).collect();
    nodes.sort_by_key(|n| n.index());
    nodes.dedup();
    for n in nodes {
        let per_type: Vec<String> = out
            .chosen_eval
            .types
            .iter()
            .map(|t| format!("{} {}", t.name, t.plan.get(n).map_or("-".to_string(), |p| p.to_string())))
            .collect();
        writeln!(s, "  {}: {}", g.node(n).name, per_type.join(", ")).expect("a String grows");
    }
    s
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

fn global_batch(e: &Eval) -> u64 {
    e.types.iter().map(|t| u64::from(t.count) * u64::from(t.local_batch)).sum()
}

fn type_of<'e>(e: &'e Eval, name: &str) -> &'e qsync_planner::TypeEval {
    e.types.iter().find(|t| t.name == name).expect("a type of that name")
}

/// Samples/s of the two devices under explicit plans, as the planner's
/// predictor sees them.
fn predicted(g: &Graph, batch: u32, targets: Vec<Target>) -> qsync_sim::SimResult {
    Predictor::new(g, targets, predict_options(batch)).expect("predicts").result().clone()
}

/// A plan with every candidate GEMM of `g` at `p`.
fn gemms_at(g: &Graph, layers: usize, p: Precision) -> Plan {
    let mut plan = Plan::new();
    for i in 0..layers {
        plan.set(node(g, &format!("fc{i}")), p);
    }
    plan
}

/// The floor the default rule keeps: the best of UP and DBS.
fn best_baseline(out: &Outcome) -> f64 {
    out.up.samples_per_s.max(out.dbs.samples_per_s)
}

#[test]
fn tiny_mlp_the_slow_device_quantizes() {
    // 4096 samples through three 1024² GEMMs: ~26 GFLOP a layer per
    // iteration, against 4 MiB of weights. The T4 in FP32 (8 TFLOPS) would
    // take several times the V100's AMP step; in FP16 it runs on Tensor
    // Cores. QSync's method keeps the uniform batch, so the T4 must
    // quantize to keep up.
    let (batch, layers) = (4096, 3);
    let g = mlp(batch, 1024, layers);
    let opts = AllocOptions { method: Method::Qsync, ..AllocOptions::default() };
    let out = plan(&g, batch, v100_t4(batch, None), &opts).expect("plans");
    insta::assert_snapshot!(render(&g, &out));

    // The V100 is the training type (faster at FP32 per sample), in AMP:
    // its GEMMs in FP16 (it has no BF16); the T4 is planned.
    let (v100, t4) = (type_of(&out.chosen_eval, "v100"), type_of(&out.chosen_eval, "t4"));
    assert_eq!((v100.role, t4.role), ("training", "inference"));
    assert_eq!(v100.plan, gemms_at(&g, layers, Precision::Fp16));
    // Every T4 GEMM is quantized, and the T4 at FP32 is slower than the
    // chosen plan, worked out with the predictor itself.
    assert_eq!(t4.plan, gemms_at(&g, layers, Precision::Fp16));
    let fp32 = predicted(
        &g,
        batch,
        vec![
            Target { plan: v100.plan.clone(), ..target("v100", batch, None) },
            Target { plan: gemms_at(&g, layers, Precision::Fp32), ..target("t4", batch, None) },
        ],
    );
    assert!(
        fp32.samples_per_s < out.chosen_eval.samples_per_s * 0.9,
        "{} vs {}",
        fp32.samples_per_s,
        out.chosen_eval.samples_per_s
    );
    // QSync's method keeps the uniform batch and UP's floor.
    assert!(out.chosen == "qsync" || out.chosen == "qsync-greedy", "{}", out.chosen);
    assert!(out.chosen_eval.types.iter().all(|t| t.local_batch == batch && t.fits));
    assert!(out.chosen_eval.samples_per_s >= out.up.samples_per_s * (1.0 - 1e-9));
    assert!(out.chosen_eval.indicator_sum <= out.up.indicator_sum * (1.0 + 1e-9));
}

#[test]
fn joint_plan_splits_the_batch_and_keeps_the_best_baseline() {
    // Smaller GEMMs: the T4 can afford one FP32 layer once it takes fewer
    // samples than the V100.
    let (batch, layers) = (2048, 3);
    let g = mlp(batch, 512, layers);
    let out = plan(&g, batch, v100_t4(batch, None), &AllocOptions::default()).expect("plans");
    insta::assert_snapshot!(render(&g, &out));

    let joint = out.joint.as_ref().expect("a joint plan at the floor");
    // The global batch is kept, every device has a sample, and the faster
    // V100 takes more of them.
    assert_eq!(global_batch(joint), 2 * u64::from(batch));
    assert_eq!(out.global_batch(), 2 * u64::from(batch));
    let (v100, t4) = (type_of(joint, "v100"), type_of(joint, "t4"));
    assert!(t4.local_batch >= 1 && v100.local_batch > t4.local_batch, "{} / {}", v100.local_batch, t4.local_batch);
    // DBS's split too, at the training precision everywhere.
    let dbs = out.dbs.eval.as_ref().expect("DBS fits");
    assert_eq!(global_batch(dbs), 2 * u64::from(batch));
    assert!(out.dbs.batch_split["v100"] > out.dbs.batch_split["t4"]);
    // The floor is the best baseline, and the chosen plan keeps it.
    assert_eq!(out.t_min_rule, TMin::Best);
    assert!(out.t_min >= best_baseline(&out) * (1.0 - 1e-12));
    assert!(out.chosen_eval.samples_per_s >= best_baseline(&out) * (1.0 - 1e-9));
    assert!(out.chosen_eval.types.iter().all(|t| t.fits));
    // The least indicator of the data-parallel plans that keep the floor.
    for (key, e) in out.methods() {
        let ddp = !matches!(key, "fsdp" | "fsdp-dbs" | "sharded");
        if ddp && e.types.iter().all(|t| t.fits) && e.samples_per_s >= out.t_min * (1.0 - 1e-9) {
            assert!(out.chosen_eval.indicator_sum <= e.indicator_sum * (1.0 + 1e-9), "{key} has a smaller indicator");
        }
    }
}

#[test]
fn memory_forces_the_lower_precision() {
    // Activations dominate (32768 × 128 per value, tiny weights) and the
    // graph fixes its batch: the T4 cannot shed samples, only precision.
    // At 3.8% of its 16 GiB (0.61 GiB) it holds the FP16 plan, not FP32.
    let (batch, layers, share) = (32768, 6, 0.038);
    let g = mlp(batch, 128, layers);
    let opts = AllocOptions { fixed_local_batch: Some(batch), ..AllocOptions::default() };
    let out = plan(&g, batch, v100_t4(batch, Some(share)), &opts).expect("plans");
    insta::assert_snapshot!(render(&g, &out));

    // By hand: the all-FP32 T4 does not fit, the all-FP16 one does.
    let v100 = Target { plan: gemms_at(&g, layers, Precision::Fp16), ..target("v100", batch, None) };
    let at = |p: Precision| {
        let t4 = Target { plan: gemms_at(&g, layers, p), ..target("t4", batch, Some(share)) };
        predicted(&g, batch, vec![v100.clone(), t4]).devices[1].fits
    };
    assert!(!at(Precision::Fp32), "the FP32 T4 fits in {share} of its memory");
    assert!(at(Precision::Fp16));
    // UP keeps the one uniform level that fits, and every plan written fits
    // at the fixed batch.
    assert_eq!(type_of(&out.up, "t4").plan, gemms_at(&g, layers, Precision::Fp16));
    assert!(out.up_lowest.is_none());
    for e in [&out.up, &out.ours, &out.greedy, &out.chosen_eval] {
        assert!(e.types.iter().all(|t| t.fits && t.local_batch == batch), "{}", e.method);
    }
    let t4 = type_of(&out.chosen_eval, "t4");
    assert!(t4.precision_histogram.get("fp16").copied().unwrap_or(0) > 0, "{:?}", t4.precision_histogram);

    // Asked for the fastest plan at indicator 0 (the T4 in FP32), the joint
    // search finds it with all the T4's memory, and nothing without.
    let fp32 = AllocOptions {
        objective: Objective::Throughput,
        indicator_bound: Some(0.0),
        fixed_local_batch: Some(batch),
        ..AllocOptions::default()
    };
    let free = plan(&g, batch, v100_t4(batch, None), &fp32).expect("plans");
    let fastest = free.joint_fastest.as_ref().expect("an FP32 plan fits in all of the T4's memory");
    assert_eq!(type_of(fastest, "t4").plan, gemms_at(&g, layers, Precision::Fp32));
    assert_eq!(fastest.indicator_sum, 0.0);
    let capped = plan(&g, batch, v100_t4(batch, Some(share)), &fp32).expect("plans");
    assert!(capped.joint_fastest.is_none(), "no plan at indicator 0 fits in {share} of the T4");
    let t4 = type_of(&capped.chosen_eval, "t4");
    assert!(t4.fits && t4.plan == gemms_at(&g, layers, Precision::Fp16), "{}", capped.chosen);
}

#[test]
fn nothing_fits_is_refused_with_the_memory_it_needs() {
    // 1% of each device's memory is less than the CUDA context and
    // workspace the predictor counts: no precision and no sharding fits.
    let batch = 256;
    let g = mlp(batch, 256, 2);
    let targets = vec![target("v100", batch, Some(0.01)), target("t4", batch, Some(0.01))];
    let err = plan(&g, batch, targets.clone(), &AllocOptions::default()).expect_err("nothing fits");
    let PlanError::Infeasible(msg) = &err else { panic!("not an infeasible plan: {err}") };
    assert!(msg.contains("does not fit") && msg.contains("v100") && msg.contains("t4"), "{msg}");
    insta::assert_snapshot!("nothing_fits_joint", msg);
    // QSync's UP refuses on its own terms.
    let up = AllocOptions { method: Method::Up, ..AllocOptions::default() };
    let err = plan(&g, batch, targets, &up).expect_err("nothing fits");
    let PlanError::Infeasible(msg) = &err else { panic!("not an infeasible plan: {err}") };
    assert!(msg.starts_with("UP does not fit"), "{msg}");
    insta::assert_snapshot!("nothing_fits_up", msg);
}

#[test]
fn rounding_keeps_four_significant_digits() {
    assert_eq!(sig(3615616.76), "3616000");
    assert_eq!(sig(1.13291), "1.133");
    assert_eq!(sig(0.0123456), "0.01235");
    assert_eq!(sig(0.0), "0");
}
