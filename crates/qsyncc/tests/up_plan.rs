//! `qsyncc MODEL --method up`: QSync's UP baseline written as a plan
//! directory, the plan every other run reports under the same key of
//! `methods`.
//!
//! The model is a two-layer MLP with a softmax (2048 wide, batch 256), with
//! calibration statistics for both layers' activations (keyed by node
//! name), so every GEMM-like operator may be INT8. On a T4 the fastest
//! uniform level is FP16 here (INT8's quantize / dequantize cost more than
//! its faster GEMMs save): the planner's `up` (the fastest level, its
//! throughput floor) is FP16, and QSync's UP, the lowest level that fits,
//! is reported as `up-lowest` — the plan `--method up` writes. Its rule, per inference
//! device type: every planned operator at the lowest precision it may take
//! at the uniform level — the Gemms `fc1`, `fc2` in INT8 (QSync's
//! simulated INT8), the softmax in FP16 (`--precisions fp16,int8`: the
//! lowest float precision; INT8 is for GEMM-like operators only). The
//! training type (V100) trains as every plan has it: AMP, Gemms in FP16,
//! the softmax in FP32.

mod common;

use std::path::Path;

use common::{check_plan_dir, qsyncc, stderr, tmpdir};
use serde_json::Value;

const MLP: &str = r#"opset "" 17
graph "up_mlp" {
  init %w1: f32[2048,2048] = absent
  init %b1: f32[2048] = absent
  init %w2: f32[1024,2048] = absent
  init %b2: f32[1024] = absent
  input %x: f32[batch,2048]
  %h = Gemm "fc1"(%x, %w1, %b1) {transB=1}
  %r = Relu "relu"(%h)
  %y = Gemm "fc2"(%r, %w2, %b2) {transB=1}
  %p = Softmax "softmax"(%y) {axis=1}
  output %p
}
"#;

const STATS: &str = r#"{"format": "qsync-calibration", "version": 1, "ops": {
  "fc1": {"input": {"norm2": 524288, "min": -3.5, "max": 3.25, "numel": 524288}},
  "fc2": {"input": {"norm2": 262144, "min": 0, "max": 4.5, "numel": 524288}}}}"#;

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `qsyncc m.qir --targets v100:2,t4:2 … --method METHOD -o DIR`: the manifest.
fn plan(dir: &Path, method: &str) -> Value {
    let (m, s, out) = (dir.join("m.qir"), dir.join("stats.json"), dir.join(method));
    let o = qsyncc(&[
        m.to_str().expect("utf8"),
        "--targets",
        "v100:2,t4:2",
        "--batch",
        "256",
        "--precisions",
        "fp16,int8",
        "--stats",
        s.to_str().expect("utf8"),
        "--method",
        method,
        "-o",
        out.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "--method {method}: {}", stderr(&o));
    check_plan_dir(&out)
}

/// (node, op, precision) of a device's planned operators, in plan order.
fn planned(dir: &Path, device: &str) -> Vec<(String, String, String)> {
    let plan = read_json(&dir.join(device).join("plan.json"));
    plan["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["planned"] == true)
        .map(|n| {
            let s = |k: &str| n[k].as_str().unwrap_or_else(|| panic!("{k} in {n}")).to_string();
            (s("name"), s("op"), s("precision"))
        })
        .collect()
}

#[test]
fn method_up_writes_the_up_baseline_the_other_methods_report() {
    let dir = tmpdir("up-plan");
    std::fs::write(dir.join("m.qir"), MLP).expect("write model");
    std::fs::write(dir.join("stats.json"), STATS).expect("write stats");
    let up = plan(&dir, "up");
    assert_eq!((&up["method"], &up["chosen"]), (&Value::from("up"), &Value::from("up-lowest")), "{up}");
    assert!(up["warnings"].as_array().expect("warnings").iter().all(|w| !w.to_string().contains("INT8")), "{up}");

    // The rule, per operator.
    let t4 = planned(&dir.join("up"), "t4");
    let want = |v: [(&str, &str, &str); 3]| v.map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string())).to_vec();
    assert_eq!(t4, want([("fc1", "Gemm", "int8"), ("fc2", "Gemm", "int8"), ("softmax", "Softmax", "fp16")]));
    let v100 = planned(&dir.join("up"), "v100");
    assert_eq!(v100, want([("fc1", "Gemm", "fp16"), ("fc2", "Gemm", "fp16"), ("softmax", "Softmax", "fp32")]));

    // Ω: the plan's indicator sum is `up-lowest`'s as this run reports it,
    // the sum of its inference type's per-operator Ω, and `up-lowest`'s as
    // the joint and QSync runs report it; the FP16 `up` has a smaller one.
    let f = |v: &Value| v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"));
    let omega = f(&up["indicator_sum"]);
    assert_eq!(omega, f(&up["methods"]["up-lowest"]["indicator_sum"]));
    assert!(omega > f(&up["methods"]["up"]["indicator_sum"]), "{up}");
    let t4_plan = read_json(&dir.join("up/t4/plan.json"));
    let per_op: f64 = t4_plan["nodes"].as_array().expect("nodes").iter().filter_map(|n| n["indicator"].as_f64()).sum();
    assert!((per_op - omega).abs() <= 1e-9 * omega, "Σ Ω over t4's operators {per_op} vs {omega}");
    for other in ["joint", "qsync"] {
        let m = plan(&dir, other);
        assert_eq!(f(&m["methods"]["up-lowest"]["indicator_sum"]), omega, "--method {other}");
        assert_eq!(m["methods"]["up-lowest"], up["methods"]["up-lowest"], "--method {other}");
        assert_eq!(m["methods"]["up"], up["methods"]["up"], "--method {other}");
    }
    // Its iteration is the plan's.
    assert_eq!(up["samples_per_s"], up["methods"]["up-lowest"]["samples_per_s"]);
    let _ = std::fs::remove_dir_all(&dir);
}
