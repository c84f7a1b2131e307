//! `qsyncc MODEL --targets … -o DIR`: the planner end to end on every
//! shared model, ClusterB, error exits, a `plan.json` snapshot, and
//! onnxruntime numerics of the per-device graphs (when Python has it).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{check_plan_dir, models_dir, onnx_models, qsyncc, stderr, tmpdir};

fn read_json(p: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Run the planner on a shared model for `targets`; returns the plan
/// directory and the `--json` summary.
fn run_planner(model: &str, targets: &str, extra: &[&str]) -> (PathBuf, serde_json::Value) {
    let path = models_dir().join(model);
    let out = tmpdir(&format!("{model}-{targets}-{}", extra.join("_").replace(['%', '=', ':', ','], "")));
    let mut args =
        vec![path.to_str().expect("utf8"), "--targets", targets, "-o", out.to_str().expect("utf8"), "--json"];
    args.extend_from_slice(extra);
    let o = qsyncc(&args);
    assert!(o.status.success(), "{model}: {}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json prints JSON");
    // Every manifest written matches the documented schema and lists
    // every file; `--json` uses the manifest's names for the same data.
    let manifest = check_plan_dir(&out);
    for k in
        ["model", "chosen", "methods", "devices", "sync", "files", "iteration_ms", "samples_per_s", "indicator_sum"]
    {
        assert_eq!(summary[k], manifest[k], "{model}: --json `{k}` differs from the manifest's");
    }
    (out, summary)
}

/// The chosen plan against every method computed in the same run: never
/// slower than the best baseline (max of UP and DBS), and its indicator
/// sum no larger than that of any method at equal or greater throughput.
/// With `--method qsync` (QSync's allocator as published) the floor is UP's
/// and the plan dominates greedy's.
fn check_choice(model: &str, summary: &serde_json::Value, qsync_method: bool) {
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{model}: {k} in {v}"));
    let methods = summary["methods"].as_object().expect("methods");
    let chosen = summary["chosen"].as_str().expect("chosen");
    assert!(methods.contains_key(chosen), "{model}: chosen `{chosen}` is not a key of methods");
    let (sps, ind) = (f(summary, "samples_per_s"), f(summary, "indicator_sum"));
    let up = f(&methods["up"], "samples_per_s");
    if qsync_method {
        let greedy = &methods["qsync-greedy"];
        assert!(sps >= up * (1.0 - 1e-9), "{model}: {sps} < UP {up}");
        assert!(sps >= f(greedy, "samples_per_s") * (1.0 - 1e-9));
        assert!(ind <= f(greedy, "indicator_sum") * (1.0 + 1e-9));
        return;
    }
    let dbs = methods.get("dbs").map_or(0.0, |d| f(d, "samples_per_s"));
    assert!(sps >= up.max(dbs) * (1.0 - 1e-9), "{model}: chosen {sps} < max(UP {up}, DBS {dbs})");
    for (k, m) in methods {
        if m["fits"] == true && f(m, "samples_per_s") >= sps * (1.0 + 1e-9) {
            assert!(ind <= f(m, "indicator_sum") * (1.0 + 1e-9), "{model}: {k} is faster with a smaller indicator");
        }
    }
}

/// Local batches keep the global batch, and the gradient weights of all
/// devices sum to one.
fn check_batches(manifest: &serde_json::Value) {
    let global = manifest["cluster"]["global_batch"].as_u64().expect("global_batch");
    let (mut samples, mut weight) = (0u64, 0.0f64);
    for t in manifest["targets"].as_array().expect("targets") {
        let (n, b) = (t["count"].as_u64().expect("count"), t["local_batch"].as_u64().expect("local_batch"));
        assert!(b >= 1, "{t}");
        samples += n * b;
        weight += n as f64 * t["gradient_weight"].as_f64().expect("gradient_weight");
        assert!((t["gradient_weight"].as_f64().unwrap_or(0.0) - b as f64 / global as f64).abs() < 1e-12);
    }
    assert_eq!(samples, global, "{manifest}");
    assert!((weight - 1.0).abs() < 1e-9, "gradient weights sum to {weight}");
}

/// Run the planner and check every file and the headline invariants.
fn plan(model: &str, extra: &[&str]) -> (PathBuf, serde_json::Value) {
    let (out, summary) = run_planner(model, "v100:16,t4:16", extra);
    let manifest = read_json(&out.join("manifest.json"));
    assert_eq!(manifest["schema"], "qsync-plan/4");
    assert_eq!(manifest["model"]["sha256"].as_str().map(str::len), Some(64));
    read_json(&out.join("timeline.json"));
    assert!(std::fs::read_to_string(out.join("report.md")).expect("report").contains("<svg"));
    for dev in ["v100", "t4"] {
        read_json(&out.join(dev).join("plan.json"));
        let bytes = std::fs::read(out.join(dev).join("model.onnx")).expect("model.onnx");
        qsync_onnx::import_bytes_with_report(&bytes, None, dev).expect("per-device ONNX imports");
        let d = &summary["devices"][dev];
        let (peak, cap) =
            (d["peak_memory_bytes"].as_f64().expect("peak"), d["memory_capacity_bytes"].as_f64().expect("cap"));
        assert!(peak <= cap, "{model} {dev}: {peak} > {cap}");
        assert!(d["precision_histogram"].is_object() && d["indicator"].is_number());
    }
    check_choice(model, &summary, extra.windows(2).any(|w| w == ["--method", "qsync"]));
    check_batches(&manifest);
    (out, summary)
}

#[test]
fn every_shared_model_plans_on_cluster_a() {
    // Each device's written graph is the plan that was predicted: `qsyncc
    // simulate` on `plan/<device>/model.onnx` (its casts materialized and
    // optimized, its precisions read from the dtypes) agrees with the
    // manifest's compute time within 5% — QSync's replayer bound. A graph
    // whose precision-dependent ops fell back to FP32 behind casts, or a
    // predictor that ignored the casts a plan needs, fails this.
    for p in onnx_models() {
        let name = p.file_name().and_then(|n| n.to_str()).expect("name").to_string();
        let (out, _) = plan(&name, &["--batch", "16"]);
        let manifest = read_json(&out.join("manifest.json"));
        for dev in ["v100", "t4"] {
            // A sharded plan's compute steps only its shard (and may
            // recompute checkpointed blocks); the same plan replicated is
            // what `simulate` of its graph predicts.
            let planned = if manifest["sharding"]["stage"] == "replicate" {
                manifest["devices"][dev]["compute_ms"].as_f64().expect("compute_ms")
            } else {
                manifest["sharding"]["devices"][dev]["replicated_compute_ms"].as_f64().expect("replicated_compute_ms")
            };
            let model = out.join(dev).join("model.onnx");
            let targets = format!("{dev}:16");
            let batch = manifest["devices"][dev]["local_batch"].as_u64().expect("local_batch").to_string();
            let o = qsyncc(&[
                "simulate",
                model.to_str().expect("utf8"),
                "--targets",
                &targets,
                "--batch",
                &batch,
                "--json",
            ]);
            assert!(o.status.success(), "{name} {dev}: {}", String::from_utf8_lossy(&o.stderr));
            let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
            let written = j["devices"][dev]["compute_ms"].as_f64().expect("compute_ms");
            let off = (written - planned) / planned;
            // Within 5%, QSync's replayer bound — except a device given under
            // a third of the reference batch (BERT-base's T4s get 4–5 of 16
            // since small batches are priced by waves): the plan prices it by
            // scaling the reference batch's ops and casts, the written graph
            // at its own batch, and the two differ by up to 9% there
            // (measured 2026-11-26: -8.1% with egraph-casts, +9.0% without).
            // The sharded plans' split (FSDP-DBS: 7 of 16 on BERT-base's
            // T4s) shows the same gap below half the reference batch
            // (-6.6%).
            let local: f64 = batch.parse().expect("batch");
            let bound = if local * 2.0 < 16.0 { 0.10 } else { 0.05 };
            assert!(off.abs() < bound, "{name} {dev}: planned {planned} ms, written graph {written} ms ({off:+.3})");
            if manifest["devices"][dev]["precision_histogram"].get("fp32").is_none() {
                assert_eq!(j["devices"][dev]["precision"], "planned", "{name} {dev}");
            }
        }
    }
}

/// Calibration statistics of torchvision's ResNet-50 (random weights and
/// data, as `scripts/calibrate.py resnet50 FILE --batch 2 --iterations 2`
/// writes them), which match `resnet50_train.onnx` by parameter names: the
/// activation ranges without which the planner offers no INT8.
fn resnet50_stats() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/resnet50_calibration.json");
    p.to_str().expect("utf8").to_string()
}

#[test]
fn int8_plans_simulate_as_predicted() {
    // Without FP16, ResNet-50's T4s at 30% memory need INT8 on some
    // operators (given the activation ranges INT8 needs: `--stats`). The
    // written graph holds them as QDQ pairs around FP32 ops;
    // `simulate` reads those as the INT8 ops they are and agrees with the
    // manifest (without that reading it said FP32, 26% slower).
    let stats = resnet50_stats();
    let (out, summary) = plan(
        "resnet50_train.onnx",
        &["--batch", "32", "--precisions", "fp32,int8", "--memory", "t4=30%", "--method", "qsync", "--stats", &stats],
    );
    let manifest = read_json(&out.join("manifest.json"));
    let t4 = &manifest["devices"]["t4"];
    assert!(t4["precision_histogram"]["int8"].as_u64().unwrap_or(0) > 0, "{summary}");
    assert!(t4["qdq_pairs"].as_u64().unwrap_or(0) > 0, "{t4}");
    let model = out.join("t4").join("model.onnx");
    let o = qsyncc(&["simulate", model.to_str().expect("utf8"), "--targets", "t4:16", "--batch", "32", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let (planned, written) =
        (t4["compute_ms"].as_f64().expect("planned"), j["devices"]["t4"]["compute_ms"].as_f64().expect("written"));
    assert!(((written - planned) / planned).abs() < 0.05, "planned {planned} ms, written graph {written} ms");
    assert_eq!(j["devices"]["t4"]["precision"], "planned");
}

#[test]
fn paper_t_min_trades_throughput_for_precision() {
    // `--t-min lowest`: the floor is the lowest uniform precision that fits
    // (INT8 on the T4s), below UP; recovery gives precision back down to
    // it, so the plan's Ω is below the default plan's and its throughput
    // between the floor and UP.
    let stats = resnet50_stats();
    let run = |rule: &str| {
        let (out, summary) = run_planner(
            "resnet50_train.onnx",
            "v100:16,t4:16",
            &["--batch", "32", "--t-min", rule, "--method", "qsync", "--stats", &stats],
        );
        (summary, read_json(&out.join("manifest.json")))
    };
    let ((fast, fast_m), (low, low_m)) = (run("fastest"), run("lowest"));
    assert_eq!(fast_m["t_min_rule"], "fastest");
    assert_eq!(low_m["t_min_rule"], "lowest");
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    let up = f(&low["methods"]["up"], "samples_per_s");
    let floor = f(&low_m, "t_min_samples_per_s");
    assert!(floor < up, "INT8 is the slower uniform level here: floor {floor}, UP {up}");
    assert_eq!(f(&fast_m, "t_min_samples_per_s"), up);
    let sps = f(&low, "samples_per_s");
    assert!(sps >= floor * (1.0 - 1e-9) && sps <= up * (1.0 + 1e-9), "{floor} <= {sps} <= {up}");
    assert!(f(&low, "indicator_sum") < f(&fast, "indicator_sum"), "{low} vs {fast}");
    assert!(low_m["devices"]["t4"]["precision_histogram"]["fp32"].as_u64().unwrap_or(0) > 0);
    // An unknown rule is a usage error.
    let path = models_dir().join("resnet50_train.onnx");
    let o = qsyncc(&[path.to_str().expect("utf8"), "--targets", "t4", "--t-min", "slowest", "-o", "/tmp/never"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn the_training_role_goes_to_the_device_faster_on_the_model() {
    // An L4 has the higher FP32 peak (30 TFLOPS on CUDA cores against an
    // A100's 19.5) but a fifth of its memory bandwidth: on ResNet-50 the
    // A100 is the faster FP32 device, so it trains in FP32 and the L4 is
    // the one planned below FP32 (here BF16).
    let (out, _) = run_planner(
        "resnet50_train.onnx",
        "a100-40gb:4,l4:4",
        &["--precisions", "fp32,bf16", "--batch", "16", "--method", "qsync", "--train-precision", "fp32"],
    );
    let m = read_json(&out.join("manifest.json"));
    assert_eq!(m["devices"]["a100-40gb"]["role"], "training", "{m}");
    assert_eq!(m["devices"]["l4"]["role"], "inference", "{m}");
    assert!(m["devices"]["l4"]["precision_histogram"]["bf16"].as_u64().unwrap_or(0) > 0, "{m}");
    assert!(m["devices"]["a100-40gb"]["precision_histogram"].get("bf16").is_none(), "{m}");
}

#[test]
fn cluster_b_all_four() {
    for m in ["resnet50_train.onnx", "vgg16.onnx", "vgg16_bn.onnx", "bert_base_train.onnx"] {
        plan(m, &["--memory", "t4=30%", "--batch", "32"]);
    }
}

#[test]
fn bert_tiny_plan_snapshot() {
    let (out, _) = plan("bert_tiny.onnx", &["--batch", "16", "--method", "qsync"]);
    let t4 = read_json(&out.join("t4").join("plan.json"));
    let rows: Vec<String> = t4["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["planned"] == true)
        .map(|n| {
            format!(
                "{} {} {}",
                n["name"].as_str().unwrap_or(""),
                n["op"].as_str().unwrap_or(""),
                n["precision"].as_str().unwrap_or("")
            )
        })
        .collect();
    insta::assert_snapshot!(rows.join("\n"));
}

#[test]
fn bad_input_exits_2() {
    let m = models_dir().join("squeezenet1_1.onnx");
    let m = m.to_str().expect("utf8");
    let out = tmpdir("bad");
    let o = out.to_str().expect("utf8");
    for (args, needle) in [
        (vec![m, "--targets", "v100,h9000", "-o", o], "h9000"),
        (vec![m, "--targets", "v100,t4", "-o", o, "--precisions", "fp12"], "fp12"),
        (vec![m, "--targets", "v100,t4", "-o", o, "--memory", "t4=0.01%", "--batch", "64"], "does not fit"),
    ] {
        let r = qsyncc(&args);
        assert_eq!(r.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&r.stderr).contains(needle),
            "{args:?}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
    }
    // The subcommands still work beside the bare form.
    assert!(qsyncc(&["inspect", m]).status.success());
}

#[test]
fn per_device_onnx_runs_in_onnxruntime() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../passes/tests/numerics.py");
    let has_ort =
        Command::new("python3").args(["-c", "import onnxruntime, onnx"]).output().is_ok_and(|o| o.status.success());
    assert!(has_ort, "python3 with onnx and onnxruntime is needed: run scripts/setup.sh");
    for m in ["squeezenet1_1.onnx", "bert_tiny.onnx"] {
        let (out, _) = plan(m, &["--batch", "16"]);
        for dev in ["v100", "t4"] {
            let planned = out.join(dev).join("model.onnx");
            let r =
                Command::new("python3").arg(&script).arg(models_dir().join(m)).arg(&planned).output().expect("python3");
            assert!(
                r.status.success(),
                "{m} {dev}: {}{}",
                String::from_utf8_lossy(&r.stdout),
                String::from_utf8_lossy(&r.stderr)
            );
        }
    }
}

#[test]
fn emit_writes_each_devices_code() {
    let dir = tmpdir("plan-emit");
    let m = models_dir().join("squeezenet1_1.onnx");
    let o = qsyncc(&[
        m.to_str().expect("utf8"),
        "--targets",
        "v100:16,t4:16",
        "--emit",
        "onnx,mlir,ptx",
        "-o",
        dir.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let manifest = check_plan_dir(&dir);
    for (dev, sm) in [("v100", "sm_70"), ("t4", "sm_75")] {
        assert_eq!(manifest["devices"][dev]["files"]["ptx"], format!("{dev}/kernels.ptx"));
        assert_eq!(manifest["devices"][dev]["files"]["mlir"], format!("{dev}/model.mlir"));
        let ptx = std::fs::read_to_string(dir.join(dev).join("kernels.ptx")).expect("kernels.ptx");
        assert!(ptx.contains(&format!(".target {sm}")) && ptx.contains(".entry "), "{dev}");
        let mlir = std::fs::read_to_string(dir.join(dev).join("model.mlir")).expect("model.mlir");
        assert!(mlir.contains("func.func"), "{dev}");
        assert!(dir.join(dev).join("model.onnx").is_file());
    }
    let o =
        qsyncc(&[m.to_str().expect("utf8"), "--targets", "t4", "--emit", "llvm", "-o", dir.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2));
    // A re-plan without --emit (and all FP32) replaces the directory whole:
    // no FP16 model.mlir / kernels.ptx stay beside the new plan.
    let o = qsyncc(&[
        m.to_str().expect("utf8"),
        "--targets",
        "v100:16,t4:16",
        "--precisions",
        "fp32",
        "-o",
        dir.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check_plan_dir(&dir);
    assert!(!dir.join("t4").join("kernels.ptx").exists() && !dir.join("t4").join("model.mlir").exists());
}

#[test]
fn torchscript_archives_plan() {
    for m in ["squeezenet1_1.pt", "bert_tiny.pt"] {
        let dir = tmpdir(&format!("plan-{m}"));
        let path = models_dir().join(m);
        let o = qsyncc(&[
            path.to_str().expect("utf8"),
            "--targets",
            "v100:16,t4:16",
            "--batch",
            "16",
            "-o",
            dir.to_str().expect("utf8"),
            "--json",
        ]);
        assert!(o.status.success(), "{m}: {}", String::from_utf8_lossy(&o.stderr));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert!(j["iteration_ms"].as_f64().is_some_and(|t| t > 0.0 && t.is_finite()), "{m}: {j}");
        check_plan_dir(&dir);
        for dev in ["v100", "t4"] {
            assert!(dir.join(dev).join("model.onnx").is_file(), "{m} {dev}");
        }
    }
}

#[test]
fn manifests_are_byte_identical_across_runs() {
    let m = models_dir().join("squeezenet1_1.onnx");
    let dir = tmpdir("determinism");
    let mut texts = Vec::new();
    for name in ["a", "b"] {
        let out = dir.join(name);
        let o = qsyncc(&[m.to_str().expect("utf8"), "--targets", "v100:4,t4:4", "-o", out.to_str().expect("utf8")]);
        assert!(o.status.success(), "{}", stderr(&o));
        check_plan_dir(&out);
        texts.push(std::fs::read(out.join("manifest.json")).expect("manifest"));
    }
    assert!(texts[0] == texts[1], "manifest.json differs between two runs");
    // The report explains the indicator to its reader, and its timeline
    // draws the time after the backward pass as waiting unless it is the
    // optimizer step.
    let report = std::fs::read_to_string(dir.join("a").join("report.md")).expect("report");
    assert!(report.contains("**The indicator**") && report.contains("not an accuracy prediction"), "{report}");
    assert!(report.contains("grey waiting") && report.contains("fill=\"#dddddd\""), "{report}");
}

/// The count of weights without data, from each command's output.
fn missing_counts(model: &Path, plan_dir: &Path) -> (u64, String, String) {
    let p = model.to_str().expect("utf8");
    let j = common::inspect_json(model, &[]);
    let o = qsyncc(&["opt", p, "--passes", "verify"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let opt = stderr(&o);
    let o = qsyncc(&[p, "--targets", "v100,t4", "--batch", "4", "-o", plan_dir.to_str().expect("utf8"), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    (j["absent_initializers"].as_u64().expect("count"), opt, plan["warnings"].to_string())
}

#[test]
fn weights_without_data_are_counted_once_and_external_data_is_used() {
    // bert_tiny written as text IR puts its large weights in `m.qir.bin`,
    // external data beside the model.
    let dir = tmpdir("external");
    let src = models_dir().join("bert_tiny.onnx");
    let m = dir.join("m.qir");
    let o = qsyncc(&["opt", src.to_str().expect("utf8"), "-o", m.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(dir.join("m.qir.bin").is_file());
    // Present: no command warns, and the indicator reads the weights.
    let (count, opt, plan) = missing_counts(&m, &dir.join("p1"));
    assert_eq!(count, 0);
    assert!(!opt.contains("no data") && !plan.contains("no data"), "{opt}\n{plan}");
    let manifest = check_plan_dir(&dir.join("p1"));
    let sources = &manifest["indicator"]["sources"];
    assert!(sources["weights_from_initializers"].as_u64().unwrap_or(0) > 0, "{sources}");
    // The written plan carries the external data it references.
    let ext = manifest["devices"]["t4"]["files"]["external_data"].as_array().expect("external_data listed");
    assert!(ext.iter().any(|f| f == "t4/m.qir.bin"), "{ext:?}");
    // Missing: every command gives the same count.
    std::fs::remove_file(dir.join("m.qir.bin")).expect("rm");
    let (count, opt, plan) = missing_counts(&m, &dir.join("p2"));
    assert!(count > 0);
    let needle = format!("{count} of ");
    assert!(opt.contains(&needle) && opt.contains("have no data"), "opt: {opt}");
    assert!(plan.contains(&needle) && plan.contains("have no data"), "plan: {plan}");
    let o = qsyncc(&["inspect", m.to_str().expect("utf8")]);
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("{count} without values")));
}

/// One T4's predicted compute time (ms) for `model` at batch `b`, by
/// `simulate` or by `opt --json`.
fn t4_compute_ms(command: &str, model: &str, b: &str) -> f64 {
    let o = if command == "simulate" {
        qsyncc(&["simulate", model, "--targets", "t4", "--batch", b, "--json"])
    } else {
        qsyncc(&["opt", model, "--passes", "verify", "--target", "t4", "--batch", b, "--json"])
    };
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let ms = if command == "simulate" { &v["devices"]["t4"]["compute_ms"] } else { &v["predicted_ms"]["total"] };
    ms.as_f64().expect("predicted")
}

#[test]
fn a_graph_that_cannot_be_rebatched_is_planned_at_its_own_batch_everywhere() {
    // The TorchScript BERT keeps batch 1 (its mask indexing is traced):
    // `--batch 8` plans, predicts and writes batch 1 on every device, the
    // manifest, the written models, `simulate` and `opt` agreeing.
    let m = common::models_dir().join("bert_tiny.pt");
    let p = m.to_str().expect("utf8");
    let dir = tmpdir("unrebatchable-plan");
    let o = qsyncc(&[p, "--targets", "v100:2,t4:2", "--batch", "8", "-o", dir.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let manifest = check_plan_dir(&dir);
    assert_eq!(manifest["cluster"]["global_batch"].as_u64(), Some(4), "{manifest}");
    for t in ["v100", "t4"] {
        assert_eq!(manifest["devices"][t]["local_batch"].as_u64(), Some(1), "{t}: {manifest}");
        let written = common::inspect_json(&dir.join(t).join("model.onnx"), &[]);
        assert_eq!(written["inputs"][0]["type"], "i64[1,128]", "{written}");
    }
    assert!(manifest["warnings"].to_string().contains("written at batch 1"), "{}", manifest["warnings"]);
    let sim = |b: &str| t4_compute_ms("simulate", p, b);
    assert_eq!(sim("8"), sim("1"), "simulate predicts the batch the graph has");
    let opt_ms = |b: &str| t4_compute_ms("opt", p, b);
    assert_eq!(opt_ms("8"), opt_ms("1"), "opt predicts the batch the graph has");
}

#[test]
fn a_batchnorm_over_single_values_gets_at_least_two_samples() {
    // After global pooling a BatchNorm over [N, C] has one value per sample
    // and channel: PyTorch cannot train it on one sample, so no device may
    // be given a local batch of 1, however slow it is.
    let dir = tmpdir("bn-min-batch");
    let p = dir.join("bn.qir");
    std::fs::write(
        &p,
        "opset \"\" 17\ngraph \"g\" {\n  init %w: f32[512,4096] = absent\n  init %s: f32[4096] = absent\n  init %b: f32[4096] = absent\n  \
         init %m: f32[4096] = absent\n  init %v: f32[4096] = absent\n  input %x: f32[batch,512]\n  %h = MatMul \"fc\"(%x, %w)\n  \
         %y = BatchNormalization \"bn\"(%h, %s, %b, %m, %v)\n  output %y\n}\n",
    )
    .expect("write");
    let out = dir.join("plan");
    let o = qsyncc(&[
        p.to_str().expect("utf8"),
        "--targets",
        "h100-sxm:1,t4:1",
        "--batch",
        "4",
        "-o",
        out.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let manifest = check_plan_dir(&out);
    for (t, d) in manifest["devices"].as_object().expect("devices") {
        assert!(d["local_batch"].as_u64().is_some_and(|b| b >= 2), "{t}: {d}");
    }
}

#[test]
fn fixed_batch_models_are_rebatched_everywhere() {
    // The bundled SqueezeNet fixes batch 1 (input [1,3,224,224], reshape
    // target [1,1000]). It is rebatched: `opt --batch`, `simulate
    // --batch`, the manifest's local batch and the written model agree.
    let m = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/squeezenet1_1.onnx");
    let p = m.to_str().expect("utf8");
    let j = common::inspect_json(&m, &["--batch", "32"]);
    assert_eq!(j["inputs"][0]["type"], "f32[32,3,224,224]", "{j}");
    assert_eq!(j["outputs"][0]["type"], "f32[32,1000]", "{j}");
    assert!(j["fixed_batch"].is_null(), "{j}");
    let opt_ms = |b: &str| t4_compute_ms("opt", p, b);
    let (one, many) = (opt_ms("1"), opt_ms("32"));
    assert!(many > 8.0 * one, "opt --batch 32 predicts the batch-32 time: {one} vs {many} ms");
    let sim = |b: &str| t4_compute_ms("simulate", p, b);
    let ratio = sim("32") / opt_ms("32");
    assert!((0.5..2.0).contains(&ratio), "simulate and opt predict the same batch: ratio {ratio}");
    let dir = tmpdir("fixed-batch");
    let o = qsyncc(&[p, "--targets", "t4:2", "--batch", "32", "-o", dir.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let manifest = check_plan_dir(&dir);
    let local = manifest["devices"]["t4"]["local_batch"].as_u64().expect("local_batch");
    let written = common::inspect_json(&dir.join("t4").join("model.onnx"), &[]);
    assert_eq!(written["inputs"][0]["type"], format!("f32[{local},3,224,224]"), "{written}");
}

#[test]
fn the_verdict_says_when_leaving_devices_out_is_faster() {
    // BERT-base on 8 A100s + 8 T4s: the A100s alone (BF16 AMP) beat every
    // plan that also uses the T4s (the cross-node gradient sync costs more
    // than the T4s add), and the first line says so with the numbers.
    let (out, s) = run_planner("bert_base_train.onnx", "a100-40gb:8,t4:8", &["--dim", "seq=128"]);
    let alone = s["alone"]["a100-40gb"]["samples_per_s"].as_f64().expect("a100 alone");
    let chosen = s["samples_per_s"].as_f64().expect("chosen");
    assert!(alone > chosen, "{s}");
    for (k, m) in s["methods"].as_object().expect("methods") {
        assert!(alone > m["samples_per_s"].as_f64().expect("sps"), "{k} beats the A100s alone: {s}");
    }
    let verdict = s["verdict"].as_str().expect("verdict");
    assert!(verdict.starts_with("**Leave the other devices out**: a100-40gb x8 alone"), "{verdict}");
    assert!(verdict.contains(&format!("{alone:.1} samples/s")), "{verdict}");
    let report = std::fs::read_to_string(out.join("report.md")).expect("report");
    assert!(report.lines().nth(2).is_some_and(|l| l.starts_with("**Leave the other devices out**")), "{report}");
    assert!(report.contains("| a100-40gb alone (") && report.contains("| t4 alone ("), "{report}");
    // The training devices are planned in AMP (BF16 on an A100), not FP32.
    assert!(s["devices"]["a100-40gb"]["precision_histogram"]["bf16"].as_u64().unwrap_or(0) > 0, "{s}");
    // And the terminal (without --json) opens with the same verdict.
    let path = models_dir().join("bert_base_train.onnx");
    let dir = tmpdir("verdict-terminal");
    let o = qsyncc(&[
        path.to_str().expect("utf8"),
        "--targets",
        "a100-40gb:8,t4:8",
        "--dim",
        "seq=128",
        "-o",
        dir.to_str().expect("utf8"),
    ]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).starts_with(verdict), "{}", String::from_utf8_lossy(&o.stdout));
}

#[test]
fn a_single_device_type_is_a_training_cluster_at_its_training_precision() {
    for (targets, dtype) in [("a100-40gb:8", "bf16"), ("v100:4", "fp16"), ("t4:8", "fp16")] {
        let dev = targets.split(':').next().expect("device");
        let (_, s) = run_planner("bert_base_train.onnx", targets, &["--dim", "seq=128"]);
        assert_eq!(s["devices"][dev]["role"], "training", "{targets}: {s}");
        assert_eq!(s["devices"][dev]["indicator"].as_f64(), Some(0.0), "{targets}");
        assert!(s["devices"][dev]["precision_histogram"][dtype].as_u64().unwrap_or(0) > 0, "{targets}: {s}");
        assert!(s["verdict"].as_str().expect("verdict").starts_with(&format!("**Train on {dev} x")), "{s}");
        // FP32 only when asked.
        let (_, f) = run_planner("bert_base_train.onnx", targets, &["--dim", "seq=128", "--train-precision", "fp32"]);
        assert!(f["devices"][dev]["precision_histogram"].get(dtype).is_none(), "{targets}: {f}");
        assert!(
            f["samples_per_s"].as_f64().expect("sps") < s["samples_per_s"].as_f64().expect("sps"),
            "{targets}: AMP is predicted faster than FP32"
        );
    }
    // A precision the device lacks is refused, naming it.
    let path = models_dir().join("bert_base_train.onnx");
    let o = qsyncc(&[
        path.to_str().expect("utf8"),
        "--targets",
        "v100:4",
        "--train-precision",
        "bf16",
        "-o",
        "/tmp/never-bf16",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("v100 has no bf16"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn adding_devices_that_pay_is_said_with_the_ratio() {
    // ResNet-50 has the compute for the T4s to pay for their share of the
    // synchronization: the V100s alone train the same 1024 samples per step
    // (64 per device) 1.14x slower than the cluster (predicted 2026-11-26).
    // SqueezeNet at batch 16 no longer pays once the V100s alone are
    // credited with the whole global batch (32 per device): its verdict
    // says to leave the T4s out.
    let (_, s) = run_planner("resnet50_train.onnx", "v100:16,t4:16", &["--batch", "32"]);
    let best_alone =
        s["alone"].as_object().expect("alone").values().filter_map(|v| v["samples_per_s"].as_f64()).fold(0.0, f64::max);
    assert!(s["samples_per_s"].as_f64().expect("sps") > best_alone, "{s}");
    assert!(s["verdict"].as_str().expect("verdict").contains("Adding the other devices pays"), "{s}");
    assert!(s["verdict"].as_str().expect("verdict").contains("same global batch of 1024"), "{s}");
    assert_eq!(s["alone"]["v100"]["local_batches"]["v100"], 64, "{s}");
    let (_, q) = run_planner("squeezenet1_1.onnx", "v100:16,t4:16", &["--batch", "16"]);
    assert!(q["verdict"].as_str().expect("verdict").starts_with("**Leave the other devices out**"), "{q}");
}

/// ResNet-50 on V100s + T4s: the V100s alone beat the plan the indicator
/// objective writes, but the sharded plan with the T4s beats the V100s
/// alone. The verdict names that plan rather than telling the user to
/// leave the T4s out, and `--objective throughput` (whose bound, UP's
/// indicator, the sharded plan is within) writes it.
#[test]
fn a_faster_all_device_plan_passed_over_is_named_not_left_out() {
    let (_, s) = run_planner("resnet50.onnx", "v100:16,t4:16", &[]);
    let alone = s["alone"]["v100"]["samples_per_s"].as_f64().expect("v100 alone");
    let sharded = s["methods"]["sharded"]["samples_per_s"].as_f64().expect("sharded");
    let chosen = s["samples_per_s"].as_f64().expect("chosen");
    assert!(chosen < alone && alone < sharded, "{s}");
    let verdict = s["verdict"].as_str().expect("verdict");
    assert!(verdict.starts_with("**Adding the other devices pays only with `sharded`**"), "{verdict}");
    assert!(verdict.contains(&format!("{sharded:.1} samples/s")), "{verdict}");
    let (_, t) = run_planner("resnet50.onnx", "v100:16,t4:16", &["--objective", "throughput"]);
    assert_eq!(t["chosen"], "sharded", "{t}");
    assert!(
        t["indicator_sum"].as_f64().expect("indicator") <= t["methods"]["up"]["indicator_sum"].as_f64().expect("up")
    );
    assert!(t["verdict"].as_str().expect("verdict").contains("Adding the other devices pays"), "{t}");
}
