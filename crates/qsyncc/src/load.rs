//! Reading models in any accepted format and writing them back out.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_ir::{Model, Tensor, TensorData, ValueDef};
use qsync_torchscript::InputSpec;

/// Input formats `qsyncc` accepts.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Format {
    Onnx,
    Qir,
    /// A `torch.jit` archive (`.pt`): a zip holding `data.pkl` and `code/`.
    TorchScript,
}

/// A model ready for passes: imported, shapes inferred, verified.
#[derive(Debug)]
pub struct Loaded {
    pub model: Model,
    pub format: Format,
    /// Nodes in the source file's main graph (every one is imported).
    pub source_nodes: usize,
    /// Live values whose dtype or shape could not be inferred.
    pub unknown_shapes: usize,
    /// When `--batch` was asked for but the graph fixes its batch.
    pub fixed_batch: Option<i64>,
    pub warnings: Vec<String>,
}

fn detect(path: &Path, head: &[u8]) -> Format {
    match path.extension().and_then(|e| e.to_str()) {
        Some("qir") => Format::Qir,
        Some("onnx") => Format::Onnx,
        Some("pt" | "pth" | "ptl") => Format::TorchScript,
        _ if qsync_torchscript::looks_like_archive(head) => Format::TorchScript,
        _ => {
            let text = String::from_utf8_lossy(&head[..head.len().min(64)]);
            let first = text.split_whitespace().next().unwrap_or("");
            if ["ir_version", "opset", "graph", "producer", "#"].iter().any(|k| first.starts_with(k)) {
                Format::Qir
            } else {
                Format::Onnx
            }
        }
    }
}

/// Read, import, bind dims, infer shapes and verify. `inputs` (`--input
/// NAME=TYPE`) give TorchScript inputs their types and override the declared
/// types of ONNX / text IR inputs of those names.
pub fn load_model(path: &Path, opts: &InferOptions, inputs: &[InputSpec]) -> Result<Loaded> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let format = detect(path, &bytes);
    let label = path.display().to_string();
    let mut warnings = Vec::new();
    let mut model = match format {
        Format::Onnx => {
            let base = path.parent().map(Path::to_path_buf);
            let (model, report) = qsync_onnx::import_bytes_with_report(&bytes, base.as_deref(), &label)?;
            warnings.extend(report.warnings);
            model
        }
        Format::Qir => {
            let text = std::str::from_utf8(&bytes).with_context(|| format!("{label}: text IR is not valid UTF-8"))?;
            let mut m = qsync_ir::text::parse_model(text).map_err(|e| anyhow::anyhow!("{label}:{e}"))?;
            m.base_dir = Some(path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf));
            m
        }
        Format::TorchScript => {
            let (model, report) = qsync_torchscript::import_bytes(&bytes, &label, inputs)?;
            warnings.extend(report.warnings);
            model
        }
    };
    if format != Format::TorchScript {
        for s in inputs {
            let Some(v) = model.graph.inputs().iter().copied().find(|&v| model.graph.value_name(v) == s.name) else {
                bail!("{label}: --input `{}` names no graph input", s.name);
            };
            model.graph.set_ty(v, s.ty.clone());
        }
    }
    let source_nodes = model.graph.node_count();
    let opset = model.opset();
    let pristine = opts.batch.is_some().then(|| model.graph.clone());
    let mut report = infer_shapes(&mut model.graph, opset, opts);
    if let (Some(asked), Some(first), Some(pristine)) = (opts.batch, report.errors.first().cloned(), pristine) {
        // Some exports declare a symbolic batch but bake the traced batch into
        // reshape targets. Binding another batch then contradicts the graph;
        // treat such a graph as fixing its batch, as for constant inputs.
        for traced in [1, 2] {
            let mut g = pristine.clone();
            let retry = infer_shapes(&mut g, opset, &InferOptions { batch: Some(traced), ..opts.clone() });
            if retry.errors.is_empty() && retry.unknown.len() <= report.unknown.len() {
                warnings.push(format!(
                    "{label}: a batch of {asked} contradicts the graph (node {:?} ({}): {}); it fixes its batch at {traced} inside",
                    first.node, first.op, first.message
                ));
                model.graph = g;
                report = retry;
                report.fixed_batch = Some(traced);
                break;
            }
        }
    }
    if !report.errors.is_empty() {
        let lines: Vec<String> =
            report.errors.iter().map(|e| format!("  node {:?} ({}): {}", e.node, e.op, e.message)).collect();
        bail!("{label}: shape inference failed:\n{}", lines.join("\n"));
    }
    for w in &report.warnings {
        warnings.push(format!("{label}: node {:?} ({}): {}", w.node, w.op, w.message));
    }
    if let Some(b) = report.fixed_batch.filter(|_| !warnings.iter().any(|w| w.contains("contradicts the graph"))) {
        warnings.push(format!(
            "{label}: the batch is fixed at {b} inside the graph (constant reshape targets); inputs were not rebatched"
        ));
    }
    if let Err(errors) = qsync_ir::verify::verify(&model.graph, opset) {
        let lines: Vec<String> = errors.iter().map(|e| format!("  {e}")).collect();
        bail!("{label}: the model does not verify:\n{}", lines.join("\n"));
    }
    Ok(Loaded {
        model,
        format,
        source_nodes,
        unknown_shapes: report.unknown.len(),
        fixed_batch: report.fixed_batch,
        warnings,
    })
}

/// Write by extension: `.onnx` or `.qir`.
pub fn save_model(model: &Model, path: &Path) -> Result<()> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("onnx") => {
            qsync_onnx::export_file(model, path).with_context(|| format!("writing {}", path.display()))?;
            Ok(())
        }
        Some("qir") => write_qir(model, path),
        _ => bail!("{}: unknown output format (use .onnx or .qir)", path.display()),
    }
}

/// Inline tensors above this size go to the `.qir.bin` sidecar.
const SIDECAR_MIN_BYTES: usize = 1024;

/// Write text IR; large inline tensors go to `<file>.bin` beside it, as
/// external data, and external data of the source is copied beside the
/// output so every reference resolves from there.
pub fn write_qir(model: &Model, path: &Path) -> Result<()> {
    let mut m = model.clone();
    let out_dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let file_name = path.file_name().and_then(|n| n.to_str()).context("output path has no file name")?;
    let sidecar = format!("{file_name}.bin");
    let mut blob: Vec<u8> = Vec::new();
    for v in m.graph.inits().to_vec() {
        let ValueDef::Init(t) = &m.graph.value(v).def else { continue };
        if let TensorData::Inline(bytes) = &t.data {
            if bytes.len() >= SIDECAR_MIN_BYTES {
                let offset = blob.len() as u64;
                blob.extend_from_slice(bytes);
                let nt = Tensor {
                    dtype: t.dtype,
                    dims: t.dims.clone(),
                    data: TensorData::External { location: sidecar.clone(), offset, length: Some(bytes.len() as u64) },
                };
                m.graph.set_init(v, nt);
            }
        }
    }
    if let Some(base) = &model.base_dir {
        qsync_onnx::export::copy_external_data(model, base, out_dir, &path.display().to_string())?;
    }
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    if !blob.is_empty() {
        let p = out_dir.join(&sidecar);
        std::fs::write(&p, &blob).with_context(|| format!("writing {}", p.display()))?;
    }
    std::fs::write(path, qsync_ir::text::print_model(&m)).with_context(|| format!("writing {}", path.display()))
}
