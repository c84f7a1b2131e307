//! Whole shared models through MLIR on the CPU against onnxruntime: the
//! emitted module runs with every argument a constant — the graph inputs
//! from a seeded generator, the initializers the model's own weights, both as
//! hex `dense<"0x…">` literals of the raw little-endian buffers — and its
//! outputs are compared with onnxruntime's on the same ONNX file and inputs.
//! Skipped, with the reason printed, when the MLIR tools or runner libraries
//! (see `common`) or python3 with numpy and onnxruntime are missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_ir::{DType, Model, Op};

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/models")
}

fn load(name: &str) -> Model {
    let mut m = qsync_onnx::import_file(models_dir().join(format!("{name}.onnx"))).expect("import");
    let opset = m.opset();
    infer_shapes(&mut m.graph, opset, &InferOptions::default());
    m
}

/// Imported, then planned like `qsyncc opt MODEL --passes SPEC --target t4`.
fn planned(name: &str, spec: &str) -> Model {
    let mut m = load(name);
    let pm = qsync_passes::pipeline_from_spec(spec).expect("pipeline");
    let mut cx = qsync_passes::PassContext { target: Some("t4".into()), ..Default::default() };
    pm.run(&mut m, &mut cx).expect(spec);
    m
}

/// Whether python3 imports numpy and onnxruntime; prints why not.
fn onnxruntime_present() -> bool {
    match Command::new("python3").args(["-c", "import numpy, onnxruntime"]).output() {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr);
            eprintln!(
                "skipping the onnxruntime comparison: python3 cannot import numpy and onnxruntime: {}",
                why.trim()
            );
            false
        }
        Err(e) => {
            eprintln!("skipping the onnxruntime comparison: python3 is not runnable: {e}");
            false
        }
    }
}

/// SplitMix64: a deterministic stream for the inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn f32_bytes(vals: impl IntoIterator<Item = f32>) -> Vec<u8> {
    vals.into_iter().flat_map(f32::to_le_bytes).collect()
}

fn i64_bytes(vals: impl IntoIterator<Item = i64>) -> Vec<u8> {
    vals.into_iter().flat_map(i64::to_le_bytes).collect()
}

/// The MLIR tensor type and its `dense<"0x…">` literal holding `bytes`, the
/// ONNX raw layout (little-endian, bools one a byte). MLIR reads a hex
/// literal as the attribute's raw buffer: little-endian elements, except
/// `i1`, packed eight a byte from the least significant bit.
fn hex_literal(dtype: DType, dims: &[i64], bytes: &[u8]) -> (String, String) {
    let elem = match dtype {
        DType::F64 => "f64",
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I64 | DType::U64 => "i64",
        DType::I32 | DType::U32 => "i32",
        DType::I16 | DType::U16 => "i16",
        DType::I8 | DType::U8 => "i8",
        DType::Bool => "i1",
        other => panic!("no hex literal for {other:?} tensors"),
    };
    let n: usize = dims.iter().map(|&d| usize::try_from(d).expect("static dim")).product();
    assert!(n > 0, "empty tensors have no hex literal");
    let packed: Vec<u8>;
    let raw = if dtype == DType::Bool {
        assert_eq!(bytes.len(), n, "one byte a bool");
        packed = bytes
            .chunks(8)
            .map(|c| c.iter().enumerate().fold(0u8, |acc, (i, &b)| acc | (u8::from(b != 0) << i)))
            .collect();
        &packed[..]
    } else {
        assert_eq!(bytes.len() as u64, dtype.storage_bytes(n as u64), "{dtype:?}{dims:?}: buffer size");
        bytes
    };
    // The buffer holds every element, so MLIR never reads it as a splat (one
    // element's worth) unless it is one: for `i1` a single byte 0x00 or 0xFF
    // when n ≤ 8, which as a splat means the same values.
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut lit = String::with_capacity(2 * raw.len() + 12);
    lit.push_str("dense<\"0x");
    for &b in raw {
        lit.push(char::from(HEX[usize::from(b >> 4)]));
        lit.push(char::from(HEX[usize::from(b & 15)]));
    }
    lit.push_str("\">");
    let ty = format!("tensor<{}{elem}>", dims.iter().map(|d| format!("{d}x")).collect::<String>());
    (ty, lit)
}

fn dims(m: &Model, v: qsync_ir::ValueId) -> Vec<i64> {
    m.graph.ty(v).concrete_shape().expect("static shape").to_vec()
}

/// Emits `m`, runs it with `inputs` (raw bytes per graph input) and the
/// model's initializers, and returns its outputs (f32 each).
fn run_mlir(tag: &str, m: &Model, inputs: &[Vec<u8>]) -> Vec<Vec<f64>> {
    let g = &m.graph;
    let out = qsync_codegen::emit_mlir_model(m, "model").unwrap_or_else(|e| panic!("{tag}: {e}"));
    assert!(out.all_ops_mapped(), "{tag}: generic ops {:?}", out.generic_ops);
    assert!(!out.rng_offset, "{tag}: inference draws no random numbers");
    let mut args = Vec::new();
    for (&v, bytes) in g.inputs().iter().zip(inputs) {
        args.push(hex_literal(g.ty(v).dtype.expect("input dtype"), &dims(m, v), bytes));
    }
    for &v in g.inits() {
        let t = g.value(v).init().expect("initializer");
        let bytes = t.load(m.base_dir.as_deref()).expect("read weights").expect("the model holds its weights");
        assert_eq!(t.dims, dims(m, v), "{tag}: {}", g.value_name(v));
        args.push(hex_literal(t.dtype, &t.dims, &bytes));
    }
    let rtys: Vec<String> = g
        .outputs()
        .iter()
        .map(|&v| {
            assert_eq!(g.ty(v).dtype, Some(DType::F32), "{tag}: f32 outputs");
            common::f32_result_type(g, v)
        })
        .collect();
    let call: Vec<(&str, &str)> = args.iter().map(|(t, l)| (t.as_str(), l.as_str())).collect();
    common::run_module(tag, &out.text, "model", &rtys, &[call]).remove(0)
}

/// Loads each input (raw bytes, dtype and shape from the feed list) with
/// numpy, runs the model in onnxruntime on the CPU and prints each output on
/// one line.
const ORT_SCRIPT: &str = r#"
import sys
import numpy as np
import onnxruntime as ort
model, feed_list = sys.argv[1], sys.argv[2]
feeds = {}
for line in open(feed_list):
    path, name, dtype, shape = line.rstrip("\n").split("\t")
    feeds[name] = np.fromfile(path, dtype=dtype).reshape([int(d) for d in shape.split(",") if d])
sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
for out in sess.run(None, feeds):
    print(" ".join(repr(float(x)) for x in out.astype(np.float64).ravel()))
"#;

/// onnxruntime's outputs of the ONNX file `path` (a graph like `m`) on `inputs`.
fn run_onnxruntime(tag: &str, path: &Path, m: &Model, inputs: &[Vec<u8>]) -> Vec<Vec<f64>> {
    let dir = std::env::temp_dir().join(format!("qsync-ort-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut list = String::new();
    for (i, (&v, bytes)) in m.graph.inputs().iter().zip(inputs).enumerate() {
        let file = dir.join(format!("in{i}.bin"));
        std::fs::write(&file, bytes).expect("write input");
        let dtype = match m.graph.ty(v).dtype {
            Some(DType::F32) => "float32",
            Some(DType::F16) => "float16",
            Some(DType::I64) => "int64",
            Some(DType::I32) => "int32",
            Some(DType::Bool) => "bool",
            d => panic!("{tag}: input of type {d:?}"),
        };
        let shape: Vec<String> = dims(m, v).iter().map(i64::to_string).collect();
        list.push_str(&format!("{}\t{}\t{dtype}\t{}\n", file.display(), m.graph.value_name(v), shape.join(",")));
    }
    let feed_list = dir.join("feeds.tsv");
    std::fs::write(&feed_list, list).expect("write feed list");
    let start = std::time::Instant::now();
    let out = Command::new("python3").arg("-c").arg(ORT_SCRIPT).arg(path).arg(&feed_list).output().expect("python3");
    eprintln!("{tag}: onnxruntime {:.1} s", start.elapsed().as_secs_f64());
    assert!(out.status.success(), "{tag}: onnxruntime failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().map(|s| s.parse::<f64>().expect("printed float")).collect())
        .collect()
}

/// Asserts every output within `rel · max(1, max |ref|)` of the reference
/// (per output) and returns the largest |diff| seen, relative to that scale.
fn compare(tag: &str, m: &Model, got: &[Vec<f64>], want: &[Vec<f64>], rel: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{tag}: number of outputs");
    let mut worst = 0.0f64;
    for ((&v, g), w) in m.graph.outputs().iter().zip(got).zip(want) {
        let name = m.graph.value_name(v);
        let numel: i64 = dims(m, v).iter().product();
        assert_eq!(g.len(), w.len(), "{tag} {name}: element counts");
        assert_eq!(g.len() as i64, numel, "{tag} {name}: every element printed (a NaN prints as none)");
        let peak = w.iter().fold(0.0f64, |a, x| a.max(x.abs()));
        let scale = peak.max(1.0);
        let (at, diff) = g.iter().zip(w).map(|(a, b)| (a - b).abs()).enumerate().fold((0, 0.0f64), |best, (i, d)| {
            if d > best.1 {
                (i, d)
            } else {
                best
            }
        });
        eprintln!(
            "{tag} {name}: {numel} values, max |diff| {diff:.3e} (at {at}: {} vs {}), max |ref| {peak:.3e}",
            g[at], w[at]
        );
        assert!(diff.is_finite() && diff <= rel * scale, "{tag} {name}: max |diff| {diff:e} > {rel:e} · {scale:e}");
        worst = worst.max(diff / scale);
    }
    worst
}

fn squeezenet_input(m: &Model) -> Vec<Vec<u8>> {
    let x = m.graph.inputs()[0];
    let n: i64 = dims(m, x).iter().product();
    let mut rng = Rng(1);
    vec![f32_bytes((0..n).map(|_| rng.unit()))]
}

/// Tolerance for FP32 against FP32: the emitted loops sum each convolution
/// window and the pooling means in their own order (input channel outermost,
/// then the window), onnxruntime in MLAS's blocked GEMM order; each order
/// rounds differently, a few ulps per sum, and the differences pass through
/// 26 convolutions. 1e-4 of the output scale leaves room for that and is far
/// below any lowering error (a wrong tap, pad or bias moves logits by ≫1e-2).
const FP32_REL: f64 = 1e-4;

#[test]
fn squeezenet_fp32_matches_onnxruntime() {
    if !common::tools_present() || !onnxruntime_present() {
        return;
    }
    let m = load("squeezenet1_1");
    let inputs = squeezenet_input(&m);
    let got = run_mlir("squeezenet_fp32", &m, &inputs);
    let want = run_onnxruntime("squeezenet_fp32", &models_dir().join("squeezenet1_1.onnx"), &m, &inputs);
    compare("squeezenet_fp32", &m, &got, &want, FP32_REL);
}

/// Tolerance for the f16 plan (amp for a T4: every convolution in f16,
/// f32 model input and output). The reference is onnxruntime running the
/// planned graph exported to ONNX, but its CPU provider has no f16 `Conv`
/// kernel on x86: it computes those nodes in f32 between inserted casts and
/// drops some of the plan's f32→f16→f32 cast pairs as it goes (what it drops
/// depends on the optimization level), so it rounds to f16 less often than
/// the plan says. Both accumulate in f32 (the emitted convolutions round
/// each sum once to f16, relative step 2⁻¹¹ ≈ 4.9e-4), through 26 layers:
/// the two end up under 1e-4 of the output scale apart, and about 4e-4 from
/// the FP32 model, which is checked too. 1e-2 of the scale (ten f16 steps)
/// bounds that with margin and still fails on any lowering error.
const F16_REL: f64 = 1e-2;

/// `model` after `amp` for a T4, run through MLIR on `inputs`, against
/// onnxruntime on the exported plan and on the FP32 model.
fn amp_plan_matches_onnxruntime(model: &str, inputs: impl FnOnce(&Model) -> Vec<Vec<u8>>) {
    if !common::tools_present() || !onnxruntime_present() {
        return;
    }
    let m = planned(model, "amp");
    let dir = std::env::temp_dir().join(format!("qsync-amp-{model}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let onnx = dir.join(format!("{model}.amp.onnx"));
    // The export holds the initializers (the FP32 master weights, cast by the
    // plan's Cast nodes).
    qsync_onnx::export_file(&m, &onnx).expect("export");
    let inputs = inputs(&m);
    let tag = format!("{model}_amp");
    let got = run_mlir(&tag, &m, &inputs);
    let want = run_onnxruntime(&tag, &onnx, &m, &inputs);
    let _ = std::fs::remove_dir_all(&dir);
    compare(&tag, &m, &got, &want, F16_REL);
    let vs = format!("{tag}_vs_fp32");
    let fp32 = run_onnxruntime(&vs, &models_dir().join(format!("{model}.onnx")), &m, &inputs);
    compare(&vs, &m, &got, &fp32, F16_REL);
}

#[test]
fn squeezenet_amp_f16_matches_onnxruntime() {
    amp_plan_matches_onnxruntime("squeezenet1_1", squeezenet_input);
}

/// bert_tiny's inputs: token ids below the word-embedding table's row
/// count; the mask keeps the first three quarters of the sequence, the rest
/// is padding.
fn bert_tiny_inputs(m: &Model) -> Vec<Vec<u8>> {
    let g = &m.graph;
    let ids = g.value_by_name("input_ids").expect("input_ids");
    let vocab = g
        .node_ids()
        .into_iter()
        .map(|n| g.node(n))
        .find(|n| n.op == Op::Gather && n.input(1) == Some(ids))
        .and_then(|n| g.value(n.input(0)?).init().map(|t| t.dims[0]))
        .expect("the word embedding");
    let mut rng = Rng(2);
    g.inputs()
        .iter()
        .map(|&v| {
            let shape = dims(m, v);
            let n = shape.iter().product::<i64>();
            match g.value_name(v) {
                "input_ids" => i64_bytes((0..n).map(|_| (rng.next() % vocab as u64) as i64)),
                "attention_mask" => i64_bytes((0..n).map(|i| i64::from(i % shape[1] < shape[1] * 3 / 4))),
                other => panic!("unexpected input {other}"),
            }
        })
        .collect()
}

#[test]
fn bert_tiny_fp32_matches_onnxruntime() {
    if !common::tools_present() || !onnxruntime_present() {
        return;
    }
    let m = load("bert_tiny");
    let inputs = bert_tiny_inputs(&m);
    let got = run_mlir("bert_tiny_fp32", &m, &inputs);
    let want = run_onnxruntime("bert_tiny_fp32", &models_dir().join("bert_tiny.onnx"), &m, &inputs);
    compare("bert_tiny_fp32", &m, &got, &want, FP32_REL);
}

/// bert_tiny after `amp` for a T4: f16 matmuls (f32 sums), softmax and
/// GELU, LayerNorm kept FP32 by the plan.
#[test]
fn bert_tiny_amp_f16_matches_onnxruntime() {
    amp_plan_matches_onnxruntime("bert_tiny", bert_tiny_inputs);
}
