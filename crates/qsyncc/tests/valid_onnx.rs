//! Every ONNX file qsync writes passes `onnx.checker.check_model(full_check=True)`,
//! whether or not the model's weights are present.
//!
//! For every shared model, for a weightless variant of each model that
//! carries its weights (the same graph with every weight moved to an
//! external-data file that is not written, as real exports of large models
//! arrive), and for a tiny GPT-style graph from `scripts/gen_gpt.py` with and
//! without weights: the planner's per-device `model.onnx`
//! (`qsyncc MODEL --targets v100:16,t4:16 --batch 16 -o DIR`, the default
//! `egraph-casts` pipeline, so refreshed copies of absent weights are
//! written), `opt --passes campo,egraph-casts` (training: refreshed copies)
//! and `opt --passes amp,egraph-casts --mode inference` (weights stored low by
//! materialization and folded by `egraph-casts`). `tests/onnx_check.py` runs
//! the checker, standing in sparse files for absent external data (the
//! checker requires referenced files to exist); a file whose initializer has
//! neither values nor a reference fails. A negative control checks that the
//! script does catch such a file.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{onnx_models, qsyncc, stderr, tmpdir};
use qsync_ir::{TensorData, ValueId};

fn python_with_onnx() {
    let probe = Command::new("python3").args(["-c", "import onnx"]).output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "python3 cannot import onnx ({}): run scripts/setup.sh to install it",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("python3 not runnable ({e}): run scripts/setup.sh"),
    }
}

/// Run `onnx_check.py` on `files`; returns (success, its output).
fn check(files: &[PathBuf]) -> (bool, String) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/onnx_check.py");
    let o = Command::new("python3").arg(script).args(files).output().expect("run onnx_check.py");
    (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

/// `src` with every initializer of more than 1,024 elements moved to
/// external data in `{stem}.weights` — a file that is not written, so the
/// weights are absent. Whether the original had any does not matter.
fn without_weights(src: &Path, dir: &Path) -> PathBuf {
    let mut model = qsync_onnx::import_file(src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    let stem = src.file_stem().and_then(|s| s.to_str()).expect("utf8 stem");
    let location = format!("{stem}.weights");
    let g = &mut model.graph;
    let inits: Vec<ValueId> = g.inits().to_vec();
    let mut offset = 0u64;
    let mut moved = 0;
    for v in inits {
        let Some(t) = g.value(v).init().cloned() else { continue };
        if t.numel() <= 1024 {
            continue;
        }
        let length = t.byte_len();
        let data = TensorData::External { location: location.clone(), offset, length: Some(length) };
        g.set_init(v, qsync_ir::Tensor { data, ..t });
        offset += length.div_ceil(64) * 64;
        moved += 1;
    }
    assert!(moved > 0, "{}: no weights to move", src.display());
    let out = dir.join(format!("{stem}_noweights.onnx"));
    model.base_dir = Some(dir.to_path_buf());
    qsync_onnx::export_file(&model, &out).expect("export the weightless variant");
    assert!(!dir.join(&location).exists());
    out
}

/// Plan and optimize `model`; returns the ONNX files written.
fn written(model: &Path, dir: &Path) -> Vec<PathBuf> {
    let stem = model.file_stem().and_then(|s| s.to_str()).expect("utf8 stem");
    let m = model.to_str().expect("utf8 path");
    let plan = dir.join(format!("{stem}-plan"));
    let o = qsyncc(&[m, "--targets", "v100:16,t4:16", "--batch", "16", "-o", plan.to_str().expect("utf8")]);
    assert!(o.status.success(), "planning {m}: {}", stderr(&o));
    let mut files: Vec<PathBuf> = ["v100", "t4"].iter().map(|d| plan.join(d).join("model.onnx")).collect();
    for (tag, passes, mode) in [("train", "campo,egraph-casts", "training"), ("infer", "amp,egraph-casts", "inference")]
    {
        let out = dir.join(format!("{stem}-{tag}.onnx"));
        let o = qsyncc(&[
            "opt",
            m,
            "--passes",
            passes,
            "--target",
            "t4",
            "--mode",
            mode,
            "--batch",
            "16",
            "-o",
            out.to_str().expect("utf8"),
        ]);
        assert!(o.status.success(), "opt {m} {passes} {mode}: {}", stderr(&o));
        files.push(out);
    }
    for f in &files {
        assert!(f.is_file(), "{} not written", f.display());
    }
    files
}

#[test]
fn every_written_model_passes_the_full_checker_with_or_without_weights() {
    python_with_onnx();
    let dir = tmpdir("valid-onnx");
    let mut models = onnx_models();
    // Weightless variants of the models that carry weights, and a tiny
    // generated decoder both ways.
    for m in onnx_models() {
        let has_weights = std::fs::metadata(&m).map(|md| md.len() > 2_000_000).unwrap_or(false);
        if has_weights {
            models.push(without_weights(&m, &dir));
        }
    }
    let gen = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gen_gpt.py");
    for (name, extra) in [("gpt_tiny.onnx", vec!["--with-weights"]), ("gpt_tiny_noweights.onnx", vec![])] {
        let out = dir.join(name);
        let o = Command::new("python3")
            .arg(&gen)
            .args(["-o", out.to_str().expect("utf8")])
            .args(["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "100", "--positions", "64"])
            .args(["--batch", "batch", "--seq", "32", "--dropout", "0.1"])
            .args(extra)
            .output()
            .expect("run gen_gpt.py");
        assert!(o.status.success(), "gen_gpt.py: {}", String::from_utf8_lossy(&o.stderr));
        models.push(out);
    }
    let absent_variants = models.iter().filter(|m| m.to_string_lossy().contains("noweights")).count();
    assert!(absent_variants >= 3, "expected weightless variants of squeezenet1_1, bert_tiny and the GPT");

    let mut files = Vec::new();
    for m in &models {
        files.extend(written(m, &dir));
    }
    let (ok, out) = check(&files);
    assert!(ok, "onnx.checker failures:\n{out}");
    assert!(out.contains(&format!("checked {} files, 0 failed", files.len())), "{out}");

    // The weightless variants did get low-precision copies of absent
    // weights, written as references (so the check above covered them).
    // (The V100 trains in FP16 AMP, the T4 runs what the plan gives it:
    // either may hold the copies.)
    let mut external = 0;
    for dev in ["v100", "t4"] {
        let planned = qsync_onnx::import_file(dir.join(format!("squeezenet1_1_noweights-plan/{dev}/model.onnx")))
            .expect("import");
        let g = &planned.graph;
        for (c, m) in g.refreshed_copies() {
            let (Some(copy), Some(master)) = (g.value(c).init(), g.value(m).init()) else { panic!("copy and master") };
            // Weights of up to 1,024 elements stayed inline in the variant.
            let TensorData::External { location: ml, .. } = &master.data else { continue };
            let TensorData::External { location, length, .. } = &copy.data else {
                panic!("copy {} of an absent weight is not external data", g.value_name(c))
            };
            assert_eq!(location, &format!("{ml}.{}", copy.dtype));
            assert_eq!(*length, Some(copy.byte_len()));
            external += 1;
        }
    }
    assert!(external > 0, "the plan stores refreshed copies of absent weights");
}

/// The negative control: an initializer with no values and no reference
/// (what the planner used to write for copies of absent weights) fails.
#[test]
fn the_checker_script_rejects_an_initializer_without_values() {
    python_with_onnx();
    let dir = tmpdir("valueless");
    let text = "opset \"\" 17\ngraph \"g\" {\n  init %w: f16[4,4] = absent\n  input %x: f16[2,4]\n  %y: f16[2,4] = MatMul \"mm\"(%x, %w)\n  output %y\n}\n";
    let src = dir.join("m.qir");
    std::fs::write(&src, text).expect("write");
    let out = dir.join("m.onnx");
    let o = qsyncc(&["opt", src.to_str().expect("utf8"), "--passes", "verify", "-o", out.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (ok, report) = check(std::slice::from_ref(&out));
    assert!(!ok && report.contains("initializers without values: w"), "{report}");
}
