//! `qsyncc simulate` end to end: every shared model, the JSON contract,
//! traces, custom devices, calibration, and clear errors (exit 2).

mod common;

use std::path::{Path, PathBuf};

use common::{models_dir, onnx_models, qsyncc, run_json, stderr, tmpdir};

fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny_mlp.qir")
}

fn simulate_json(model: &Path, extra: &[&str]) -> serde_json::Value {
    run_json("simulate", model, extra)
}

fn iteration_ms(j: &serde_json::Value) -> f64 {
    j["iteration_ms"].as_f64().expect("iteration_ms")
}

const CLUSTER: [&str; 4] = ["--targets", "v100:16,t4:16", "--batch", "32"];

#[test]
fn every_shared_model_simulates_on_the_hybrid_cluster() {
    for path in onnx_models() {
        let j = simulate_json(&path, &CLUSTER);
        let it = iteration_ms(&j);
        assert!(it.is_finite() && it > 0.0, "{}: iteration {it} ms", path.display());
        let sps = j["samples_per_s"].as_f64().expect("samples_per_s");
        assert!(sps.is_finite() && sps > 0.0, "{}: {sps} samples/s", path.display());
        for d in ["v100", "t4"] {
            let dev = &j["devices"][d];
            for f in ["compute_ms", "comm_ms", "idle_ms"] {
                let v = dev[f].as_f64().unwrap_or(f64::NAN);
                assert!(v.is_finite() && v >= 0.0, "{}: devices.{d}.{f} = {v}", path.display());
            }
            assert!(dev["compute_ms"].as_f64().is_some_and(|v| v > 0.0), "{}: {d} computes", path.display());
            assert!(dev["peak_memory_bytes"].as_u64().is_some_and(|b| b > 0), "{}: {d} memory", path.display());
            assert!(dev["memory_capacity_bytes"].as_u64().is_some_and(|b| b > 0), "{}: {d} capacity", path.display());
        }
    }
}

#[test]
fn fp16_on_t4_beats_fp32_on_t4() {
    for model in ["resnet50_train.onnx", "bert_base_train.onnx", "vgg16.onnx"] {
        let path = models_dir().join(model);
        let fp32 = iteration_ms(&simulate_json(&path, &["--targets", "t4", "--batch", "32"]));
        let fp16 = iteration_ms(&simulate_json(&path, &["--targets", "t4", "--batch", "32", "--precision", "t4=fp16"]));
        assert!(fp16 < fp32, "{model}: fp16 {fp16} ms, fp32 {fp32} ms");
    }
}

#[test]
fn trace_is_chrome_format() {
    let dir = tmpdir("trace");
    let out = dir.join("trace.json");
    let path = models_dir().join("resnet50_train.onnx");
    simulate_json(&path, &["--targets", "v100:16,t4:16", "--batch", "32", "--trace", out.to_str().expect("utf8")]);
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("trace written")).expect("valid JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let spans: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert!(spans.len() > 100, "{} spans", spans.len());
    for e in &spans {
        assert!(e["name"].is_string(), "{e}");
        assert!(e["ts"].as_f64().is_some_and(|t| t >= 0.0), "{e}");
        assert!(e["dur"].as_f64().is_some_and(|d| d >= 0.0), "{e}");
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
    }
}

#[test]
fn tiny_model_trace_snapshot() {
    let dir = tmpdir("tiny");
    let out = dir.join("tiny.json");
    let p = tiny();
    let o = qsyncc(&[
        "simulate",
        p.to_str().expect("utf8"),
        "--targets",
        "v100:2,t4:2",
        "--batch",
        "8",
        "--precision",
        "t4=fp16",
        "--json",
        "--trace",
        out.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    insta::assert_snapshot!(std::fs::read_to_string(&out).expect("trace"));
}

#[test]
fn text_output_reports_plans_that_do_not_fit_and_exits_0() {
    let path = models_dir().join("bert_base_train.onnx");
    let args = ["--targets", "v100:8,t4:8", "--batch", "256", "--dim", "seq=512", "--memory", "t4=30%"];
    let j = simulate_json(&path, &args);
    assert_eq!(j["devices"]["t4"]["fits"], false, "{j}");
    assert!(
        j["warnings"]
            .as_array()
            .expect("warnings")
            .iter()
            .any(|w| w.as_str().is_some_and(|s| s.contains("does not fit"))),
        "{j}"
    );
    let mut text_args = vec!["simulate", path.to_str().expect("utf8")];
    text_args.extend_from_slice(&args);
    let o = qsyncc(&text_args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("DOES NOT FIT"));
}

#[test]
fn memory_fraction_lowers_capacity_only() {
    let p = tiny();
    let full = simulate_json(&p, &["--targets", "t4", "--batch", "8"]);
    let part = simulate_json(&p, &["--targets", "t4", "--batch", "8", "--memory", "t4=30%"]);
    let cap = |j: &serde_json::Value| j["devices"]["t4"]["memory_capacity_bytes"].as_f64().expect("capacity");
    assert!((cap(&part) - 0.3 * cap(&full)).abs() < 1.0);
    assert_eq!(full["devices"]["t4"]["peak_memory_bytes"], part["devices"]["t4"]["peak_memory_bytes"]);
    assert_eq!(iteration_ms(&full), iteration_ms(&part));
}

/// The bundled T4 renamed, every rate scaled by `k`.
fn custom_device(dir: &Path, name: &str, k: f64) -> PathBuf {
    let (_, text) = qsync_cost::DeviceDb::bundled_files().iter().find(|(f, _)| *f == "t4.json").expect("t4.json");
    let mut v: serde_json::Value = serde_json::from_str(text).expect("json");
    v["name"] = name.into();
    for f in ["tensor_core", "cuda_core", "memory"] {
        v["efficiency"][f] = (v["efficiency"][f].as_f64().expect("eff") * k).into();
    }
    v["memory_bandwidth_gb_s"] = (v["memory_bandwidth_gb_s"].as_f64().expect("bw") * k).into();
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&v).expect("json")).expect("write");
    path
}

#[test]
fn custom_device_file_and_a_slower_device_never_speed_up() {
    let dir = tmpdir("devices");
    let path = models_dir().join("resnet50_train.onnx");
    let mut last = 0.0;
    for (name, k) in [("t4same", 1.0), ("t4slow", 0.7), ("t4slower", 0.4)] {
        let file = custom_device(&dir, name, k);
        let targets = format!("v100:16,{name}:16");
        let j = simulate_json(
            &path,
            &["--targets", &targets, "--batch", "32", "--device-file", file.to_str().expect("utf8")],
        );
        let it = iteration_ms(&j);
        assert!(j["devices"][name].is_object(), "{j}");
        assert!(it >= last, "{name}: {it} ms < {last} ms");
        last = it;
    }
    let bundled = iteration_ms(&simulate_json(&path, &CLUSTER));
    let same = custom_device(&dir, "t4same", 1.0);
    let j = simulate_json(
        &path,
        &["--targets", "v100:16,t4same:16", "--batch", "32", "--device-file", same.to_str().expect("utf8")],
    );
    assert_eq!(iteration_ms(&j), bundled, "an identical custom device predicts the same");
}

#[test]
fn calibration_profile_applies_to_its_device() {
    let dir = tmpdir("calib");
    let p = tiny();
    let tp = p.to_str().expect("utf8");
    // fc1 at batch 8: Gemm inputs [8,32], [64,32], [64].
    let profile = dir.join("t4.json");
    std::fs::write(
        &profile,
        r#"{"device": "t4", "ops": [{"op": "Gemm", "inputs": [[8, 32], [64, 32], [64]], "precision": "fp32", "fwd_us": 5000}]}"#,
    )
    .expect("write");
    let base = iteration_ms(&simulate_json(&p, &["--targets", "v100,t4", "--batch", "8"]));
    let cal =
        simulate_json(&p, &["--targets", "v100,t4", "--batch", "8", "--profile", profile.to_str().expect("utf8")]);
    assert!(iteration_ms(&cal) >= base + 4.9, "{} ms vs {base} ms", iteration_ms(&cal));
    assert!(cal["devices"]["t4"]["compute_ms"].as_f64().expect("t4") > 5.0);
    assert!(cal["devices"]["v100"]["compute_ms"].as_f64().expect("v100") < 1.0);
    // A profile for a device not in the cluster, or naming none, is an error.
    let other = dir.join("a10.json");
    std::fs::write(&other, r#"{"device": "a10", "ops": []}"#).expect("write");
    let o = qsyncc(&["simulate", tp, "--targets", "v100,t4", "--profile", other.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not among --targets"), "{}", stderr(&o));
    let anon = dir.join("anon.json");
    std::fs::write(&anon, r#"{"ops": []}"#).expect("write");
    let o = qsyncc(&["simulate", tp, "--targets", "t4", "--profile", anon.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("does not name its device"), "{}", stderr(&o));
    // The planner's `--profile` takes the same file and predicts the same
    // slower T4 (its UP baseline is simulate's uniform FP32 plan).
    let plan_dir = dir.join("plan");
    let o = qsyncc(&[
        "plan",
        tp,
        "--targets",
        "v100,t4",
        "--batch",
        "8",
        "--precisions",
        "fp32",
        "--profile",
        profile.to_str().expect("utf8"),
        "--json",
        "-o",
        plan_dir.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let up = j["methods"]["up"]["iteration_ms"].as_f64().expect("up");
    assert!(up >= base + 4.9, "the planner's UP {up} ms applies the profile ({base} ms without)");
}

#[test]
fn bad_input_exits_2_with_a_clear_message() {
    let p = tiny();
    let tp = p.to_str().expect("utf8");
    let cases: &[(&[&str], &[&str])] = &[
        (&["--targets", "v100:16,k80:4"], &["unknown device `k80`", "known:", "v100", "t4"]),
        (&["--targets", "v100", "--precision", "v100=bf16"], &["v100", "does not support bf16", "fp16"]),
        (&["--targets", "t4", "--precision", "t4=fp9"], &["unknown precision `fp9`"]),
        (&["--targets", "t4", "--precision", "v100=fp16"], &["not among --targets"]),
        (&["--targets", "t4", "--memory", "t4=130%"], &["must be in (0, 100%]"]),
        (&["--targets", "t4", "--memory", "t4=0"], &["must be in (0, 100%]"]),
        (&["--targets", "t4", "--memory", "t4=half"], &["not a fraction"]),
        (&["--targets", "t4", "--memory", "t4"], &["not DEVICE=VALUE"]),
        (&["--targets", "t4:x"], &["not a device count"]),
        (&["--targets", "t4:0"], &["at least 1"]),
        (&["--targets", ":4"], &["no device name"]),
        (&["--targets", "t4:4/0"], &["bad devices per node"]),
        (&["--targets", "t4,t4"], &["twice"]),
        (&["--targets", "t4", "--optimizer", "lion"], &["unknown optimizer"]),
        (&["--targets", "t4", "--bucket-mb", "0"], &["--bucket-mb"]),
        (&["--targets", "t4", "--device-file", "/nonexistent/dev.json"], &["/nonexistent/dev.json"]),
    ];
    for (extra, needles) in cases {
        let mut args = vec!["simulate", tp];
        args.extend_from_slice(extra);
        let o = qsyncc(&args);
        assert_eq!(o.status.code(), Some(2), "{extra:?} should fail: {}", stderr(&o));
        let e = stderr(&o);
        for n in *needles {
            assert!(e.contains(n), "{extra:?}: `{n}` not in: {e}");
        }
    }
    let o = qsyncc(&["simulate", "/nonexistent/model.onnx", "--targets", "t4"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn json_is_deterministic() {
    let p = tiny();
    let a = qsyncc(&["simulate", p.to_str().expect("utf8"), "--targets", "v100:16,t4:16", "--json"]);
    let b = qsyncc(&["simulate", p.to_str().expect("utf8"), "--targets", "v100:16,t4:16", "--json"]);
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(a.stdout, b.stdout);
}
