//! The optimizer step priced per parameter tensor from a profile's
//! per-tensor samples, and the host dispatch of views, against hand-worked
//! values.
#![allow(clippy::unwrap_used)]

mod common;

use common::{gemm_graph, t};
use qsync_cost::{Bindings, CostModel, DeviceDb, GraphFacts, Precision, Profile, SizeCurve, HOST_OP_S};
use qsync_ir::{NodeSpec, Op};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
}

#[test]
fn size_curve_by_hand() {
    // Points (elements, µs per tensor): (1024, 50), (4096, 80), (16384, 200);
    // a repeated size is averaged: (4096, 70) and (4096, 90) give 80.
    let us = |x: f64| x * 1e-6;
    let c =
        SizeCurve::new(&[(16384.0, us(200.0)), (4096.0, us(70.0)), (1024.0, us(50.0)), (4096.0, us(90.0))]).unwrap();
    assert_eq!(c.points.len(), 3);
    // Below the smallest size: its time (the fixed cost per tensor).
    assert!(close(c.at(512.0), us(50.0)));
    // Between 1024 and 4096: 50 + (80 − 50)·(2048 − 1024)/(4096 − 1024) = 60.
    assert!(close(c.at(2048.0), us(60.0)));
    // Beyond 16384, the line through the last two points:
    // 80 + (200 − 80)·(32768 − 4096)/(16384 − 4096) = 80 + 120·7/3 = 360.
    assert!(close(c.at(32768.0), us(360.0)));
    // A step over tensors of 512, 2048 and 32768 elements: 50 + 60 + 360 = 470.
    assert!(close(c.step(&[512.0, 2048.0, 32768.0]), us(470.0)));
    // One size is no curve.
    assert!(SizeCurve::new(&[(1024.0, 1.0), (1024.0, 2.0)]).is_none());
}

#[test]
fn optimizer_step_sums_the_per_tensor_curve_over_the_tensors() {
    let dev = DeviceDb::bundled().unwrap().get("t4").unwrap().clone();
    let json = r#"{"device": "t4", "optimizers": [
        {"optimizer": "adamw", "tensors": [[1024, 50], [4096, 80], [16384, 200]]},
        {"optimizer": "sgd", "samples": [[1000, 12], [3000, 32]]}]}"#;
    let m = CostModel::new(&dev, Some(&Profile::from_json(json, "test").unwrap())).unwrap();
    // adam over one 32768-element tensor and 39 of 128 elements:
    // 360 + 39·50 = 2310 µs (the total, 37760 parameters, would read 2310
    // only by accident: the curve sees each tensor's size).
    let mut tensors = vec![32768.0];
    tensors.extend([128.0; 39]);
    assert!(close(m.optimizer_step("adam", &tensors).unwrap(), 2310e-6));
    // The same parameters in one tensor: the curve at 37760,
    // 80 + 120·(37760 − 4096)/12288 = 80 + 328.75 = 408.75 µs.
    assert!(close(m.optimizer_step("adam", &[37760.0]).unwrap(), 408.75e-6));
    // sgd has only the older samples against the total: the fit
    // 12 + (32 − 12)/(3000 − 1000)·(x − 1000) = 2 + 0.01·x µs at x = 1500 + 500.
    assert!(close(m.optimizer_step("sgd", &[1500.0, 500.0]).unwrap(), 22e-6));
    // Nothing measured for momentum.
    assert!(m.optimizer_step("momentum", &[1e6]).is_none());
    // A per-tensor entry needs two distinct sizes.
    let one = r#"{"optimizers": [{"optimizer": "adam", "tensors": [[1024, 50]]}]}"#;
    assert!(CostModel::new(&dev, Some(&Profile::from_json(one, "test").unwrap())).is_err());
    let bad = r#"{"optimizers": [{"optimizer": "adam", "tensors": [[0, 50], [1024, 60]]}]}"#;
    assert!(Profile::from_json(bad, "test").is_err());
}

#[test]
fn views_cost_the_devices_dispatch_forward_and_backward() {
    // gemm_graph's output needs a gradient (the Gemm trains W), its input x
    // does not: Flatten(y) has a backward, Flatten(x) none, and Shape(y) is
    // shape arithmetic.
    let (mut g, fc) = gemm_graph(8, 16, 16);
    let y = g.node(fc).outputs()[0];
    let x = g.inputs()[0];
    let fy = g.add_node(NodeSpec::new("fy", Op::Flatten).input(y).output("fy", t(&[8, 16])));
    let fx = g.add_node(NodeSpec::new("fx", Op::Flatten).input(x).output("fx", t(&[8, 16])));
    let shape = qsync_ir::TensorType::new(qsync_ir::DType::I64, vec![qsync_ir::Dim::from(2)]);
    let sh = g.add_node(NodeSpec::new("sh", Op::Shape).input(y).output("sh", shape));
    let outs: Vec<_> = [fy, fx, sh].iter().map(|&n| g.node(n).outputs()[0]).collect();
    g.set_outputs(outs);
    let facts = GraphFacts::new(&g, &Bindings::new()).unwrap();
    let mut dev = DeviceDb::bundled().unwrap().get("t4").unwrap().clone();
    // A GPU's device file carries none: a view costs the nominal host time.
    assert_eq!(dev.view_op_us, 0.0);
    let gpu = CostModel::new(&dev, None).unwrap();
    let c = gpu.op_cost(&facts, fy, Precision::Fp32).unwrap();
    assert_eq!((c.fwd, c.bwd_input, c.bwd_weight), (HOST_OP_S, 0.0, 0.0));
    // 3 µs per view and pass: Flatten(y) 3 µs forward + 3 µs backward,
    // Flatten(x) 3 µs forward only, Shape(y) still the nominal host time.
    dev.view_op_us = 3.0;
    let cpu = CostModel::new(&dev, None).unwrap();
    let c = cpu.op_cost(&facts, fy, Precision::Fp32).unwrap();
    assert!(close(c.fwd, 3e-6) && close(c.bwd_input, 3e-6) && c.bwd_weight == 0.0, "{c:?}");
    let c = cpu.op_cost(&facts, fx, Precision::Fp32).unwrap();
    assert!(close(c.fwd, 3e-6) && c.bwd_input == 0.0, "{c:?}");
    let c = cpu.op_cost(&facts, sh, Precision::Fp32).unwrap();
    assert_eq!((c.fwd, c.bwd_input), (HOST_OP_S, 0.0));
}
