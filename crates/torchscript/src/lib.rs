//! # qsync-torchscript — the TorchScript frontend
//!
//! Imports `torch.jit` archives (`.pt`, a zip written by
//! `torch.jit.trace(…).save()` or `torch.jit.script`) into the same IR the
//! ONNX frontend produces:
//!
//! - [`archive`]: the zip container and its members;
//! - [`pickle`]: our pickle reader for `data.pkl`, `constants.pkl` and
//!   `traced_inputs.pkl` (module tree, parameters as storage views);
//! - [`module`]: storage views to contiguous IR tensors;
//! - [`code`]: the parser of the TorchScript code under `code/__torch__/`;
//! - [`lower`] and [`aten`]: the interpreter that inlines every submodule's
//!   `forward` into one graph and maps `aten` ops onto IR ops.
//!
//! Input shapes come from `traced_inputs.pkl` when the archive has it, else
//! from [`InputSpec`]s (`--input NAME=f32[1,3,224,224]`). Import never
//! panics on any bytes; every error names the archive and, where it has one,
//! the member file and line.

pub mod archive;
pub mod aten;
pub mod code;
pub mod error;
pub mod lower;
pub mod module;
pub mod pickle;

use std::path::Path;
use std::rc::Rc;

use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_ir::{Dim, Model, TensorType, ValueId};

pub use error::TsError;
use lower::{Lowerer, ModRef, Val};
use pickle::PyVal;

/// An input's type given on the command line: `NAME=TYPE` in the text IR's
/// type syntax.
#[derive(Clone, Debug, PartialEq)]
pub struct InputSpec {
    pub name: String,
    pub ty: TensorType,
}

impl InputSpec {
    /// Parse `NAME=f32[1,3,224,224]`.
    pub fn parse(s: &str) -> Result<InputSpec, String> {
        let (name, ty) = s.split_once('=').ok_or_else(|| format!("`{s}` is not NAME=TYPE"))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(format!("`{s}` has an empty input name"));
        }
        let ty = qsync_ir::text::parse_type(ty.trim()).map_err(|e| format!("`{}`: {}", ty.trim(), e.message))?;
        Ok(InputSpec { name: name.to_string(), ty })
    }
}

/// What import found besides the model.
#[derive(Clone, Debug, Default)]
pub struct ImportReport {
    pub warnings: Vec<String>,
    /// Elements of the module's parameters (buffers excluded, shared counted once).
    pub parameters: u64,
}

/// Whether `bytes` look like a TorchScript archive (a zip holding `data.pkl`).
pub fn looks_like_archive(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04")
}

/// Import an archive from a file.
pub fn import_file(path: &Path, inputs: &[InputSpec]) -> Result<(Model, ImportReport), TsError> {
    let label = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| TsError::Io { file: label.clone(), source: e })?;
    import_bytes(&bytes, &label, inputs)
}

fn pickle_member(ar: &archive::Archive, member: &str) -> Result<Option<PyVal>, TsError> {
    let Some(b) = ar.get(member) else { return Ok(None) };
    pickle::load(b).map(Some).map_err(|e| TsError::Pickle {
        file: ar.label.clone(),
        member: member.to_string(),
        offset: e.offset,
        msg: e.msg,
    })
}

/// Import an archive held in memory; `label` names it in errors.
pub fn import_bytes(bytes: &[u8], label: &str, inputs: &[InputSpec]) -> Result<(Model, ImportReport), TsError> {
    let ar = archive::Archive::open(bytes, label)?;
    if !ar.has_prefix("code/") {
        return Err(TsError::Missing { file: label.to_string(), member: "code/".into() });
    }
    let root = match pickle_member(&ar, "data.pkl")? {
        Some(PyVal::Object(o)) => o,
        _ => {
            return Err(TsError::Invalid {
                file: label.to_string(),
                msg: "data.pkl does not hold a module object".into(),
            })
        }
    };
    let constants = match pickle_member(&ar, "constants.pkl")? {
        Some(v) => v.items().unwrap_or_default(),
        None => Vec::new(),
    };
    let traced: Vec<TensorType> = match pickle_member(&ar, "traced_inputs.pkl")? {
        Some(PyVal::Dict(d)) => {
            let d = d.borrow();
            let fwd =
                d.iter().find(|(k, _)| k.as_str() == Some("forward")).and_then(|(_, v)| v.items()).unwrap_or_default();
            fwd.iter()
                .filter_map(|v| match v {
                    PyVal::Tensor(t) => {
                        Some(TensorType::new(t.storage.dtype, t.sizes.iter().map(|&d| Dim::from(d)).collect()))
                    }
                    _ => None,
                })
                .collect()
        }
        _ => Vec::new(),
    };
    let graph_name = Path::new(label).file_stem().and_then(|s| s.to_str()).unwrap_or("torchscript").to_string();
    let mut lw = Lowerer::new(&ar, &graph_name, constants);
    let root = Rc::new(ModRef { obj: root, path: String::new() });
    let parameters = lw.declare_parameters(&root)?;
    let (member, class) = lw.class_of(&root)?;
    let Some(fwd) = class.methods.get("forward") else {
        return Err(TsError::Code {
            file: label.to_string(),
            member,
            line: class.line,
            msg: format!("class `{}` has no forward", class.name),
        });
    };
    let mut args = Vec::new();
    for (i, p) in fwd.params.iter().skip(1).enumerate() {
        let ty = match inputs.iter().find(|s| &s.name == p) {
            Some(s) => s.ty.clone(),
            None => match traced.get(i) {
                Some(t) => t.clone(),
                None => {
                    return Err(TsError::Invalid {
                        file: label.to_string(),
                        msg: format!("input `{p}` has no recorded shape: give one with --input {p}=f32[...]"),
                    })
                }
            },
        };
        args.push(Val::Tensor(lw.g.add_input(p.clone(), ty)));
    }
    for s in inputs {
        if !fwd.params.iter().skip(1).any(|p| p == &s.name) {
            lw.warnings.push(format!(
                "{label}: --input `{}` names no input of forward ({})",
                s.name,
                fwd.params[1..].join(", ")
            ));
        }
    }
    let out = lw.call_method(&root, "forward", args, Vec::new())?;
    let mut outs: Vec<(Option<String>, ValueId)> = Vec::new();
    flatten_outputs(&out, None, &mut outs);
    if outs.is_empty() {
        return Err(TsError::Invalid { file: label.to_string(), msg: "forward returns no tensor".into() });
    }
    for (name, v) in &outs {
        if let Some(n) = name {
            if lw.g.value_by_name(n).is_none() && lw.g.producer(*v).is_some() {
                lw.g.rename_value(*v, n.clone());
            }
        }
    }
    lw.g.set_outputs(outs.into_iter().map(|(_, v)| v).collect());
    let warnings = std::mem::take(&mut lw.warnings);
    let opset = lw.opset;
    let mut model = Model::new(lw.g);
    model.opsets = vec![(String::new(), opset)];
    model.producer_name = "torch.jit".into();
    model.producer_version = ar
        .get(".data/version")
        .or_else(|| ar.get("version"))
        .map(|b| String::from_utf8_lossy(b).trim().to_string())
        .unwrap_or_default();
    let report = infer_shapes(&mut model.graph, opset, &InferOptions::default());
    if let Some(e) = report.errors.first() {
        return Err(TsError::Lower {
            file: label.to_string(),
            place: format!("node {}", e.node),
            msg: e.message.clone(),
        });
    }
    Ok((model, ImportReport { warnings, parameters }))
}

fn flatten_outputs(v: &Val, name: Option<String>, out: &mut Vec<(Option<String>, ValueId)>) {
    match v {
        Val::Tensor(t) => out.push((name, *t)),
        Val::Tuple(x) | Val::List(x) => x.iter().for_each(|e| flatten_outputs(e, None, out)),
        Val::Dict(d) => d
            .iter()
            .for_each(|(k, e)| flatten_outputs(e, if let Val::Str(s) = k { Some(s.clone()) } else { None }, out)),
        _ => {}
    }
}
