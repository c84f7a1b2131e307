//! The parser: text → [`Model`].
//!
//! # Grammar
//!
//! ```text
//! file     := header* graph
//! header   := 'ir_version' INT
//!           | 'opset' STRING INT                 # "" is the default domain
//!           | 'producer' STRING STRING           # name, version
//!           | 'domain' STRING | 'model_version' INT | 'doc' STRING
//!           | 'metadata' STRING STRING
//!           | 'function' STRING                  # base64 of an encoded FunctionProto
//! graph    := 'graph' STRING '{' stmt* '}'
//! stmt     := 'init' VALUE ':' type '=' data
//!           | 'refresh' VALUE 'from' VALUE       # initializer 1 is a refreshed copy of trained parameter 2
//!           | 'input' VALUE (':' type)?          # no type: an initializer that is also an input
//!           | outs '=' OP STRING '(' args? ')' attrs? captures? ('@' DTYPE)?
//!           | 'output' VALUE (',' VALUE)*
//! outs     := '()' | out (',' out)*
//! out      := VALUE (':' type)?
//! args     := arg (',' arg)*
//! arg      := VALUE | '_'                        # '_' = omitted optional input
//! OP       := IDENT                              # a known ONNX op type, e.g. Conv
//!           | '!' DOMAIN '::' IDENT              # an opaque op, e.g. !com.microsoft::FusedMatMul
//! attrs    := '{' attr (',' attr)* '}'
//! captures := 'captures' '(' capture (',' capture)* ')'   # outer values the subgraphs read
//! capture  := VALUE ('as' VALUE)?                # 'as': the name inside the subgraphs, when it differs
//! attr     := (IDENT | STRING) '=' avalue
//! avalue   := INT | FLOAT | STRING | '[' INT,* ']' | '[' FLOAT,* ']' | '[' STRING,* ']'
//!           | 'ints[]' | 'floats[]' | 'strings[]'
//!           | 'tensor' '<' DTYPE '[' INT,* ']' '>' data
//!           | 'tensors' '[' (tensor (',' tensor)*)? ']'
//!           | RAWKIND '<' STRING,* '>'           # graph, graphs, sparse_tensor(s), type_proto(s): base64
//! type     := (DTYPE | '?') ('[' (dim (',' dim)*)? ']')?   # no brackets: rank unknown
//!           | 'seq' '<' type '>' | 'opt' '<' type '>' | 'map' '<' DTYPE ',' type '>'   # at most 16 deep
//! dim      := dimension expression over INT and symbols with + - * ( ) and '/' INT
//! data     := '[' number,* ']' | 'hex' STRING | 'external' '(' STRING ',' INT (',' INT)? ')'
//!           | 'absent' | 'elided' '(' INT ')'
//! VALUE    := '%' [A-Za-z0-9_.]+ | '%' STRING
//! ```
//!
//! `#` starts a comment that runs to the end of the line. Forward references
//! are allowed (the verifier, not the parser, reports cycles and values that
//! are never defined or defined twice).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use base64::Engine;

use crate::attr::{Attr, RawAttrKind};
use crate::text::unescape_quoted_bytes;
use crate::{
    Capture, Container, DType, Dim, Graph, Model, NodeSpec, Op, Tensor, TensorData, TensorType, ValueDef, ValueId,
};

/// Deepest nesting of container types (`seq<opt<…>>`) the parser accepts.
pub const MAX_CONTAINER_DEPTH: usize = 16;

/// A parse error with its 1-based position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.col, self.message)
    }
}

impl std::error::Error for ParseError {}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Int(String),
    Float(String),
    Str(Vec<u8>),
    Value(String),
    Opaque(String, String),
    Punct(char),
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) | Tok::Int(s) | Tok::Float(s) => f.write_str(s),
            Tok::Str(_) => f.write_str("a string"),
            Tok::Value(v) => write!(f, "%{v}"),
            Tok::Opaque(d, t) => write!(f, "!{d}::{t}"),
            Tok::Punct(c) => write!(f, "{c}"),
            Tok::Eof => f.write_str("end of input"),
        }
    }
}

struct Lexed {
    toks: Vec<(Tok, usize, usize)>,
}

fn lex(src: &str) -> Result<Lexed, ParseError> {
    let b = src.as_bytes();
    let mut toks = Vec::new();
    let (mut i, mut line, mut line_start) = (0usize, 1usize, 0usize);
    let err = |i: usize, line: usize, ls: usize, m: String| ParseError { line, col: i - ls + 1, message: m };
    while i < b.len() {
        let c = b[i];
        let col = i - line_start + 1;
        match c {
            b'\n' => {
                i += 1;
                line += 1;
                line_start = i;
            }
            b' ' | b'\t' | b'\r' => i += 1,
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'"' => {
                let (bytes, used) = unescape_quoted_bytes(&src[i..]).map_err(|m| err(i, line, line_start, m))?;
                toks.push((Tok::Str(bytes), line, col));
                i += used;
            }
            b'%' => {
                i += 1;
                if b.get(i) == Some(&b'"') {
                    let (bytes, used) = unescape_quoted_bytes(&src[i..]).map_err(|m| err(i, line, line_start, m))?;
                    let name = String::from_utf8(bytes)
                        .map_err(|_| err(i, line, line_start, "value name is not UTF-8".into()))?;
                    toks.push((Tok::Value(name), line, col));
                    i += used;
                } else {
                    let st = i;
                    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                        i += 1;
                    }
                    if st == i {
                        return Err(err(st, line, line_start, "expected a value name after `%`".into()));
                    }
                    toks.push((Tok::Value(src[st..i].to_string()), line, col));
                }
            }
            b'!' => {
                let st = i + 1;
                i = st;
                while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'(' && b[i] != b'"' {
                    i += 1;
                }
                let text = &src[st..i];
                let (d, t) = text
                    .rsplit_once("::")
                    .ok_or_else(|| err(st, line, line_start, format!("opaque op `!{text}` must be `!domain::Type`")))?;
                toks.push((Tok::Opaque(d.to_string(), t.to_string()), line, col));
            }
            c if c.is_ascii_digit() => {
                let st = i;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                let mut float = false;
                if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
                    float = true;
                    i += 1;
                    while i < b.len() && b[i].is_ascii_digit() {
                        i += 1;
                    }
                }
                if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
                    let mut j = i + 1;
                    if j < b.len() && (b[j] == b'-' || b[j] == b'+') {
                        j += 1;
                    }
                    if j < b.len() && b[j].is_ascii_digit() {
                        float = true;
                        i = j;
                        while i < b.len() && b[i].is_ascii_digit() {
                            i += 1;
                        }
                    }
                }
                let text = src[st..i].to_string();
                toks.push((if float { Tok::Float(text) } else { Tok::Int(text) }, line, col));
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let st = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                toks.push((Tok::Ident(src[st..i].to_string()), line, col));
            }
            b'{' | b'}' | b'(' | b')' | b'[' | b']' | b',' | b'=' | b':' | b'@' | b'<' | b'>' | b'+' | b'-' | b'*'
            | b'/' | b'?' => {
                toks.push((Tok::Punct(c as char), line, col));
                i += 1;
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(err(i, line, line_start, format!("unexpected character `{ch}`")));
            }
        }
    }
    toks.push((Tok::Eof, line, i - line_start + 1));
    Ok(Lexed { toks })
}

/// Parse a model from text.
pub fn parse_model(src: &str) -> Result<Model, ParseError> {
    let lexed = lex(src)?;
    let mut p = Parser { toks: lexed.toks, pos: 0, graph: Graph::default(), pending: HashMap::new(), dim_depth: 0 };
    let mut m = Model::default();
    p.header(&mut m)?;
    p.graph_block()?;
    p.expect_eof()?;
    m.graph = p.graph;
    Ok(m)
}

/// Parse a graph-only text (a `graph "…" { … }` block, optional headers
/// ignored) — a convenience for tests.
pub fn parse_graph(src: &str) -> Result<Graph, ParseError> {
    parse_model(src).map(|m| m.graph)
}

/// Parse a value type alone, as written in the text format: `f32[1,3,224,224]`,
/// `i64[batch,seq]`, `f32` (unknown rank). Used for `--input NAME=TYPE`.
pub fn parse_type(src: &str) -> Result<TensorType, ParseError> {
    let lexed = lex(src)?;
    let mut p = Parser { toks: lexed.toks, pos: 0, graph: Graph::default(), pending: HashMap::new(), dim_depth: 0 };
    let ty = p.ty()?;
    p.expect_eof()?;
    Ok(ty)
}

struct Parser {
    toks: Vec<(Tok, usize, usize)>,
    pos: usize,
    graph: Graph,
    /// Names referenced before their definition.
    pending: HashMap<String, ValueId>,
    /// Nesting of parentheses and signs in the dim being parsed, bounded by
    /// [`crate::dim::MAX_NESTING`] so hostile text cannot exhaust the stack.
    dim_depth: usize,
}

type PResult<T> = Result<T, ParseError>;

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].0
    }

    fn peek_at(&self, k: usize) -> &Tok {
        &self.toks[(self.pos + k).min(self.toks.len() - 1)].0
    }

    fn next(&mut self) -> Tok {
        let t = self.toks[self.pos].0.clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn err<T>(&self, message: impl Into<String>) -> PResult<T> {
        let (_, line, col) = &self.toks[self.pos];
        Err(ParseError { line: *line, col: *col, message: message.into() })
    }

    fn expected<T>(&self, what: &str) -> PResult<T> {
        self.err(format!("expected {what}, found `{}`", self.peek()))
    }

    fn eat_punct(&mut self, c: char) -> bool {
        if *self.peek() == Tok::Punct(c) {
            self.next();
            true
        } else {
            false
        }
    }

    fn punct(&mut self, c: char) -> PResult<()> {
        if self.eat_punct(c) {
            Ok(())
        } else {
            self.expected(&format!("`{c}`"))
        }
    }

    fn eat_ident(&mut self, kw: &str) -> bool {
        if matches!(self.peek(), Tok::Ident(s) if s == kw) {
            self.next();
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> PResult<String> {
        match self.next() {
            Tok::Ident(s) => Ok(s),
            _ => {
                self.pos -= 1;
                self.expected("a name")
            }
        }
    }

    fn string_bytes(&mut self) -> PResult<Vec<u8>> {
        match self.peek().clone() {
            Tok::Str(b) => {
                self.next();
                Ok(b)
            }
            _ => self.expected("a string"),
        }
    }

    fn string(&mut self) -> PResult<String> {
        let b = self.string_bytes()?;
        String::from_utf8(b).or_else(|_| self.err("string is not valid UTF-8"))
    }

    /// An integer, with an optional leading `-`.
    fn int(&mut self) -> PResult<i64> {
        let neg = self.eat_punct('-');
        match self.peek().clone() {
            Tok::Int(s) => {
                let v: i128 = s.parse().or_else(|_| self.err(format!("integer `{s}` out of range")))?;
                let v = if neg { -v } else { v };
                let v = i64::try_from(v).or_else(|_| self.err(format!("integer `{s}` out of range")))?;
                self.next();
                Ok(v)
            }
            _ => self.expected("an integer"),
        }
    }

    fn expect_eof(&mut self) -> PResult<()> {
        if *self.peek() == Tok::Eof {
            Ok(())
        } else {
            self.expected("end of input")
        }
    }

    fn header(&mut self, m: &mut Model) -> PResult<()> {
        loop {
            let Tok::Ident(kw) = self.peek().clone() else { return self.expected("`graph`") };
            match kw.as_str() {
                "graph" => return Ok(()),
                "ir_version" => {
                    self.next();
                    m.ir_version = self.int()?;
                }
                "opset" => {
                    self.next();
                    let d = self.string()?;
                    let v = self.int()?;
                    m.opsets.push((d, v));
                }
                "producer" => {
                    self.next();
                    m.producer_name = self.string()?;
                    m.producer_version = self.string()?;
                }
                "domain" => {
                    self.next();
                    m.domain = self.string()?;
                }
                "model_version" => {
                    self.next();
                    m.model_version = self.int()?;
                }
                "doc" => {
                    self.next();
                    m.doc_string = self.string()?;
                }
                "metadata" => {
                    self.next();
                    let k = self.string()?;
                    let v = self.string()?;
                    m.metadata.push((k, v));
                }
                "function" => {
                    self.next();
                    let s = self.string()?;
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(s.as_bytes())
                        .or_else(|e| self.err(format!("bad base64 in function: {e}")))?;
                    m.functions.push(bytes);
                }
                other => return self.err(format!("unknown header `{other}` (expected `graph`)")),
            }
        }
    }

    fn graph_block(&mut self) -> PResult<()> {
        if !self.eat_ident("graph") {
            return self.expected("`graph`");
        }
        self.graph.name = self.string()?;
        self.punct('{')?;
        loop {
            match self.peek().clone() {
                Tok::Punct('}') => {
                    self.next();
                    break;
                }
                Tok::Ident(kw) if kw == "init" => {
                    self.next();
                    self.init_stmt()?;
                }
                Tok::Ident(kw) if kw == "input" => {
                    self.next();
                    self.input_stmt()?;
                }
                Tok::Ident(kw) if kw == "refresh" => {
                    self.next();
                    let copy = self.value_name()?;
                    if !self.eat_ident("from") {
                        return self.expected("`from`");
                    }
                    let master = self.value_name()?;
                    let (c, m) = (self.use_value(&copy), self.use_value(&master));
                    self.graph.link_refreshed_copy(c, m);
                }
                Tok::Ident(kw) if kw == "output" => {
                    self.next();
                    let mut outs = Vec::new();
                    loop {
                        let name = self.value_name()?;
                        outs.push(self.use_value(&name));
                        if !self.eat_punct(',') {
                            break;
                        }
                    }
                    let mut all = self.graph.outputs().to_vec();
                    all.extend(outs);
                    self.graph.set_outputs(all);
                }
                Tok::Value(_) | Tok::Punct('(') => self.node_stmt()?,
                _ => return self.expected("`init`, `refresh`, `input`, `output`, a node or `}`"),
            }
        }
        Ok(())
    }

    fn value_name(&mut self) -> PResult<String> {
        match self.peek().clone() {
            Tok::Value(v) => {
                self.next();
                Ok(v)
            }
            _ => self.expected("a value (`%name`)"),
        }
    }

    /// The value `name` refers to, creating a forward reference if needed.
    fn use_value(&mut self, name: &str) -> ValueId {
        if let Some(v) = self.graph.value_by_name(name) {
            return v;
        }
        let v = self.graph.add_undefined(name);
        self.pending.insert(name.to_string(), v);
        v
    }

    /// A value to define: the pending forward reference, or a new value.
    fn def_value(&mut self, name: &str) -> ValueId {
        self.pending.remove(name).unwrap_or_else(|| self.graph.add_undefined(name))
    }

    fn init_stmt(&mut self) -> PResult<()> {
        let name = self.value_name()?;
        self.punct(':')?;
        let ty = self.ty()?;
        let (Some(dtype), Some(shape)) = (ty.dtype, ty.shape.clone()) else {
            return self.err("an initializer needs a dtype and a shape");
        };
        let dims: Option<Vec<i64>> = shape.iter().map(Dim::as_const).collect();
        let Some(dims) = dims else { return self.err("an initializer's shape must be concrete") };
        self.punct('=')?;
        let data = self.data(dtype, &dims)?;
        let t = Tensor { dtype, dims, data };
        if let Some(v) = self.pending.remove(&name) {
            self.graph.set_init(v, t);
            self.graph.push_init_existing(v);
        } else {
            self.graph.add_init(name, t);
        }
        Ok(())
    }

    fn input_stmt(&mut self) -> PResult<()> {
        let name = self.value_name()?;
        if self.eat_punct(':') {
            let ty = self.ty()?;
            if let Some(v) = self.pending.remove(&name) {
                self.graph.set_ty(v, ty);
                self.graph.define_input(v);
            } else {
                self.graph.add_input(name, ty);
            }
            return Ok(());
        }
        match self.graph.value_by_name(&name) {
            Some(v) if matches!(self.graph.value(v).def, ValueDef::Init(_)) => {
                self.graph.push_input(v);
                Ok(())
            }
            _ => self.err(format!("input %{name} has no type and is not an initializer defined above")),
        }
    }

    fn node_stmt(&mut self) -> PResult<()> {
        let mut outs: Vec<(String, TensorType)> = Vec::new();
        if self.eat_punct('(') {
            self.punct(')')?;
        } else {
            loop {
                let name = self.value_name()?;
                let ty = if self.eat_punct(':') { self.ty()? } else { TensorType::unknown() };
                outs.push((name, ty));
                if !self.eat_punct(',') {
                    break;
                }
            }
        }
        self.punct('=')?;
        let op = match self.next() {
            Tok::Ident(s) => {
                let op = Op::from_onnx("", &s);
                if op.is_opaque() {
                    self.pos -= 1;
                    return self.err(format!("unknown op `{s}` (write opaque ops as `!domain::{s}`)"));
                }
                op
            }
            Tok::Opaque(d, t) => Op::Opaque { domain: d, op_type: t },
            _ => {
                self.pos -= 1;
                return self.expected("an op");
            }
        };
        let name = self.string()?;
        self.punct('(')?;
        let mut inputs = Vec::new();
        if !self.eat_punct(')') {
            loop {
                if self.eat_ident("_") {
                    inputs.push(None);
                } else {
                    let v = self.value_name()?;
                    inputs.push(Some(self.use_value(&v)));
                }
                if self.eat_punct(')') {
                    break;
                }
                self.punct(',')?;
            }
        }
        let mut attrs = BTreeMap::new();
        if self.eat_punct('{') {
            loop {
                let key = match self.peek().clone() {
                    Tok::Ident(s) => {
                        self.next();
                        s
                    }
                    Tok::Str(_) => self.string()?,
                    _ => return self.expected("an attribute name"),
                };
                self.punct('=')?;
                let a = self.attr_value()?;
                if attrs.insert(key.clone(), a).is_some() {
                    return self.err(format!("attribute `{key}` given twice"));
                }
                if self.eat_punct('}') {
                    break;
                }
                self.punct(',')?;
            }
        }
        let mut captures = Vec::new();
        if self.eat_ident("captures") {
            self.punct('(')?;
            loop {
                let outer = self.value_name()?;
                let inner = if self.eat_ident("as") { self.value_name()? } else { outer.clone() };
                captures.push(Capture { name: inner, value: self.use_value(&outer) });
                if self.eat_punct(')') {
                    break;
                }
                self.punct(',')?;
            }
        }
        let precision = if self.eat_punct('@') {
            let d = self.ident()?;
            Some(DType::from_name(&d).map_or_else(|| self.err(format!("unknown dtype `{d}`")), Ok)?)
        } else {
            None
        };
        let out_ids: Vec<ValueId> = outs.iter().map(|(n, _)| self.def_value(n)).collect();
        let spec = NodeSpec { name, op, attrs, inputs, outputs: outs, precision, captures };
        self.graph.add_node_defining(spec, out_ids);
        Ok(())
    }

    fn ty(&mut self) -> PResult<TensorType> {
        self.ty_at(0)
    }

    /// A type; containers nest at most [`MAX_CONTAINER_DEPTH`] deep.
    fn ty_at(&mut self, depth: usize) -> PResult<TensorType> {
        let is_container = matches!(self.peek(), Tok::Ident(s) if s == "seq" || s == "opt" || s == "map")
            && *self.peek_at(1) == Tok::Punct('<');
        if is_container {
            if depth >= MAX_CONTAINER_DEPTH {
                return self.err(format!("types nest more than {MAX_CONTAINER_DEPTH} containers deep"));
            }
            let kind = self.ident()?;
            self.punct('<')?;
            let c = match kind.as_str() {
                "seq" => Container::Sequence(self.ty_at(depth + 1)?),
                "opt" => Container::Optional(self.ty_at(depth + 1)?),
                _ => {
                    let k = self.ident()?;
                    let key = DType::from_name(&k).map_or_else(|| self.err(format!("unknown dtype `{k}`")), Ok)?;
                    self.punct(',')?;
                    Container::Map(key, self.ty_at(depth + 1)?)
                }
            };
            self.punct('>')?;
            return Ok(TensorType::of(c));
        }
        let dtype = if self.eat_punct('?') {
            None
        } else {
            let d = self.ident()?;
            Some(DType::from_name(&d).map_or_else(|| self.err(format!("unknown dtype `{d}`")), Ok)?)
        };
        let shape = if self.eat_punct('[') {
            let mut dims = Vec::new();
            if !self.eat_punct(']') {
                loop {
                    dims.push(self.dim()?);
                    if self.eat_punct(']') {
                        break;
                    }
                    self.punct(',')?;
                }
            }
            Some(dims)
        } else {
            None
        };
        Ok(TensorType { container: None, dtype, shape })
    }

    /// A dimension expression; too deep, too complex or overflowing is a
    /// parse error at the dim.
    fn dim(&mut self) -> PResult<Dim> {
        let start = self.pos;
        let d = self.dim_expr()?;
        if d.is_invalid() {
            self.pos = start;
            return self.err(format!(
                "dimension too complex (more than {} terms, degree above {}, or a value outside i64)",
                crate::dim::MAX_TERMS,
                crate::dim::MAX_DEGREE
            ));
        }
        Ok(d)
    }

    fn dim_expr(&mut self) -> PResult<Dim> {
        let mut acc = self.dim_term()?;
        loop {
            if self.eat_punct('+') {
                acc = acc.add(&self.dim_term()?);
            } else if self.eat_punct('-') {
                acc = acc.sub(&self.dim_term()?);
            } else {
                return Ok(acc);
            }
        }
    }

    fn dim_term(&mut self) -> PResult<Dim> {
        let mut acc = self.dim_unary()?;
        loop {
            if self.eat_punct('*') {
                acc = acc.mul(&self.dim_unary()?);
            } else if self.eat_punct('/') {
                let d = self.int()?;
                acc = match acc.floor_div_const(d) {
                    Some(x) => x,
                    None => return self.err("a dimension can only be divided by a positive integer"),
                };
            } else {
                return Ok(acc);
            }
        }
    }

    fn dim_unary(&mut self) -> PResult<Dim> {
        if self.dim_depth >= crate::dim::MAX_NESTING {
            return self.err(format!("dimension nests deeper than {} levels", crate::dim::MAX_NESTING));
        }
        self.dim_depth += 1;
        let r = self.dim_unary_inner();
        self.dim_depth -= 1;
        r
    }

    fn dim_unary_inner(&mut self) -> PResult<Dim> {
        match self.peek().clone() {
            Tok::Punct('-') => {
                self.next();
                Ok(self.dim_unary()?.neg())
            }
            Tok::Punct('(') => {
                self.next();
                let e = self.dim_expr()?;
                self.punct(')')?;
                Ok(e)
            }
            Tok::Int(_) => Ok(Dim::from(self.int()?)),
            Tok::Ident(s) => {
                self.next();
                Ok(Dim::sym(&s))
            }
            Tok::Str(_) => Ok(Dim::sym(&self.string()?)),
            _ => self.expected("a dimension"),
        }
    }

    /// A number literal as f64 (for float data and attributes).
    fn float_lit(&mut self) -> PResult<f64> {
        let neg = self.eat_punct('-');
        let v = match self.peek().clone() {
            Tok::Float(s) | Tok::Int(s) => s.parse::<f64>().or_else(|_| self.err(format!("bad number `{s}`")))?,
            Tok::Ident(s) if s == "inf" => f64::INFINITY,
            Tok::Ident(s) if s == "nan" => f64::NAN,
            _ => return self.expected("a number"),
        };
        self.next();
        Ok(if neg { -v } else { v })
    }

    fn f32_lit(&mut self) -> PResult<f32> {
        // Parse f32 text directly: going through f64 could double-round.
        let neg = self.eat_punct('-');
        let v = match self.peek().clone() {
            Tok::Float(s) | Tok::Int(s) => s.parse::<f32>().or_else(|_| self.err(format!("bad number `{s}`")))?,
            Tok::Ident(s) if s == "inf" => f32::INFINITY,
            Tok::Ident(s) if s == "nan" => f32::NAN,
            _ => return self.expected("a number"),
        };
        self.next();
        Ok(if neg { -v } else { v })
    }

    fn is_float_next(&self) -> bool {
        let t = if *self.peek() == Tok::Punct('-') { self.peek_at(1) } else { self.peek() };
        matches!(t, Tok::Float(_)) || matches!(t, Tok::Ident(s) if s == "inf" || s == "nan")
    }

    fn attr_value(&mut self) -> PResult<Attr> {
        match self.peek().clone() {
            Tok::Str(_) => Ok(Attr::String(self.string_bytes()?)),
            Tok::Ident(s) if s == "tensor" => Ok(Attr::Tensor(self.tensor_lit()?)),
            Tok::Ident(s) if s == "tensors" => {
                self.next();
                self.punct('[')?;
                let mut v = Vec::new();
                if !self.eat_punct(']') {
                    loop {
                        v.push(self.tensor_lit()?);
                        if self.eat_punct(']') {
                            break;
                        }
                        self.punct(',')?;
                    }
                }
                Ok(Attr::Tensors(v))
            }
            Tok::Ident(s) if matches!(s.as_str(), "ints" | "floats" | "strings") => {
                self.next();
                self.punct('[')?;
                self.punct(']')?;
                Ok(match s.as_str() {
                    "ints" => Attr::Ints(Vec::new()),
                    "floats" => Attr::Floats(Vec::new()),
                    _ => Attr::Strings(Vec::new()),
                })
            }
            Tok::Ident(s) if RawAttrKind::from_name(&s).is_some() => {
                self.next();
                let kind = RawAttrKind::from_name(&s).unwrap_or(RawAttrKind::Graph);
                self.punct('<')?;
                let mut items = Vec::new();
                if !self.eat_punct('>') {
                    loop {
                        let text = self.string()?;
                        let bytes = base64::engine::general_purpose::STANDARD
                            .decode(text.as_bytes())
                            .or_else(|e| self.err(format!("bad base64: {e}")))?;
                        items.push(bytes);
                        if self.eat_punct('>') {
                            break;
                        }
                        self.punct(',')?;
                    }
                }
                Ok(Attr::Raw { kind, items })
            }
            Tok::Punct('[') => {
                self.next();
                match self.peek().clone() {
                    Tok::Str(_) => {
                        let mut v = Vec::new();
                        loop {
                            v.push(self.string_bytes()?);
                            if self.eat_punct(']') {
                                break;
                            }
                            self.punct(',')?;
                        }
                        Ok(Attr::Strings(v))
                    }
                    _ if self.is_float_next() => {
                        let mut v = Vec::new();
                        loop {
                            v.push(self.f32_lit()?);
                            if self.eat_punct(']') {
                                break;
                            }
                            self.punct(',')?;
                        }
                        Ok(Attr::Floats(v))
                    }
                    _ => {
                        let mut v = Vec::new();
                        loop {
                            v.push(self.int()?);
                            if self.eat_punct(']') {
                                break;
                            }
                            self.punct(',')?;
                        }
                        Ok(Attr::Ints(v))
                    }
                }
            }
            _ if self.is_float_next() => Ok(Attr::Float(self.f32_lit()?)),
            _ => Ok(Attr::Int(self.int()?)),
        }
    }

    fn tensor_lit(&mut self) -> PResult<Tensor> {
        if !self.eat_ident("tensor") {
            return self.expected("`tensor<…>`");
        }
        self.punct('<')?;
        let d = self.ident()?;
        let dtype = DType::from_name(&d).map_or_else(|| self.err(format!("unknown dtype `{d}`")), Ok)?;
        self.punct('[')?;
        let mut dims = Vec::new();
        if !self.eat_punct(']') {
            loop {
                dims.push(self.int()?);
                if self.eat_punct(']') {
                    break;
                }
                self.punct(',')?;
            }
        }
        self.punct('>')?;
        let data = self.data(dtype, &dims)?;
        Ok(Tensor { dtype, dims, data })
    }

    fn data(&mut self, dtype: DType, dims: &[i64]) -> PResult<TensorData> {
        let numel: u64 = dims.iter().fold(1u64, |n, &d| n.saturating_mul(d.max(0) as u64));
        match self.peek().clone() {
            Tok::Ident(s) if s == "absent" => {
                self.next();
                Ok(TensorData::Absent)
            }
            Tok::Ident(s) if s == "elided" => {
                self.next();
                self.punct('(')?;
                self.int()?;
                self.punct(')')?;
                Ok(TensorData::Absent)
            }
            Tok::Ident(s) if s == "external" => {
                self.next();
                self.punct('(')?;
                let location = self.string()?;
                self.punct(',')?;
                let offset = self.int()?;
                let length = if self.eat_punct(',') { Some(self.int()?) } else { None };
                self.punct(')')?;
                if offset < 0 || length.is_some_and(|l| l < 0) {
                    return self.err("external offsets and lengths must be non-negative");
                }
                Ok(TensorData::External { location, offset: offset as u64, length: length.map(|l| l as u64) })
            }
            Tok::Ident(s) if s == "hex" => {
                self.next();
                let text = self.string()?;
                if text.len() % 2 != 0 {
                    return self.err("hex data needs an even number of digits");
                }
                let mut bytes = Vec::with_capacity(text.len() / 2);
                for i in (0..text.len()).step_by(2) {
                    let byte = text.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok());
                    match byte {
                        Some(b) => bytes.push(b),
                        None => return self.err("bad hex digit"),
                    }
                }
                if dtype != DType::Str && bytes.len() as u64 != dtype.storage_bytes(numel) {
                    return self.err(format!(
                        "hex data has {} bytes but {dtype}{dims:?} needs {}",
                        bytes.len(),
                        dtype.storage_bytes(numel)
                    ));
                }
                Ok(TensorData::Inline(bytes.into()))
            }
            Tok::Punct('[') => {
                let start = self.pos;
                self.next();
                let mut bytes: Vec<u8> = Vec::new();
                let mut count = 0u64;
                if !self.eat_punct(']') {
                    loop {
                        self.push_elem(dtype, &mut bytes)?;
                        count += 1;
                        if self.eat_punct(']') {
                            break;
                        }
                        self.punct(',')?;
                    }
                }
                if count != numel {
                    self.pos = start;
                    return self.err(format!("{count} values given for a tensor of {numel} elements"));
                }
                Ok(TensorData::Inline(bytes.into()))
            }
            _ => self.expected("tensor data (`[…]`, `hex\"…\"`, `external(…)`, `absent`)"),
        }
    }

    fn push_elem(&mut self, dtype: DType, out: &mut Vec<u8>) -> PResult<()> {
        match dtype {
            DType::F32 => out.extend(self.f32_lit()?.to_le_bytes()),
            DType::F64 => out.extend(self.float_lit()?.to_le_bytes()),
            DType::I64 => out.extend(self.int()?.to_le_bytes()),
            DType::I32 => {
                let v = self.int()?;
                let v = i32::try_from(v).or_else(|_| self.err(format!("{v} does not fit i32")))?;
                out.extend(v.to_le_bytes());
            }
            DType::I16 => {
                let v = self.int()?;
                let v = i16::try_from(v).or_else(|_| self.err(format!("{v} does not fit i16")))?;
                out.extend(v.to_le_bytes());
            }
            DType::I8 => {
                let v = self.int()?;
                let v = i8::try_from(v).or_else(|_| self.err(format!("{v} does not fit i8")))?;
                out.push(v as u8);
            }
            DType::U8 => {
                let v = self.int()?;
                let v = u8::try_from(v).or_else(|_| self.err(format!("{v} does not fit u8")))?;
                out.push(v);
            }
            DType::Bool => {
                if self.eat_ident("true") {
                    out.push(1);
                } else if self.eat_ident("false") {
                    out.push(0);
                } else {
                    return self.expected("`true` or `false`");
                }
            }
            DType::Str => {
                let b = self.string_bytes()?;
                out.extend((b.len() as u32).to_le_bytes());
                out.extend(b);
            }
            other => return self.err(format!("{other} data must be written as hex\"…\"")),
        }
        Ok(())
    }
}
