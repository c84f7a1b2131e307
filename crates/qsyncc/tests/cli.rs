//! The `qsyncc` binary end to end: real models, bad input, exit codes.

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::{inspect_json, models_dir, onnx_models, qsyncc, stderr, tmpdir};

#[test]
fn every_shared_model_inspects_with_all_shapes_known() {
    for path in onnx_models() {
        let bytes = std::fs::read(&path).expect("read");
        let file_nodes = qsync_onnx::count_file_nodes(&bytes).expect("count nodes");
        let j = inspect_json(&path, &[]);
        assert_eq!(j["onnx_nodes"].as_u64(), Some(file_nodes as u64), "{}", path.display());
        assert_eq!(j["unknown_shapes"].as_u64(), Some(0), "{}: {j}", path.display());
        assert!(j["parameters"].as_u64().is_some_and(|p| p > 0), "{}", path.display());
        let ops_total: u64 = j["ops"].as_object().expect("ops").values().filter_map(|v| v.as_u64()).sum();
        assert_eq!(ops_total, file_nodes as u64, "{}: op histogram covers every node", path.display());
    }
}

#[test]
fn batch_binding_makes_flops_concrete() {
    let path = models_dir().join("resnet50_train.onnx");
    let sym = inspect_json(&path, &[]);
    assert!(sym["flops_total"].is_string(), "symbolic batch gives an expression: {}", sym["flops_total"]);
    let b1 = inspect_json(&path, &["--batch", "1"]);
    let b8 = inspect_json(&path, &["--batch", "8"]);
    let (f1, f8) = (b1["flops_total"].as_i64().expect("concrete"), b8["flops_total"].as_i64().expect("concrete"));
    assert_eq!(f8, 8 * f1);
    // ResNet-50 forward is about 4.1 GMACs per image: 8.2 GFLOPs.
    assert!((7.5e9..9.0e9).contains(&(f1 as f64)), "resnet50 FLOPs per image {f1}");
    assert_eq!(b8["inputs"][0]["type"], "f32[8,3,224,224]");

    let bert = models_dir().join("bert_base_train.onnx");
    let j = inspect_json(&bert, &["--batch", "2", "--dim", "seq=128"]);
    assert_eq!(j["inputs"][0]["type"], "i64[2,128]");
    assert!(j["flops_total"].is_i64(), "{}", j["flops_total"]);
}

#[test]
fn fixed_batch_models_are_rebatched_where_the_graph_allows() {
    // ResNet-50 fixes batch 1 in its input and its flatten target [1,2048].
    let j = inspect_json(&models_dir().join("resnet50.onnx"), &["--batch", "8"]);
    assert!(j["fixed_batch"].is_null(), "{j}");
    assert_eq!(j["inputs"][0]["type"], "f32[8,3,224,224]");
    assert!(j["warnings"].to_string().contains("rebatched to 8"), "{j}");
    // A graph whose reshape drops the batch cannot be rebatched: it keeps
    // batch 1 and says that other batches are costed by scaling its work.
    let dir = tmpdir("unrebatchable");
    let p = dir.join("drop.qir");
    std::fs::write(
        &p,
        "opset \"\" 17\ngraph \"g\" {\n  init %t: i64[2] = [3, 4]\n  input %x: f32[1,3,4]\n  %y = Reshape \"drop\"(%x, %t)\n  output %y\n}\n",
    )
    .expect("write");
    let j = inspect_json(&p, &["--batch", "8"]);
    assert_eq!(j["fixed_batch"].as_i64(), Some(1), "{j}");
    assert!(j["warnings"].to_string().contains("could not be rebatched"), "{j}");
    assert!(j["warnings"].to_string().contains("written at batch 1"), "{j}");
}

#[test]
fn inspect_text_snapshot() {
    for name in ["squeezenet1_1.onnx", "resnet50_train.onnx"] {
        let p = models_dir().join(name);
        let o = qsyncc(&["inspect", p.to_str().expect("utf8")]);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout).replace(&*models_dir().to_string_lossy(), "<models>");
        insta::assert_snapshot!(format!("inspect_{name}"), text);
    }
}

#[test]
fn opt_writes_onnx_and_text_ir_that_read_back() {
    let dir = tmpdir("opt");
    let src = models_dir().join("bert_tiny.onnx");
    let onnx_out = dir.join("out.onnx");
    let qir_out = dir.join("out.qir");
    for out in [&onnx_out, &qir_out] {
        let o = qsyncc(&[
            "opt",
            src.to_str().expect("utf8"),
            "--passes",
            "infer-shapes,fold-constants,dce,verify",
            "-o",
            out.to_str().expect("utf8"),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("fold-constants"), "pass report on stderr: {}", stderr(&o));
    }
    // Both outputs load again and describe the same graph.
    let a = inspect_json(&onnx_out, &[]);
    let b = inspect_json(&qir_out, &[]);
    assert_eq!(a["ops"], b["ops"]);
    assert_eq!(a["parameters"], b["parameters"]);
    assert_eq!(b["unknown_shapes"].as_u64(), Some(0));
    assert!(dir.join("out.qir.bin").is_file(), "large weights go to the sidecar");
    // Text IR output is deterministic.
    let again = dir.join("again.qir");
    let o =
        qsyncc(&["opt", qir_out.to_str().expect("utf8"), "--passes", "verify", "-o", again.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t1 = std::fs::read_to_string(&qir_out).expect("qir");
    let t2 = std::fs::read_to_string(&again).expect("qir").replace("again.qir.bin", "out.qir.bin");
    assert_eq!(t1, t2);
}

fn assert_clean_failure(o: &Output, needle: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "exit code 2 expected; stderr: {e}");
    assert!(!e.contains("panicked"), "must not panic: {e}");
    assert!(e.contains(needle), "stderr should mention {needle:?}: {e}");
}

#[test]
fn bad_input_exits_2_naming_the_file() {
    let dir = tmpdir("bad");
    let real = std::fs::read(models_dir().join("resnet50_train.onnx")).expect("read");
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("empty.onnx".into(), Vec::new()),
        ("text.onnx".into(), b"this is not a model\n".to_vec()),
        ("zip.onnx".into(), b"PK\x03\x04\x14\x00\x00\x00\x08\x00garbage".to_vec()),
        ("half.onnx".into(), real[..real.len() / 2].to_vec()),
        ("short.onnx".into(), real[..97].to_vec()),
    ];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    cases.push(("random.onnx".into(), random));
    cases.push(("bad.qir".into(), b"graph \"g\" {\n  %y = Frobnicate \"n\"(%x)\n}\n".to_vec()));
    for (name, bytes) in cases {
        let p = dir.join(&name);
        std::fs::write(&p, bytes).expect("write");
        let o = qsyncc(&["inspect", p.to_str().expect("utf8"), "--json"]);
        assert_clean_failure(&o, &name);
    }
    let missing = dir.join("missing.onnx");
    assert_clean_failure(&qsyncc(&["inspect", missing.to_str().expect("utf8")]), "missing.onnx");
}

#[test]
fn bad_flags_exit_2() {
    let m = models_dir().join("squeezenet1_1.onnx");
    let m = m.to_str().expect("utf8");
    for args in [
        vec!["inspect", m, "--batch", "0"],
        vec!["inspect", m, "--batch", "-3"],
        vec!["inspect", m, "--batch", "lots"],
        vec!["inspect", m, "--dim", "seq"],
        vec!["inspect", m, "--dim", "seq=0"],
        vec!["opt", m, "--passes", "no-such-pass"],
    ] {
        let o = qsyncc(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{args:?}");
    }
}

#[test]
fn inconsistent_shapes_are_reported_with_the_node() {
    let dir = tmpdir("shapes");
    let p = dir.join("mismatch.qir");
    std::fs::write(
        &p,
        "opset \"\" 17\ngraph \"g\" {\n  input %a: f32[2,3]\n  input %b: f32[4,5]\n  %c = Add \"the_add\"(%a, %b)\n  output %c\n}\n",
    )
    .expect("write");
    let o = qsyncc(&["inspect", p.to_str().expect("utf8")]);
    assert_clean_failure(&o, "the_add");
}

#[test]
fn opt_json_reports_planning_figures() {
    let dir = tmpdir("plan");
    let m = models_dir().join("squeezenet1_1.onnx");
    let m = m.to_str().expect("utf8");
    for (passes, target) in [("amp", "v100"), ("autocast", "t4"), ("uniform=f16", "a100-40gb"), ("cascade=f16", "t4")] {
        let out = dir.join("out.onnx");
        let o =
            qsyncc(&["opt", m, "--passes", passes, "--target", target, "--json", "-o", out.to_str().expect("utf8")]);
        assert!(o.status.success(), "{passes}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        let casts = v["casts"].as_u64().expect("casts");
        let added = v["casts_added"].as_i64().expect("casts_added");
        let weights = v["weight_casts"].as_u64().expect("weight_casts");
        let frac = v["low_precision_flop_fraction"].as_f64().expect("fraction");
        assert!(casts > 0 && added > 0 && weights <= added as u64, "{passes}: {v}");
        assert!((0.9..=1.0).contains(&frac), "{passes}: {v}");
        assert!(v.get("predicted_ms").is_some(), "{passes}: the cost-model slot is present");
        assert!(out.is_file());
    }
    // Inference mode stores weights low: no weight casts.
    let o = qsyncc(&["opt", m, "--passes", "amp", "--mode", "inference", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["weight_casts"], 0, "{v}");
    // A precision the target lacks, an unknown target, bad pass arguments: exit 2.
    assert_clean_failure(&qsyncc(&["opt", m, "--passes", "uniform=bf16", "--target", "v100", "--json"]), "no bf16");
    let o = qsyncc(&["opt", m, "--passes", "amp", "--target", "nosuchgpu", "--json"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_clean_failure(&qsyncc(&["opt", m, "--passes", "amp(bogus=1)"]), "unknown argument `bogus`");
    assert_clean_failure(&qsyncc(&["opt", m, "--passes", "amp(policy=/no/such.json)"]), "cannot read");
}

#[test]
fn quantized_plans_cost_their_qdq_inside_the_op() {
    // An INT8 plan is written as QuantizeLinear/DequantizeLinear around FP32
    // ops. `opt --json` (on the plan in memory) and `inspect` (on the file)
    // predict the same time and INT8 FLOP share: the QDQ pairs are the op's
    // quantization, which the cost model charges inside the INT8 op, not
    // also as separate FP32 nodes. `simulate` reads the file the same way.
    let dir = tmpdir("int8");
    let m = models_dir().join("squeezenet1_1.onnx");
    let out = dir.join("i8.onnx");
    let (m, out_s) = (m.to_str().expect("utf8"), out.to_str().expect("utf8"));
    // INT8 activations need their ranges: measured by calibrate.py in
    // onnxruntime (without them the convolutions would stay FP32).
    let stats = dir.join("stats.json");
    let c = std::process::Command::new("python3")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/calibrate.py"))
        .args([m, stats.to_str().expect("utf8"), "--random", "2", "--seed", "0"])
        .output()
        .expect("python3");
    assert!(c.status.success(), "calibrate.py: {}", String::from_utf8_lossy(&c.stderr));
    let stats_s = stats.to_str().expect("utf8");
    let o = qsyncc(&["opt", m, "--passes", "uniform=i8", "--target", "t4", "--stats", stats_s, "--json", "-o", out_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    let planned: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let o = qsyncc(&["inspect", out_s, "--target", "t4", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let inspected: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let total = |v: &serde_json::Value| v["predicted_ms"]["total"].as_f64().expect("total");
    assert_eq!(total(&planned), total(&inspected["precision"]), "{planned} vs {inspected}");
    let frac = inspected["precision"]["low_precision_flop_fraction"].as_f64().expect("fraction");
    assert!(frac > 0.9, "the INT8 convolutions count as low precision: {inspected}");
    // `simulate` of the written file lands within 1% of the original model
    // simulated at uniform INT8 (the plans differ only in ops the pass keeps
    // FP32); read as FP32 ops plus QDQ nodes it was 20% off (2.32 vs
    // 2.89 ms).
    let o = qsyncc(&["simulate", out_s, "--targets", "t4", "--batch", "1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sim: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(sim["devices"]["t4"]["precision"], "planned", "{sim}");
    let direct = qsyncc(&["simulate", m, "--targets", "t4", "--batch", "1", "--precision", "t4=int8", "--json"]);
    let direct: serde_json::Value = serde_json::from_slice(&direct.stdout).expect("JSON");
    let ms = |v: &serde_json::Value| v["devices"]["t4"]["compute_ms"].as_f64().expect("compute_ms");
    let off = (ms(&sim) - ms(&direct)) / ms(&direct);
    assert!(off.abs() < 0.01, "written {} ms vs INT8 {} ms", ms(&sim), ms(&direct));
}

#[test]
fn symbolic_batch_contradicted_by_the_graph_is_rebatched() {
    // Exporters sometimes declare a symbolic batch but bake the traced batch
    // (here 1) into a reshape target.
    let dir = tmpdir("traced_batch");
    let p = dir.join("traced.qir");
    std::fs::write(
        &p,
        "opset \"\" 17\ngraph \"g\" {\n  init %t: i64[2] = [1, 12]\n  input %x: f32[batch,3,4]\n  %y = Reshape \"flat\"(%x, %t)\n  output %y\n}\n",
    )
    .expect("write");
    // Its reshape target is made batch-relative ([-1, 12]): rebatched.
    let j = inspect_json(&p, &["--batch", "8"]);
    assert!(j["fixed_batch"].is_null(), "{j}");
    assert_eq!(j["inputs"][0]["type"], "f32[8,3,4]");
    assert_eq!(j["outputs"][0]["type"], "f32[8,12]");
    let warnings = j["warnings"].to_string();
    assert!(warnings.contains("fixed its batch at 1; rebatched to 8"), "{warnings}");
}

/// `scripts/rebatch_check.py ORIGINAL REBATCHED --batch B`: onnxruntime
/// runs the rebatched model on B samples and the original on each alone.
fn rebatch_check(original: &std::path::Path, rebatched: &std::path::Path, batch: &str) -> Output {
    let probe = std::process::Command::new("python3").args(["-c", "import onnxruntime, numpy"]).output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "python3 cannot import onnxruntime and numpy: run scripts/setup.sh"
    );
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/rebatch_check.py");
    std::process::Command::new("python3")
        .arg(script)
        .args([original.to_str().expect("utf8"), rebatched.to_str().expect("utf8"), "--batch", batch])
        .output()
        .expect("run rebatch_check.py")
}

#[test]
fn traced_transformer_exports_are_rebatched_and_compute_each_sample_as_before() {
    // The dynamo export of BERT fixes batch 1 in its inputs, in reshape
    // targets with another -1 ([1, 128, -1, 64]) and in a GatherND that
    // broadcasts the attention mask with traced indices. Rebatched, three
    // samples with three different masks give what the original gives for
    // each alone.
    let src = models_dir().join("bert_tiny.onnx");
    let j = inspect_json(&src, &["--batch", "3", "--dim", "seq=128"]);
    assert!(j["fixed_batch"].is_null(), "{j}");
    assert_eq!(j["inputs"][0]["type"], "i64[3,128]", "{j}");
    assert_eq!(j["outputs"][0]["type"], "f32[3,128,128]", "{j}");
    assert!(j["warnings"].to_string().contains("4 shape operand(s) made batch-relative"), "{j}");
    let dir = tmpdir("rebatch_bert");
    for (name, b) in [("bert_tiny.onnx", "3"), ("squeezenet1_1.onnx", "2")] {
        let src = models_dir().join(name);
        let out = dir.join(format!("b{b}_{name}"));
        let o = qsyncc(&[
            "opt",
            src.to_str().expect("utf8"),
            "--batch",
            b,
            "--dim",
            "seq=128",
            "--passes",
            "infer-shapes",
            "-o",
            out.to_str().expect("utf8"),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let c = rebatch_check(&src, &out, b);
        assert!(
            c.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&c.stdout),
            String::from_utf8_lossy(&c.stderr)
        );
    }
}

#[test]
fn batch_indexing_traced_at_batch_one_is_not_rebatched() {
    // The TorchScript BERT builds its mask with `Range(0, 1)` over the
    // samples and a Gather on the flattened mask: shapes would check at
    // batch 8, but every sample would read sample 0's mask. The loader
    // refuses, names the node, and the graph keeps its batch.
    let src = models_dir().join("bert_tiny.pt");
    let j = inspect_json(&src, &["--batch", "8", "--dim", "seq=128"]);
    assert_eq!(j["fixed_batch"].as_i64(), Some(1), "{j}");
    assert_eq!(j["inputs"][0]["type"], "i64[1,128]", "{j}");
    let w = j["warnings"].to_string();
    assert!(w.contains("could not be rebatched") && w.contains("Gather_64") && w.contains("traced at batch 1"), "{w}");
    assert!(w.contains("planned, predicted and written at batch 1"), "{w}");
}

#[test]
fn codegen_writes_mlir_and_ptx_for_t4_and_v100() {
    for (model, target, sm) in [
        ("squeezenet1_1.onnx", "t4", "sm_75"),
        ("bert_tiny.onnx", "v100", "sm_70"),
        ("bert_tiny.onnx", "t4", "sm_75"),
        ("squeezenet1_1.onnx", "v100", "sm_70"),
    ] {
        let dir = tmpdir(&format!("codegen-{target}-{model}"));
        let path = models_dir().join(model);
        let o = qsyncc(&[
            "codegen",
            path.to_str().expect("utf8"),
            "--target",
            target,
            "--emit",
            "mlir,ptx",
            "-o",
            dir.to_str().expect("utf8"),
        ]);
        assert!(o.status.success(), "{model} {target}: {}", stderr(&o));
        let ptx = std::fs::read_to_string(dir.join("kernels.ptx")).expect("kernels.ptx");
        assert!(ptx.contains(&format!(".target {sm}")), "{model} {target}");
        assert!(ptx.matches(".entry ").count() >= 10, "{model} {target}: too few .entry kernels");
        let mlir = std::fs::read_to_string(dir.join("model.mlir")).expect("model.mlir");
        assert!(mlir.contains("func.func"), "{model}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn codegen_rejects_unknown_targets_and_emit_kinds() {
    let path = models_dir().join("squeezenet1_1.onnx");
    let p = path.to_str().expect("utf8");
    let dir = tmpdir("codegen-bad");
    let d = dir.to_str().expect("utf8");
    let o = qsyncc(&["codegen", p, "--target", "k80", "-o", d]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = qsyncc(&["codegen", p, "--target", "t4", "--emit", "llvm", "-o", d]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = qsyncc(&["codegen", p, "--target", "sm_90", "--emit", "ptx", "-o", d]);
    assert!(o.status.success(), "{}", stderr(&o));
}

fn tiny() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny_mlp.qir")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_planner_is_the_listed_main_command_and_a_subcommand() {
    // The top-level help lists `plan` first, as the main command, with examples.
    let o = qsyncc(&["--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let help = stdout(&o);
    let commands = help.split("Commands:").nth(1).expect("a Commands section");
    let first = commands.split_whitespace().next();
    assert_eq!(first, Some("plan"), "{help}");
    assert!(help.contains("main command") && help.contains("Examples:"), "{help}");
    // `qsyncc help plan` and `qsyncc plan --help` show the planner's flags.
    for args in [vec!["help", "plan"], vec!["plan", "--help"]] {
        let o = qsyncc(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).contains("--targets") && stdout(&o).contains("Examples:"), "{args:?}");
    }
    // `qsyncc plan MODEL …` and `qsyncc MODEL …` write the same plan.
    let dir = tmpdir("plan-sub");
    let m = tiny();
    let m = m.to_str().expect("utf8");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let o = qsyncc(&["plan", m, "--targets", "v100:2,t4:2", "--batch", "8", "-o", a.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = qsyncc(&[m, "--targets", "v100:2,t4:2", "--batch", "8", "-o", b.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let read = |d: &std::path::Path| std::fs::read(d.join("manifest.json")).expect("manifest");
    assert_eq!(read(&a), read(&b));
}

#[test]
fn mistyped_subcommands_are_suggested() {
    let m = models_dir().join("squeezenet1_1.onnx");
    let o = qsyncc(&["inpsect", m.to_str().expect("utf8")]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("unrecognized subcommand 'inpsect'") && e.contains("'inspect'"), "{e}");
    let o = qsyncc(&["simulat", "--targets", "t4"]);
    assert!(stderr(&o).contains("'simulate'"), "{}", stderr(&o));
    // A missing model path is still read as a model, not as a subcommand.
    let o = qsyncc(&["no/such/model.onnx", "--targets", "t4", "-o", "/tmp/qsync-never"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read no/such/model.onnx"), "{}", stderr(&o));
}

#[test]
fn every_help_has_examples_and_opt_documents_its_passes() {
    for sub in ["plan", "inspect", "opt", "simulate", "profile", "codegen", "sync-bench"] {
        let o = qsyncc(&[sub, "--help"]);
        assert!(o.status.success(), "{sub}: {}", stderr(&o));
        assert!(stdout(&o).contains("Examples:"), "{sub} --help has no examples:\n{}", stdout(&o));
    }
    let help = stdout(&qsyncc(&["opt", "--help"]));
    assert!(help.contains("The model to transform"), "MODEL is described: {help}");
    for pass in [
        "infer-shapes",
        "fold-constants",
        "dce",
        "amp",
        "autocast",
        "uniform=P",
        "cascade",
        "campo",
        "comp",
        "egraph-casts",
    ] {
        assert!(help.contains(pass), "--passes lists {pass}: {help}");
    }
}

#[test]
fn one_precision_vocabulary_in_every_command() {
    let m = models_dir().join("squeezenet1_1.onnx");
    let m = m.to_str().expect("utf8");
    // `opt` takes the planner's names and the IR's, and prints the planner's.
    let mut seen = Vec::new();
    for p in ["fp16", "f16"] {
        let o = qsyncc(&["opt", m, "--passes", &format!("uniform={p}"), "--target", "t4", "--json"]);
        assert!(o.status.success(), "uniform={p}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert!(v["precisions"]["fp16"].as_u64().unwrap_or(0) > 0, "{v}");
        assert!(v["precisions"].get("f16").is_none(), "{v}");
        seen.push(v);
    }
    assert_eq!(seen[0], seen[1]);
    let o = qsyncc(&["opt", m, "--passes", "amp(override=*Conv*=fp32)", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // `simulate` takes the IR's names too.
    for p in ["t4=f16", "t4=fp16"] {
        let o = qsyncc(&["simulate", m, "--targets", "t4", "--precision", p, "--json"]);
        assert!(o.status.success(), "{p}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert_eq!(v["devices"]["t4"]["precision"], "fp16");
    }
    // The planner likewise; an unknown name lists both spellings.
    let dir = tmpdir("vocab");
    let t = tiny();
    let o = qsyncc(&[
        t.to_str().expect("utf8"),
        "--targets",
        "v100,t4",
        "--precisions",
        "f32,f16,i8",
        "-o",
        dir.join("p").to_str().expect("utf8"),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert!(v["devices"]["t4"]["precision_histogram"]
        .as_object()
        .expect("hist")
        .keys()
        .all(|k| k.starts_with("fp") || k == "int8" || k == "bf16"));
    let o = qsyncc(&["opt", m, "--passes", "uniform=fp12"]);
    assert_clean_failure(&o, "fp16");
    assert!(stderr(&o).contains("f16"), "{}", stderr(&o));
}

#[test]
fn device_aliases_resolve_with_a_note() {
    let m = models_dir().join("squeezenet1_1.onnx");
    let m = m.to_str().expect("utf8");
    let o = qsyncc(&[
        "simulate",
        m,
        "--targets",
        "a100:2,t4",
        "--memory",
        "a100=50%",
        "--precision",
        "a100=bf16",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("`a100` is taken as `a100-40gb`") && stderr(&o).contains("a100-80gb"),
        "{}",
        stderr(&o)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["devices"]["a100-40gb"]["precision"], "bf16", "{v}");
    let o = qsyncc(&["simulate", m, "--targets", "h100", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert!(v["devices"].get("h100-sxm").is_some(), "{v}");
    let o = qsyncc(&["inspect", m, "--target", "A100"]);
    assert!(o.status.success() && stderr(&o).contains("a100-40gb"), "{}", stderr(&o));
    let o = qsyncc(&["inspect", m, "--target", "a1000"]);
    assert_clean_failure(&o, "a1000");
}

#[test]
fn batch_limits_are_one_constant() {
    let m = models_dir().join("squeezenet1_1.onnx");
    let m = m.to_str().expect("utf8");
    let over = (qsyncc::MAX_DIM + 1).to_string();
    for args in [
        vec!["inspect", m, "--batch", &over],
        vec!["opt", m, "--batch", &over],
        vec!["simulate", m, "--targets", "t4", "--batch", &over],
        vec!["plan", m, "--targets", "t4", "--batch", &over, "-o", "/tmp/qsync-never"],
        vec!["profile", "worklist", m, "--batch", &over, "-o", "/tmp/qsync-never.json"],
        vec!["inspect", m, "--dim", "seq=16777217"],
    ] {
        let o = qsyncc(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains("16777216"), "{args:?}: {}", stderr(&o));
    }
    // At the limit the FLOP share is still a number, not a silent 0.
    let max = qsyncc::MAX_DIM.to_string();
    let o = qsyncc(&["opt", m, "--passes", "uniform=fp16", "--batch", &max, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert!(v["low_precision_flop_fraction"].as_f64().is_some_and(|f| f > 0.9), "{v}");
}

#[test]
fn opt_without_output_prints_a_summary_not_the_ir() {
    let m = models_dir().join("bert_tiny.onnx");
    let m = m.to_str().expect("utf8");
    let o = qsyncc(&["opt", m, "--passes", "amp", "--target", "t4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.len() < 8 << 10, "a summary, not {} bytes of IR", s.len());
    for needle in ["nodes", "MatMul", "fp16", "casts", "predicted", "ms per iteration on t4"] {
        assert!(s.contains(needle), "summary mentions {needle}: {s}");
    }
    assert!(!s.contains("graph \""), "no IR in the summary: {s}");
    // The whole IR on request: `-o -` or `--print-ir`.
    for flag in [vec!["-o", "-"], vec!["--print-ir"]] {
        let mut args = vec!["opt", m, "--passes", "amp"];
        args.extend(flag.iter().copied());
        let o = qsyncc(&args);
        assert!(o.status.success(), "{flag:?}: {}", stderr(&o));
        assert!(stdout(&o).contains("graph \"") && stdout(&o).len() > 64 << 10, "{flag:?}");
    }
}

#[test]
fn calibration_flags_name_one_format_each() {
    let m = models_dir().join("squeezenet1_1.onnx");
    let m = m.to_str().expect("utf8");
    let dir = tmpdir("calflags");
    let f = dir.join("x.json");
    std::fs::write(&f, "{}").expect("write");
    let f = f.to_str().expect("utf8");
    // The old ambiguous flag says which new one to use, in both commands.
    for args in [
        vec!["simulate", m, "--targets", "t4", "--calibration", f],
        vec!["plan", m, "--targets", "t4", "--calibration", f, "-o", "/tmp/qsync-never"],
    ] {
        let o = qsyncc(&args);
        assert_clean_failure(&o, "--profile");
        assert!(stderr(&o).contains("--stats"), "{}", stderr(&o));
    }
    let help = stdout(&qsyncc(&["plan", "--help"]));
    assert!(help.contains("--stats") && help.contains("--profile"), "{help}");
    let help = stdout(&qsyncc(&["simulate", "--help"]));
    assert!(help.contains("--profile") && !help.contains("--calibration"), "{help}");
}
