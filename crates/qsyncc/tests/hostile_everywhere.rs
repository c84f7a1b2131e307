//! Attacker-built models through every command. Each model sits in its own
//! folder beside a "trap" file outside it whose bytes are valid weights, so
//! a command that followed the reference would succeed; instead every one
//! of `inspect`, `plan`, `simulate`, `opt -o` and `codegen` must exit with
//! status 2 within a few seconds under a 4 GB address-space limit, naming
//! the model file and the offending entry:
//!
//! - external data at `../trap.bin`, at the trap's absolute path, through a
//!   symbolic link to it, and under a symbolic link to the folder above;
//! - external data declaring 4 TiB (by `length`, and by dims alone) in a
//!   64-byte file, and an offset past the file's end;
//! - TorchScript archives whose parameter is a stride-0 view of one element
//!   with sizes [2^20, 2^20] (4 TiB), or an overlapping view just as large.
//!
//! Every model exists as ONNX and as text IR; a control model in the same
//! layout, reading its own folder, goes through every command successfully
//! (so a refusal is the reference's doing, not the command line's).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{run_within, tmpdir};

/// "A few seconds": the debug build, on a shared machine, for a 16-weight model.
const DEADLINE: Duration = Duration::from_secs(10);
/// Hang guard: past it the child is killed.
const KILL_AFTER: Duration = Duration::from_secs(60);
/// RLIMIT_AS of every run: a declared size that drives an allocation aborts.
const ADDRESS_SPACE: &str = "--as=4294967296";

/// `qsyncc ARGS` under the address-space limit: (exit code, stderr, elapsed).
fn run(args: &[String]) -> (Option<i32>, String, Duration) {
    let mut cmd = Command::new("prlimit");
    cmd.arg(ADDRESS_SPACE).arg("--").arg(env!("CARGO_BIN_EXE_qsyncc")).args(args);
    run_within(cmd, KILL_AFTER)
}

/// Every command on `model`, its outputs under `scratch`.
fn commands(model: &Path, scratch: &Path) -> Vec<Vec<String>> {
    let m = model.display().to_string();
    let out = |name: &str| scratch.join(name).display().to_string();
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        v(&["inspect", &m]),
        v(&["plan", &m, "--targets", "v100:1,t4:1", "--batch", "4", "-o", &out("plan")]),
        v(&["simulate", &m, "--targets", "v100:1,t4:1", "--batch", "4"]),
        v(&["opt", &m, "-o", &out("opt.onnx")]),
        v(&["opt", &m, "-o", &out("opt.qir")]),
        v(&["codegen", &m, "--target", "t4", "-o", &out("codegen")]),
    ]
}

const TRAP: [u8; 64] = [0x3f; 64];

/// `<tmp>/<name>/model/` (returned) beside `<tmp>/<name>/trap.bin`.
fn layout(name: &str) -> (PathBuf, PathBuf) {
    let root = tmpdir(name);
    let dir = root.join("model");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(root.join("trap.bin"), TRAP).expect("trap");
    std::fs::write(dir.join("w.bin"), [0u8; 64]).expect("w.bin");
    (root, dir)
}

/// The text IR of `y = x + w`, `w: f32[dims]` at the given external reference.
fn qir(location: &str, offset: u64, length: Option<u64>, dims: &[u64]) -> String {
    let d: Vec<String> = dims.iter().map(u64::to_string).collect();
    let d = d.join(",");
    let ext = match length {
        Some(l) => format!("external(\"{location}\", {offset}, {l})"),
        None => format!("external(\"{location}\", {offset})"),
    };
    format!(
        "ir_version 8\nopset \"\" 17\ngraph \"g\" {{\n  init %w: f32[{d}] = {ext}\n  input %x: f32[batch,{d}]\n  \
         %y: f32[batch,{d}] = Add \"add\"(%x, %w)\n  output %y\n}}\n"
    )
}

/// Write `<stem>.qir` and `<stem>.onnx` for the reference into `dir`.
fn write_models(dir: &Path, stem: &str, text: &str) -> Vec<PathBuf> {
    let q = dir.join(format!("{stem}.qir"));
    std::fs::write(&q, text).expect("write qir");
    let m = qsync_ir::text::parse_model(text).unwrap_or_else(|e| panic!("{e}"));
    let o = dir.join(format!("{stem}.onnx"));
    std::fs::write(&o, qsync_onnx::export_bytes(&m).expect("export")).expect("write onnx");
    vec![o, q]
}

fn expect_refused(model: &Path, entry: &[&str]) {
    let scratch = tmpdir("hostile-out");
    let file = model.file_name().and_then(|n| n.to_str()).expect("utf8");
    for args in commands(model, &scratch) {
        let (code, stderr, took) = run(&args);
        assert_eq!(code, Some(2), "qsyncc {args:?}: exit {code:?} after {took:?}, stderr:\n{stderr}");
        assert!(!stderr.contains("panicked"), "qsyncc {args:?} panicked:\n{stderr}");
        assert!(stderr.contains(file), "qsyncc {args:?}: the error must name `{file}`:\n{stderr}");
        for e in entry {
            assert!(stderr.contains(e), "qsyncc {args:?}: the error must name `{e}`:\n{stderr}");
        }
        assert!(took < DEADLINE, "qsyncc {args:?} took {took:?}");
    }
}

#[test]
fn the_control_model_goes_through_every_command() {
    let (_root, dir) = layout("control");
    for m in write_models(&dir, "control", &qir("w.bin", 0, Some(64), &[16])) {
        let scratch = tmpdir("control-out");
        for args in commands(&m, &scratch) {
            let (code, stderr, _) = run(&args);
            assert_eq!(code, Some(0), "qsyncc {args:?}: exit {code:?}, stderr:\n{stderr}");
        }
    }
}

#[test]
fn locations_escaping_by_dotdot_or_absolute_paths_are_refused() {
    let (root, dir) = layout("escape");
    let trap = root.join("trap.bin").display().to_string();
    for (stem, loc) in [("dotdot", "../trap.bin".to_string()), ("absolute", trap)] {
        for m in write_models(&dir, stem, &qir(&loc, 0, Some(64), &[16])) {
            expect_refused(&m, &["initializer `w`", &loc]);
        }
    }
}

#[cfg(unix)]
#[test]
fn symbolic_links_out_of_the_folder_are_refused() {
    let (root, dir) = layout("links");
    std::os::unix::fs::symlink(root.join("trap.bin"), dir.join("link.bin")).expect("symlink");
    std::os::unix::fs::symlink(&root, dir.join("up")).expect("symlink");
    for (stem, loc) in [("filelink", "link.bin"), ("dirlink", "up/trap.bin")] {
        for m in write_models(&dir, stem, &qir(loc, 0, Some(64), &[16])) {
            expect_refused(&m, &["initializer `w`", loc, "outside"]);
        }
    }
}

#[test]
fn declared_sizes_beyond_the_file_are_refused() {
    let (_root, dir) = layout("sizes");
    let big = [1u64 << 20, 1 << 20];
    for (stem, text) in [
        ("length4tib", qir("w.bin", 0, Some(1 << 42), &big)),
        ("dims4tib", qir("w.bin", 0, None, &big)),
        ("offsetpast", qir("w.bin", 32, Some(64), &[16])),
    ] {
        for m in write_models(&dir, stem, &text) {
            expect_refused(&m, &["initializer `w`", "w.bin", "64 bytes"]);
        }
    }
}

#[test]
fn torchscript_views_far_beyond_their_storage_are_refused() {
    let (_root, dir) = layout("views");
    for (stem, numel, strides) in [("zerostride", 1i64, [0i64, 0]), ("overlap", 1 << 21, [1, 1])] {
        let m = dir.join(format!("{stem}.pt"));
        std::fs::write(&m, torchscript_archive(numel, &[1 << 20, 1 << 20], &strides)).expect("write pt");
        expect_refused(&m, &["data/0"]);
    }
}

// A `.pt` archive, built by hand: a stored zip (no compression) holding a
// pickled module `__torch__.M` whose parameter `w` is an f32 view of
// storage `data/0`, its code, and a version.

fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
        }
    }
    !c
}

fn stored_zip(members: &[(&str, &[u8])]) -> Vec<u8> {
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for (name, data) in members {
        let offset = out.len() as u32;
        let (crc, size, nlen) = (crc32(data), data.len() as u32, name.len() as u16);
        // Local header: signature, version 20, flags, method 0, time, date.
        out.extend_from_slice(&[0x50, 0x4b, 3, 4, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        for v in [crc, size, size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&nlen.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        central.extend_from_slice(&[0x50, 0x4b, 1, 2, 20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        for v in [crc, size, size] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        central.extend_from_slice(&nlen.to_le_bytes());
        central.extend_from_slice(&[0; 12]); // extra, comment, disk, attributes
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let (cd_offset, cd_size, n) = (out.len() as u32, central.len() as u32, members.len() as u16);
    out.extend_from_slice(&central);
    out.extend_from_slice(&[0x50, 0x4b, 5, 6, 0, 0, 0, 0]);
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&cd_size.to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

fn pickle_int(p: &mut Vec<u8>, v: i64) {
    match i32::try_from(v) {
        Ok(s) => {
            p.push(b'J');
            p.extend_from_slice(&s.to_le_bytes());
        }
        Err(_) => {
            p.extend_from_slice(&[0x8a, 8]);
            p.extend_from_slice(&v.to_le_bytes());
        }
    }
}

fn pickle_str(p: &mut Vec<u8>, s: &str) {
    p.push(b'X');
    p.extend_from_slice(&(s.len() as u32).to_le_bytes());
    p.extend_from_slice(s.as_bytes());
}

fn torchscript_archive(numel: i64, sizes: &[i64], strides: &[i64]) -> Vec<u8> {
    let mut p = b"\x80\x02c__torch__\nM\n)\x81}(".to_vec();
    pickle_str(&mut p, "training");
    p.push(0x89);
    pickle_str(&mut p, "w");
    p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n((");
    pickle_str(&mut p, "storage");
    p.extend_from_slice(b"ctorch\nFloatStorage\n");
    pickle_str(&mut p, "0");
    pickle_str(&mut p, "cpu");
    pickle_int(&mut p, numel);
    p.extend_from_slice(b"tQ");
    pickle_int(&mut p, 0);
    for dims in [sizes, strides] {
        p.push(b'(');
        dims.iter().for_each(|&d| pickle_int(&mut p, d));
        p.push(b't');
    }
    p.extend_from_slice(b"\x89ccollections\nOrderedDict\n)RtRub.");
    let code = "class M(Module):\n  __parameters__ = [\"w\", ]\n  __buffers__ = []\n  training : bool\n  \
                w : Tensor\n  def forward(self: __torch__.M) -> Tensor:\n    return self.w\n";
    let storage = vec![0u8; numel as usize * 4];
    stored_zip(&[
        ("m/data.pkl", &p),
        ("m/code/__torch__.py", code.as_bytes()),
        ("m/data/0", &storage),
        ("m/version", b"3\n"),
    ])
}
