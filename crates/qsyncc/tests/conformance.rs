//! The ONNX backend node tests (shipped in the pinned `onnx` wheel) through
//! `qsyncc`: `scripts/onnx_conformance.py` on a deterministic sample (every
//! 12th model, to stay within a couple of minutes on two cores). The script
//! fails on any crash, undocumented refusal, wrong inferred shape, invalid
//! written model or round trip that changes onnxruntime's outputs, and
//! prints its counts. The full run is the script without `--every`.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn onnx_backend_node_tests_sample() {
    let probe = Command::new("python3").args(["-c", "import onnx, onnxruntime, numpy"]).output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "python3 cannot import onnx, onnxruntime and numpy ({}): run scripts/setup.sh",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("python3 not runnable ({e}): run scripts/setup.sh"),
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/onnx_conformance.py");
    let o = Command::new("python3")
        .arg(&script)
        .args(["--qsyncc", env!("CARGO_BIN_EXE_qsyncc"), "--every", "12"])
        .output()
        .expect("run onnx_conformance.py");
    let stdout = String::from_utf8_lossy(&o.stdout);
    eprintln!("{stdout}");
    assert!(o.status.success(), "conformance failures:\n{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("crashed: 0"), "{stdout}");
}
