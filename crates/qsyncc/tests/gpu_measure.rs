//! The GPU measurement without a GPU: `scripts/gpu-measure.sh
//! prepare` (worklist of the real models), `qsyncc profile build` on
//! synthetic measurements generated here from a hidden device (its fitted
//! rates must recover the hidden ones), and `scripts/gpu/analyze.py` on
//! synthetic training iterations whose "measured" times are that hidden
//! device's predictions: the calibrated column, built from the *other*
//! models, must land on them, the datasheet column must show the gap, and
//! every error must be (predicted − measured) / measured of independent
//! `qsyncc simulate` runs. The GPU step itself skips with its reason.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{qsyncc, stderr, tmpdir};
use serde_json::{json, Value};

/// The hidden device: the H100's datasheet with these fractions of peak.
const TRUE_TC: f64 = 0.45;
const TRUE_CUDA: f64 = 0.55;
const TRUE_MEM: f64 = 0.7;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn script(args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg(repo().join("scripts/gpu-measure.sh"))
        .args(args)
        .env("QSYNCC", env!("CARGO_BIN_EXE_qsyncc"))
        .env("QSYNC_MODELS", common::models_dir())
        .output()
        .expect("run scripts/gpu-measure.sh")
}

/// One prepared directory for every test of this file.
fn prepared() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tmpdir("gpu-measure");
        let o = script(&["prepare", dir.to_str().expect("utf8")]);
        assert!(o.status.success(), "prepare failed: {}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
        dir
    })
}

fn read_json(p: &Path) -> Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn worklist() -> Value {
    read_json(&prepared().join("worklist.json"))
}

fn h100() -> Value {
    read_json(&repo().join("crates/cost/devices/h100-sxm.json"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn prepare_lists_every_distinct_op_of_the_models() {
    let w = worklist();
    assert_eq!(w["schema"], "qsync-worklist/1");
    let models: Vec<(String, String)> = w["models"]
        .as_array()
        .expect("models")
        .iter()
        .map(|m| (m["name"].as_str().expect("name").into(), m["family"].as_str().expect("family").into()))
        .collect();
    let expect = [
        ("resnet50_train", "resnet50"),
        ("vgg16", "vgg16"),
        ("vgg16_bn", "vgg16"),
        ("bert_base_train", "bert_base"),
        ("squeezenet1_1", "squeezenet"),
    ];
    assert_eq!(models, expect.map(|(a, b)| (a.to_string(), b.to_string())).to_vec());
    let entries = w["entries"].as_array().expect("entries");
    let keys: Vec<&str> = entries.iter().map(|e| e["key"].as_str().expect("key")).collect();
    let mut unique = keys.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), keys.len(), "keys are distinct");
    // Every kernel-launching node of a model is one use of one entry.
    for m in w["models"].as_array().expect("models") {
        let name = m["name"].as_str().expect("name");
        let uses: u64 = entries.iter().filter_map(|e| e["uses"][name].as_u64()).sum();
        assert_eq!(uses, m["nodes"].as_u64().expect("nodes"), "{name}");
    }
    // The shapes the GPU measures are the ones trained at batch 32, also for
    // the fixed-batch exports (rebatched): torchvision's first convolution
    // (7x7, 64 filters, on 3x224x224), VGG-16's first classifier layer
    // (25088 = 512·7·7 inputs, 4096 outputs, weight stored [out, in]),
    // BERT-base's attention projections (768 → 768 over 32 × 128 tokens),
    // SqueezeNet 1.1's first convolution (3x3, 64 filters, stride 2), and
    // the BERT-base attention scores
    // (12 heads of 64 over 128 positions).
    for key in [
        "Conv|32x3x224x224,64x3x7x7",
        "Gemm|32x25088,4096x25088,4096",
        "MatMul|32x128x768,768x768",
        "Conv|32x3x224x224,64x3x3x3,64",
        "MatMul|32x12x128x64,32x12x64x128",
    ] {
        assert!(keys.contains(&key), "{key} missing; keys: {:?}", &keys[..keys.len().min(40)]);
    }
    let conv = entries.iter().find(|e| e["key"] == "Conv|32x3x224x224,64x3x7x7").expect("conv1");
    assert_eq!(conv["attrs"]["strides"], json!([2, 2]));
    assert_eq!(conv["attrs"]["pads"], json!([3, 3, 3, 3]));
    assert_eq!(conv["inputs"][1]["role"], "weight");
    assert_eq!(conv["inputs"][0]["grad"], false, "the image needs no gradient");
    // 2·(32·64·112·112)·(3·7·7) multiply-adds.
    assert_eq!(f(&conv["fwd"]["flops"]), 2.0 * (32.0 * 64.0 * 112.0 * 112.0) * 147.0);
}

/// Per-precision figures of the hidden device.
struct Truth {
    bw: f64,
    launch: f64,
    dev: Value,
}

impl Truth {
    fn new() -> Truth {
        let dev = h100();
        Truth { bw: f(&dev["memory_bandwidth_gb_s"]) * 1e9, launch: f(&dev["launch_overhead_us"]) * 1e-6, dev }
    }

    fn bytes(p: &str) -> f64 {
        match p {
            "fp32" | "tf32" => 4.0,
            "fp16" | "bf16" => 2.0,
            _ => 1.0,
        }
    }

    /// Seconds of one phase: the roofline, written out independently of
    /// the cost crate.
    fn phase(&self, e: &Value, phase: &str, p: &str) -> Option<f64> {
        let w = &e[phase];
        if f(&w["kernels"]) == 0.0 {
            return None;
        }
        let tc_peak = self.dev["tensor_core_tflops"][p].as_f64().unwrap_or(0.0) * 1e12;
        let align = self.dev["tensor_core_alignment"][p].as_i64().unwrap_or(0);
        let dims = e["align_dims"].as_array().expect("align_dims");
        let tc = e["gemm_like"] == true
            && tc_peak > 0.0
            && align > 0
            && dims.iter().all(|d| d.as_i64().unwrap_or(1) % align == 0);
        let rate = if tc {
            tc_peak * TRUE_TC
        } else {
            let cuda =
                self.dev["cuda_core_tflops"][p].as_f64().or_else(|| self.dev["cuda_core_tflops"]["fp32"].as_f64());
            cuda.expect("fp32 rate") * 1e12 * TRUE_CUDA
        };
        let bytes = f(&w["elems"]) * Truth::bytes(p) + f(&w["fixed_bytes"]);
        let waves = if e["gemm_like"] == true { self.waves(w) } else { 1.0 };
        Some((f(&w["flops"]) / rate * waves).max(bytes / (self.bw * TRUE_MEM)) + f(&w["kernels"]) * self.launch)
    }

    /// The device file's wave model of a GEMM-like phase, written out:
    /// output tiles, split-K only to fill one wave, whole waves.
    fn waves(&self, w: &Value) -> f64 {
        let o = &self.dev["occupancy"];
        let (outputs, flops) = (f(&w["outputs"]), f(&w["flops"]));
        if o.is_null() || outputs <= 0.0 || flops <= 0.0 {
            return 1.0;
        }
        let slots = f(&o["sm_count"]) * f(&o["tiles_per_sm"]);
        let tiles = (outputs / f(&o["tile_outputs"])).ceil();
        let max_splits = (flops / (2.0 * outputs) / f(&o["split_k_min"])).floor().max(1.0);
        let splits = (slots / tiles).floor().max(1.0).min(max_splits);
        let blocks = tiles * splits;
        (blocks / slots).ceil() * slots / blocks
    }

    /// The hidden device as a device file (replaces the bundled `h100-sxm`).
    fn device_file(&self, dir: &Path) -> PathBuf {
        let mut d = self.dev.clone();
        d["efficiency"] = json!({ "tensor_core": TRUE_TC, "cuda_core": TRUE_CUDA, "memory": TRUE_MEM });
        let p = dir.join("truth-h100.json");
        std::fs::write(&p, serde_json::to_string(&d).expect("json")).expect("write");
        p
    }
}

/// Measurements of every worklist entry on the hidden device, with cast
/// and optimizer samples from the same bandwidth.
fn synthetic_ops(dir: &Path) -> PathBuf {
    let t = Truth::new();
    let mut w = worklist();
    for e in w["entries"].as_array_mut().expect("entries") {
        let mut measured = serde_json::Map::new();
        for p in ["fp32", "tf32", "fp16", "bf16"] {
            let Some(fwd) = t.phase(e, "fwd", p) else { continue };
            let mut m = json!({ "fwd_us": fwd * 1e6 });
            if let Some(s) = t.phase(e, "bwd_input", p) {
                m["bwd_input_us"] = json!(s * 1e6);
            }
            if let Some(s) = t.phase(e, "bwd_weight", p) {
                m["bwd_weight_us"] = json!(s * 1e6);
            }
            measured.insert(p.into(), m);
        }
        e["measured"] = Value::Object(measured);
        e["skipped"] = json!({ "int8": "synthetic" });
    }
    let sizes = [65536.0, 1048576.0, 16777216.0];
    let cast = |a: &str, b: &str| {
        let r = (Truth::bytes(a) + Truth::bytes(b)) / (t.bw * TRUE_MEM);
        json!({ "from": a, "to": b, "samples": sizes.iter().map(|&n| [n, (r * n + t.launch) * 1e6]).collect::<Vec<_>>() })
    };
    // Bytes touched per parameter by one step (read p, g and state, write p and state).
    let opt = |name: &str, touched: f64| json!({ "optimizer": name, "samples": sizes.iter().map(|&n| [n, (n * touched / (t.bw * TRUE_MEM) + t.launch) * 1e6]).collect::<Vec<_>>() });
    let m = json!({
        "schema": "qsync-ops/1",
        "meta": { "gpu": "synthetic H100 (test)", "driver": "none", "torch": "none", "date": "2026-01-01T00:00:00Z" },
        "models": w["models"],
        "entries": w["entries"],
        "casts": [cast("fp32", "fp16"), cast("fp16", "fp32"), cast("fp32", "bf16"), cast("bf16", "fp32")],
        "optimizers": [opt("sgd", 12.0), opt("momentum", 20.0), opt("adam", 28.0)],
    });
    let p = dir.join("ops.json");
    std::fs::write(&p, serde_json::to_string(&m).expect("json")).expect("write");
    p
}

fn build(ops: &Path, out: &Path, extra: &[&str]) -> Value {
    let (o1, o2) = (ops.to_str().expect("utf8"), out.to_str().expect("utf8"));
    let mut args = vec!["profile", "build", o1, "--device", "h100-sxm", "-o", o2, "--json"];
    args.extend_from_slice(extra);
    let o = qsyncc(&args);
    assert!(o.status.success(), "profile build {extra:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("report")
}

#[test]
fn the_fit_recovers_a_hidden_device_from_other_models() {
    let dir = tmpdir("gpu-fit");
    let ops = synthetic_ops(&dir);
    let out = dir.join("profile.json");
    let report = build(&ops, &out, &["--exclude", "resnet50"]);
    let classes = report["classes"].as_array().expect("classes");
    let after = |c: &str| {
        classes.iter().find(|x| x["class"] == c).map(|x| f(&x["after"])).unwrap_or_else(|| panic!("{c}: {classes:?}"))
    };
    for (c, want) in [
        ("tensor_core.fp16", TRUE_TC),
        ("tensor_core.bf16", TRUE_TC),
        ("tensor_core.tf32", TRUE_TC),
        ("cuda_core.fp32", TRUE_CUDA),
        ("memory", TRUE_MEM),
    ] {
        let got = after(c);
        assert!((got - want).abs() < 1e-6 * want, "{c}: fitted {got}, hidden {want}");
    }
    assert!((f(&report["total_ratio_after"]) - 1.0).abs() < 1e-6, "{report}");
    assert!(f(&report["total_ratio_before"]) < 0.95, "the datasheet rates predict faster than the hidden device");
    // Leave-one-out: no operator only ResNet-50 has is in the profile.
    let profile = read_json(&out);
    assert_eq!(profile["device"], "h100-sxm");
    assert_eq!(profile["meta"]["excluded_families"], "resnet50");
    assert_eq!(profile["meta"]["gpu"], "synthetic H100 (test)");
    let keys: Vec<String> = profile["ops"]
        .as_array()
        .expect("ops")
        .iter()
        .map(|o| {
            let shapes: Vec<String> = o["inputs"]
                .as_array()
                .expect("inputs")
                .iter()
                .map(|s| match s.as_array() {
                    Some(d) => d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("x"),
                    None => "_".into(),
                })
                .collect();
            format!("{}|{}", o["op"].as_str().expect("op"), shapes.join(","))
        })
        .collect();
    let w = worklist();
    let only_resnet: Vec<&str> = w["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["uses"].as_object().is_some_and(|u| u.len() == 1 && u.contains_key("resnet50_train")))
        .map(|e| e["key"].as_str().expect("key"))
        .collect();
    assert!(!only_resnet.is_empty());
    for k in &only_resnet {
        assert!(!keys.iter().any(|x| x == k), "{k} comes from the excluded model");
    }
    assert!(keys.iter().any(|k| k == "MatMul|32x128x768,768x768"), "BERT-base's ops are in");
    // Deterministic: the same measurements give the same bytes.
    let again = dir.join("again.json");
    build(&ops, &again, &["--exclude", "resnet50"]);
    assert_eq!(std::fs::read(&out).expect("read"), std::fs::read(&again).expect("read"));
}

fn simulate_ms(model: &Path, extra: &[&str]) -> f64 {
    let p = model.to_str().expect("utf8");
    let mut args = vec!["simulate", p, "--targets", "h100-sxm", "--batch", "32", "--json"];
    args.extend_from_slice(extra);
    let o = qsyncc(&args);
    assert!(o.status.success(), "simulate {p} {extra:?}: {}", stderr(&o));
    let j: Value = serde_json::from_slice(&o.stdout).expect("json");
    f(&j["iteration_ms"])
}

#[test]
fn table_iii_on_synthetic_iterations_of_a_hidden_device() {
    let dir = tmpdir("gpu-analyze");
    let ops = synthetic_ops(&dir);
    let t = Truth::new();
    let truth = t.device_file(&dir);
    let truth_s = truth.to_str().expect("utf8");
    let models = prepared().join("models");
    // "Measured" iterations: the hidden device's own predictions of the
    // same model, precision and plan (autocast's for AMP).
    let mut runs = Vec::new();
    for (name, file, family, opt) in
        [("resnet50", "resnet50_train.onnx", "resnet50", "momentum"), ("vgg16", "vgg16.onnx", "vgg16", "momentum")]
    {
        let model = models.join(file);
        let fp32 = simulate_ms(&model, &["--optimizer", opt, "--precision", "h100-sxm=fp32", "--device-file", truth_s]);
        let plan = dir.join(format!("{name}-truth-amp.qir"));
        let o = qsyncc(&[
            "opt",
            model.to_str().expect("utf8"),
            "--passes",
            "autocast(dtype=f16)",
            "--target",
            "h100-sxm",
            "-o",
            plan.to_str().expect("utf8"),
        ]);
        assert!(o.status.success(), "opt: {}", stderr(&o));
        let amp = simulate_ms(&plan, &["--optimizer", opt, "--device-file", truth_s]);
        for (p, ms) in [("fp32", fp32), ("amp_fp16", amp)] {
            runs.push(json!({
                "model": name, "qsync_model": file, "family": family, "optimizer": opt, "precision": p,
                "batch": 32, "seq": null, "median_ms": ms, "p10_ms": ms, "p90_ms": ms, "iterations": 1,
                "peak_memory_bytes": 0,
            }));
        }
    }
    let its = dir.join("iterations.json");
    let doc = json!({ "schema": "qsync-iterations/1", "meta": { "gpu": "synthetic H100 (test)" }, "runs": runs });
    std::fs::write(&its, serde_json::to_string(&doc).expect("json")).expect("write");
    let results = dir.join("results.json");
    let md = dir.join("table.md");
    let o = Command::new("python3")
        .arg(repo().join("scripts/gpu/analyze.py"))
        .args(["--qsyncc", env!("CARGO_BIN_EXE_qsyncc"), "--device", "h100-sxm"])
        .args(["--ops", ops.to_str().expect("utf8"), "--iterations", its.to_str().expect("utf8")])
        .args([
            "--models-dir",
            models.to_str().expect("utf8"),
            "--out-dir",
            dir.join("analysis").to_str().expect("utf8"),
        ])
        .args(["--json", results.to_str().expect("utf8"), "--markdown", md.to_str().expect("utf8")])
        .output()
        .expect("python3");
    assert!(o.status.success(), "analyze.py: {}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    let r = read_json(&results);
    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 4);
    for row in rows {
        let (name, p) = (row["model"].as_str().expect("model"), row["precision"].as_str().expect("precision"));
        let measured = f(&row["measured_ms"]);
        // The datasheet column is exactly the bundled device's prediction.
        let file = if name == "resnet50" { "resnet50_train.onnx" } else { "vgg16.onnx" };
        let model = models.join(file);
        let datasheet = if p == "fp32" {
            simulate_ms(&model, &["--optimizer", "momentum", "--precision", "h100-sxm=fp32"])
        } else {
            simulate_ms(&dir.join(format!("{name}-truth-amp.qir")), &["--optimizer", "momentum"])
        };
        assert!((f(&row["datasheet_ms"]) - datasheet).abs() < 1e-9 * datasheet, "{row}");
        let err = (datasheet - measured) / measured;
        assert!((f(&row["datasheet_err"]) - err).abs() < 1e-12, "{row}");
        assert!(err.abs() > 0.05, "{name} {p}: the datasheet rates are off the hidden device by more than 5%: {err}");
        // Calibrated from the other models only, yet on the hidden device.
        let cal = f(&row["calibrated_err"]);
        assert!(cal.abs() < 0.01, "{name} {p}: calibrated error {cal} (datasheet {err})");
        assert_eq!(row["profile"], format!("profile-without-{name}.json"));
    }
    let table = std::fs::read_to_string(&md).expect("table");
    assert_eq!(table.lines().filter(|l| l.starts_with("| resnet50 ") || l.starts_with("| vgg16 ")).count(), 4);
    assert!(table.contains("| resnet50 | AMP FP16 | 32 |"), "{table}");
}

#[test]
fn profile_build_rejects_bad_input() {
    let dir = tmpdir("gpu-bad");
    let ops = synthetic_ops(&dir);
    let out = dir.join("p.json");
    let (ops_s, out_s) = (ops.to_str().expect("utf8"), out.to_str().expect("utf8"));
    let o = qsyncc(&["profile", "build", ops_s, "--device", "h100-sxm", "--exclude", "alexnet", "-o", out_s]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no model of family `alexnet`"), "{}", stderr(&o));
    let o = qsyncc(&["profile", "build", ops_s, "--device", "h999", "-o", out_s]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown device `h999`"), "{}", stderr(&o));
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"schema":"qsync-worklist/1","models":[],"entries":[]}"#).expect("write");
    let o = qsyncc(&["profile", "build", bad.to_str().expect("utf8"), "--device", "h100-sxm", "-o", out_s]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("bad.json") && stderr(&o).contains("qsync-ops/1"), "{}", stderr(&o));
    // --iterations: a measurement without host times has nothing to fit it
    // to; a file that is no iterations file is named. No profile is left.
    let its = dir.join("iterations.json");
    std::fs::write(&its, r#"{"schema":"qsync-iterations/1","runs":[]}"#).expect("write");
    let _ = std::fs::remove_file(&out);
    for (file, says) in [(&its, "no host times"), (&bad, "bad.json")] {
        let f = file.to_str().expect("utf8");
        let o = qsyncc(&["profile", "build", ops_s, "--device", "h100-sxm", "--iterations", f, "-o", out_s]);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
        assert!(!out.exists());
    }
    // A fixed-batch graph the loader cannot rebatch (the TorchScript BERT
    // indexes its samples with a traced `Range(0, 1)`) cannot be listed at
    // another batch; one it can rebatch (VGG-16) is listed at the batch
    // asked for.
    let bert = common::models_dir().join("bert_tiny.pt");
    let o = qsyncc(&["profile", "worklist", bert.to_str().expect("utf8"), "-o", out_s]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("fixes its batch at 1"), "{}", stderr(&o));
    let vgg = common::models_dir().join("vgg16.onnx");
    let o = qsyncc(&["profile", "worklist", vgg.to_str().expect("utf8"), "-o", out_s]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
#[allow(clippy::print_stdout)] // the skip reason and the step's output are this test's report
fn the_gpu_step_skips_with_its_reason_without_a_gpu() {
    let probe = Command::new("python3").args(["-c", "import torch; assert torch.cuda.is_available()"]).output();
    if probe.is_ok_and(|o| o.status.success()) {
        println!("a GPU is visible: the measurement itself is run by scripts/gpu-measure.sh run, not by this test");
        return;
    }
    let o = script(&["run-ops", prepared().to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(3), "{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("skipped: no GPU"), "{out}");
    println!("{}", out.trim());
}
