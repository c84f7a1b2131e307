//! The printer: [`Model`] → text. The output is canonical (fields that hold
//! their default are left out, nodes come in [`Graph::schedule`] order,
//! attributes sorted by name), so `print(parse(t)) == t` for any printed `t`.

use std::fmt::Write;

use base64::Engine;

use crate::attr::Attr;
use crate::text::quote_bytes;
use crate::{DType, Graph, Model, Tensor, TensorData, TensorType, ValueDef, ValueId};

/// Printing choices.
#[derive(Clone, Debug, Default)]
pub struct PrintOptions {
    /// Inline tensors larger than this many bytes print as `elided(N)`
    /// (parsed back as absent data). `None` prints every value.
    pub elide_above: Option<usize>,
}

/// Print a model with every value written out.
pub fn print_model(m: &Model) -> String {
    print_model_with(m, &PrintOptions::default())
}

/// Print a model.
pub fn print_model_with(m: &Model, opts: &PrintOptions) -> String {
    let mut out = String::new();
    let p = Printer { opts, out: &mut out };
    p.model(m);
    out
}

/// Whether a value or node name can be written without quotes.
fn is_bare_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.')
}

/// `%name` or `%"odd/name"`.
pub fn value_ref(name: &str) -> String {
    if is_bare_name(name) {
        format!("%{name}")
    } else {
        format!("%{}", quote_bytes(name.as_bytes()))
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

struct Printer<'a> {
    opts: &'a PrintOptions,
    out: &'a mut String,
}

impl Printer<'_> {
    fn line(&mut self, s: &str) {
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn model(mut self, m: &Model) {
        if m.ir_version != 0 {
            self.line(&format!("ir_version {}", m.ir_version));
        }
        for (d, v) in &m.opsets {
            self.line(&format!("opset {} {v}", quote_bytes(d.as_bytes())));
        }
        if !m.producer_name.is_empty() || !m.producer_version.is_empty() {
            self.line(&format!(
                "producer {} {}",
                quote_bytes(m.producer_name.as_bytes()),
                quote_bytes(m.producer_version.as_bytes())
            ));
        }
        if !m.domain.is_empty() {
            self.line(&format!("domain {}", quote_bytes(m.domain.as_bytes())));
        }
        if m.model_version != 0 {
            self.line(&format!("model_version {}", m.model_version));
        }
        if !m.doc_string.is_empty() {
            self.line(&format!("doc {}", quote_bytes(m.doc_string.as_bytes())));
        }
        for (k, v) in &m.metadata {
            self.line(&format!("metadata {} {}", quote_bytes(k.as_bytes()), quote_bytes(v.as_bytes())));
        }
        for f in &m.functions {
            self.line(&format!("function \"{}\"", b64(f)));
        }
        self.graph(&m.graph);
    }

    fn graph(&mut self, g: &Graph) {
        self.line(&format!("graph {} {{", quote_bytes(g.name.as_bytes())));
        for &v in g.inits() {
            let data = g.value(v);
            if let ValueDef::Init(t) = &data.def {
                let mut s = format!("  init {}: {} = ", value_ref(&data.name), data.ty);
                self.data(&mut s, t);
                self.line(&s);
            }
        }
        for (c, m) in g.refreshed_copies() {
            self.line(&format!("  refresh {} from {}", value_ref(g.value_name(c)), value_ref(g.value_name(m))));
        }
        for &v in g.inputs() {
            let data = g.value(v);
            if matches!(data.def, ValueDef::Init(_)) {
                self.line(&format!("  input {}", value_ref(&data.name)));
            } else {
                self.line(&format!("  input {}: {}", value_ref(&data.name), data.ty));
            }
        }
        for n in g.schedule() {
            let node = g.node(n);
            let mut s = String::from("  ");
            if node.outputs().is_empty() {
                s.push_str("()");
            }
            for (i, &o) in node.outputs().iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                s.push_str(&value_ref(g.value_name(o)));
                let ty = g.ty(o);
                if *ty != TensorType::unknown() {
                    let _ = write!(s, ": {ty}");
                }
            }
            let _ = write!(s, " = {} {}(", node.op, quote_bytes(node.name.as_bytes()));
            for (i, inp) in node.inputs().iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                match inp {
                    Some(v) => s.push_str(&value_ref(g.value_name(*v))),
                    None => s.push('_'),
                }
            }
            s.push(')');
            if !node.attrs.is_empty() {
                s.push_str(" {");
                for (i, (k, a)) in node.attrs.iter().enumerate() {
                    if i > 0 {
                        s.push_str(", ");
                    }
                    if is_bare_name(k) && !k.starts_with(|c: char| c.is_ascii_digit()) {
                        s.push_str(k);
                    } else {
                        s.push_str(&quote_bytes(k.as_bytes()));
                    }
                    s.push('=');
                    self.attr(&mut s, a);
                }
                s.push('}');
            }
            if !node.captures().is_empty() {
                s.push_str(" captures(");
                for (i, c) in node.captures().iter().enumerate() {
                    if i > 0 {
                        s.push_str(", ");
                    }
                    let outer = g.value_name(c.value);
                    s.push_str(&value_ref(outer));
                    if c.name != outer {
                        let _ = write!(s, " as {}", value_ref(&c.name));
                    }
                }
                s.push(')');
            }
            if let Some(p) = node.precision {
                let _ = write!(s, " @{p}");
            }
            self.line(&s);
        }
        if !g.outputs().is_empty() {
            let outs: Vec<String> = g.outputs().iter().map(|&v: &ValueId| value_ref(g.value_name(v))).collect();
            self.line(&format!("  output {}", outs.join(", ")));
        }
        self.line("}");
    }

    fn attr(&self, s: &mut String, a: &Attr) {
        match a {
            Attr::Int(i) => {
                let _ = write!(s, "{i}");
            }
            Attr::Float(f) => s.push_str(&float32(*f)),
            Attr::String(b) => s.push_str(&quote_bytes(b)),
            Attr::Ints(v) if v.is_empty() => s.push_str("ints[]"),
            Attr::Ints(v) => {
                let items: Vec<String> = v.iter().map(i64::to_string).collect();
                let _ = write!(s, "[{}]", items.join(", "));
            }
            Attr::Floats(v) if v.is_empty() => s.push_str("floats[]"),
            Attr::Floats(v) => {
                let items: Vec<String> = v.iter().map(|f| float32(*f)).collect();
                let _ = write!(s, "[{}]", items.join(", "));
            }
            Attr::Strings(v) if v.is_empty() => s.push_str("strings[]"),
            Attr::Strings(v) => {
                let items: Vec<String> = v.iter().map(|b| quote_bytes(b)).collect();
                let _ = write!(s, "[{}]", items.join(", "));
            }
            Attr::Tensor(t) => self.tensor(s, t),
            Attr::Tensors(v) => {
                s.push_str("tensors[");
                for (i, t) in v.iter().enumerate() {
                    if i > 0 {
                        s.push_str(", ");
                    }
                    self.tensor(s, t);
                }
                s.push(']');
            }
            Attr::Raw { kind, items } => {
                let items: Vec<String> = items.iter().map(|b| format!("\"{}\"", b64(b))).collect();
                let _ = write!(s, "{}<{}>", kind.name(), items.join(", "));
            }
        }
    }

    fn tensor(&self, s: &mut String, t: &Tensor) {
        let dims: Vec<String> = t.dims.iter().map(i64::to_string).collect();
        let _ = write!(s, "tensor<{}[{}]> ", t.dtype, dims.join(","));
        self.data(s, t);
    }

    fn data(&self, s: &mut String, t: &Tensor) {
        match &t.data {
            TensorData::Absent => s.push_str("absent"),
            TensorData::External { location, offset, length } => {
                let _ = write!(s, "external({}, {offset}", quote_bytes(location.as_bytes()));
                if let Some(l) = length {
                    let _ = write!(s, ", {l}");
                }
                s.push(')');
            }
            TensorData::Inline(bytes) => {
                if self.opts.elide_above.is_some_and(|max| bytes.len() > max) {
                    let _ = write!(s, "elided({})", bytes.len());
                    return;
                }
                s.push_str(&inline_values(t.dtype, bytes));
            }
        }
    }
}

/// Shortest text that parses back to the same `f32` (always has a `.`, an
/// exponent, or is `inf`/`-inf`/`nan`, so it never reads as an integer).
pub fn float32(f: f32) -> String {
    if f.is_nan() {
        "nan".into()
    } else {
        let s = format!("{f:?}");
        s.replace("NaN", "nan")
    }
}

fn float64(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else {
        format!("{f:?}")
    }
}

/// The literal for inline bytes of `dtype`: a list of numbers for the types
/// that have an exact decimal form here, `hex"…"` for the others.
fn inline_values(dtype: DType, b: &[u8]) -> String {
    let items: Option<Vec<String>> = match dtype {
        DType::F32 => Some(b.chunks_exact(4).map(|c| float32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect()),
        DType::F64 => Some(
            b.chunks_exact(8)
                .map(|c| float64(f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])))
                .collect(),
        ),
        DType::I64 => Some(
            b.chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]).to_string())
                .collect(),
        ),
        DType::I32 => {
            Some(b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]).to_string()).collect())
        }
        DType::I16 => Some(b.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]).to_string()).collect()),
        DType::I8 => Some(b.iter().map(|&x| (x as i8).to_string()).collect()),
        DType::U8 => Some(b.iter().map(|x| x.to_string()).collect()),
        DType::Bool if b.iter().all(|&x| x <= 1) => {
            Some(b.iter().map(|&x| if x == 1 { "true".to_string() } else { "false".to_string() }).collect())
        }
        DType::Str => str_items(b),
        _ => None,
    };
    let exact_len = match dtype {
        DType::F32 | DType::I32 => b.len().is_multiple_of(4),
        DType::F64 | DType::I64 => b.len().is_multiple_of(8),
        DType::I16 => b.len().is_multiple_of(2),
        _ => true,
    };
    match items {
        Some(items) if exact_len => format!("[{}]", items.join(", ")),
        _ => {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            format!("hex\"{hex}\"")
        }
    }
}

fn str_items(b: &[u8]) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let len = u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?) as usize;
        i += 4;
        out.push(quote_bytes(b.get(i..i + len)?));
        i += len;
    }
    Some(out)
}
