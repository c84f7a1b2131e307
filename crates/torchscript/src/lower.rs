//! Lowering: an interpreter over the parsed TorchScript that inlines every
//! submodule call into one IR graph. Values are [`Val`]s — Python scalars,
//! lists, modules, or IR tensors; `aten` calls become IR nodes (see
//! [`crate::aten`]). Each node is type-inferred as it is added
//! ([`qsync_ir::infer::Incremental`]), so rank-dependent lowerings
//! (`transpose`, `flatten`, `expand`'s `-1`) see their input's shape, and
//! sizes that are static fold to integers while symbolic ones stay
//! `Shape`/`Gather` arithmetic.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use qsync_ir::infer::Incremental;
use qsync_ir::{Attr, DType, Graph, NodeSpec, Op, Tensor, TensorType, ValueId};

use crate::archive::Archive;
use crate::code::{self, ClassDef, CodeFile, Expr, FnDef, Stmt, StmtKind};
use crate::error::{Result, TsError};
use crate::pickle::{Object, PyVal, TensorRef};

/// A value during lowering.
#[derive(Clone, Debug)]
pub enum Val {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Device,
    Tensor(ValueId),
    List(Vec<Val>),
    Tuple(Vec<Val>),
    Dict(Vec<(Val, Val)>),
    Module(Rc<ModRef>),
    /// A dotted name not bound to a value: `torch`, `ops.prim`, a type.
    Ns(String),
}

/// A module instance from `data.pkl` and its path in the module tree.
#[derive(Debug)]
pub struct ModRef {
    pub obj: Rc<RefCell<Object>>,
    pub path: String,
}

impl ModRef {
    fn attr(&self, name: &str) -> Option<PyVal> {
        let o = self.obj.borrow();
        let PyVal::Dict(d) = &o.state else { return None };
        let d = d.borrow();
        d.iter().find(|(k, _)| k.as_str() == Some(name)).map(|(_, v)| v.clone())
    }

    fn class_path(&self) -> (String, String) {
        let o = self.obj.borrow();
        (o.module.clone(), o.name.clone())
    }
}

/// Where lowering currently is, for error messages.
#[derive(Clone, Debug, Default)]
struct Loc {
    member: String,
    line: usize,
}

pub struct Lowerer<'a> {
    pub g: Graph,
    pub inc: Incremental,
    pub opset: i64,
    ar: &'a Archive,
    pub warnings: Vec<String>,
    files: HashMap<String, Rc<CodeFile>>,
    tensors: HashMap<*const TensorRef, ValueId>,
    constants: Vec<PyVal>,
    counter: usize,
    scope: String,
    loc: Loc,
    depth: usize,
}

impl std::fmt::Debug for Lowerer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lowerer").field("nodes", &self.g.node_count()).finish()
    }
}

type Env = HashMap<String, Val>;

impl<'a> Lowerer<'a> {
    pub fn new(ar: &'a Archive, graph_name: &str, constants: Vec<PyVal>) -> Lowerer<'a> {
        Lowerer {
            g: Graph::new(graph_name),
            inc: Incremental::new(),
            opset: 17,
            ar,
            warnings: Vec::new(),
            files: HashMap::new(),
            tensors: HashMap::new(),
            constants,
            counter: 0,
            scope: String::new(),
            loc: Loc::default(),
            depth: 0,
        }
    }

    // ---- errors -------------------------------------------------------------

    pub fn err<T>(&self, msg: impl Into<String>) -> Result<T> {
        Err(self.error(msg))
    }

    pub fn error(&self, msg: impl Into<String>) -> TsError {
        TsError::Code {
            file: self.ar.label.clone(),
            member: self.loc.member.clone(),
            line: self.loc.line,
            msg: msg.into(),
        }
    }

    pub fn warn(&mut self, msg: impl AsRef<str>) {
        let w = format!("{}: {}:{}: {}", self.ar.label, self.loc.member, self.loc.line, msg.as_ref());
        self.warnings.push(w);
    }

    // ---- graph building -----------------------------------------------------

    fn fresh(&mut self, base: &str) -> String {
        self.counter += 1;
        let s = if self.scope.is_empty() { base.to_string() } else { format!("{}.{base}", self.scope) };
        self.g.fresh_value_name(&format!("{s}_{}", self.counter))
    }

    /// Add a node with `nout` outputs and infer its types.
    pub fn node_n(
        &mut self,
        op: Op,
        inputs: Vec<Option<ValueId>>,
        attrs: Vec<(&str, Attr)>,
        nout: usize,
    ) -> Result<Vec<ValueId>> {
        let base = op.op_type().to_string();
        let name = self.fresh(&base);
        let mut spec = NodeSpec::new(name.clone(), op);
        spec.inputs = inputs;
        for (k, a) in attrs {
            spec.attrs.insert(k.to_string(), a);
        }
        for i in 0..nout {
            let vn = if i == 0 { name.clone() } else { format!("{name}:{i}") };
            spec.outputs.push((vn, TensorType::unknown()));
        }
        let n = self.g.add_node(spec);
        // The attribute path of the module being inlined, and this node's
        // own call (`MatMul_69`) within it.
        let call = name.strip_prefix(&format!("{}.", self.scope)).unwrap_or(&name).to_string();
        self.g.node_mut(n).scope = Some(qsync_ir::Scope { module: self.scope.clone(), call });
        if let Err(m) = self.inc.infer_node(&mut self.g, n, self.opset) {
            return self.err(format!("{}: {m}", self.g.node(n).op.op_type()));
        }
        Ok(self.g.node(n).outputs().to_vec())
    }

    pub fn node(&mut self, op: Op, inputs: Vec<ValueId>, attrs: Vec<(&str, Attr)>) -> Result<ValueId> {
        let v = self.node_n(op, inputs.into_iter().map(Some).collect(), attrs, 1)?;
        v.first().copied().ok_or_else(|| self.error("node without output"))
    }

    pub fn constant(&mut self, t: Tensor) -> Result<ValueId> {
        self.node(Op::Constant, vec![], vec![("value", Attr::Tensor(t))])
    }

    pub fn const_i64s(&mut self, v: &[i64]) -> Result<ValueId> {
        self.constant(Tensor::from_i64(vec![v.len() as i64], v))
    }

    pub fn const_scalar(&mut self, dtype: DType, x: f64) -> Result<ValueId> {
        let t = Tensor::from_f64s(dtype, vec![], &[x]).ok_or_else(|| self.error(format!("no scalar of {dtype}")))?;
        self.constant(t)
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.g.ty(v)
    }

    pub fn rank(&self, v: ValueId) -> Result<usize> {
        self.g
            .ty(v)
            .rank()
            .ok_or_else(|| self.error(format!("`{}`: its {}", self.g.value_name(v), crate::aten::UNKNOWN_RANK)))
    }

    // ---- modules, parameters, code -----------------------------------------

    fn code_file(&mut self, module: &str) -> Result<Rc<CodeFile>> {
        let member = format!("code/{}.py", module.replace('.', "/"));
        if let Some(f) = self.files.get(&member) {
            return Ok(f.clone());
        }
        let bytes = self.ar.require(&member)?;
        let src = std::str::from_utf8(bytes).map_err(|_| TsError::Code {
            file: self.ar.label.clone(),
            member: member.clone(),
            line: 0,
            msg: "code is not UTF-8".into(),
        })?;
        let f = code::parse(src).map_err(|e| TsError::Code {
            file: self.ar.label.clone(),
            member: member.clone(),
            line: e.line,
            msg: e.msg,
        })?;
        let f = Rc::new(f);
        self.files.insert(member, f.clone());
        Ok(f)
    }

    pub fn class_of(&mut self, m: &ModRef) -> Result<(String, ClassDef)> {
        let (module, name) = m.class_path();
        let f = self.code_file(&module)?;
        let member = format!("code/{}.py", module.replace('.', "/"));
        match f.classes.iter().find(|c| c.name == name) {
            Some(c) => Ok((member, c.clone())),
            None => {
                Err(TsError::Code { file: self.ar.label.clone(), member, line: 0, msg: format!("no class `{name}`") })
            }
        }
    }

    /// A tensor stored in the archive, as an initializer (once per tensor).
    pub fn tensor_value(&mut self, t: &Rc<TensorRef>, name: &str) -> Result<ValueId> {
        let key = Rc::as_ptr(t);
        if let Some(&v) = self.tensors.get(&key) {
            return Ok(v);
        }
        let tensor = crate::module::load_tensor(self.ar, t)?;
        let name = self.g.fresh_value_name(name);
        let v = self.g.add_init(name, tensor);
        self.tensors.insert(key, v);
        Ok(v)
    }

    /// Create every parameter of the module tree as an initializer, in
    /// module order, so that unused parameters still count.
    pub fn declare_parameters(&mut self, m: &Rc<ModRef>) -> Result<u64> {
        let (_, class) = self.class_of(m)?;
        let mut count = 0u64;
        for p in &class.parameters {
            if let Some(PyVal::Tensor(t)) = m.attr(p) {
                if !self.tensors.contains_key(&Rc::as_ptr(&t)) {
                    count = count.saturating_add(t.sizes.iter().fold(1u64, |n, &d| n.saturating_mul(d.max(0) as u64)));
                }
                let name = if m.path.is_empty() { p.clone() } else { format!("{}.{p}", m.path) };
                self.tensor_value(&t, &name)?;
            }
        }
        let children: Vec<(String, Rc<RefCell<Object>>)> = {
            let o = m.obj.borrow();
            match &o.state {
                PyVal::Dict(d) => d
                    .borrow()
                    .iter()
                    .filter_map(|(k, v)| match (k, v) {
                        (PyVal::Str(k), PyVal::Object(o)) => Some((k.clone(), o.clone())),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            }
        };
        for (k, o) in children {
            let path = if m.path.is_empty() { k } else { format!("{}.{k}", m.path) };
            count += self.declare_parameters(&Rc::new(ModRef { obj: o, path }))?;
        }
        Ok(count)
    }

    fn module_attr(&mut self, m: &Rc<ModRef>, name: &str) -> Result<Val> {
        let Some(v) = m.attr(name) else { return self.err(format!("module `{}` has no attribute `{name}`", m.path)) };
        let path = if m.path.is_empty() { name.to_string() } else { format!("{}.{name}", m.path) };
        self.pyval(&v, &path)
    }

    fn pyval(&mut self, v: &PyVal, path: &str) -> Result<Val> {
        Ok(match v {
            PyVal::None => Val::None,
            PyVal::Bool(b) => Val::Bool(*b),
            PyVal::Int(i) => Val::Int(*i),
            PyVal::Float(f) => Val::Float(*f),
            PyVal::Str(s) => Val::Str(s.clone()),
            PyVal::Tensor(t) => Val::Tensor(self.tensor_value(t, path)?),
            PyVal::Object(o) => Val::Module(Rc::new(ModRef { obj: o.clone(), path: path.to_string() })),
            PyVal::Tuple(t) => Val::Tuple(t.iter().map(|x| self.pyval(x, path)).collect::<Result<_>>()?),
            PyVal::List(l) => {
                let items = l.borrow().clone();
                Val::List(items.iter().map(|x| self.pyval(x, path)).collect::<Result<_>>()?)
            }
            other => return self.err(format!("unsupported attribute value {other:?}")),
        })
    }

    // ---- the interpreter ----------------------------------------------------

    /// Inline `method` of module `m` with `args` (self excluded).
    pub fn call_method(
        &mut self,
        m: &Rc<ModRef>,
        method: &str,
        args: Vec<Val>,
        kwargs: Vec<(String, Val)>,
    ) -> Result<Val> {
        let (member, class) = self.class_of(m)?;
        let Some(f) = class.methods.get(method) else {
            return self.err(format!("class `{}` has no method `{method}`", class.name));
        };
        let mut all = vec![Val::Module(m.clone())];
        all.extend(args);
        let saved_scope = std::mem::replace(&mut self.scope, m.path.clone());
        let r = self.call_fn(&member, f, all, kwargs);
        self.scope = saved_scope;
        r
    }

    fn call_fn(&mut self, member: &str, f: &FnDef, args: Vec<Val>, kwargs: Vec<(String, Val)>) -> Result<Val> {
        if self.depth > 200 {
            return self.err("call depth over 200 (recursive module?)");
        }
        let mut env = Env::new();
        for (p, a) in f.params.iter().zip(args) {
            env.insert(p.clone(), a);
        }
        for (k, v) in kwargs {
            env.insert(k, v);
        }
        let saved = std::mem::replace(&mut self.loc, Loc { member: member.to_string(), line: f.line });
        self.depth += 1;
        let r = self.exec(&f.body, &mut env);
        self.depth -= 1;
        self.loc = saved;
        Ok(r?.unwrap_or(Val::None))
    }

    fn exec(&mut self, body: &[Stmt], env: &mut Env) -> Result<Option<Val>> {
        for s in body {
            self.loc.line = s.line;
            match &s.kind {
                StmtKind::Pass => {}
                StmtKind::Expr(e) => {
                    self.eval(e, env)?;
                }
                StmtKind::Return(e) => return Ok(Some(self.eval(e, env)?)),
                StmtKind::Assign(targets, e) => {
                    let v = self.eval(e, env)?;
                    if targets.len() == 1 {
                        env.insert(targets[0].clone(), v);
                    } else {
                        let items = match v {
                            Val::Tuple(x) | Val::List(x) => x,
                            _ => return self.err("cannot unpack a non-tuple"),
                        };
                        if items.len() != targets.len() {
                            return self.err(format!("unpacking {} values into {} names", items.len(), targets.len()));
                        }
                        for (t, x) in targets.iter().zip(items) {
                            env.insert(t.clone(), x);
                        }
                    }
                }
                StmtKind::If { cond, then, other } => match self.eval(cond, env)? {
                    Val::Bool(b) => {
                        if let Some(r) = self.exec(if b { then } else { other }, env)? {
                            return Ok(Some(r));
                        }
                    }
                    Val::None => {
                        if let Some(r) = self.exec(other, env)? {
                            return Ok(Some(r));
                        }
                    }
                    c => self.opaque_control("If", Some(c), &[then, other], env)?,
                },
                StmtKind::Loop { body, .. } => self.opaque_control("Loop", None, &[body], env)?,
            }
        }
        Ok(None)
    }

    /// Scripted control flow with a dynamic condition: one opaque node whose
    /// inputs are the tensors the blocks read and whose outputs rebind the
    /// names they assign.
    fn opaque_control(&mut self, kind: &str, cond: Option<Val>, blocks: &[&Vec<Stmt>], env: &mut Env) -> Result<()> {
        self.warn(format!("scripted control flow (prim::{kind}) kept opaque: its outputs have no inferred shapes"));
        let mut assigned = Vec::new();
        for b in blocks {
            collect_assigned(b, &mut assigned);
        }
        let mut inputs = Vec::new();
        if let Some(Val::Tensor(c)) = cond {
            inputs.push(Some(c));
        }
        let mut names: Vec<&String> = env.keys().collect();
        names.sort();
        for n in names {
            if let Some(Val::Tensor(v)) = env.get(n) {
                if !inputs.contains(&Some(*v)) {
                    inputs.push(Some(*v));
                }
            }
        }
        let op = Op::Opaque { domain: "prim".into(), op_type: kind.into() };
        let outs = self.node_n(op, inputs, vec![], assigned.len().max(1))?;
        for (n, v) in assigned.into_iter().zip(outs) {
            env.insert(n, Val::Tensor(v));
        }
        Ok(())
    }

    pub fn eval(&mut self, e: &Expr, env: &mut Env) -> Result<Val> {
        Ok(match e {
            Expr::Name(n) => match env.get(n) {
                Some(v) => v.clone(),
                None => Val::Ns(n.clone()),
            },
            Expr::Int(i) => Val::Int(*i),
            Expr::Float(f) => Val::Float(*f),
            Expr::Str(s) => Val::Str(s.clone()),
            Expr::Bool(b) => Val::Bool(*b),
            Expr::None => Val::None,
            Expr::Tuple(v) => Val::Tuple(v.iter().map(|x| self.eval(x, env)).collect::<Result<_>>()?),
            Expr::List(v) => Val::List(v.iter().map(|x| self.eval(x, env)).collect::<Result<_>>()?),
            Expr::Dict(v) => {
                let mut out = Vec::new();
                for (k, x) in v {
                    out.push((self.eval(k, env)?, self.eval(x, env)?));
                }
                Val::Dict(out)
            }
            Expr::Attr(base, name) => {
                let b = self.eval(base, env)?;
                match b {
                    Val::Ns(p) if p == "CONSTANTS" => self.constant_n(name)?,
                    Val::Ns(p) => Val::Ns(format!("{p}.{name}")),
                    Val::Module(m) => self.module_attr(&m, name)?,
                    other => return self.err(format!("attribute `{name}` of {other:?} is not supported")),
                }
            }
            Expr::Call { func, args, kwargs } => {
                if let Expr::Attr(base, meth) = func.as_ref() {
                    if let Val::Module(m) = self.eval(base, env)? {
                        let a = args.iter().map(|x| self.eval(x, env)).collect::<Result<Vec<_>>>()?;
                        let k = kwargs
                            .iter()
                            .map(|(n, x)| Ok((n.clone(), self.eval(x, env)?)))
                            .collect::<Result<Vec<_>>>()?;
                        let line = self.loc.line;
                        let r = self.call_method(&m, meth, a, k);
                        self.loc.line = line;
                        return r;
                    }
                }
                let f = self.eval(func, env)?;
                let a = args.iter().map(|x| self.eval(x, env)).collect::<Result<Vec<_>>>()?;
                let k = kwargs.iter().map(|(n, x)| Ok((n.clone(), self.eval(x, env)?))).collect::<Result<Vec<_>>>()?;
                match f {
                    Val::Ns(path) => self.call_builtin(&path, a, k)?,
                    other => return self.err(format!("calling {other:?} is not supported")),
                }
            }
            Expr::Index(base, idx) => {
                let b = self.eval(base, env)?;
                let i = self.eval(idx, env)?;
                match (b, i) {
                    (Val::List(v) | Val::Tuple(v), Val::Int(i)) => {
                        let n = v.len() as i64;
                        let j = if i < 0 { i + n } else { i };
                        match usize::try_from(j).ok().and_then(|j| v.get(j)) {
                            Some(x) => x.clone(),
                            None => return self.err(format!("index {i} out of range")),
                        }
                    }
                    (Val::Dict(d), k) => match d.iter().find(|(dk, _)| val_eq(dk, &k)) {
                        Some((_, v)) => v.clone(),
                        None => return self.err("dict key not found"),
                    },
                    (Val::Tensor(t), Val::Int(i)) => {
                        let idx = self.const_scalar(DType::I64, i as f64)?;
                        Val::Tensor(self.node(Op::Gather, vec![t, idx], vec![("axis", Attr::Int(0))])?)
                    }
                    // `List[int]`, `Optional[Tensor]`: type expressions, only ever passed to `annotate`.
                    (Val::Ns(n), _) => Val::Ns(n),
                    (b, _) => return self.err(format!("subscript of {b:?} is not supported")),
                }
            }
            Expr::Unary(op, x) => {
                let v = self.eval(x, env)?;
                match (*op, v) {
                    ("not", Val::Bool(b)) => Val::Bool(!b),
                    ("-", Val::Int(i)) => Val::Int(i.wrapping_neg()),
                    ("-", Val::Float(f)) => Val::Float(-f),
                    ("-", Val::Tensor(t)) => Val::Tensor(self.node(Op::Neg, vec![t], vec![])?),
                    (op, v) => return self.err(format!("unary `{op}` of {v:?} is not supported")),
                }
            }
            Expr::Binary(op, l, r) => {
                let a = self.eval(l, env)?;
                let b = self.eval(r, env)?;
                self.binary_py(op, a, b)?
            }
            Expr::IfElse { cond, then, other } => match self.eval(cond, env)? {
                Val::Bool(true) => self.eval(then, env)?,
                Val::Bool(false) | Val::None => self.eval(other, env)?,
                _ => return self.err("conditional expression on a tensor is not supported"),
            },
        })
    }

    fn constant_n(&mut self, name: &str) -> Result<Val> {
        let idx: Option<usize> = name.strip_prefix('c').and_then(|s| s.parse().ok());
        let Some(v) = idx.and_then(|i| self.constants.get(i)).cloned() else {
            return self.err(format!("CONSTANTS.{name} is not in constants.pkl"));
        };
        self.pyval(&v, &format!("CONSTANTS.{name}"))
    }

    /// Python-level arithmetic: folded on numbers, IR nodes on tensors.
    fn binary_py(&mut self, op: &str, a: Val, b: Val) -> Result<Val> {
        use Val::{Bool, Float, Int};
        Ok(match (op, &a, &b) {
            ("is" | "==", Val::None, Val::None) => Bool(true),
            ("is" | "==", Val::None, _) | ("is" | "==", _, Val::None) => Bool(false),
            ("is not" | "!=", Val::None, Val::None) => Bool(false),
            ("is not" | "!=", Val::None, _) | ("is not" | "!=", _, Val::None) => Bool(true),
            ("and", Bool(x), Bool(y)) => Bool(*x && *y),
            ("or", Bool(x), Bool(y)) => Bool(*x || *y),
            (_, Int(x), Int(y)) => {
                let (x, y) = (*x, *y);
                match op {
                    "+" => Int(x.wrapping_add(y)),
                    "-" => Int(x.wrapping_sub(y)),
                    "*" => Int(x.wrapping_mul(y)),
                    "//" if y != 0 => Int(x.div_euclid(y)),
                    "%" if y != 0 => Int(x.rem_euclid(y)),
                    "/" if y != 0 => Float(x as f64 / y as f64),
                    _ => match compare(op, &x, &y) {
                        Some(r) => Bool(r),
                        None => return self.err(format!("`{x} {op} {y}` is not supported")),
                    },
                }
            }
            (_, Int(_) | Float(_), Int(_) | Float(_)) => {
                let (x, y) = (num(&a).unwrap_or(0.0), num(&b).unwrap_or(0.0));
                match op {
                    "+" => Float(x + y),
                    "-" => Float(x - y),
                    "*" => Float(x * y),
                    "/" => Float(x / y),
                    _ => match compare(op, &x, &y) {
                        Some(r) => Bool(r),
                        None => return self.err(format!("`{x} {op} {y}` is not supported")),
                    },
                }
            }
            _ if matches!(a, Val::Tensor(_)) || matches!(b, Val::Tensor(_)) => {
                let name = match op {
                    "+" => "add",
                    "-" => "sub",
                    "*" => "mul",
                    "/" => "div",
                    "//" => "floor_divide",
                    "==" => "eq",
                    "!=" => "ne",
                    "<" => "lt",
                    "<=" => "le",
                    ">" => "gt",
                    ">=" => "ge",
                    "&" => "__and__",
                    "|" => "__or__",
                    "@" => "matmul",
                    _ => return self.err(format!("operator `{op}` on tensors is not supported")),
                };
                crate::aten::lower(self, name, vec![a, b], vec![])?
            }
            _ => return self.err(format!("operator `{op}` on {a:?} and {b:?} is not supported")),
        })
    }

    fn call_builtin(&mut self, path: &str, args: Vec<Val>, kwargs: Vec<(String, Val)>) -> Result<Val> {
        if let Some(op) = path.strip_prefix("torch.").or_else(|| path.strip_prefix("ops.aten.")) {
            if op == "device" {
                return Ok(Val::Device);
            }
            return crate::aten::lower(self, op, args, kwargs);
        }
        if let Some(op) = path.strip_prefix("ops.prim.") {
            return crate::aten::prim(self, op, args);
        }
        let first = args.first().cloned().unwrap_or(Val::None);
        match path {
            "annotate" | "unchecked_cast" => Ok(args.get(1).cloned().unwrap_or(Val::None)),
            "uninitialized" => Ok(Val::None),
            "int" => match first {
                Val::Float(f) => Ok(Val::Int(f as i64)),
                Val::Bool(b) => Ok(Val::Int(i64::from(b))),
                v @ (Val::Int(_) | Val::Tensor(_)) => Ok(v),
                v => self.err(format!("int() of {v:?}")),
            },
            "float" => match first {
                Val::Int(i) => Ok(Val::Float(i as f64)),
                v @ (Val::Float(_) | Val::Tensor(_)) => Ok(v),
                v => self.err(format!("float() of {v:?}")),
            },
            "bool" => match first {
                Val::Int(i) => Ok(Val::Bool(i != 0)),
                v @ (Val::Bool(_) | Val::Tensor(_)) => Ok(v),
                v => self.err(format!("bool() of {v:?}")),
            },
            "len" => match first {
                Val::List(v) | Val::Tuple(v) => Ok(Val::Int(v.len() as i64)),
                v => self.err(format!("len() of {v:?}")),
            },
            "getattr" => match (first, args.get(1)) {
                (Val::Module(m), Some(Val::Str(n))) => self.module_attr(&m, n),
                _ => self.err("getattr() wants a module and a name"),
            },
            p if p.starts_with("__torch__.") => {
                let (module, name) = p.rsplit_once('.').unwrap_or((p, ""));
                let f = self.code_file(module)?;
                let member = format!("code/{}.py", module.replace('.', "/"));
                let Some(def) = f.functions.iter().find(|d| d.name == name).cloned() else {
                    return self.err(format!("no function `{p}`"));
                };
                let line = self.loc.line;
                let r = self.call_fn(&member, &def, args, kwargs);
                self.loc.line = line;
                r
            }
            _ => self.err(format!("unsupported call `{path}`")),
        }
    }
}

fn num(v: &Val) -> Option<f64> {
    match v {
        Val::Int(i) => Some(*i as f64),
        Val::Float(f) => Some(*f),
        Val::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

fn val_eq(a: &Val, b: &Val) -> bool {
    match (a, b) {
        (Val::Str(x), Val::Str(y)) => x == y,
        (Val::Int(x), Val::Int(y)) => x == y,
        _ => false,
    }
}

fn collect_assigned(body: &[Stmt], out: &mut Vec<String>) {
    for s in body {
        match &s.kind {
            StmtKind::Assign(t, _) => {
                for n in t {
                    if !out.contains(n) {
                        out.push(n.clone());
                    }
                }
            }
            StmtKind::If { then, other, .. } => {
                collect_assigned(then, out);
                collect_assigned(other, out);
            }
            StmtKind::Loop { body, .. } => collect_assigned(body, out),
            _ => {}
        }
    }
}

/// A Python comparison operator applied to two scalars; `None` for other operators.
fn compare<T: PartialOrd>(op: &str, x: &T, y: &T) -> Option<bool> {
    Some(match op {
        "==" => x == y,
        "!=" => x != y,
        "<" => x < y,
        "<=" => x <= y,
        ">" => x > y,
        ">=" => x >= y,
        _ => return None,
    })
}
