//! The optimizer step per parameter tensor: the device file's fallback by
//! hand, and a profile's per-tensor curve summed over the graph's tensors.

use std::collections::BTreeMap;
use std::path::PathBuf;

use qsync_cost::{Bindings, DeviceDb, GraphFacts, Optimizer, Plan, Profile, SizeCurve};
use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_sim::topology::NodeNetwork;
use qsync_sim::{optimizer_seconds, PredictOptions, Predictor, Target};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
}

#[test]
fn device_file_step_launches_per_tensor_on_a_cpu_only() {
    let gpu = DeviceDb::bundled().expect("db").get("t4").expect("t4").clone();
    let bw = gpu.mem_bytes_per_s() * gpu.efficiency.memory;
    let launch = gpu.launch_s();
    // AdamW over tensors of 1000 and 3000 elements: 28 bytes per parameter.
    // GPU (multi-tensor kernels): 4000·28/bw + 1 launch.
    let tensors = [1000.0, 3000.0];
    assert!(close(optimizer_seconds(&gpu, &tensors, Optimizer::Adam), 4000.0 * 28.0 / bw + launch));
    // CPU (a loop over the tensors, 9 operators each): 4000·28/bw + 9·2 launches.
    let mut cpu = gpu.clone();
    cpu.arch = "cpu".into();
    assert!(close(optimizer_seconds(&cpu, &tensors, Optimizer::Adam), 4000.0 * 28.0 / bw + 18.0 * launch));
    // Momentum: 20 bytes per parameter, 3 operators per tensor.
    let m = Optimizer::Sgd { momentum: true };
    assert!(close(optimizer_seconds(&cpu, &tensors, m), 4000.0 * 20.0 / bw + 6.0 * launch));
}

/// BERT-tiny at batch 8 and sequence 32, with its symbolic dims bound.
fn bert_tiny() -> (qsync_ir::Graph, Bindings) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/bert_tiny.onnx");
    let mut m = qsync_onnx::import_file(&path).expect("import");
    let opset = m.opset();
    let io = InferOptions { batch: Some(8), dims: BTreeMap::from([("seq".to_string(), 32)]) };
    assert!(infer_shapes(&mut m.graph, opset, &io).errors.is_empty());
    let g = m.graph;
    let mut bindings = Bindings::new();
    for v in g.live_values() {
        for d in g.ty(v).shape.iter().flatten() {
            for s in d.symbols() {
                bindings.set(&s, 32);
            }
        }
    }
    (g, bindings)
}

#[test]
fn ranks_that_share_the_hosts_cores_compute_at_their_share() {
    // A CPU device file of one core; 4 ranks, 2 a node. With one core a
    // node, each rank computes at half the file's speed: every op and the
    // optimizer step take twice as long. With two, or unsaid, at full
    // speed; a GPU's compute never depends on its host's cores.
    let (g, bindings) = bert_tiny();
    let opts = PredictOptions { bindings, optimizer: Optimizer::Adam, ..PredictOptions::default() };
    let mut cpu = DeviceDb::bundled().expect("db").get("t4").expect("t4").clone();
    cpu.arch = "cpu".into();
    cpu.occupancy.as_mut().expect("t4's occupancy").sm_count = 1;
    let compute_us = |device: &qsync_cost::Device, cores: Option<u32>| {
        let mut t = Target::new(device.clone(), 4, 8, Plan::new());
        t.per_node = 2;
        t.network = Some(NodeNetwork { host_cores: cores, ..NodeNetwork::single_nic(10.0) });
        let share = match (device.arch.as_str(), cores) {
            ("cpu", Some(1)) => 2.0,
            _ => 1.0,
        };
        assert_eq!(t.compute_share(), share);
        Predictor::new(&g, vec![t], opts.clone()).expect("predict").result().devices[0].compute_us
    };
    let own = compute_us(&cpu, None);
    assert!(own > 0.0);
    assert!(close(compute_us(&cpu, Some(1)), 2.0 * own));
    assert!(close(compute_us(&cpu, Some(2)), own));
    let gpu = DeviceDb::bundled().expect("db").get("t4").expect("t4").clone();
    assert!(close(compute_us(&gpu, Some(1)), compute_us(&gpu, None)));
}

#[test]
fn profile_step_sums_its_curve_over_the_graphs_parameter_tensors() {
    let (g, bindings) = bert_tiny();
    let json =
        r#"{"device": "t4", "optimizers": [{"optimizer": "adam", "tensors": [[1024, 50], [4096, 80], [16384, 200]]}]}"#;
    let profile = Profile::from_json(json, "test").expect("profile");
    let opts = PredictOptions { bindings: bindings.clone(), optimizer: Optimizer::Adam, ..PredictOptions::default() };
    let mut t = Target::new(DeviceDb::bundled().expect("db").get("t4").expect("t4").clone(), 1, 8, Plan::new());
    t.calibration = Some(profile);
    let r = Predictor::new(&g, vec![t], opts).expect("predict").result().clone();
    let step_us = r.devices[0].finish_us - r.devices[0].backward_end_us;
    // The curve (50 µs up to 1024 elements, then linear through 80 µs at
    // 4096 and 200 µs at 16384, extended beyond) at each parameter tensor.
    let facts = GraphFacts::new(&g, &bindings).expect("facts");
    let tensors: Vec<f64> = facts.params().iter().filter_map(|&v| facts.elements(v)).collect();
    let at = |n: f64| {
        if n <= 1024.0 {
            50.0
        } else if n <= 4096.0 {
            50.0 + 30.0 * (n - 1024.0) / 3072.0
        } else {
            (80.0 + 120.0 * (n - 4096.0) / 12288.0).max(80.0)
        }
    };
    let by_hand: f64 = tensors.iter().map(|&n| at(n)).sum();
    assert!((step_us - by_hand).abs() < 1e-6 * by_hand, "step {step_us} µs, by hand {by_hand} µs");
    let curve = SizeCurve::new(&[(1024.0, 50.0), (4096.0, 80.0), (16384.0, 200.0)]).expect("curve");
    assert!((curve.step(&tensors) - by_hand).abs() < 1e-9 * by_hand);
    // More than one tensor, and not the curve at their total.
    assert!(tensors.len() > 1 && (curve.at(tensors.iter().sum()) - by_hand).abs() > 1.0);
}
