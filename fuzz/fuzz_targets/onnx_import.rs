//! ONNX import on arbitrary bytes: it must return a model or an error,
//! never panic, overflow the stack or allocate from declared sizes; a model
//! it accepts must export, and the export must import again.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(model) = qsync_onnx::import_bytes(data, None, "fuzz.onnx") {
        if let Ok(bytes) = qsync_onnx::export_bytes(&model) {
            let _ = qsync_onnx::import_bytes(&bytes, None, "fuzz-export.onnx");
        }
    }
});
