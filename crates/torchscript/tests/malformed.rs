//! Bad archives give clean errors, never panics: not a zip, truncated zips,
//! random bytes, a zip without `code/` or `data.pkl`, a corrupt pickle, an
//! unknown opcode, code the parser does not handle (the error names the file
//! and line), and missing input shapes.

use std::io::{Cursor, Read, Write};
use std::path::PathBuf;

use qsync_torchscript::{import_bytes, InputSpec, TsError};

fn archive(name: &str) -> Vec<u8> {
    std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models").join(name))
        .expect("read archive")
}

/// Rewrite an archive, replacing or dropping members (`None` drops).
type Edit<'a> = &'a dyn Fn(&str, Vec<u8>) -> Option<Vec<u8>>;

fn rewrite(bytes: &[u8], edit: Edit) -> Vec<u8> {
    let mut zin = zip::ZipArchive::new(Cursor::new(bytes)).expect("zip");
    let mut out = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..zin.len() {
        let mut f = zin.by_index(i).expect("entry");
        let name = f.name().to_string();
        let mut data = Vec::new();
        f.read_to_end(&mut data).expect("read entry");
        if let Some(d) = edit(&name, data) {
            out.start_file(name, opts).expect("start");
            out.write_all(&d).expect("write");
        }
    }
    out.finish().expect("finish").into_inner()
}

fn err(bytes: &[u8]) -> TsError {
    match import_bytes(bytes, "bad.pt", &[]) {
        Ok(_) => panic!("imported a bad archive"),
        Err(e) => e,
    }
}

#[test]
fn not_a_zip() {
    let e = err(b"this is not a zip file at all");
    assert!(matches!(e, TsError::NotArchive { .. }), "{e}");
    assert!(e.to_string().starts_with("bad.pt:"), "{e}");
    assert!(matches!(err(b""), TsError::NotArchive { .. }));
}

#[test]
fn truncated_zips_and_random_bytes_never_panic() {
    let good = archive("squeezenet1_1.pt");
    let mut n = 0;
    while n < good.len() {
        assert!(import_bytes(&good[..n], "t.pt", &[]).is_err(), "prefix {n} imported");
        n = n * 2 + 1;
    }
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..200 {
        let mut b: Vec<u8> = (0..512).map(|_| rnd() as u8).collect();
        b[..4].copy_from_slice(b"PK\x03\x04");
        assert!(import_bytes(&b, "r.pt", &[]).is_err());
    }
    // Flip bytes inside data.pkl's region of a real archive.
    for k in 0..50 {
        let mut b = good.clone();
        let i = 200 + (rnd() as usize % 8000);
        b[i] ^= (k as u8) | 1;
        let _ = import_bytes(&b, "f.pt", &[]);
    }
}

#[test]
fn zip_without_code_or_data() {
    let good = archive("squeezenet1_1.pt");
    let no_code = rewrite(&good, &|n, d| (!n.contains("/code/")).then_some(d));
    let e = err(&no_code);
    assert!(matches!(&e, TsError::Missing { member, .. } if member == "code/"), "{e}");
    let no_data = rewrite(&good, &|n, d| (!n.ends_with("/data.pkl")).then_some(d));
    let e = err(&no_data);
    assert!(matches!(&e, TsError::Missing { member, .. } if member == "data.pkl"), "{e}");
}

#[test]
fn truncated_pickle_and_unknown_opcode() {
    let good = archive("squeezenet1_1.pt");
    let trunc = rewrite(&good, &|n, d| Some(if n.ends_with("/data.pkl") { d[..d.len() / 2].to_vec() } else { d }));
    let e = err(&trunc);
    assert!(matches!(&e, TsError::Pickle { member, .. } if member == "data.pkl"), "{e}");
    let bad_op = rewrite(&good, &|n, mut d| {
        if n.ends_with("/data.pkl") {
            d[2] = 0xfe;
        }
        Some(d)
    });
    let e = err(&bad_op);
    assert!(e.to_string().contains("unknown or unsupported opcode 0xfe"), "{e}");
}

#[test]
fn unsupported_syntax_names_file_and_line() {
    let good = archive("squeezenet1_1.pt");
    let bad = rewrite(&good, &|n, d| {
        if n.ends_with("code/__torch__/torch/nn/modules/conv.py") {
            let s = String::from_utf8(d).expect("utf8").replacen(
                "    bias = self.bias\n",
                "    bias = lambda: self.bias\n",
                1,
            );
            Some(s.into_bytes())
        } else {
            Some(d)
        }
    });
    let e = err(&bad);
    match &e {
        TsError::Code { member, line, .. } => {
            assert_eq!(member, "code/__torch__/torch/nn/modules/conv.py");
            assert!(*line > 1, "{e}");
        }
        _ => panic!("expected a code error, got {e}"),
    }
}

#[test]
fn inputs_without_shapes_need_input_specs() {
    let good = archive("squeezenet1_1.pt");
    let untraced = rewrite(&good, &|n, d| (!n.contains("traced_inputs")).then_some(d));
    let e = err(&untraced);
    assert!(e.to_string().contains("--input x="), "{e}");
    let spec = InputSpec::parse("x=f32[batch,3,224,224]").expect("spec");
    let (m, _) = import_bytes(&untraced, "u.pt", &[spec]).expect("imports with --input");
    let out = m.graph.outputs()[0];
    assert_eq!(m.graph.ty(out).to_string(), "f32[batch,1000]");
    assert!(InputSpec::parse("x").is_err());
    assert!(InputSpec::parse("x=f99[1]").is_err());
}
