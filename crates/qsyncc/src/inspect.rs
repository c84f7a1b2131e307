//! `qsyncc inspect`: what a model is made of.
//!
//! Forward FLOPs are counted per op class with the usual conventions (a
//! multiply-add is 2 FLOPs; elementwise ops 1 per output element; data
//! movement, shape and cast ops 0). Counts are dimension expressions, so a
//! model with a symbolic batch reports e.g. `8178892800*batch`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use anyhow::Result;
use qsync_ir::infer::InferOptions;
use qsync_ir::text::{print_model_with, PrintOptions};
use qsync_ir::{Dim, Graph, NodeId, Op, OpClass, TensorType, ValueDef};
use serde::Serialize;

use crate::load::Loaded;

#[derive(Serialize, Debug)]
struct Io {
    name: String,
    #[serde(rename = "type")]
    ty: String,
}

/// A count that is an integer when every dim is known, else an expression.
#[derive(Serialize, Debug)]
#[serde(untagged)]
enum Count {
    Known(i64),
    Symbolic(String),
}

impl From<&Dim> for Count {
    fn from(d: &Dim) -> Count {
        d.as_const().map_or_else(|| Count::Symbolic(d.to_string()), Count::Known)
    }
}

#[derive(Serialize, Debug)]
struct Summary {
    model: String,
    format: &'static str,
    ir_version: i64,
    opset: i64,
    producer: String,
    /// Nodes in the file's main graph; every one was imported.
    onnx_nodes: usize,
    ir_nodes: usize,
    values: usize,
    unknown_shapes: usize,
    parameters: u64,
    parameter_bytes: u64,
    initializers: usize,
    absent_initializers: usize,
    ops: BTreeMap<String, usize>,
    flops: BTreeMap<String, Count>,
    flops_total: Count,
    inputs: Vec<Io>,
    outputs: Vec<Io>,
    fixed_batch: Option<i64>,
    warnings: Vec<String>,
}

fn summarize(path: &Path, l: &Loaded) -> Summary {
    let m = &l.model;
    let g = &m.graph;
    let mut ops = BTreeMap::new();
    let mut flops: BTreeMap<String, Dim> = BTreeMap::new();
    for n in g.schedule() {
        let node = g.node(n);
        let key = match &node.op {
            Op::Opaque { domain, op_type } if !domain.is_empty() => format!("{domain}::{op_type}"),
            op => op.op_type().to_string(),
        };
        *ops.entry(key).or_insert(0) += 1;
        if let Some(f) = node_flops(g, n) {
            if f != Dim::from(0) {
                let e = flops.entry(node.op.class().name().to_string()).or_insert_with(|| Dim::from(0));
                *e = e.add(&f);
            }
        }
    }
    // Normalization running statistics are buffers, not trained parameters.
    let buffers: std::collections::HashSet<qsync_ir::ValueId> = g
        .node_ids()
        .into_iter()
        .filter(|&n| matches!(g.node(n).op, Op::BatchNormalization))
        .flat_map(|n| [g.node(n).input(3), g.node(n).input(4)])
        .flatten()
        .collect();
    let (mut parameters, mut parameter_bytes) = (0u64, 0u64);
    for &v in g.inits() {
        if let ValueDef::Init(t) = &g.value(v).def {
            if t.dtype.is_float() && !buffers.contains(&v) {
                parameters += t.numel();
                parameter_bytes += t.byte_len();
            }
        }
    }
    let absent = crate::load::initializers_without_data(m).count;
    let total = flops.values().fold(Dim::from(0), |a, d| a.add(d));
    let io = |v: &qsync_ir::ValueId| Io { name: g.value_name(*v).to_string(), ty: g.ty(*v).to_string() };
    Summary {
        model: path.display().to_string(),
        format: match l.format {
            crate::load::Format::Onnx => "onnx",
            crate::load::Format::Qir => "qir",
            crate::load::Format::TorchScript => "torchscript",
        },
        ir_version: m.ir_version,
        opset: m.opset(),
        producer: format!("{} {}", m.producer_name, m.producer_version).trim().to_string(),
        onnx_nodes: l.source_nodes,
        ir_nodes: g.node_count(),
        values: g.live_values().count(),
        unknown_shapes: l.unknown_shapes,
        parameters,
        parameter_bytes,
        initializers: g.inits().len(),
        absent_initializers: absent,
        ops,
        flops: flops.iter().map(|(k, v)| (k.clone(), Count::from(v))).collect(),
        flops_total: Count::from(&total),
        inputs: g.inputs().iter().filter(|v| !matches!(g.value(**v).def, ValueDef::Init(_))).map(io).collect(),
        outputs: g.outputs().iter().map(io).collect(),
        fixed_batch: l.fixed_batch,
        warnings: l.warnings.clone(),
    }
}

fn shape(ty: &TensorType) -> Option<&[Dim]> {
    ty.shape.as_deref()
}

fn prod(dims: &[Dim]) -> Dim {
    dims.iter().fold(Dim::from(1), |a, d| a.mul(d))
}

/// Forward FLOPs of one node, when its shapes are known.
pub fn node_flops(g: &Graph, n: NodeId) -> Option<Dim> {
    let node = g.node(n);
    let in_ty = |i: usize| node.input(i).map(|v| g.ty(v));
    let out = shape(g.ty(*node.outputs().first()?))?;
    let out_n = prod(out);
    let k = |x: i64| Dim::from(x);
    Some(match node.op.class() {
        OpClass::Conv => {
            let w = shape(in_ty(1)?)?;
            if matches!(node.op, Op::ConvTranspose) {
                // Each input element scatters into Cout/group * kernel outputs.
                let x = prod(shape(in_ty(0)?)?);
                // w: [Cin, Cout/group, k...]
                let cout_g = w.get(1)?.clone();
                k(2).mul(&x).mul(&cout_g).mul(&prod(w.get(2..)?))
            } else {
                // w: [Cout, Cin/group, k...]
                k(2).mul(&out_n).mul(&prod(w.get(1..)?))
            }
        }
        OpClass::MatMul => match node.op {
            Op::Gemm => {
                let a = shape(in_ty(0)?)?;
                let ta = node.attr_int("transA").unwrap_or(0) != 0;
                let kd = if ta { a.first()? } else { a.get(1)? };
                k(2).mul(&out_n).mul(kd)
            }
            Op::MatMul | Op::MatMulInteger | Op::QLinearMatMul => {
                let a = shape(in_ty(0)?)?;
                k(2).mul(&out_n).mul(a.last()?)
            }
            _ => return None,
        },
        OpClass::Norm => k(match node.op {
            Op::BatchNormalization => 4,
            _ => 8,
        })
        .mul(&out_n),
        OpClass::Softmax => k(5).mul(&out_n),
        OpClass::Pool => match node.op {
            Op::GlobalAveragePool | Op::GlobalMaxPool | Op::GlobalLpPool => prod(shape(in_ty(0)?)?),
            _ => out_n.mul(&prod(&node.attr_ints("kernel_shape")?.iter().map(|&d| Dim::from(d)).collect::<Vec<_>>())),
        },
        OpClass::Reduce => prod(shape(in_ty(0)?)?),
        OpClass::Binary | OpClass::Unary | OpClass::Activation | OpClass::Loss => out_n,
        OpClass::Recurrent | OpClass::Control | OpClass::Other | OpClass::Opaque => return None,
        OpClass::Movement | OpClass::Shape | OpClass::Cast | OpClass::Random => k(0),
    })
}

/// Render the report (text or JSON), optionally followed by the text IR.
pub fn render(
    path: &Path,
    l: &Loaded,
    ir: bool,
    json: bool,
    target: Option<&str>,
    opts: &InferOptions,
) -> Result<String> {
    let s = summarize(path, l);
    let planned = crate::plan::planned(&l.model.graph, target, opts);
    if json {
        let mut v = serde_json::to_value(&s)?;
        if let Some(p) = &planned {
            v["precision"] = serde_json::to_value(p)?;
        }
        if ir {
            v["ir"] = serde_json::Value::String(print_model_with(&l.model, &PrintOptions { elide_above: Some(256) }));
        }
        return Ok(serde_json::to_string_pretty(&v)? + "\n");
    }
    let mut o = String::new();
    let _ = writeln!(o, "model       {} ({}, ir_version {}, opset {})", s.model, s.format, s.ir_version, s.opset);
    if !s.producer.is_empty() {
        let _ = writeln!(o, "producer    {}", s.producer);
    }
    let _ = writeln!(o, "nodes       {} in the file, {} in the IR", s.onnx_nodes, s.ir_nodes);
    let _ = writeln!(o, "values      {} ({} with unknown shape)", s.values, s.unknown_shapes);
    let _ = writeln!(
        o,
        "parameters  {} ({:.1} MiB in {} initializers, {} without values)",
        s.parameters,
        s.parameter_bytes as f64 / (1 << 20) as f64,
        s.initializers,
        s.absent_initializers
    );
    if let Some(b) = s.fixed_batch {
        let _ = writeln!(o, "batch       fixed at {b} inside the graph");
    }
    let _ = writeln!(o, "inputs");
    for i in &s.inputs {
        let _ = writeln!(o, "  {:<24} {}", i.name, i.ty);
    }
    let _ = writeln!(o, "outputs");
    for i in &s.outputs {
        let _ = writeln!(o, "  {:<24} {}", i.name, i.ty);
    }
    let _ = writeln!(o, "ops");
    for (k, v) in &s.ops {
        let _ = writeln!(o, "  {k:<24} {v}");
    }
    let _ = writeln!(o, "forward FLOPs");
    let fmt_count = |c: &Count| match c {
        Count::Known(v) => format!("{v} ({:.3} GFLOP)", *v as f64 / 1e9),
        Count::Symbolic(e) => e.clone(),
    };
    for (k, v) in &s.flops {
        let _ = writeln!(o, "  {k:<24} {}", fmt_count(v));
    }
    let _ = writeln!(o, "  {:<24} {}", "total", fmt_count(&s.flops_total));
    if let Some(p) = &planned {
        let _ = writeln!(o, "precision");
        let _ = writeln!(o, "  {:<24} {} ({} of weights)", "casts", p.casts, p.weight_casts);
        if p.refreshed_copies > 0 {
            let _ =
                writeln!(o, "  {:<24} {} (rewritten by the optimizer step)", "refreshed copies", p.refreshed_copies);
        }
        match p.low_precision_flop_fraction {
            Some(x) => {
                let _ = writeln!(o, "  {:<24} {x:.4}", "low-precision FLOPs");
            }
            None => {
                let _ = writeln!(o, "  {:<24} unknown (a FLOP count overflows 64 bits)", "low-precision FLOPs");
            }
        }
        if let (Some(t), Some(ms)) = (target, &p.predicted_ms) {
            let _ = writeln!(
                o,
                "  {:<24} {:.3} ms forward + {:.3} ms backward + {:.3} ms refresh = {:.3} ms on {t}",
                "predicted", ms.forward, ms.backward, ms.refresh, ms.total
            );
        }
    }
    for w in &s.warnings {
        let _ = writeln!(o, "warning: {w}");
    }
    if ir {
        o.push('\n');
        o.push_str(&print_model_with(&l.model, &PrintOptions { elide_above: Some(256) }));
    }
    Ok(o)
}
