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
    // External data is read only from inside the model's folder and only
    // within the sizes the file has: refused here, before any command reads.
    qsync_ir::tensor::check_model_external_data(&model).map_err(|e| anyhow::anyhow!("{label}: {e}"))?;
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
    if let (Some(asked), Some(first), Some(pristine)) = (opts.batch, report.errors.first().cloned(), pristine.as_ref())
    {
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
    // A graph that fixes its batch (constant input dims, a constant reshape
    // target) is rebatched when the graph allows: its inputs' leading dims
    // and the reshape targets that carry the batch become batch-relative,
    // so the batch asked for is the batch everything is computed, predicted
    // and written at. Where that does not re-infer cleanly the graph keeps
    // its own batch and callers plan at that batch.
    let mut rebatched = None;
    let mut not_rebatched = String::new();
    if let (Some(fixed), Some(pristine)) = (report.fixed_batch, pristine.as_ref()) {
        // Even at the batch the graph fixes: the planner writes each
        // device's graph at its own local batch.
        match rebatch(pristine, &model.graph, fixed, opset, opts, report.unknown.len()) {
            Ok((g, r, targets)) => {
                model.graph = g;
                report = r;
                warnings.retain(|w| !w.contains("contradicts the graph"));
                rebatched = Some((fixed, targets));
            }
            Err(why) => not_rebatched = why,
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
    if let Some((fixed, targets)) = rebatched {
        warnings.push(format!(
            "{label}: the graph fixed its batch at {fixed}; rebatched to {} (inputs' leading dimension{})",
            opts.batch.unwrap_or(fixed),
            if targets > 0 { format!(" and {targets} shape operand(s) made batch-relative") } else { String::new() }
        ));
    } else if let Some(b) = report.fixed_batch.filter(|_| !warnings.iter().any(|w| w.contains("contradicts the graph")))
    {
        warnings.push(format!(
            "{label}: the batch is fixed at {b} inside the graph and could not be rebatched ({}): it is planned, \
             predicted and written at batch {b}",
            if not_rebatched.is_empty() { "its traced batch is not in its inputs" } else { &not_rebatched }
        ));
    }
    let missing = initializers_without_data(&model);
    if missing.count > 0 {
        warnings.push(format!(
            "{label}: {} of {} initializers have no data{}: shapes, parameter counts and times are exact, but the \
             plan's indicator estimates those weights' statistics and written models lack their values",
            missing.count,
            model.graph.inits().len(),
            if missing.files.is_empty() {
                String::new()
            } else {
                format!(
                    " (external data file{} {} not found next to the model)",
                    if missing.files.len() > 1 { "s" } else { "" },
                    missing.files.join(", ")
                )
            }
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

/// `pristine` (a graph whose batch is fixed at `fixed`) with a symbolic
/// batch, `at_fixed` being the same graph inferred at that batch:
/// - inputs whose leading dim is `fixed` get the symbol `batch` (a symbolic
///   leading dim stays);
/// - constant reshape targets `[fixed, ...]` (initializers or `Constant`
///   nodes read only as reshape targets) become `[-1, ...]`; another `-1`
///   in them is first resolved to the dim every such reshape produces at
///   the fixed batch (`[1, 128, -1, 64]` → `[-1, 128, 2, 64]`);
/// - a `GatherND` whose constant indices pick row 0 and every column of a
///   `[1, S]` tensor (the traced attention-mask broadcast of the dynamo
///   exporter) becomes the reshape it is, `[-1, 1, …, S]`;
/// - declared shapes of everything but the inputs are dropped for
///   re-inference.
///
/// Each rewrite computes the same values at the fixed batch. Returned with
/// its inference report and the number of shape operands rewritten when it
/// infers without errors, no fixed batch and no more unknown shapes than
/// `unknown_before`; otherwise why not (the graph keeps its batch).
fn rebatch(
    pristine: &qsync_ir::Graph,
    at_fixed: &qsync_ir::Graph,
    fixed: i64,
    opset: i64,
    opts: &InferOptions,
    unknown_before: usize,
) -> Result<(qsync_ir::Graph, qsync_ir::infer::InferReport, usize), String> {
    use qsync_ir::{Attr, DType, Dim, Op, TensorType};
    let mut g = pristine.clone();
    let lead_is_fixed =
        |t: &TensorType| t.shape.as_ref().and_then(|s| s.first()).is_some_and(|d| *d == Dim::from(fixed));
    let inputs: Vec<_> = g.inputs().iter().copied().filter(|&v| g.value(v).init().is_none()).collect();
    let mut any = false;
    for &v in &inputs {
        let mut t = g.ty(v).clone();
        if lead_is_fixed(&t) {
            if let Some(s) = t.shape.as_mut() {
                s[0] = Dim::sym("batch");
            }
            g.set_ty(v, t);
            any = true;
        } else if t.shape.as_ref().and_then(|s| s.first()).is_some_and(|d| d.as_sym().is_some()) {
            // A symbolic batch the graph contradicts (a traced reshape
            // target): the targets below are what fix it.
            any = true;
        }
    }
    if !any {
        return Err("no input carries the batch".into());
    }
    // The concrete shape `at_fixed` gives a value.
    let concrete = |v: qsync_ir::ValueId| -> Option<Vec<i64>> {
        at_fixed.ty(v).shape.as_ref()?.iter().map(Dim::as_const).collect()
    };
    // A batch-relative reshape target for `vals`, read by `users`.
    let relative = |vals: &[i64], users: &[(qsync_ir::NodeId, usize)]| -> Option<Vec<i64>> {
        if vals.first() != Some(&fixed) {
            return None;
        }
        let mut out = vals.to_vec();
        if vals[1..].contains(&-1) {
            // Resolve the other -1 from what every reader produces.
            let mut resolved: Option<Vec<i64>> = None;
            for &(n, _) in users {
                let shape = concrete(*pristine.node(n).outputs().first()?)?;
                if shape.len() != vals.len() || resolved.as_ref().is_some_and(|r| *r != shape) {
                    return None;
                }
                resolved = Some(shape);
            }
            let shape = resolved?;
            for (o, (&v, &d)) in out.iter_mut().zip(vals.iter().zip(&shape)) {
                if v == -1 {
                    *o = d;
                }
            }
        }
        out[0] = -1;
        Some(out)
    };
    // A constant read only as reshape targets, made batch-relative.
    let relative_target = |g: &qsync_ir::Graph, v: qsync_ir::ValueId, t: &Tensor| -> Option<Tensor> {
        let users = g.users(v);
        if t.dtype != DType::I64
            || users.is_empty()
            || !users.iter().all(|&(n, i)| g.node(n).op == Op::Reshape && i == 1)
        {
            return None;
        }
        Tensor::from_i64s(DType::I64, t.dims.clone(), &relative(&t.as_i64s()?, &users)?)
    };
    let mut targets = 0;
    for &v in &g.inits().to_vec() {
        let Some(nt) = g.value(v).init().and_then(|t| relative_target(&g, v, t)) else { continue };
        g.set_init(v, nt);
        targets += 1;
    }
    for n in g.node_ids() {
        let node = g.node(n);
        match node.op {
            Op::Constant => {
                let (Some(&out_v), Some(Attr::Tensor(t))) = (node.outputs().first(), node.attr("value")) else {
                    continue;
                };
                let Some(nt) = relative_target(&g, out_v, t) else { continue };
                g.node_mut(n).attrs.insert("value".into(), Attr::Tensor(nt));
                targets += 1;
            }
            Op::GatherND if fixed == 1 && node.attr_int("batch_dims").unwrap_or(0) == 0 => {
                let (Some(data), Some(idx)) = (node.input(0), node.input(1)) else { continue };
                let Some(it) = g.value(idx).init() else { continue };
                let (Some(ds), Some(iv)) = (concrete(data), it.as_i64s()) else { continue };
                // data [1, S]; indices [1, …, 1, S, 2] = (0, s) for s in 0..S.
                let [1, cols] = ds[..] else { continue };
                let dims = &it.dims;
                let Some((&2, lead)) = dims.split_last() else { continue };
                let Some((&s, ones)) = lead.split_last() else { continue };
                let identity = s == cols
                    && ones.iter().all(|&d| d == 1)
                    && iv.len() as i64 == 2 * cols
                    && iv.chunks(2).enumerate().all(|(k, p)| p[0] == 0 && p[1] == k as i64);
                if !identity || ones.is_empty() {
                    continue;
                }
                let mut shape = lead.to_vec();
                shape[0] = -1;
                let name = g.fresh_value_name(&format!("{}_shape", node.name));
                let Some(st) = Tensor::from_i64s(DType::I64, vec![shape.len() as i64], &shape) else { continue };
                let sv = g.add_init(name, st);
                let node = g.node_mut(n);
                node.op = Op::Reshape;
                node.attrs.clear();
                g.set_input(n, 1, Some(sv));
                targets += 1;
            }
            _ => {}
        }
    }
    // Declared shapes were traced at the fixed batch, also where the batch
    // is folded into another dim (`[batch·heads, S, D]`): all are re-inferred.
    let stale: Vec<_> = g
        .live_values()
        .filter(|&v| g.value(v).init().is_none() && !inputs.contains(&v) && g.ty(v).shape.is_some())
        .collect();
    for v in stale {
        let dtype = g.ty(v).dtype;
        g.set_ty(v, TensorType { container: None, dtype, shape: None });
    }
    if let Some(n) = collapses_batch(&g, opset, opts) {
        let node = g.node(n);
        let no_data =
            node.inputs().iter().skip(1).flatten().any(|&v| g.value(v).init().is_some_and(|t| t.as_i64s().is_none()));
        return Err(if no_data {
            format!(
                "node {:?} indexes the samples with traced indices whose values are not in the model (its external \
                 data file is missing), so they cannot be made batch-relative",
                node.name
            )
        } else {
            format!(
                "node {:?} indexes the samples with indices traced at batch {fixed}, so every sample would read the first",
                node.name
            )
        });
    }
    let r = infer_shapes(&mut g, opset, opts);
    if let Some(e) = r.errors.first() {
        return Err(format!("node {:?} ({}): {}", e.node, e.op, e.message));
    }
    if r.fixed_batch.is_some() || r.unknown.len() > unknown_before {
        return Err("shapes do not re-infer at another batch".into());
    }
    Ok((g, r, targets))
}

/// The first node of `g` (rebatched: its inputs' leading dim is the symbol
/// `batch`) that indexes along the batch with indices of a batch-free
/// shape: a Gather, GatherElements, GatherND or Slice whose data carries
/// the batch and whose outputs do not. Such indices were traced at the
/// fixed batch (a `Range(0, 1)` over the samples, a slice `[:1]`): shapes
/// still check at another batch, but every sample would read sample 0.
/// The graph is inferred with the batch left symbolic to see it.
fn collapses_batch(g: &qsync_ir::Graph, opset: i64, opts: &InferOptions) -> Option<qsync_ir::NodeId> {
    use qsync_ir::Op;
    let mut sym = g.clone();
    let r = infer_shapes(&mut sym, opset, &InferOptions { batch: None, ..opts.clone() });
    if !r.errors.is_empty() {
        return None;
    }
    let has_batch = |v: qsync_ir::ValueId| {
        sym.ty(v).shape.as_ref().is_some_and(|s| s.iter().any(|d| d.symbols().iter().any(|x| &**x == "batch")))
    };
    sym.schedule().into_iter().find_map(|n| {
        let node = sym.node(n);
        if !matches!(node.op, Op::Gather | Op::GatherElements | Op::GatherND | Op::Slice) {
            return None;
        }
        let data = node.input(0)?;
        (has_batch(data) && !node.outputs().iter().any(|&o| has_batch(o))).then_some(n)
    })
}

/// Initializers whose values are neither in the model nor in an external
/// data file found next to it: the one count every command reports
/// (`inspect`'s "without values", the load warning of the others).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MissingData {
    pub count: usize,
    /// External data files referenced but not found, sorted.
    pub files: Vec<String>,
}

pub fn initializers_without_data(model: &Model) -> MissingData {
    let g = &model.graph;
    let base = model.base_dir.as_deref().unwrap_or(Path::new("."));
    let mut files = std::collections::BTreeSet::new();
    let mut count = 0;
    for &v in g.inits() {
        let ValueDef::Init(t) = &g.value(v).def else { continue };
        let present = match &t.data {
            TensorData::Inline(_) => true,
            TensorData::Absent => false,
            TensorData::External { location, .. } => {
                let ok = matches!(qsync_ir::tensor::resolve_external(Some(base), location), Ok(Some(_)));
                if !ok {
                    files.insert(location.clone());
                }
                ok
            }
        };
        count += usize::from(!present);
    }
    MissingData { count, files: files.into_iter().collect() }
}

/// `model`'s graph with the values of external-data initializers read in
/// (inline), for code that needs weight values (the planner's indicator);
/// `None` when no initializer has external data that can be read. Files
/// that are missing leave their tensors external.
pub fn with_external_data_inline(model: &Model) -> Result<Option<qsync_ir::Graph>> {
    let g = &model.graph;
    let base = model.base_dir.as_deref().unwrap_or(Path::new("."));
    let mut out: Option<qsync_ir::Graph> = None;
    for &v in g.inits() {
        let ValueDef::Init(t) = &g.value(v).def else { continue };
        let TensorData::External { location, .. } = &t.data else { continue };
        // One bounded reader: the location and the declared sizes are
        // checked against the folder and the file before anything is read.
        let bytes = t
            .load(Some(base))
            .map_err(|e| anyhow::anyhow!("initializer `{}`: external data `{location}`: {e}", g.value_name(v)))?;
        let Some(bytes) = bytes else { continue };
        let nt = Tensor { dtype: t.dtype, dims: t.dims.clone(), data: TensorData::Inline(bytes) };
        out.get_or_insert_with(|| g.clone()).set_init(v, nt);
    }
    Ok(out)
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

/// Symbols still free in the graph's shapes.
pub fn free_symbols(g: &qsync_ir::Graph) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for v in g.live_values() {
        for d in g.ty(v).shape.iter().flatten() {
            out.extend(d.symbols().iter().map(|s| s.to_string()));
        }
    }
    out
}

/// Unbound symbols other than the batch take this value, with a warning.
pub const DEFAULT_DIM: i64 = 128;

/// A model loaded for prediction at a per-device batch.
#[derive(Debug)]
pub struct Prepared {
    pub loaded: Loaded,
    /// The batch it is predicted at: the one asked for, or the batch a
    /// graph fixes inside when it could not be rebatched.
    pub batch: i64,
    /// Values for the symbols still free after binding (defaulted, with a warning).
    pub bindings: qsync_cost::Bindings,
    pub warnings: Vec<String>,
}

/// Load `model` with its batch bound to `batch` (or at the batch it fixes,
/// when it cannot be rebatched) and default the symbols left free.
pub fn prepare(model: &Path, batch: i64, dims: &[(String, i64)]) -> Result<Prepared> {
    let opts = InferOptions { batch: Some(batch), dims: dims.iter().cloned().collect() };
    let loaded = load_model(model, &opts, &[])?;
    let mut warnings = loaded.warnings.clone();
    // Graphs that fix their batch are rebatched on load where the graph
    // allows. One that cannot be is planned, predicted and written at the
    // batch it has, in every command, the loader's warning saying so.
    let batch = loaded.fixed_batch.filter(|&b| b > 0).unwrap_or(batch);
    let mut bindings = qsync_cost::Bindings::new();
    for s in free_symbols(&loaded.model.graph) {
        warnings.push(format!("dimension `{s}` is not bound; using {DEFAULT_DIM} (bind it with --dim {s}=N)"));
        bindings.set(&s, DEFAULT_DIM);
    }
    Ok(Prepared { loaded, batch, bindings, warnings })
}
