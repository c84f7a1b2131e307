//! The planner's loading path on a model plus its external-data folder:
//! `qsyncc::load::load_model` (import, shape inference, the external-data
//! check) and `with_external_data_inline` (the weights the indicator
//! reads). Input: a flag byte (bit 0: text IR, else ONNX), the model's
//! length (u16 LE), the model, then the bytes of `w.bin` beside it. The
//! folder also holds `link.bin`, a symbolic link to a trap file outside it,
//! and `up`, a link to the folder above, so escapes are one name away.
//!
//! Properties: no panic, no allocation from a declared size, and no value
//! ever comes from the trap file: every external reference of an accepted
//! model resolves inside the folder, and no weight read in holds the trap's
//! bytes.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use qsync_ir::infer::InferOptions;
use qsync_ir::{TensorData, ValueDef};

const TRAP: &[u8; 16] = b"QSYNC-FUZZ-TRAP!";

fn folder() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("qsync-fuzz-planner-load-{}", std::process::id()));
        let dir = root.join("model");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(root.join("trap.bin"), TRAP.repeat(1 << 12)).expect("trap");
        #[cfg(unix)]
        {
            let _ = std::os::unix::fs::symlink(root.join("trap.bin"), dir.join("link.bin"));
            let _ = std::os::unix::fs::symlink(&root, dir.join("up"));
        }
        dir
    })
}

fn has_trap(bytes: &[u8]) -> bool {
    bytes.len() >= TRAP.len() && bytes.windows(TRAP.len()).any(|w| w == TRAP)
}

fuzz_target!(|data: &[u8]| {
    let [flags, a, b, rest @ ..] = data else { return };
    let n = usize::from(u16::from_le_bytes([*a, *b])).min(rest.len());
    let (model, weights) = rest.split_at(n);
    let dir = folder();
    let path = dir.join(if flags & 1 == 1 { "m.qir" } else { "m.onnx" });
    std::fs::write(&path, model).expect("write model");
    std::fs::write(dir.join("w.bin"), weights).expect("write w.bin");
    let Ok(loaded) = qsyncc::load::load_model(&path, &InferOptions::default(), &[]) else { return };
    let m = &loaded.model;
    let g = &m.graph;
    let base = m.base_dir.as_deref().unwrap_or(Path::new("."));
    for &v in g.inits() {
        if let ValueDef::Init(t) = &g.value(v).def {
            if let TensorData::External { location, .. } = &t.data {
                let r = qsync_ir::tensor::resolve_external(Some(base), location);
                assert!(r.is_ok(), "accepted a reference the loader refuses: {location}: {r:?}");
            }
        }
    }
    if let Ok(Some(inlined)) = qsyncc::load::with_external_data_inline(m) {
        for &v in g.inits() {
            let external = matches!(g.value(v).init(), Some(t) if matches!(t.data, TensorData::External { .. }));
            if let (true, Some(t)) = (external, inlined.value(v).init()) {
                let bytes = t.inline_bytes().unwrap_or(&[]);
                assert!(!has_trap(bytes) || has_trap(weights), "`{}` was read from the trap file", g.value_name(v));
            }
        }
    }
});
