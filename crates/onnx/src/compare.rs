//! Structural comparison of models and graphs, independent of value and node
//! ids and of any text printer: values are matched by name, nodes by their
//! position in [`Graph::schedule`]. Used to check that import → export →
//! import is the identity.

use qsync_ir::{Graph, Model, ValueDef, ValueId};

/// Every difference between two models (empty when they are the same).
pub fn model_diff(a: &Model, b: &Model) -> Vec<String> {
    let mut d = Vec::new();
    let mut field = |name: &str, x: String, y: String| {
        if x != y {
            d.push(format!("model {name}: {x} vs {y}"));
        }
    };
    field("ir_version", a.ir_version.to_string(), b.ir_version.to_string());
    field("opsets", format!("{:?}", a.opsets), format!("{:?}", b.opsets));
    field("producer_name", a.producer_name.clone(), b.producer_name.clone());
    field("producer_version", a.producer_version.clone(), b.producer_version.clone());
    field("domain", a.domain.clone(), b.domain.clone());
    field("model_version", a.model_version.to_string(), b.model_version.to_string());
    field("doc_string", a.doc_string.clone(), b.doc_string.clone());
    field("metadata", format!("{:?}", a.metadata), format!("{:?}", b.metadata));
    if a.functions != b.functions {
        d.push("model functions differ".into());
    }
    d.extend(graph_diff(&a.graph, &b.graph));
    d
}

/// A value by name, type and kind of definition (node outputs by slot).
fn value_desc(g: &Graph, v: ValueId) -> String {
    let data = g.value(v);
    let def = match &data.def {
        ValueDef::Input => "input".to_string(),
        ValueDef::Init(t) => format!("init {t:?}"),
        ValueDef::Node(n, slot) => format!("output {slot} of `{}`", g.node(*n).name),
        ValueDef::Undefined => "undefined".to_string(),
        ValueDef::Removed => "removed".to_string(),
    };
    format!("`{}`: {} ({def})", data.name, data.ty)
}

fn opt_desc(g: &Graph, v: Option<ValueId>) -> String {
    v.map_or_else(|| "<none>".to_string(), |v| value_desc(g, v))
}

fn list_diff(what: &str, ga: &Graph, a: &[ValueId], gb: &Graph, b: &[ValueId], d: &mut Vec<String>) {
    if a.len() != b.len() {
        d.push(format!("{what}: {} vs {}", a.len(), b.len()));
    }
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        let (x, y) = (value_desc(ga, x), value_desc(gb, y));
        if x != y {
            d.push(format!("{what} #{i}: {x} vs {y}"));
        }
    }
}

/// Every difference between two graphs (empty when they are the same).
pub fn graph_diff(a: &Graph, b: &Graph) -> Vec<String> {
    let mut d = Vec::new();
    if a.name != b.name {
        d.push(format!("graph name: `{}` vs `{}`", a.name, b.name));
    }
    list_diff("graph inputs", a, a.inputs(), b, b.inputs(), &mut d);
    list_diff("initializers", a, a.inits(), b, b.inits(), &mut d);
    list_diff("graph outputs", a, a.outputs(), b, b.outputs(), &mut d);
    let copies = |g: &Graph| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> =
            g.refreshed_copies().map(|(c, m)| (g.value_name(c).to_string(), g.value_name(m).to_string())).collect();
        v.sort();
        v
    };
    if copies(a) != copies(b) {
        d.push(format!("refreshed copies: {:?} vs {:?}", copies(a), copies(b)));
    }
    let (sa, sb) = (a.schedule(), b.schedule());
    if sa.len() != sb.len() {
        d.push(format!("node count: {} vs {}", sa.len(), sb.len()));
    }
    for (i, (&x, &y)) in sa.iter().zip(&sb).enumerate() {
        let (nx, ny) = (a.node(x), b.node(y));
        let at = format!("node #{i} `{}`", nx.name);
        if nx.name != ny.name || nx.op != ny.op || nx.precision != ny.precision {
            d.push(format!("{at}: {} {:?} vs `{}` {} {:?}", nx.op, nx.precision, ny.name, ny.op, ny.precision));
        }
        if nx.attrs != ny.attrs {
            d.push(format!("{at}: attributes differ: {:?} vs {:?}", nx.attrs, ny.attrs));
        }
        let ix: Vec<String> = nx.inputs().iter().map(|&v| opt_desc(a, v)).collect();
        let iy: Vec<String> = ny.inputs().iter().map(|&v| opt_desc(b, v)).collect();
        if ix != iy {
            d.push(format!("{at}: inputs {ix:?} vs {iy:?}"));
        }
        let cx: Vec<&str> = nx.captures().iter().map(|c| a.value_name(c.value)).collect();
        let cy: Vec<&str> = ny.captures().iter().map(|c| b.value_name(c.value)).collect();
        if cx != cy {
            d.push(format!("{at}: captures {cx:?} vs {cy:?}"));
        }
        let ox: Vec<String> = nx.outputs().iter().map(|&v| value_desc(a, v)).collect();
        let oy: Vec<String> = ny.outputs().iter().map(|&v| value_desc(b, v)).collect();
        if ox != oy {
            d.push(format!("{at}: outputs {ox:?} vs {oy:?}"));
        }
    }
    d
}
