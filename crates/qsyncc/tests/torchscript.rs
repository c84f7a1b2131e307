//! `qsyncc` on TorchScript archives: the shared `.pt` files inspect with
//! every shape known, the module's parameter count, and the same number of
//! convolutions and matrix multiplications (and FLOPs within 1%) as their
//! ONNX exports; `--input` gives symbolic shapes; bad archives exit 2.

mod common;

use common::{inspect_json, models_dir, qsyncc};

fn count(j: &serde_json::Value, ops: &[&str]) -> u64 {
    ops.iter().map(|o| j["ops"][*o].as_u64().unwrap_or(0)).sum()
}

#[test]
fn shared_archives_match_their_onnx_exports() {
    for (name, params) in [("squeezenet1_1", 1_235_496u64), ("bert_tiny", 610_176)] {
        let ts = inspect_json(&models_dir().join(format!("{name}.pt")), &[]);
        let onnx = inspect_json(&models_dir().join(format!("{name}.onnx")), &[]);
        assert_eq!(ts["format"], "torchscript");
        assert_eq!(ts["unknown_shapes"], 0, "{name}");
        assert_eq!(ts["parameters"].as_u64(), Some(params), "{name}");
        assert_eq!(count(&ts, &["Conv", "ConvTranspose"]), count(&onnx, &["Conv", "ConvTranspose"]), "{name}: convs");
        assert_eq!(count(&ts, &["MatMul", "Gemm"]), count(&onnx, &["MatMul", "Gemm"]), "{name}: matmuls");
        let (a, b) = (ts["flops_total"].as_f64().unwrap_or(0.0), onnx["flops_total"].as_f64().unwrap_or(1.0));
        assert!((a - b).abs() / b < 0.01, "{name}: FLOPs {a} vs {b}");
    }
}

#[test]
fn input_flag_gives_symbolic_shapes() {
    let j = inspect_json(
        &models_dir().join("bert_tiny.pt"),
        &["--input", "input_ids=i64[batch,seq]", "--input", "attention_mask=i64[batch,seq]"],
    );
    assert_eq!(j["unknown_shapes"], 0);
    assert_eq!(j["outputs"][0]["type"], "f32[batch,seq,128]");
    let j = inspect_json(&models_dir().join("squeezenet1_1.pt"), &["--input", "x=f32[N,3,224,224]", "--batch", "4"]);
    assert_eq!(j["outputs"][0]["type"], "f32[4,1000]");
    // The same flag retypes ONNX inputs (this export fixes its batch in a reshape, so keep 1).
    let j = inspect_json(&models_dir().join("squeezenet1_1.onnx"), &["--input", "x=f32[1,3,112,112]"]);
    assert_eq!(j["inputs"][0]["type"], "f32[1,3,112,112]");
    let p = models_dir().join("squeezenet1_1.onnx");
    let o = qsyncc(&["inspect", p.to_str().expect("utf8"), "--input", "nosuch=f32[1]"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn opt_accepts_archives() {
    let p = models_dir().join("squeezenet1_1.pt");
    let o = qsyncc(&["opt", p.to_str().expect("utf8"), "--passes", "infer-shapes,dce"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn bad_archives_exit_2() {
    let dir = std::env::temp_dir().join(format!("qsyncc-ts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let good = std::fs::read(models_dir().join("bert_tiny.pt")).expect("read");
    let cases: [(&str, Vec<u8>); 3] = [
        ("random.pt", (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()),
        ("trunc.pt", good[..good.len() / 3].to_vec()),
        ("empty.pt", Vec::new()),
    ];
    for (n, bytes) in cases {
        let p = dir.join(n);
        std::fs::write(&p, bytes).expect("write");
        let o = qsyncc(&["inspect", p.to_str().expect("utf8")]);
        assert_eq!(o.status.code(), Some(2), "{n}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(n) && !err.contains("panicked"), "{n}: {err}");
    }
    let p = models_dir().join("squeezenet1_1.pt");
    let o = qsyncc(&["inspect", p.to_str().expect("utf8"), "--input", "x"]);
    assert_eq!(o.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}
