//! The importer and the exporter's copy of external data accept only what
//! ONNX allows: a relative location inside the model's folder. `..`,
//! absolute paths and symbolic links resolving outside the folder are
//! refused with an error naming the file, the initializer and the location;
//! declared sizes beyond the data file are refused before anything is read.

mod common;

use std::path::Path;

use prost::Message;
use qsync_onnx::proto::{self, TypeValue};
use qsync_onnx::{export::copy_external_data, import_bytes};

/// A model `Identity(w)` whose f32[16] initializer `w` is external data.
fn model(location: &str, offset: &str, length: &str, dims: Vec<i64>) -> Vec<u8> {
    let entry = |k: &str, v: &str| proto::StringStringEntryProto { key: k.into(), value: v.into() };
    let w = proto::TensorProto {
        name: "w".into(),
        data_type: 1,
        dims,
        data_location: proto::DATA_LOCATION_EXTERNAL,
        external_data: vec![entry("location", location), entry("offset", offset), entry("length", length)],
        ..Default::default()
    };
    let out = proto::ValueInfoProto {
        name: "y".into(),
        r#type: Some(proto::TypeProto {
            value: Some(TypeValue::TensorType(proto::TypeTensor {
                elem_type: 1,
                shape: Some(proto::TensorShapeProto { dim: vec![] }),
            })),
            denotation: String::new(),
        }),
        ..Default::default()
    };
    proto::ModelProto {
        ir_version: 8,
        graph: Some(proto::GraphProto {
            node: vec![proto::NodeProto {
                input: vec!["w".into()],
                output: vec!["y".into()],
                name: "id".into(),
                op_type: "Identity".into(),
                ..Default::default()
            }],
            initializer: vec![w],
            output: vec![out],
            ..Default::default()
        }),
        opset_import: vec![proto::OperatorSetIdProto { domain: String::new(), version: 17 }],
        ..Default::default()
    }
    .encode_to_vec()
}

fn refused(bytes: &[u8], base: &Path, needles: &[&str]) {
    let e = import_bytes(bytes, Some(base), "evil.onnx").map(|_| ()).expect_err("refused").to_string();
    for n in needles {
        assert!(e.contains(n), "`{n}` missing from: {e}");
    }
    assert!(e.contains("evil.onnx"), "{e}");
}

#[test]
fn import_refuses_locations_outside_the_folder() {
    let root = common::temp_dir("ext-refused");
    let dir = root.join("model");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(root.join("trap.bin"), [1u8; 64]).expect("trap");
    std::fs::write(dir.join("w.bin"), [2u8; 64]).expect("w");
    refused(&model("../trap.bin", "0", "64", vec![16]), &dir, &["initializer `w`", "../trap.bin"]);
    let abs = root.join("trap.bin");
    let abs = abs.to_str().expect("utf8");
    refused(&model(abs, "0", "64", vec![16]), &dir, &["initializer `w`", abs]);
    // Also without a folder: the location alone is wrong.
    assert!(import_bytes(&model("../trap.bin", "0", "64", vec![16]), None, "evil.onnx").is_err());
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(root.join("trap.bin"), dir.join("link.bin")).expect("symlink");
        refused(&model("link.bin", "0", "64", vec![16]), &dir, &["initializer `w`", "link.bin", "outside"]);
    }
    // Sizes beyond the file, or contradicting the dims.
    refused(
        &model("w.bin", "0", "4398046511104", vec![1 << 20, 1 << 20]),
        &dir,
        &["initializer `w`", "w.bin", "64 bytes"],
    );
    refused(&model("w.bin", "32", "64", vec![16]), &dir, &["initializer `w`", "w.bin", "offset 32"]);
    refused(&model("w.bin", "0", "8", vec![16]), &dir, &["initializer `w`", "need 64 bytes"]);
    // The plain name inside imports.
    assert!(import_bytes(&model("w.bin", "0", "64", vec![16]), Some(&dir), "ok.onnx").is_ok());
}

#[test]
fn copying_external_data_refuses_locations_outside_the_folder() {
    let root = common::temp_dir("ext-copy");
    let (dir, out) = (root.join("model"), root.join("out"));
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::create_dir_all(&out).expect("mkdir");
    std::fs::write(root.join("trap.bin"), [1u8; 64]).expect("trap");
    for loc in ["../trap.bin".to_string(), root.join("trap.bin").display().to_string()] {
        let text = format!(
            "ir_version 8\nopset \"\" 17\ngraph \"g\" {{\n  init %w: f32[16] = external(\"{loc}\", 0, 64)\n  \
             %y: f32[16] = Relu \"r\"(%w)\n  output %y\n}}\n"
        );
        let m = qsync_ir::text::parse_model(&text).unwrap_or_else(|e| panic!("{e}"));
        let e = copy_external_data(&m, &dir, &out, "out.onnx").expect_err("refused").to_string();
        assert!(e.contains(&loc) && e.contains("out.onnx"), "{e}");
    }
    assert!(std::fs::read_dir(&out).expect("out").next().is_none(), "nothing copied");
}
