//! No input bytes make the importer panic; every error names the file.

mod common;

use qsync_onnx::{import_bytes, import_file, OnnxError};

/// A simple seeded linear congruential generator (no `rand` crate).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn assert_err_names(bytes: &[u8], label: &str) -> OnnxError {
    let r = std::panic::catch_unwind(|| import_bytes(bytes, None, label));
    let r = r.unwrap_or_else(|_| panic!("importer panicked on {label}"));
    let e = match r {
        Ok(_) => panic!("{label}: imported without error"),
        Err(e) => e,
    };
    assert!(e.to_string().contains(label), "error does not name the file: {e}");
    e
}

#[test]
fn truncated_prefixes_of_a_real_model_are_errors() {
    let path = common::models_dir().join("resnet50_train.onnx");
    let bytes = std::fs::read(&path).expect("read model");
    let n = bytes.len();
    let mut cuts: Vec<usize> = (1..64).collect();
    cuts.extend((1..200).map(|i| i * n / 200));
    cuts.push(n - 1);
    for cut in cuts {
        let label = format!("trunc{cut}.onnx");
        let r = std::panic::catch_unwind(|| import_bytes(&bytes[..cut], None, &label));
        match r {
            Err(_) => panic!("panic on prefix of {cut} bytes"),
            Ok(Err(e)) => assert!(e.to_string().contains(&label), "{e}"),
            // A prefix can end exactly between top-level fields and still be
            // a valid model only if the graph is complete; that is not the
            // case for any prefix that cuts into the graph.
            Ok(Ok(m)) => panic!("prefix of {cut} bytes imported ({} nodes)", m.graph.node_count()),
        }
    }
}

#[test]
fn random_bytes_are_errors() {
    let mut rng = Lcg(0x5eed);
    for i in 0..500 {
        let len = 1 + (rng.next() % 2000) as usize;
        let bytes = rng.bytes(len);
        assert_err_names(&bytes, &format!("random{i}.onnx"));
    }
}

#[test]
fn corrupted_real_model_never_panics() {
    let path = common::models_dir().join("vgg16_bn.onnx");
    let bytes = std::fs::read(&path).expect("read model");
    let mut rng = Lcg(42);
    for i in 0..300 {
        let mut b = bytes.clone();
        for _ in 0..1 + rng.next() % 8 {
            let at = (rng.next() as usize) % b.len();
            b[at] = rng.next() as u8;
        }
        let label = format!("corrupt{i}.onnx");
        let r = std::panic::catch_unwind(|| import_bytes(&b, None, &label));
        match r {
            Err(_) => panic!("panic on corruption {i}"),
            Ok(Err(e)) => assert!(e.to_string().contains(&label), "{e}"),
            Ok(Ok(_)) => {} // a flipped byte inside a name or weight is still a model
        }
    }
}

#[test]
fn empty_file_is_an_error() {
    let e = assert_err_names(b"", "empty.onnx");
    assert!(matches!(e, OnnxError::Empty { .. }), "{e}");
    let dir = common::temp_dir("empty");
    let p = dir.join("empty.onnx");
    std::fs::write(&p, b"").expect("write");
    let e = import_file(&p).expect_err("empty file");
    assert!(e.to_string().contains("empty.onnx"), "{e}");
}

#[test]
fn text_and_zip_are_not_onnx() {
    let e = assert_err_names(b"hello, this is a text file\nnot a model\n", "notes.txt");
    assert!(matches!(e, OnnxError::NotOnnx { .. }), "{e}");
    let e = assert_err_names(b"ir_version: 8\ngraph { node { op_type: \"Relu\" } }\n", "model.onnxtxt");
    assert!(matches!(e, OnnxError::NotOnnx { .. }), "{e}");
    let mut zip = b"PK\x03\x04\x14\x00\x00\x00\x08\x00".to_vec();
    zip.extend(Lcg(7).bytes(300));
    let e = assert_err_names(&zip, "model.pt");
    assert!(matches!(e, OnnxError::NotOnnx { .. }), "{e}");
    let pt = common::models_dir().join("squeezenet1_1.pt");
    let e = import_file(&pt).expect_err("TorchScript archive");
    assert!(matches!(e, OnnxError::NotOnnx { .. }) && e.to_string().contains("squeezenet1_1.pt"), "{e}");
}

#[test]
fn missing_file_is_an_io_error() {
    let e = import_file("/nonexistent/dir/model.onnx").expect_err("missing file");
    assert!(matches!(e, OnnxError::Io { .. }) && e.to_string().contains("model.onnx"), "{e}");
}
