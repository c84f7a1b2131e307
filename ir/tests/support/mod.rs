//! Test support: load an ONNX model through `onnx_to_json.py` (Python `onnx`)
//! into a `Graph`, without the ONNX importer.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use qsync_ir::{Attr, DType, Dim, Graph, NodeSpec, Op, Tensor, TensorType, ValueId};
use serde_json::Value;

pub struct Loaded {
    pub graph: Graph,
    pub opset: i64,
    /// onnx.shape_inference's result per value name: (dtype code, dims).
    pub reference: Value,
}

/// Run the converter on `model` and parse the JSON it writes.
pub fn model_json(model: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/onnx_to_json.py");
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!(
        "qsync_ir_{}_{}_{k}.json",
        model.file_stem().unwrap().to_string_lossy(),
        std::process::id()
    ));
    let status = Command::new("python3").arg(&script).arg(model).arg(&out).status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("python3 {} failed ({s}); is the `onnx` Python package installed?", script.display()),
        Err(e) => panic!("cannot run python3 ({e}); python3 with the `onnx` package is needed for this test"),
    }
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    serde_json::from_str(&text).unwrap()
}

fn num(v: &Value) -> Option<f64> {
    match v {
        Value::String(s) => s.parse::<f64>().ok(),
        _ => v.as_f64(),
    }
}

fn dtype(code: &Value) -> Option<DType> {
    DType::from_onnx_code(i32::try_from(code.as_i64()?).ok()?)
}

pub fn ttype(v: &Value) -> TensorType {
    let dt = dtype(&v["dtype"]);
    let shape = v["dims"].as_array().map(|ds| {
        ds.iter()
            .enumerate()
            .map(|(i, d)| match d {
                Value::Number(n) => Dim::from(n.as_i64().unwrap()),
                Value::String(s) => Dim::sym(s),
                _ => Dim::sym(&format!("{}_d{i}", v["name"].as_str().unwrap_or("?"))),
            })
            .collect()
    });
    TensorType { container: None, dtype: dt, shape }
}

fn tensor(v: &Value) -> Tensor {
    let dt = dtype(&v["dtype"]).unwrap();
    let dims: Vec<i64> = v["dims"].as_array().unwrap().iter().map(|d| d.as_i64().unwrap()).collect();
    if let Some(ints) = v["ints"].as_array() {
        let vals: Vec<i64> = ints.iter().map(|x| x.as_i64().unwrap()).collect();
        if let Some(t) = Tensor::from_i64s(dt, dims.clone(), &vals) {
            return t;
        }
    }
    if let Some(fl) = v["floats"].as_array() {
        let vals: Vec<f64> = fl.iter().map(|x| num(x).unwrap()).collect();
        if let Some(t) = Tensor::from_f64s(dt, dims.clone(), &vals) {
            return t;
        }
    }
    Tensor { dtype: dt, dims, data: qsync_ir::TensorData::Absent }
}

fn attr(v: &Value) -> Option<Attr> {
    let (k, x) = v.as_object()?.iter().next()?;
    Some(match k.as_str() {
        "int" => Attr::Int(x.as_i64()?),
        "float" => Attr::Float(num(x)? as f32),
        "string" => Attr::String(x.as_str()?.as_bytes().to_vec()),
        "ints" => Attr::Ints(x.as_array()?.iter().filter_map(Value::as_i64).collect()),
        "floats" => Attr::Floats(x.as_array()?.iter().filter_map(|f| num(f).map(|f| f as f32)).collect()),
        "strings" => {
            Attr::Strings(x.as_array()?.iter().filter_map(|s| s.as_str().map(|s| s.as_bytes().to_vec())).collect())
        }
        "tensor" => Attr::Tensor(tensor(x)),
        _ => return None,
    })
}

/// Build a graph from the converter's JSON.
pub fn load(model: &Path) -> Loaded {
    let j = model_json(model);
    let mut g = Graph::new(model.file_stem().unwrap().to_string_lossy());
    let mut init_names = std::collections::HashSet::new();
    for t in j["initializers"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        init_names.insert(name.to_string());
        g.add_init(name, tensor(t));
    }
    for i in j["inputs"].as_array().unwrap() {
        let name = i["name"].as_str().unwrap();
        if init_names.contains(name) {
            continue;
        }
        g.add_input(name, ttype(i));
    }
    let declared: std::collections::HashMap<String, TensorType> = j["value_info"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap().to_string(), ttype(v)))
        .collect();
    for n in j["nodes"].as_array().unwrap() {
        let op = Op::from_onnx(n["domain"].as_str().unwrap(), n["op_type"].as_str().unwrap());
        let mut spec = NodeSpec::new(n["name"].as_str().unwrap(), op);
        for (k, a) in n["attrs"].as_object().unwrap() {
            if let Some(a) = attr(a) {
                spec = spec.attr(k, a);
            }
        }
        for i in n["inputs"].as_array().unwrap() {
            let name = i.as_str().unwrap();
            let v: Option<ValueId> = if name.is_empty() {
                None
            } else {
                Some(g.value_by_name(name).unwrap_or_else(|| g.add_undefined(name)))
            };
            spec.inputs.push(v);
        }
        for o in n["outputs"].as_array().unwrap() {
            let name = o.as_str().unwrap();
            spec = spec.output(name, declared.get(name).cloned().unwrap_or_default());
        }
        g.add_node(spec);
    }
    let outs: Vec<ValueId> =
        j["outputs"].as_array().unwrap().iter().filter_map(|o| g.value_by_name(o.as_str().unwrap())).collect();
    g.set_outputs(outs);
    let opset = j["opset"].as_i64().unwrap();
    Loaded { graph: g, opset, reference: j["ref"].clone() }
}
