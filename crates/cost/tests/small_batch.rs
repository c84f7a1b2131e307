//! Small per-device work: the wave model of GEMM-like
//! phases, costs at a fraction of the batch, and measured batch curves.
//! Every expected value is worked out by hand in the comments.
#![allow(clippy::unwrap_used)]

mod common;

use common::{gemm_graph, init};
use qsync_cost::model::wave_factor;
use qsync_cost::{Bindings, CostModel, DeviceDb, GraphFacts, Precision, Profile, Work};
use qsync_ir::{Attr, DType, Dim, Graph, NodeId, NodeSpec, Op, TensorType};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
}

fn work(outputs: f64, k: f64) -> Work {
    Work { flops: 2.0 * outputs * k, elems: 0.0, fixed_bytes: 0.0, kernels: 1.0, outputs }
}

#[test]
fn waves_are_flat_below_one_wave_and_step_per_wave() {
    // T4: 40 SMs × 1 tile of 16,384 outputs = 40 blocks a wave; split-K
    // slices ≥ 256. K = 128 allows no split.
    let db = DeviceDb::bundled().unwrap();
    let t4 = db.get("t4").unwrap();
    let tile = 16_384.0;
    // 10 tiles → 10 blocks of 40 → factor 40/10 = 4; 5 tiles → 8.
    assert_eq!(wave_factor(t4, &work(10.0 * tile, 128.0)), 4.0);
    assert_eq!(wave_factor(t4, &work(5.0 * tile, 128.0)), 8.0);
    // Flat below one wave: compute ∝ flops · factor = 2·outputs·K · 40/tiles,
    // the same for 5 and 10 tiles.
    let at = |tiles: f64| 2.0 * tiles * tile * 128.0 * wave_factor(t4, &work(tiles * tile, 128.0));
    assert_eq!(at(5.0), at(10.0));
    assert_eq!(at(1.0), at(40.0));
    // 40 tiles: exactly one wave (1); 41: two waves → 80/41; 80: 1 again.
    assert_eq!(wave_factor(t4, &work(40.0 * tile, 128.0)), 1.0);
    assert!(close(wave_factor(t4, &work(41.0 * tile, 128.0)), 80.0 / 41.0));
    assert_eq!(wave_factor(t4, &work(80.0 * tile, 128.0)), 1.0);
    // A partial tile is a whole tile: 16,385 outputs = 2 tiles → 20.
    assert_eq!(wave_factor(t4, &work(tile + 1.0, 128.0)), 20.0);
    // Split-K: 2 tiles with K = 4096 allow floor(4096/256) = 16 splits;
    // floor(40/2) = 20 would fill the wave, so 16 → 32 blocks → 40/32.
    assert_eq!(wave_factor(t4, &work(2.0 * tile, 4096.0)), 1.25);
    // K = 1024 allows 4: 2·4 = 8 blocks → 5.
    assert_eq!(wave_factor(t4, &work(2.0 * tile, 1024.0)), 5.0);
    // No outputs named (not a GEMM phase): 1.
    assert_eq!(wave_factor(t4, &work(0.0, 128.0)), 1.0);
    // A device without occupancy figures: 1.
    let mut bare = t4.clone();
    bare.occupancy = None;
    assert_eq!(wave_factor(&bare, &work(tile, 128.0)), 1.0);
}

#[test]
fn a_gemm_at_an_eighth_of_its_batch_costs_far_more_than_an_eighth() {
    // T4 FP16 Tensor Cores: 65e12 × 0.3 = 19.5e12 FLOP/s; 320 GB/s × 0.6 =
    // 192e9 B/s; 4 µs launch. x[256,768] · Wᵀ[768,768] + b.
    // Batch as built (scale 1):
    //   flops = 2·256·768·768 + 256·768 = 302,186,496 → 15.497 µs at peak·eff;
    //   outputs 196,608 → 12 tiles, K = 302,186,496 / (2·196,608) = 768.5 →
    //   ≤ 3 splits, floor(40/12) = 3 → 36 blocks → ×40/36 → 17.219 µs;
    //   elems = 196,608 (x) + 589,824 (W) + 768 (b) + 196,608 (y) = 983,808,
    //   2 bytes each → 10.248 µs. fwd = 17.219 + 4 = 21.219 µs.
    // Scale 1/8 (32 rows):
    //   flops = 37,773,312; outputs 24,576 → 2 tiles, K = 768.5 → ≤ 3 splits,
    //   floor(40/2) = 20 → 3 → 6 blocks → ×40/6 → 12.914 µs;
    //   elems = 590,592 (W, b: once) + (983,808 − 590,592)/8 = 639,744 →
    //   6.664 µs. fwd = 12.914 + 4 = 16.914 µs — the linear rule gave
    //   4 + 17.219/8 = 6.15 µs.
    let (g, fc) = gemm_graph(256, 768, 768);
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    let db = DeviceDb::bundled().unwrap();
    let cm = CostModel::new(db.get("t4").unwrap(), None).unwrap();
    let (tc, bw, l): (f64, f64, f64) = (65e12 * 0.3, 320e9 * 0.6, 4e-6);
    let full = cm.op_cost_at(&facts, fc, Precision::Fp16, 1.0).unwrap();
    let want_full = (302_186_496.0 / tc * 40.0 / 36.0).max(2.0 * 983_808.0 / bw) + l;
    assert!(close(full.fwd, want_full), "{} vs {want_full}", full.fwd);
    assert!((full.fwd * 1e6 - 21.219).abs() < 1e-3);
    assert_eq!(full, cm.op_cost(&facts, fc, Precision::Fp16).unwrap(), "scale 1 is op_cost");
    let eighth = cm.op_cost_at(&facts, fc, Precision::Fp16, 0.125).unwrap();
    let want = (37_773_312.0 / tc * 40.0 / 6.0).max(2.0 * 639_744.0 / bw) + l;
    assert!(close(eighth.fwd, want), "{} vs {want}", eighth.fwd);
    assert!((eighth.fwd * 1e6 - 16.914).abs() < 1e-3, "{}", eighth.fwd * 1e6);
    assert_eq!(eighth.fwd_flops, 37_773_312.0);
    // The same node really at 32 rows costs the same as the scaled one.
    let (g32, fc32) = gemm_graph(32, 768, 768);
    let f32_facts = GraphFacts::new(&g32, &Bindings::new()).unwrap();
    let direct = cm.op_cost(&f32_facts, fc32, Precision::Fp16).unwrap();
    assert!(close(direct.fwd, eighth.fwd), "{} vs {}", direct.fwd, eighth.fwd);
    assert!(close(direct.bwd_input, eighth.bwd_input) && close(direct.bwd_weight, eighth.bwd_weight));
}

/// A profile with the 256-row GEMM measured at batch 8 (its shapes' batch,
/// for the test) and at batches 2 and 32; `extra` adds fields to the op.
fn curve_profile(extra: &str) -> Profile {
    let text = format!(
        r#"{{ "device": "t4", "ops": [ {{ "op": "Gemm", "inputs": [[256, 768], [768, 768], [768]],
            "precision": "fp16", "fwd_us": 40.0, "bwd_input_us": 50.0, "batch": 8 {extra} }} ] }}"#
    );
    Profile::from_json(&text, "test").unwrap()
}

#[test]
fn a_batch_curve_is_piecewise_linear_flat_below_and_extrapolated_above() {
    let p = curve_profile(
        r#", "batch_points": [
            { "batch": 2, "fwd_us": 25.0, "bwd_input_us": 30.0 },
            { "batch": 32, "inputs": [[1024, 768], [768, 768], [768]], "fwd_us": 100.0 } ]"#,
    );
    let (table, curves) = p.op_table_with_curves();
    assert_eq!(curves.len(), 1);
    let c = &curves[0];
    let us = |(f, bi, bw): (f64, Option<f64>, Option<f64>)| (f * 1e6, bi.map(|x| x * 1e6), bw.map(|x| x * 1e6));
    let near = |a: (f64, Option<f64>, Option<f64>), b: (f64, Option<f64>, Option<f64>)| {
        let o = |x: Option<f64>, y: Option<f64>| match (x, y) {
            (Some(x), Some(y)) => (x - y).abs() < 1e-9,
            (None, None) => true,
            _ => false,
        };
        (a.0 - b.0).abs() < 1e-9 && o(a.1, b.1) && o(a.2, b.2)
    };
    // fwd points (2, 25), (8, 40), (32, 100); bwd_input (2, 30), (8, 50);
    // bwd_weight never measured → None.
    // Batch 1, below the first point: flat at the first point's time.
    assert!(near(us(c.at(1.0)), (25.0, Some(30.0), None)), "{:?}", us(c.at(1.0)));
    // Batch 4: fwd 25 + (40 − 25)·(4 − 2)/(8 − 2) = 30; bwd_input 30 + 20·2/6 = 36.667.
    assert!(near(us(c.at(4.0)), (30.0, Some(30.0 + 20.0 / 3.0), None)), "{:?}", us(c.at(4.0)));
    // Batch 16: fwd 40 + 60·8/24 = 60; bwd_input beyond its last point (8):
    // the line through (2, 30) and (8, 50): 50 + 20·8/6 = 76.667.
    assert!(near(us(c.at(16.0)), (60.0, Some(50.0 + 160.0 / 6.0), None)), "{:?}", us(c.at(16.0)));
    // Batch 64, beyond the last fwd point: the line through (8, 40) and
    // (32, 100): 100 + 60·32/24 = 180.
    assert!((c.at(64.0).0 * 1e6 - 180.0).abs() < 1e-9);
    // Exactly at a point: that point.
    assert!((c.at(32.0).0 * 1e6 - 100.0).abs() < 1e-9);
    // The point that names its inputs is also an entry of its own key.
    let m = table["Gemm|1024x768,768x768,768"][Precision::Fp16.index()].unwrap();
    assert!(close(m.fwd, 100e-6) && m.batch == 32.0 && m.curve == Some(0), "{m:?}");
    let m = table["Gemm|256x768,768x768,768"][Precision::Fp16.index()].unwrap();
    assert_eq!((m.batch, m.curve), (8.0, Some(0)));
}

#[test]
fn the_cost_model_reads_a_measured_curve_at_the_scaled_batch() {
    // The profile's GEMM is the graph's node (same key). At scale 1/4 the
    // node runs at batch 8/4 = 2: fwd 25 µs, bwd_input 30 µs (the points);
    // bwd_weight was never measured and stays analytic at the scaled work.
    let p = curve_profile(r#", "batch_points": [ { "batch": 2, "fwd_us": 25.0, "bwd_input_us": 30.0 } ]"#);
    let db = DeviceDb::bundled().unwrap();
    let t4 = db.get("t4").unwrap();
    let cm = CostModel::new(t4, Some(&p)).unwrap();
    let bare = CostModel::new(t4, None).unwrap();
    let (g, fc) = gemm_graph(256, 768, 768);
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    let c = cm.op_cost_at(&facts, fc, Precision::Fp16, 0.25).unwrap();
    assert!(c.measured);
    assert!(close(c.fwd, 25e-6) && close(c.bwd_input, 30e-6), "{c:?}");
    let analytic = bare.op_cost_at(&facts, fc, Precision::Fp16, 0.25).unwrap();
    assert!(close(c.bwd_weight, analytic.bwd_weight));
    // At scale 1: the entry's own times.
    let one = cm.op_cost_at(&facts, fc, Precision::Fp16, 1.0).unwrap();
    assert!(close(one.fwd, 40e-6) && close(one.bwd_input, 50e-6));
    // Without batch points a measured op scales linearly (all but one 4 µs
    // launch), floored at a launch plus its weights read once at FP16:
    // 590,592 · 2 B / 192e9 B/s = 6.152 µs. fwd 4 + 36/4 = 13 µs;
    // bwd_input 4 + 46/4 = 15.5 µs; at 1/64: 4 + 36/64 = 4.5625 < the floor
    // 10.152 µs.
    let flat = CostModel::new(t4, Some(&curve_profile(""))).unwrap();
    let q = flat.op_cost_at(&facts, fc, Precision::Fp16, 0.25).unwrap();
    assert!(close(q.fwd, 13e-6) && close(q.bwd_input, 15.5e-6), "{q:?}");
    let tiny = flat.op_cost_at(&facts, fc, Precision::Fp16, 1.0 / 64.0).unwrap();
    let floor = 4e-6 + 590_592.0 * 2.0 / (320e9 * 0.6);
    assert!(close(tiny.fwd, floor), "{} vs {floor}", tiny.fwd);
}

#[test]
fn batch_points_are_checked() {
    let bad = |extra: &str| {
        let text = format!(
            r#"{{ "ops": [ {{ "op": "Gemm", "inputs": [[256, 768]], "precision": "fp16", "fwd_us": 40.0 {extra} }} ] }}"#
        );
        Profile::from_json(&text, "p.json").unwrap_err().to_string()
    };
    let e = bad(r#", "batch_points": [ { "batch": 2, "fwd_us": 1.0 } ]"#);
    assert!(e.contains("batch_points need the entry's `batch`"), "{e}");
    let e = bad(r#", "batch": 8, "batch_points": [ { "batch": 8, "fwd_us": 1.0 } ]"#);
    assert!(e.contains("batch 8 is not positive or repeats one"), "{e}");
    let e = bad(r#", "batch": 8, "batch_points": [ { "batch": 2, "fwd_us": -1.0 } ]"#);
    assert!(e.contains("fwd_us must be a non-negative number"), "{e}");
    let e = bad(r#", "batch": 8, "batch_points": [ { "batch": 2, "inputs": [], "fwd_us": 1.0 } ]"#);
    assert!(e.contains("as many slots"), "{e}");
    let e = bad(r#", "batch": 0"#);
    assert!(e.contains("batch must be positive"), "{e}");
}

/// x[batch,768] → Add(s) → Gemm(W[768,768]ᵀ, b): the GEMM at any batch.
fn symbolic_gemm() -> (Graph, NodeId) {
    let mut g = Graph::new("gemm");
    let ty = |d: i64| TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::from(d)]);
    let x = g.add_input("x", ty(768));
    let s = init(&mut g, "s", &[768]);
    let r = g.add_node(NodeSpec::new("shift", Op::Add).input(x).input(s).output("r", ty(768)));
    let rv = g.node(r).outputs()[0];
    let w = init(&mut g, "w", &[768, 768]);
    let b = init(&mut g, "b", &[768]);
    let spec =
        NodeSpec::new("fc", Op::Gemm).input(rv).input(w).input(b).attr("transB", Attr::Int(1)).output("y", ty(768));
    let fc = g.add_node(spec);
    let y = g.node(fc).outputs()[0];
    g.set_outputs(vec![y]);
    (g, fc)
}

#[test]
fn worklist_batch_points_become_the_profiles_batch_curve() {
    use qsync_cost::calibrate::{build_profile, Measurements, Worklist};
    let (g, fc) = symbolic_gemm();
    // Points sorted, the main batch and repeats dropped.
    let mut w = Worklist::new(8, Default::default()).with_batch_points(&[32, 1, 8, 2, 2]);
    assert_eq!(w.batch_points, vec![1, 2, 32]);
    w.add_graph("m", "m", &g, &Bindings::new().with("batch", 8)).unwrap();
    let e = w.entries.iter().find(|e| e.op == "Gemm").unwrap();
    assert_eq!(e.key, "Gemm|8x768,768x768,768");
    let batches: Vec<i64> = e.at_batches.iter().map(|a| a.batch).collect();
    assert_eq!(batches, vec![1, 2, 32]);
    assert_eq!(e.at_batches[1].inputs, vec![Some(vec![2, 768]), Some(vec![768, 768]), Some(vec![768])]);
    assert_eq!(e.at_batches[1].outputs, vec![vec![2, 768]]);
    // The work at batch 2: 2·2·768·768 + 2·768 (bias) FLOPs, 2·768 outputs.
    assert_eq!(e.at_batches[1].fwd.flops, 2.0 * 2.0 * 768.0 * 768.0 + 2.0 * 768.0);
    assert_eq!(e.at_batches[1].fwd.outputs, 2.0 * 768.0);
    // Measurements: fwd 40 µs at 8, 25 µs at 2, 20 µs at 1, 100 µs at 32.
    let mut m = serde_json::json!({
        "schema": "qsync-ops/1", "batch": 8, "models": w.models, "entries": w.entries,
    });
    for e in m["entries"].as_array_mut().unwrap() {
        let gemm = e["op"] == "Gemm";
        let us = |x: f64| if gemm { x } else { 1.0 };
        e["measured"] = serde_json::json!({ "fp32": { "fwd_us": us(40.0) } });
        e["at_batches_measured"] = serde_json::json!({ "fp32": [
            { "batch": 1, "fwd_us": us(20.0) }, { "batch": 2, "fwd_us": us(25.0) }, { "batch": 32, "fwd_us": us(100.0) } ] });
    }
    let m = Measurements::from_json(&m.to_string(), "ops.json").unwrap();
    let db = DeviceDb::bundled().unwrap();
    let v100 = db.get("v100").unwrap();
    let (profile, report) = build_profile(&m, v100, &[]).unwrap();
    // Every point was a sample of the fit: 2 ops × 4 batches × fwd only.
    assert_eq!(report.phases, 8);
    let op = profile.ops.iter().find(|o| o.op == "Gemm").unwrap();
    assert_eq!(op.batch, Some(8));
    assert_eq!(op.batch_points.iter().map(|p| p.batch).collect::<Vec<_>>(), vec![1, 2, 32]);
    // The graph at batch 2: the point is an exact key (25 µs).
    let cm = CostModel::new(v100, Some(&profile)).unwrap();
    let at2 = GraphFacts::new(&g, &Bindings::new().with("batch", 2)).unwrap();
    assert!(close(cm.op_cost(&at2, fc, Precision::Fp32).unwrap().fwd, 25e-6));
    // The graph at batch 8 scaled to 4 (×0.5): between the points at 2 and
    // 8: 25 + 15·(4 − 2)/6 = 30 µs. At 64 (×8): beyond 32, the line through
    // (8, 40) and (32, 100): 100 + 60·32/24 = 180 µs.
    let at8 = GraphFacts::new(&g, &Bindings::new().with("batch", 8)).unwrap();
    assert!(close(cm.op_cost_at(&at8, fc, Precision::Fp32, 0.5).unwrap().fwd, 30e-6));
    assert!(close(cm.op_cost_at(&at8, fc, Precision::Fp32, 8.0).unwrap().fwd, 180e-6));
    // The graph at batch 3, a key nobody measured: analytic.
    let at3 = GraphFacts::new(&g, &Bindings::new().with("batch", 3)).unwrap();
    assert!(!cm.op_cost(&at3, fc, Precision::Fp32).unwrap().measured);
}

#[test]
fn a_gpus_times_lose_the_harness_floor_a_cpus_keep_it() {
    use qsync_cost::calibrate::{build_profile, Measurements, Worklist};
    let (g, _) = symbolic_gemm();
    let mut w = Worklist::new(8, Default::default()).with_batch_points(&[2]);
    w.add_graph("m", "m", &g, &Bindings::new().with("batch", 8)).unwrap();
    // Gemm: fwd 40 µs, 25 µs at batch 2; the Add: fwd 5 µs (the smallest:
    // the estimated floor), 6 µs at batch 2.
    let measurements = |method: Option<&str>, floor: Option<&str>| {
        let mut m = serde_json::json!({ "schema": "qsync-ops/1", "batch": 8, "models": w.models, "entries": w.entries,
                                         "meta": {} });
        if let Some(method) = method {
            m["meta"]["method"] = method.into();
        }
        if let Some(f) = floor {
            for k in ["fwd", "bwd_input", "bwd_weight"] {
                m["meta"][format!("harness_floor_{k}_us")] = f.into();
            }
        }
        for e in m["entries"].as_array_mut().unwrap() {
            let (main, at2) = if e["op"] == "Gemm" { (40.0, 25.0) } else { (5.0, 6.0) };
            e["measured"] = serde_json::json!({ "fp32": { "fwd_us": main } });
            e["at_batches_measured"] = serde_json::json!({ "fp32": [{ "batch": 2, "fwd_us": at2 }] });
        }
        Measurements::from_json(&m.to_string(), "ops.json").unwrap()
    };
    let db = DeviceDb::bundled().unwrap();
    let v100 = db.get("v100").unwrap();
    let launch = v100.launch_overhead_us;
    let gemm_fwd = |m: &Measurements| {
        let (p, _) = build_profile(m, v100, &[]).unwrap();
        let op = p.ops.iter().find(|o| o.op == "Gemm").unwrap().clone();
        (op.fwd_us, op.batch_points[0].fwd_us, p.meta.get("harness_floor_removed").cloned())
    };
    // On a GPU, estimated: 40 → launch + 35, 25 → launch + 20.
    let gpu = measurements(Some("CUDA events, back-to-back calls"), None);
    let floor = gpu.harness_floor().unwrap();
    assert_eq!((floor.fwd_us, floor.source), (5.0, "estimated"));
    let (fwd, at2, note) = gemm_fwd(&gpu);
    assert!(close(fwd, launch + 35.0) && close(at2, launch + 20.0), "{fwd} {at2}");
    assert!(note.unwrap().starts_with("estimated: fwd 5.0 us"));
    // Measured by the script (3 µs): 40 → launch + 37, 5 → launch + 2.
    let measured = measurements(Some("CUDA events, back-to-back calls"), Some("3"));
    assert_eq!(measured.harness_floor().unwrap().source, "measured");
    let (fwd, _, _) = gemm_fwd(&measured);
    assert!(close(fwd, launch + 37.0), "{fwd}");
    // A measured floor above the fastest entry (12 µs against the Add's 5)
    // is capped by it: 40 → launch + 35, and the Add keeps one launch.
    let high = measurements(Some("CUDA events, back-to-back calls"), Some("12"));
    let floor = high.harness_floor().unwrap();
    assert_eq!((floor.fwd_us, floor.source), (5.0, "measured, capped by the fastest entry"));
    let (fwd, _, _) = gemm_fwd(&high);
    assert!(close(fwd, launch + 35.0), "{fwd}");
    let fixed = high.without_harness_floor(&floor, launch);
    let add = fixed.entries.iter().find(|e| e.item.op == "Add").unwrap();
    assert!(close(add.measured[&Precision::Fp32].fwd_us, launch));
    // A CPU's (process CPU time): the host's dispatch is its own time.
    let (fwd, at2, note) = gemm_fwd(&measurements(Some("process CPU time, back-to-back calls"), None));
    assert_eq!((fwd, at2, note), (40.0, 25.0, None));
}

/// The symbolic Gemm graph listed at batch 8 as model `m` of `family`: a
/// measurement file's skeleton (`meta` as given, no times yet).
fn gemm_measurements(family: &str, meta: serde_json::Value) -> (Graph, NodeId, serde_json::Value) {
    let (g, fc) = symbolic_gemm();
    let mut w = qsync_cost::calibrate::Worklist::new(8, Default::default());
    w.add_graph("m", family, &g, &Bindings::new().with("batch", 8)).unwrap();
    let m = serde_json::json!({ "schema": "qsync-ops/1", "batch": 8, "models": w.models, "entries": w.entries,
                                "meta": meta });
    (g, fc, m)
}

#[test]
fn a_gpus_host_times_reach_the_profile_as_measured() {
    use qsync_cost::calibrate::{build_profile, Measurements};
    use qsync_cost::profile::{HostTimes, Profile};
    let (_, _, mut m) = gemm_measurements("m", serde_json::json!({ "method": "CUDA events, back-to-back calls" }));
    m["optimizers"] = serde_json::json!([{ "optimizer": "adam", "tensors": [[1024, 20.0], [4096, 21.0]],
                                           "host_tensors": [[1024, 19.5], [4096, 19.8]] }]);
    for e in m["entries"].as_array_mut().unwrap() {
        // The Gemm: 40 µs of GPU time, 12 µs of host time to issue it; the
        // Add: host-bound (its 9 µs are the host's pace).
        let (dev, host) = if e["op"] == "Gemm" { (40.0, 12.0) } else { (9.0, 8.8) };
        e["measured"] = serde_json::json!({ "fp32": { "fwd_us": dev, "fwd_host_us": host,
                                                      "bwd_input_us": 2.0 * dev, "bwd_input_host_us": 50.0 } });
    }
    let m = Measurements::from_json(&m.to_string(), "ops.json").unwrap();
    let db = DeviceDb::bundled().unwrap();
    let (p, _) = build_profile(&m, db.get("h100-sxm").unwrap(), &[]).unwrap();
    // The device times lose the estimated floor (the Add's 9 µs); the host
    // times are what the host spent and stay as measured.
    let gemm = p.ops.iter().find(|o| o.op == "Gemm").unwrap();
    assert_eq!(gemm.host_us, Some(HostTimes { fwd_us: 12.0, bwd_input_us: Some(50.0), ..Default::default() }));
    assert!(gemm.fwd_us < 40.0, "{}", gemm.fwd_us);
    let adam = p.optimizers.iter().find(|o| o.optimizer == "adam").unwrap();
    assert_eq!(adam.host_tensors, vec![(1024.0, 19.5), (4096.0, 19.8)]);
    // Written and read back, the host times survive; a measurement without
    // them gives a profile without them.
    let back = Profile::from_json(&serde_json::to_string(&p).unwrap(), "profile.json").unwrap();
    assert_eq!(back.ops, p.ops);
    let mut plain = m.clone();
    for e in &mut plain.entries {
        for t in e.measured.values_mut() {
            (t.fwd_host_us, t.bwd_input_host_us) = (None, None);
        }
    }
    let (p, _) = build_profile(&plain, db.get("h100-sxm").unwrap(), &[]).unwrap();
    assert!(p.ops.iter().all(|o| o.host_us.is_none()));
}

#[test]
fn a_profile_that_priced_the_host_charges_each_op_what_issuing_it_costs() {
    use qsync_cost::calibrate::{build_profile, build_profile_with, fit_host_overhead, Measurements, TrainingRuns};
    // Harness floors on the host: 10 µs a forward call, 60 µs a gradient
    // call, so a gradient's share in a training backward is its time − 50.
    let meta = serde_json::json!({ "method": "CUDA events, back-to-back calls", "harness_floor_fwd_us": "1",
                  "harness_floor_bwd_input_us": "1", "harness_floor_bwd_weight_us": "1",
                  "harness_floor_fwd_host_us": "10", "harness_floor_bwd_input_host_us": "60",
                  "harness_floor_bwd_weight_host_us": "60" });
    let (g, fc, mut m) = gemm_measurements("fam", meta);
    for e in m["entries"].as_array_mut().unwrap() {
        // The Gemm: kernels 200 µs, issued in 30; its backward, both
        // gradients in one call, 400 µs issued in 90 (40 in training). The
        // Add: 40 µs a call, all of it the host's (host-bound: its kernels
        // are priced at the rates, at most 40).
        e["measured"] = if e["op"] == "Gemm" {
            serde_json::json!({ "fp32": { "fwd_us": 200.0, "fwd_host_us": 30.0, "bwd_input_us": 200.0,
                "bwd_input_host_us": 80.0, "bwd_weight_us": 200.0, "bwd_weight_host_us": 80.0,
                "bwd_both_us": 400.0, "bwd_both_host_us": 90.0 } })
        } else {
            serde_json::json!({ "fp32": { "fwd_us": 40.0, "fwd_host_us": 39.0 } })
        };
    }
    let m = Measurements::from_json(&m.to_string(), "ops.json").unwrap();
    let db = DeviceDb::bundled().unwrap();
    let h100 = db.get("h100-sxm").unwrap();
    let facts = GraphFacts::new(&g, &Bindings::new().with("batch", 8)).unwrap();
    // Without the host model nothing reads the host times.
    let (plain, _) = build_profile(&m, h100, &[]).unwrap();
    assert!(plain.host.is_none());
    let c = CostModel::new(h100, Some(&plain)).unwrap().op_cost(&facts, fc, Precision::Fp32).unwrap();
    assert_eq!((c.host_fwd, c.host_bwd), (0.0, 0.0));
    // With it, and a host-bound training run whose host issued its forward
    // in 2 × and its backward in 3 × what the ops add up to (forward
    // 30 + 39 = 69 µs, backward 40 µs): overheads 2 and 3.
    let (mut p, _) = build_profile_with(&m, h100, &[], true).unwrap();
    let runs = serde_json::json!({ "schema": "qsync-iterations/1", "runs": [
        { "model": "m", "qsync_model": "m.onnx", "family": "fam", "precision": "fp32", "median_ms": 1.0,
          "kernels": { "kernels_us": 500.0 },
          "phases_ms": { "forward": 0.138, "backward": 0.120, "optimizer": 0.01 },
          "host_phases_ms": { "forward": 0.138, "backward": 0.120, "optimizer": 0.01 } },
        // GPU-bound (kernels 95% of the iteration): its host times are not
        // the host's own and are left out.
        { "model": "m", "qsync_model": "m.onnx", "family": "fam", "precision": "fp32", "median_ms": 1.0,
          "kernels": { "kernels_us": 950.0 },
          "phases_ms": { "forward": 0.5, "backward": 0.5 }, "host_phases_ms": { "forward": 0.9, "backward": 0.9 } } ] });
    let runs = TrainingRuns::from_json(&runs.to_string(), "iterations.json").unwrap();
    let note = fit_host_overhead(&mut p, &m, &runs, &[]).unwrap();
    let host = p.host.clone().unwrap();
    assert!(close(host.overhead_fwd, 2.0) && close(host.overhead_bwd, 3.0), "{note}");
    let cm = CostModel::new(h100, Some(&p)).unwrap();
    assert!(cm.prices_host());
    let c = cm.op_cost(&facts, fc, Precision::Fp32).unwrap();
    assert!(close(c.host_fwd, 60e-6) && close(c.host_bwd, 120e-6), "{c:?}");
    // The Add's kernels: its 40 µs were the host's pace, so the rates price
    // them (an 8 × 768 add is far below that), and the host pays 2 × 39.
    let add = g.schedule().into_iter().find(|&n| g.node(n).name == "shift").unwrap();
    let c = cm.op_cost(&facts, add, Precision::Fp32).unwrap();
    assert!(c.fwd < 20e-6 && close(c.host_fwd, 78e-6), "{c:?}");
    // Fitting the family it predicts is refused by leaving it out: no run
    // is left, the overheads stay 1.
    let (mut p, _) = build_profile_with(&m, h100, &[], true).unwrap();
    let note = fit_host_overhead(&mut p, &m, &runs, &["fam".into()]).unwrap();
    assert!(note.contains("no host-bound training run"), "{note}");
}

/// x[batch,262144] → Add(s) → Dropout → y: one elementwise and one dropout
/// op, listed at batch 8 with batch points 1, 2 and 32.
fn add_dropout() -> (Graph, NodeId, qsync_cost::calibrate::Worklist) {
    let mut g = Graph::new("drop");
    let ty = || TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::from(262_144)]);
    let x = g.add_input("x", ty());
    let s = init(&mut g, "s", &[262_144]);
    let a = g.add_node(NodeSpec::new("shift", Op::Add).input(x).input(s).output("a", ty()));
    let av = g.node(a).outputs()[0];
    let d = g.add_node(NodeSpec::new("drop", Op::Dropout).input(av).attr("ratio", Attr::Float(0.1)).output("y", ty()));
    let y = g.node(d).outputs()[0];
    g.set_outputs(vec![y]);
    let mut w = qsync_cost::calibrate::Worklist::new(8, Default::default()).with_batch_points(&[1, 2, 32]);
    w.add_graph("m", "m", &g, &Bindings::new().with("batch", 8)).unwrap();
    (g, d, w)
}

#[test]
fn a_kind_the_roofline_underprices_carries_its_own_factor() {
    use qsync_cost::calibrate::{build_profile, Measurements};
    use qsync_cost::model::{roofline, Rates};
    let db = DeviceDb::bundled().unwrap();
    let v100 = db.get("v100").unwrap();
    let (g, drop, w) = add_dropout();
    // Every phase measured at its roofline time at the device file's rates
    // plus one launch: the Add at 1×, the Dropout at 3× (a random number
    // per element, which its FLOPs and bytes do not count).
    let dev_rates = Rates::of(v100);
    let launch = v100.launch_s();
    let mut m = serde_json::json!({ "schema": "qsync-ops/1", "batch": 8, "models": w.models, "entries": w.entries });
    for e in m["entries"].as_array_mut().unwrap() {
        let dropout = e["op"] == "Dropout";
        let k = if dropout { 3.0 } else { 1.0 };
        let us = |pw: &serde_json::Value| {
            let pw: qsync_cost::calibrate::PhaseWork = serde_json::from_value(pw.clone()).unwrap();
            let t = roofline(v100, &dev_rates, &Work::from(pw), false, Precision::Fp32, false);
            (k * t.body + launch) * 1e6
        };
        e["measured"] = serde_json::json!({ "fp32": { "fwd_us": us(&e["fwd"]) } });
        let points: Vec<serde_json::Value> = e["at_batches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| serde_json::json!({ "batch": a["batch"], "fwd_us": us(&a["fwd"]) }))
            .collect();
        e["at_batches_measured"] = serde_json::json!({ "fp32": points });
    }
    let m = Measurements::from_json(&m.to_string(), "ops.json").unwrap();
    let (profile, report) = build_profile(&m, v100, &[]).unwrap();
    let eff = profile.efficiency.clone().unwrap();
    // The dropout's forward phases leave the rate fit (their work is not
    // all counted): the Add alone sets the memory rate, at the device
    // file's (its phases ran at exactly that roofline), and the dropout
    // keeps the factor 3 its phases ran at over it.
    assert!(close(eff.memory.unwrap(), v100.efficiency.memory), "{:?}", eff.memory);
    let d = eff.kinds["dropout"];
    assert!(close(d, 3.0), "dropout {d}");
    assert!(!eff.kinds.contains_key("elementwise"), "{:?}", eff.kinds);
    assert!(report.classes.iter().any(|c| c.class == "kind.dropout" && c.phases == 4));
    // A dropout the profile did not measure (batch 3): its forward is the
    // roofline at the fitted rates times the kind's factor, plus one launch.
    let cm = CostModel::new(v100, Some(&profile)).unwrap();
    let at3 = GraphFacts::new(&g, &Bindings::new().with("batch", 3)).unwrap();
    let c = cm.op_cost(&at3, drop, Precision::Fp32).unwrap();
    assert!(!c.measured);
    let fitted = Rates::calibrated(v100, Some(&profile));
    let t = roofline(v100, &fitted, &at3.node(drop).unwrap().fwd, false, Precision::Fp32, false);
    assert!(close(c.fwd, d * t.body + t.launch), "{} vs {}", c.fwd, d * t.body + t.launch);
    // Its backward applies the saved mask, no random numbers: the roofline
    // alone.
    let b = roofline(v100, &fitted, &at3.node(drop).unwrap().bwd_input, false, Precision::Fp32, false);
    assert!(b.body > 0.0 && close(c.bwd_input, b.body + b.launch), "{} vs {}", c.bwd_input, b.body + b.launch);
    // It round-trips through the profile file; nonsense is refused, naming
    // the field.
    let json = serde_json::to_string(&profile).unwrap();
    assert!(json.contains("\"kinds\":{\"dropout\""), "{json}");
    assert_eq!(Profile::from_json(&json, "p.json").unwrap().efficiency.unwrap().kinds, eff.kinds);
    for (bad, says) in [
        ("{\"nonsense\": 2.0}", "unknown kind of operator `nonsense`"),
        ("{\"dropout\": 100.0}", "efficiency.kinds.dropout must be in"),
    ] {
        let text = format!("{{\"device\": \"v100\", \"efficiency\": {{\"kinds\": {bad}}}, \"ops\": []}}");
        let e = Profile::from_json(&text, "p.json").unwrap_err().to_string();
        assert!(e.contains(says) && e.contains("p.json"), "{e}");
    }
}
