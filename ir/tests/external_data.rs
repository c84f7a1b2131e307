//! External tensor data is read only from where ONNX allows — a relative
//! location inside the model's folder — and only within the sizes the file
//! has. Absolute locations, `..`, and symbolic links that resolve outside
//! the folder are refused before anything is opened; a declared length or
//! offset beyond the file, or a length the dims contradict, is refused
//! before anything is allocated. A missing file is absent values, as before.

use std::path::{Path, PathBuf};

use qsync_ir::tensor::{check_model_external_data, resolve_external};
use qsync_ir::text::parse_model;
use qsync_ir::{DType, Tensor, TensorData};

/// `<tmp>/…/model/` holding `w.bin` (64 bytes), beside `trap.bin` outside it.
fn folder(name: &str) -> (PathBuf, PathBuf) {
    let root = std::env::temp_dir().join(format!("qsync-ir-ext-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let model = root.join("model");
    std::fs::create_dir_all(&model).expect("mkdir");
    std::fs::write(model.join("w.bin"), [7u8; 64]).expect("write w.bin");
    std::fs::write(root.join("trap.bin"), [0xEEu8; 64]).expect("write trap.bin");
    (root, model)
}

fn ext(location: &str, offset: u64, length: Option<u64>, dims: Vec<i64>) -> Tensor {
    Tensor { dtype: DType::F32, dims, data: TensorData::External { location: location.into(), offset, length } }
}

/// `load` must refuse the reference with an error mentioning `needle`.
fn refused(t: &Tensor, base: &Path, needle: &str) {
    match t.load(Some(base)) {
        Ok(v) => panic!("{:?} loaded ({} bytes)", t.data, v.map_or(0, |b| b.len())),
        Err(e) => assert!(e.to_string().contains(needle), "{:?}: {e}", t.data),
    }
}

#[test]
fn locations_outside_the_folder_are_refused() {
    let (root, model) = folder("outside");
    let trap = root.join("trap.bin");
    let abs = trap.to_str().expect("utf8");
    for loc in ["../trap.bin", abs, "./../trap.bin", "sub/../../trap.bin", "./w.bin", ""] {
        refused(&ext(loc, 0, Some(64), vec![16]), &model, "");
        assert!(resolve_external(Some(&model), loc).is_err(), "{loc}");
    }
    refused(&ext("../trap.bin", 0, Some(64), vec![16]), &model, "../trap.bin");
    // The plain name inside reads.
    let ok = ext("w.bin", 0, Some(64), vec![16]).load(Some(&model)).expect("io");
    assert_eq!(ok.as_deref(), Some(&[7u8; 64][..]));
}

#[cfg(unix)]
#[test]
fn symbolic_links_out_of_the_folder_are_refused() {
    let (root, model) = folder("links");
    std::os::unix::fs::symlink(root.join("trap.bin"), model.join("link.bin")).expect("symlink");
    std::os::unix::fs::symlink(&root, model.join("up")).expect("symlink dir");
    std::os::unix::fs::symlink("w.bin", model.join("inside.bin")).expect("symlink inside");
    refused(&ext("link.bin", 0, Some(64), vec![16]), &model, "outside the model's folder");
    refused(&ext("up/trap.bin", 0, Some(64), vec![16]), &model, "outside the model's folder");
    // A link that stays inside is fine.
    let ok = ext("inside.bin", 0, Some(64), vec![16]).load(Some(&model)).expect("io");
    assert_eq!(ok.as_deref(), Some(&[7u8; 64][..]));
}

#[test]
fn declared_sizes_are_checked_against_the_file_before_reading() {
    let (_root, model) = folder("sizes");
    // 4 TiB declared, 64 bytes present.
    refused(&ext("w.bin", 0, Some(1 << 42), vec![1 << 20, 1 << 20]), &model, "the file holds 64 bytes");
    // Dims alone (no length) far beyond the file.
    refused(&ext("w.bin", 0, None, vec![1 << 20, 1 << 20]), &model, "the file holds 64 bytes");
    // A length the dims contradict.
    refused(&ext("w.bin", 0, Some(8), vec![16]), &model, "need 64 bytes");
    // offset + length past u64::MAX.
    refused(&ext("w.bin", u64::MAX - 8, Some(64), vec![16]), &model, "at offset");
    refused(&ext("w.bin", 8, Some(64), vec![16]), &model, "the file holds 64 bytes");
    // A missing file is absent values, not an error.
    assert_eq!(ext("gone.bin", 0, Some(64), vec![16]).load(Some(&model)).expect("io"), None);
}

#[test]
fn a_text_model_names_the_refused_initializer_and_location() {
    let (_root, model) = folder("text");
    let text = "ir_version 8\nopset \"\" 17\ngraph \"g\" {\n  init %w: f32[16] = external(\"../trap.bin\", 0, 64)\n  \
                %y: f32[16] = Relu \"r\"(%w)\n  output %y\n}\n";
    let mut m = parse_model(text).unwrap_or_else(|e| panic!("{e}"));
    m.base_dir = Some(model.clone());
    let e = check_model_external_data(&m).expect_err("refused");
    assert!(e.contains("initializer `w`") && e.contains("../trap.bin"), "{e}");
}
