//! Exports real models and checks them with the Python `onnx` checker and
//! onnxruntime (`tests/interop.py`).

mod common;

use std::path::PathBuf;
use std::process::Command;

use qsync_onnx::{export_file, import_file};

const MODELS: [&str; 5] = ["squeezenet1_1", "bert_tiny", "resnet50_train", "bert_base_train", "vgg16_bn"];

#[test]
fn exported_models_pass_checker_and_onnxruntime() {
    let probe = Command::new("python3").args(["-c", "import onnx, onnxruntime"]).output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "python3 cannot import onnx and onnxruntime ({}): run scripts/setup.sh to install them",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => {
            panic!("python3 not runnable ({e}): run scripts/setup.sh to install python3 with onnx and onnxruntime")
        }
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop.py");
    let dir = common::temp_dir("interop");
    let mut failures = Vec::new();
    for name in MODELS {
        let src = common::models_dir().join(format!("{name}.onnx"));
        let model = import_file(&src).unwrap_or_else(|e| panic!("{e}"));
        let out = dir.join(format!("{name}.onnx"));
        export_file(&model, &out).unwrap_or_else(|e| panic!("{e}"));
        let o = Command::new("python3").arg(&script).arg(&src).arg(&out).output().expect("run interop.py");
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        eprintln!("{name}: {}", text.trim());
        if !o.status.success() {
            failures.push(format!("{name}: {}", text.trim()));
        }
    }
    assert!(failures.is_empty(), "interop failures:\n{}", failures.join("\n"));
}
