//! The plan pipeline as a library, on a small text-IR model: no `qsyncc`
//! binary, no shared models.

use std::path::{Path, PathBuf};

use qsync_pipeline::{plan, Error, PlanRequest, Targets};

/// A two-layer MLP over a symbolic batch, written as text IR.
fn mlp(dir: &Path) -> PathBuf {
    let weights = |n: usize| vec!["0.01"; n].join(", ");
    let text = format!(
        "opset \"\" 17\n\
         graph \"mlp\" {{\n\
         \x20 init %w1: f32[64,64] = [{w}]\n\
         \x20 init %w2: f32[64,16] = [{w2}]\n\
         \x20 input %x: f32[batch,64]\n\
         \x20 %h: f32[batch,64] = MatMul \"fc1\"(%x, %w1)\n\
         \x20 %r: f32[batch,64] = Relu \"relu\"(%h)\n\
         \x20 %y: f32[batch,16] = MatMul \"fc2\"(%r, %w2)\n\
         \x20 output %y\n\
         }}\n",
        w = weights(64 * 64),
        w2 = weights(64 * 16),
    );
    let path = dir.join("mlp.qir");
    std::fs::write(&path, text).expect("writes the model");
    path
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qsync-pipeline-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmpdir");
    d
}

fn targets(s: &str) -> Targets {
    s.parse().expect("targets")
}

#[test]
fn plans_and_writes_a_text_ir_model() {
    let dir = tmpdir("mlp");
    let mut req = PlanRequest::new(mlp(&dir), targets("v100:2,t4:2"));
    req.batch = 8;
    let planned = plan(&req).expect("plans");
    let out = &planned.outcome;
    assert!(out.chosen_eval.samples_per_s > 0.0);
    assert!(out.methods().iter().any(|(k, _)| *k == out.chosen), "{} is one of the methods", out.chosen);
    let names: Vec<&str> = planned.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["v100", "t4"]);
    let plan_dir = dir.join("plan");
    planned.write(&plan_dir).expect("writes");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plan_dir.join("manifest.json")).expect("manifest"))
            .expect("json");
    assert_eq!(manifest["schema"], qsync_pipeline::SCHEMA);
    assert_eq!(manifest["chosen"], out.chosen.as_str());
    for f in manifest["files"].as_array().expect("files") {
        assert!(plan_dir.join(f.as_str().expect("a path")).is_file(), "{f} is written");
    }
    // Every device's plan names the model's nodes.
    let t4: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plan_dir.join("t4/plan.json")).expect("plan")).expect("json");
    let nodes: Vec<&str> = t4["nodes"].as_array().expect("nodes").iter().filter_map(|n| n["name"].as_str()).collect();
    assert_eq!(nodes, ["fc1", "relu", "fc2"]);
    // No temporary sibling is left behind.
    let left: Vec<String> = std::fs::read_dir(&dir)
        .expect("ls")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains("qsync-tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn each_failure_is_its_own_variant() {
    let dir = tmpdir("errors");
    let model = mlp(&dir);
    match plan(&PlanRequest::new(&model, targets("v100,h9000"))) {
        Err(Error::Cluster(msg)) => assert!(msg.contains("h9000"), "{msg}"),
        other => panic!("expected a cluster error, got {other:?}"),
    }
    match plan(&PlanRequest::new(dir.join("absent.qir"), targets("v100"))) {
        Err(Error::Model(msg)) => assert!(msg.contains("absent.qir"), "{msg}"),
        other => panic!("expected a model error, got {other:?}"),
    }
    let mut req = PlanRequest::new(&model, targets("v100"));
    req.batch = 0;
    match plan(&req) {
        Err(Error::Request(msg)) => assert_eq!(msg, format!("--batch 0 is outside 1..={}", qsync_pipeline::MAX_DIM)),
        other => panic!("expected a request error, got {other:?}"),
    }
    // A plan that emits code cannot be written without a code emitter, and
    // leaves nothing behind.
    let mut req = PlanRequest::new(&model, targets("v100"));
    req.batch = 4;
    req.emit = qsync_pipeline::Emit::parse_list(&["onnx", "ptx"]).expect("kinds");
    let planned = plan(&req).expect("plans");
    match planned.write(&dir.join("plan")) {
        Err(Error::Output { reason, .. }) => assert!(reason.contains("ptx"), "{reason}"),
        other => panic!("expected an output error, got {other:?}"),
    }
    assert!(!dir.join("plan").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
