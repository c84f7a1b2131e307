//! A parser for the TorchScript code `torch.jit` writes under
//! `code/__torch__/`: the typed Python subset of class definitions (attribute
//! annotations, `__parameters__`, `__buffers__`) and methods (assignments
//! with tuple unpacking, calls with keyword arguments, attribute access,
//! subscripts, tuple/list/dict literals, arithmetic, `if`/`for`/`while`).
//! Errors carry the line; the importer adds the file name.
//!
//! Bounded on hostile input: parentheses, unary operators, `elif` chains and
//! blocks nest at most [`MAX_NESTING`] deep while parsing, and each
//! statement's expression tree (left-associative chains such as
//! `a+b+c+…` grow it without recursion) at most [`MAX_EXPR_DEPTH`], so the
//! recursive lowering that follows cannot exhaust the stack. Expressions are
//! dropped iteratively, so even a refused tree is freed safely.

use std::collections::HashMap;

/// How deep the parser may recurse (parentheses, unary operators, blocks).
pub const MAX_NESTING: usize = 40;
/// The deepest expression tree one statement may hold.
pub const MAX_EXPR_DEPTH: usize = 200;

/// An expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Name(String),
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
    None,
    Tuple(Vec<Expr>),
    List(Vec<Expr>),
    Dict(Vec<(Expr, Expr)>),
    Attr(Box<Expr>, String),
    Call { func: Box<Expr>, args: Vec<Expr>, kwargs: Vec<(String, Expr)> },
    Index(Box<Expr>, Box<Expr>),
    Unary(&'static str, Box<Expr>),
    Binary(String, Box<Expr>, Box<Expr>),
    IfElse { cond: Box<Expr>, then: Box<Expr>, other: Box<Expr> },
}

impl Expr {
    /// Move the sub-expressions out (leaving `None`s), for iterative drop.
    fn take_children(&mut self, out: &mut Vec<Expr>) {
        let mut take = |b: &mut Box<Expr>| out.push(std::mem::replace(&mut **b, Expr::None));
        match self {
            Expr::Attr(b, _) | Expr::Unary(_, b) => take(b),
            Expr::Index(a, b) | Expr::Binary(_, a, b) => {
                take(a);
                take(b);
            }
            Expr::IfElse { cond, then, other } => {
                take(cond);
                take(then);
                take(other);
            }
            Expr::Call { func, args, kwargs } => {
                take(func);
                out.append(args);
                out.extend(kwargs.drain(..).map(|(_, e)| e));
            }
            Expr::Tuple(v) | Expr::List(v) => out.append(v),
            Expr::Dict(v) => out.extend(v.drain(..).flat_map(|(k, e)| [k, e])),
            Expr::Name(_) | Expr::Int(_) | Expr::Float(_) | Expr::Str(_) | Expr::Bool(_) | Expr::None => {}
        }
    }

    /// The depth of the tree, computed without recursion.
    pub fn depth(&self) -> usize {
        let mut stack = vec![(self, 1usize)];
        let mut max = 0;
        while let Some((e, d)) = stack.pop() {
            max = max.max(d);
            match e {
                Expr::Attr(b, _) | Expr::Unary(_, b) => stack.push((b, d + 1)),
                Expr::Index(a, b) | Expr::Binary(_, a, b) => stack.extend([(&**a, d + 1), (&**b, d + 1)]),
                Expr::IfElse { cond, then, other } => {
                    stack.extend([(&**cond, d + 1), (&**then, d + 1), (&**other, d + 1)]);
                }
                Expr::Call { func, args, kwargs } => {
                    stack.push((func, d + 1));
                    stack.extend(args.iter().chain(kwargs.iter().map(|(_, e)| e)).map(|e| (e, d + 1)));
                }
                Expr::Tuple(v) | Expr::List(v) => stack.extend(v.iter().map(|e| (e, d + 1))),
                Expr::Dict(v) => stack.extend(v.iter().flat_map(|(k, e)| [(k, d + 1), (e, d + 1)])),
                Expr::Name(_) | Expr::Int(_) | Expr::Float(_) | Expr::Str(_) | Expr::Bool(_) | Expr::None => {}
            }
        }
        max
    }
}

/// Iterative: the default drop recurses once per level, and a chain like
/// `a.b.c.…` or `x+x+…` may be far deeper than the stack.
impl Drop for Expr {
    fn drop(&mut self) {
        let mut work = Vec::new();
        self.take_children(&mut work);
        while let Some(mut e) = work.pop() {
            e.take_children(&mut work);
        }
    }
}

/// A statement, with its 1-based line.
#[derive(Clone, Debug, PartialEq)]
pub struct Stmt {
    pub line: usize,
    pub kind: StmtKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum StmtKind {
    /// `a = e` (one target) or `a, b = e` (unpacking).
    Assign(Vec<String>, Expr),
    Expr(Expr),
    Return(Expr),
    If {
        cond: Expr,
        then: Vec<Stmt>,
        other: Vec<Stmt>,
    },
    /// `for`/`while`: kept whole, lowered opaquely.
    Loop {
        kind: &'static str,
        body: Vec<Stmt>,
    },
    Pass,
}

/// A method or free function.
#[derive(Clone, Debug, PartialEq)]
pub struct FnDef {
    pub name: String,
    pub line: usize,
    /// Parameter names, `self` included when present.
    pub params: Vec<String>,
    pub body: Vec<Stmt>,
}

/// A class: its parameter and buffer names, annotated attributes and methods.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ClassDef {
    pub name: String,
    pub line: usize,
    pub parameters: Vec<String>,
    pub buffers: Vec<String>,
    /// `name : Type` annotations, the type as written.
    pub attrs: Vec<(String, String)>,
    pub methods: HashMap<String, FnDef>,
}

/// One code file.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct CodeFile {
    pub classes: Vec<ClassDef>,
    pub functions: Vec<FnDef>,
}

/// A parse failure at a line.
#[derive(Clone, Debug, PartialEq)]
pub struct CodeError {
    pub line: usize,
    pub msg: String,
}

type CResult<T> = Result<T, CodeError>;

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Name(String),
    Int(i64),
    Float(f64),
    Str(String),
    Op(&'static str),
    Newline,
    Indent,
    Dedent,
    Eof,
}

const OPS: [&str; 34] = [
    "**", "//", "==", "!=", "<=", ">=", "->", "<<", ">>", "+=", "-=", "(", ")", "[", "]", "{", "}", ",", ":", ".", "=",
    "+", "-", "*", "/", "%", "<", ">", "&", "|", "^", "~", "@", ";",
];

fn lex(src: &str) -> CResult<Vec<(Tok, usize)>> {
    let mut out = Vec::new();
    let mut indents = vec![0usize];
    let mut depth = 0usize;
    for (ln, raw) in src.lines().enumerate() {
        let line = ln + 1;
        let body = raw.trim_end();
        let stripped = body.trim_start();
        if depth == 0 {
            if stripped.is_empty() || stripped.starts_with('#') {
                continue;
            }
            let ind = body.len() - stripped.len();
            let top = indents.last().copied().unwrap_or(0);
            if ind > top {
                indents.push(ind);
                out.push((Tok::Indent, line));
            } else {
                while ind < indents.last().copied().unwrap_or(0) {
                    indents.pop();
                    out.push((Tok::Dedent, line));
                }
                if ind != indents.last().copied().unwrap_or(0) {
                    return Err(CodeError { line, msg: "inconsistent indentation".into() });
                }
            }
        }
        let b = stripped.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            if c == b' ' || c == b'\t' {
                i += 1;
            } else if c == b'#' {
                break;
            } else if c.is_ascii_alphabetic() || c == b'_' {
                let s = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                out.push((Tok::Name(stripped[s..i].to_string()), line));
            } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
                let s = i;
                let mut float = false;
                while i < b.len() {
                    let d = b[i];
                    if d.is_ascii_digit() || d == b'_' {
                        i += 1;
                    } else if d == b'.' || d == b'e' || d == b'E' {
                        float = true;
                        i += 1;
                        if (d == b'e' || d == b'E') && i < b.len() && (b[i] == b'-' || b[i] == b'+') {
                            i += 1;
                        }
                    } else {
                        break;
                    }
                }
                let t = &stripped[s..i];
                let tok = if float {
                    t.parse::<f64>()
                        .map(Tok::Float)
                        .map_err(|_| CodeError { line, msg: format!("bad number `{t}`") })?
                } else {
                    t.parse::<i64>().map(Tok::Int).map_err(|_| CodeError { line, msg: format!("bad integer `{t}`") })?
                };
                out.push((tok, line));
            } else if c == b'"' || c == b'\'' {
                let mut s = String::new();
                i += 1;
                loop {
                    let Some(&d) = b.get(i) else { return Err(CodeError { line, msg: "unterminated string".into() }) };
                    i += 1;
                    if d == c {
                        break;
                    }
                    if d == b'\\' {
                        let Some(&e) = b.get(i) else {
                            return Err(CodeError { line, msg: "unterminated string".into() });
                        };
                        i += 1;
                        s.push(match e {
                            b'n' => '\n',
                            b't' => '\t',
                            other => char::from(other),
                        });
                    } else {
                        // Multi-byte UTF-8: copy the whole character.
                        let start = i - 1;
                        let ch = stripped[start..].chars().next().unwrap_or('?');
                        s.push(ch);
                        i = start + ch.len_utf8();
                    }
                }
                out.push((Tok::Str(s), line));
            } else {
                let rest = &stripped[i..];
                let Some(op) = OPS.iter().find(|o| rest.starts_with(**o)) else {
                    return Err(CodeError {
                        line,
                        msg: format!("unexpected character `{}`", rest.chars().next().unwrap_or('?')),
                    });
                };
                match *op {
                    "(" | "[" | "{" => depth += 1,
                    ")" | "]" | "}" => depth = depth.saturating_sub(1),
                    _ => {}
                }
                out.push((Tok::Op(op), line));
                i += op.len();
            }
        }
        if depth == 0 {
            out.push((Tok::Newline, line));
        }
    }
    let last = src.lines().count().max(1);
    while indents.len() > 1 {
        indents.pop();
        out.push((Tok::Dedent, last));
    }
    out.push((Tok::Eof, last));
    Ok(out)
}

struct P {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    /// Current recursion depth, bounded by [`MAX_NESTING`].
    depth: usize,
}

impl P {
    /// Run a recursive step one level deeper, refusing input that nests
    /// past [`MAX_NESTING`].
    fn nested<T>(&mut self, f: impl FnOnce(&mut P) -> CResult<T>) -> CResult<T> {
        if self.depth >= MAX_NESTING {
            return self.err(format!("nesting deeper than {MAX_NESTING} levels"));
        }
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        r
    }

    /// A statement's expression, checked against [`MAX_EXPR_DEPTH`].
    fn shallow(&self, e: Expr, line: usize) -> CResult<Expr> {
        let d = e.depth();
        if d > MAX_EXPR_DEPTH {
            return Err(CodeError { line, msg: format!("expression nests {d} levels deep (limit {MAX_EXPR_DEPTH})") });
        }
        Ok(e)
    }

    fn peek(&self) -> &Tok {
        self.toks.get(self.pos).map_or(&Tok::Eof, |t| &t.0)
    }
    fn line(&self) -> usize {
        self.toks.get(self.pos).or(self.toks.last()).map_or(1, |t| t.1)
    }
    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        self.pos += 1;
        t
    }
    fn err<T>(&self, msg: impl Into<String>) -> CResult<T> {
        Err(CodeError { line: self.line(), msg: msg.into() })
    }
    fn is_op(&self, op: &str) -> bool {
        matches!(self.peek(), Tok::Op(o) if *o == op)
    }
    fn is_name(&self, n: &str) -> bool {
        matches!(self.peek(), Tok::Name(x) if x == n)
    }
    fn eat_op(&mut self, op: &str) -> bool {
        let y = self.is_op(op);
        if y {
            self.pos += 1;
        }
        y
    }
    fn eat_name(&mut self, n: &str) -> bool {
        let y = self.is_name(n);
        if y {
            self.pos += 1;
        }
        y
    }
    fn op(&mut self, op: &str) -> CResult<()> {
        if self.eat_op(op) {
            Ok(())
        } else {
            self.err(format!("expected `{op}`, found {}", show(self.peek())))
        }
    }
    fn name(&mut self) -> CResult<String> {
        match self.next() {
            Tok::Name(n) => Ok(n),
            t => {
                self.pos -= 1;
                self.err(format!("expected a name, found {}", show(&t)))
            }
        }
    }
    fn newline(&mut self) -> CResult<()> {
        match self.peek() {
            Tok::Newline => {
                self.pos += 1;
                Ok(())
            }
            Tok::Eof | Tok::Dedent => Ok(()),
            t => self.err(format!("expected end of line, found {}", show(t))),
        }
    }

    /// Skip a type expression: up to `,` `)` `=` `:` or a newline at depth 0.
    fn skip_type(&mut self) -> CResult<String> {
        let mut depth = 0usize;
        let mut s = String::new();
        loop {
            match self.peek() {
                Tok::Op("[") | Tok::Op("(") => depth += 1,
                Tok::Op("]") | Tok::Op(")") if depth > 0 => depth -= 1,
                Tok::Op(",") | Tok::Op(")") | Tok::Op("=") | Tok::Op(":") if depth == 0 => return Ok(s),
                Tok::Newline | Tok::Eof | Tok::Indent | Tok::Dedent => return Ok(s),
                _ => {}
            }
            s.push_str(&show_raw(&self.next()));
        }
    }

    fn file(&mut self) -> CResult<CodeFile> {
        let mut f = CodeFile::default();
        loop {
            match self.peek() {
                Tok::Eof => return Ok(f),
                Tok::Newline => self.pos += 1,
                Tok::Name(n) if n == "class" => f.classes.push(self.class()?),
                Tok::Name(n) if n == "def" => f.functions.push(self.def()?),
                Tok::Name(n) if n == "import" || n == "from" => {
                    while !matches!(self.peek(), Tok::Newline | Tok::Eof) {
                        self.pos += 1;
                    }
                }
                // Module-level assignments (e.g. `__torch__ = …`) carry nothing we use.
                Tok::Name(_) => {
                    self.stmt()?;
                }
                t => return self.err(format!("unexpected {} at top level", show(t))),
            }
        }
    }

    fn class(&mut self) -> CResult<ClassDef> {
        let line = self.line();
        self.eat_name("class");
        let mut c = ClassDef { name: self.name()?, line, ..ClassDef::default() };
        if self.eat_op("(") {
            while !self.eat_op(")") {
                if matches!(self.peek(), Tok::Eof | Tok::Newline) {
                    return self.err("unclosed base list");
                }
                self.pos += 1;
            }
        }
        self.op(":")?;
        self.newline()?;
        if !matches!(self.next(), Tok::Indent) {
            return Ok(c);
        }
        loop {
            match self.peek().clone() {
                Tok::Dedent => {
                    self.pos += 1;
                    return Ok(c);
                }
                Tok::Eof => return Ok(c),
                Tok::Newline => self.pos += 1,
                Tok::Name(n) if n == "def" => {
                    let d = self.def()?;
                    c.methods.insert(d.name.clone(), d);
                }
                Tok::Name(n) => {
                    self.pos += 1;
                    if self.is_op("[") {
                        // `__annotations__["0"] = Type`: submodule types of containers.
                        while !matches!(self.peek(), Tok::Newline | Tok::Eof) {
                            self.pos += 1;
                        }
                        self.newline()?;
                    } else if self.eat_op(":") {
                        let ty = self.skip_type()?;
                        c.attrs.push((n, ty));
                        self.newline()?;
                    } else if self.eat_op("=") {
                        let e = self.expr()?;
                        let names = || match &e {
                            Expr::List(v) | Expr::Tuple(v) => v
                                .iter()
                                .filter_map(|x| if let Expr::Str(s) = x { Some(s.clone()) } else { None })
                                .collect(),
                            _ => Vec::new(),
                        };
                        match n.as_str() {
                            "__parameters__" => c.parameters = names(),
                            "__buffers__" => c.buffers = names(),
                            _ => {}
                        }
                        self.newline()?;
                    } else {
                        return self.err(format!("unexpected `{n}` in class body"));
                    }
                }
                t => return self.err(format!("unexpected {} in class body", show(&t))),
            }
        }
    }

    fn def(&mut self) -> CResult<FnDef> {
        let line = self.line();
        self.eat_name("def");
        let name = self.name()?;
        self.op("(")?;
        let mut params = Vec::new();
        while !self.eat_op(")") {
            params.push(self.name()?);
            if self.eat_op(":") {
                self.skip_type()?;
            }
            if self.eat_op("=") {
                self.expr()?;
            }
            if !self.eat_op(",") && !self.is_op(")") {
                return self.err(format!("expected `,` or `)` in parameters, found {}", show(self.peek())));
            }
        }
        if self.eat_op("->") {
            self.skip_type()?;
        }
        self.op(":")?;
        let body = self.block()?;
        Ok(FnDef { name, line, params, body })
    }

    fn block(&mut self) -> CResult<Vec<Stmt>> {
        self.nested(P::block_inner)
    }

    fn block_inner(&mut self) -> CResult<Vec<Stmt>> {
        if !matches!(self.peek(), Tok::Newline) {
            // `if c: stmt` on one line
            return Ok(vec![self.stmt()?]);
        }
        self.pos += 1;
        if !matches!(self.next(), Tok::Indent) {
            self.pos -= 1;
            return self.err("expected an indented block");
        }
        let mut out = Vec::new();
        loop {
            match self.peek() {
                Tok::Dedent => {
                    self.pos += 1;
                    return Ok(out);
                }
                Tok::Eof => return Ok(out),
                Tok::Newline => self.pos += 1,
                _ => out.push(self.stmt()?),
            }
        }
    }

    fn stmt(&mut self) -> CResult<Stmt> {
        let line = self.line();
        let kind = if self.eat_name("return") {
            let e = if matches!(self.peek(), Tok::Newline | Tok::Eof) { Expr::None } else { self.expr_list()? };
            self.newline()?;
            StmtKind::Return(self.shallow(e, line)?)
        } else if self.eat_name("pass") {
            self.newline()?;
            StmtKind::Pass
        } else if self.is_name("if") {
            self.pos += 1;
            return self.if_rest(line);
        } else if self.is_name("for") || self.is_name("while") {
            let kind = if self.eat_name("for") {
                "for"
            } else {
                self.pos += 1;
                "while"
            };
            while !self.is_op(":") || matches!(self.toks.get(self.pos + 1), Some((Tok::Op(_), _))) {
                if matches!(self.peek(), Tok::Newline | Tok::Eof) {
                    return self.err("loop header without `:`");
                }
                self.pos += 1;
            }
            self.op(":")?;
            StmtKind::Loop { kind, body: self.block()? }
        } else if self.is_name("raise") || self.is_name("assert") || self.is_name("del") {
            while !matches!(self.peek(), Tok::Newline | Tok::Eof) {
                self.pos += 1;
            }
            self.newline()?;
            StmtKind::Pass
        } else {
            let e = self.expr_list()?;
            if self.eat_op(":") {
                self.skip_type()?;
            }
            if self.eat_op("=") {
                let targets = match &e {
                    Expr::Name(n) => vec![n.clone()],
                    Expr::Tuple(v) => v
                        .iter()
                        .map(|x| match x {
                            Expr::Name(n) => Ok(n.clone()),
                            _ => Err(CodeError { line, msg: "unsupported assignment target".into() }),
                        })
                        .collect::<CResult<_>>()?,
                    _ => return Err(CodeError { line, msg: "unsupported assignment target".into() }),
                };
                let v = self.expr_list()?;
                self.newline()?;
                StmtKind::Assign(targets, self.shallow(v, line)?)
            } else {
                self.newline()?;
                StmtKind::Expr(self.shallow(e, line)?)
            }
        };
        Ok(Stmt { line, kind })
    }

    fn if_rest(&mut self, line: usize) -> CResult<Stmt> {
        self.nested(|p| p.if_rest_inner(line))
    }

    fn if_rest_inner(&mut self, line: usize) -> CResult<Stmt> {
        let cond = self.expr()?;
        let cond = self.shallow(cond, line)?;
        self.op(":")?;
        let then = self.block()?;
        let other = if self.is_name("elif") {
            let l = self.line();
            self.pos += 1;
            vec![self.if_rest(l)?]
        } else if self.eat_name("else") {
            self.op(":")?;
            self.block()?
        } else {
            Vec::new()
        };
        Ok(Stmt { line, kind: StmtKind::If { cond, then, other } })
    }

    /// `a, b, ` — a bare tuple when there is a comma.
    fn expr_list(&mut self) -> CResult<Expr> {
        let first = self.expr()?;
        if !self.is_op(",") {
            return Ok(first);
        }
        let mut v = vec![first];
        while self.eat_op(",") {
            if matches!(self.peek(), Tok::Newline | Tok::Eof) || self.is_op("=") || self.is_op(":") {
                break;
            }
            v.push(self.expr()?);
        }
        Ok(Expr::Tuple(v))
    }

    fn expr(&mut self) -> CResult<Expr> {
        self.nested(P::expr_inner)
    }

    fn expr_inner(&mut self) -> CResult<Expr> {
        let e = self.or()?;
        if self.eat_name("if") {
            let cond = self.or()?;
            if !self.eat_name("else") {
                return self.err("conditional expression without `else`");
            }
            let other = self.expr()?;
            return Ok(Expr::IfElse { cond: Box::new(cond), then: Box::new(e), other: Box::new(other) });
        }
        Ok(e)
    }

    fn or(&mut self) -> CResult<Expr> {
        let mut l = self.and()?;
        while self.eat_name("or") {
            l = Expr::Binary("or".into(), Box::new(l), Box::new(self.and()?));
        }
        Ok(l)
    }

    fn and(&mut self) -> CResult<Expr> {
        let mut l = self.not()?;
        while self.eat_name("and") {
            l = Expr::Binary("and".into(), Box::new(l), Box::new(self.not()?));
        }
        Ok(l)
    }

    fn not(&mut self) -> CResult<Expr> {
        if self.eat_name("not") {
            return Ok(Expr::Unary("not", Box::new(self.nested(P::not)?)));
        }
        self.cmp()
    }

    fn cmp(&mut self) -> CResult<Expr> {
        let mut l = self.arith(0)?;
        loop {
            let op = match self.peek() {
                Tok::Op(o @ ("==" | "!=" | "<" | "<=" | ">" | ">=")) => o.to_string(),
                Tok::Name(n) if n == "is" || n == "in" => n.clone(),
                Tok::Name(n)
                    if n == "not" && matches!(self.toks.get(self.pos + 1), Some((Tok::Name(x), _)) if x == "in") =>
                {
                    self.pos += 1;
                    "not in".into()
                }
                _ => return Ok(l),
            };
            self.pos += 1;
            let op = if op == "is" && self.eat_name("not") { "is not".to_string() } else { op };
            l = Expr::Binary(op, Box::new(l), Box::new(self.arith(0)?));
        }
    }

    /// Binary arithmetic by precedence level: `|`, `^`, `&`, shifts, `+ -`, `* / // % @`.
    fn arith(&mut self, level: usize) -> CResult<Expr> {
        const LEVELS: [&[&str]; 6] = [&["|"], &["^"], &["&"], &["<<", ">>"], &["+", "-"], &["*", "/", "//", "%", "@"]];
        if level == LEVELS.len() {
            return self.unary();
        }
        let mut l = self.arith(level + 1)?;
        loop {
            let op = match self.peek() {
                Tok::Op(o) if LEVELS[level].contains(o) => *o,
                _ => return Ok(l),
            };
            self.pos += 1;
            l = Expr::Binary(op.to_string(), Box::new(l), Box::new(self.arith(level + 1)?));
        }
    }

    fn unary(&mut self) -> CResult<Expr> {
        if self.eat_op("-") {
            return Ok(match self.nested(P::unary)? {
                Expr::Int(i) => Expr::Int(i.wrapping_neg()),
                Expr::Float(f) => Expr::Float(-f),
                e => Expr::Unary("-", Box::new(e)),
            });
        }
        if self.eat_op("~") {
            return Ok(Expr::Unary("~", Box::new(self.nested(P::unary)?)));
        }
        let base = self.postfix()?;
        if self.eat_op("**") {
            return Ok(Expr::Binary("**".into(), Box::new(base), Box::new(self.nested(P::unary)?)));
        }
        Ok(base)
    }

    fn postfix(&mut self) -> CResult<Expr> {
        let mut e = self.atom()?;
        loop {
            if self.eat_op(".") {
                e = Expr::Attr(Box::new(e), self.name()?);
            } else if self.eat_op("(") {
                let (mut args, mut kwargs) = (Vec::new(), Vec::new());
                while !self.eat_op(")") {
                    let is_kw = matches!(self.peek(), Tok::Name(_))
                        && matches!(self.toks.get(self.pos + 1), Some((Tok::Op("="), _)));
                    if is_kw {
                        let k = self.name()?;
                        self.op("=")?;
                        kwargs.push((k, self.expr()?));
                    } else {
                        args.push(self.expr()?);
                    }
                    if !self.eat_op(",") && !self.is_op(")") {
                        return self.err(format!("expected `,` or `)` in call, found {}", show(self.peek())));
                    }
                }
                e = Expr::Call { func: Box::new(e), args, kwargs };
            } else if self.eat_op("[") {
                let i = self.expr_list()?;
                self.op("]")?;
                e = Expr::Index(Box::new(e), Box::new(i));
            } else {
                return Ok(e);
            }
        }
    }

    fn seq(&mut self, close: &str) -> CResult<Vec<Expr>> {
        let mut v = Vec::new();
        while !self.eat_op(close) {
            v.push(self.expr()?);
            if !self.eat_op(",") && !self.is_op(close) {
                return self.err(format!("expected `,` or `{close}`, found {}", show(self.peek())));
            }
        }
        Ok(v)
    }

    fn atom(&mut self) -> CResult<Expr> {
        match self.next() {
            Tok::Int(i) => Ok(Expr::Int(i)),
            Tok::Float(f) => Ok(Expr::Float(f)),
            Tok::Str(s) => {
                let mut s = s;
                while let Tok::Str(more) = self.peek().clone() {
                    self.pos += 1;
                    s.push_str(&more);
                }
                Ok(Expr::Str(s))
            }
            Tok::Name(n) => Ok(match n.as_str() {
                "True" => Expr::Bool(true),
                "False" => Expr::Bool(false),
                "None" => Expr::None,
                "inf" => Expr::Float(f64::INFINITY),
                "nan" => Expr::Float(f64::NAN),
                _ => Expr::Name(n),
            }),
            Tok::Op("(") => {
                if self.eat_op(")") {
                    return Ok(Expr::Tuple(Vec::new()));
                }
                let first = self.expr()?;
                if self.eat_op(")") {
                    return Ok(first);
                }
                self.op(",")?;
                let mut v = vec![first];
                v.extend(self.seq(")")?);
                Ok(Expr::Tuple(v))
            }
            Tok::Op("[") => Ok(Expr::List(self.seq("]")?)),
            Tok::Op("{") => {
                let mut v = Vec::new();
                while !self.eat_op("}") {
                    let k = self.expr()?;
                    self.op(":")?;
                    v.push((k, self.expr()?));
                    if !self.eat_op(",") && !self.is_op("}") {
                        return self.err(format!("expected `,` or `}}`, found {}", show(self.peek())));
                    }
                }
                Ok(Expr::Dict(v))
            }
            t => {
                self.pos -= 1;
                self.err(format!("unexpected {} in expression", show(&t)))
            }
        }
    }
}

fn show_raw(t: &Tok) -> String {
    match t {
        Tok::Name(n) => n.clone(),
        Tok::Int(i) => i.to_string(),
        Tok::Float(f) => f.to_string(),
        Tok::Str(s) => format!("{s:?}"),
        Tok::Op(o) => (*o).to_string(),
        Tok::Newline => "\n".into(),
        Tok::Indent | Tok::Dedent | Tok::Eof => String::new(),
    }
}

fn show(t: &Tok) -> String {
    match t {
        Tok::Newline => "end of line".into(),
        Tok::Indent => "an indent".into(),
        Tok::Dedent => "a dedent".into(),
        Tok::Eof => "end of file".into(),
        t => format!("`{}`", show_raw(t)),
    }
}

/// Parse one code file.
pub fn parse(src: &str) -> Result<CodeFile, CodeError> {
    let toks = lex(src)?;
    P { toks, pos: 0, depth: 0 }.file()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = r#"class Linear(Module):
  __parameters__ = ["weight", "bias", ]
  __buffers__ = []
  weight : Tensor
  training : bool
  def forward(self: __torch__.Linear,
    input: Tensor) -> Tensor:
    bias = self.bias
    _0, _1, = ops.prim.TupleUnpack(x)
    y = torch.view(input, [_0, -1, 64])
    z = (self.sub).forward(y, )
    w = torch.to(z, torch.device("cpu"), 11, scale=0.125)
    return (z, {"a": w})
"#;

    #[test]
    fn parses_classes_and_methods() {
        let f = parse(SRC).expect("parses");
        let c = &f.classes[0];
        assert_eq!(c.name, "Linear");
        assert_eq!(c.parameters, vec!["weight", "bias"]);
        assert_eq!(c.attrs[0], ("weight".to_string(), "Tensor".to_string()));
        let m = &c.methods["forward"];
        assert_eq!(m.params, vec!["self", "input"]);
        assert_eq!(m.body.len(), 6);
        assert!(matches!(&m.body[1].kind, StmtKind::Assign(t, _) if t.len() == 2));
        assert!(matches!(&m.body[5].kind, StmtKind::Return(Expr::Tuple(v)) if v.len() == 2));
        assert_eq!(m.body[2].line, 10);
    }

    #[test]
    fn control_flow_and_operators() {
        let src = "def f(x: int) -> int:\n  if x == 1 and not x is None:\n    y = x + 2 * -3\n  else:\n    y = 0\n  for i in range(3):\n    pass\n  return y\n";
        let f = parse(src).expect("parses");
        let b = &f.functions[0].body;
        assert!(matches!(b[0].kind, StmtKind::If { .. }));
        assert!(matches!(b[1].kind, StmtKind::Loop { kind: "for", .. }));
    }

    #[test]
    fn hostile_nesting_is_an_error_not_a_stack_overflow() {
        let def = |body: &str| format!("def forward(self):\n  x = {body}\n  return x\n");
        let deep = format!("{}1{}", "(".repeat(5000), ")".repeat(5000));
        let e = parse(&def(&deep)).expect_err("deep parentheses");
        assert!(e.msg.contains("nesting deeper"), "{}", e.msg);
        assert_eq!(e.line, 2);
        for (body, what) in [
            (format!("a{}", "+a".repeat(100_000)), "long sum"),
            (format!("a{}", ".b".repeat(100_000)), "long attribute chain"),
            (format!("{}a", "-".repeat(100_000)), "long unary chain"),
        ] {
            let e = parse(&def(&body)).expect_err(what);
            assert!(e.msg.contains("deep"), "{what}: {}", e.msg);
        }
        // An unfinished long chain (a syntax error after it) is dropped safely.
        assert!(parse(&def(&format!("a{}+", "+a".repeat(100_000)))).is_err());
        // Ordinary depth parses.
        let ok = format!("{}1{}", "(".repeat(30), ")".repeat(30));
        assert!(parse(&def(&ok)).is_ok());
        let nested_ifs: String = (0..60).map(|i| format!("{}if c:\n", " ".repeat(2 + 2 * i))).collect();
        let src = format!("def forward(self):\n{nested_ifs}{}pass\n", " ".repeat(2 + 2 * 60));
        assert!(parse(&src).expect_err("deep blocks").msg.contains("nesting deeper"));
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let e = parse("class A(Module):\n  def forward(self):\n    x = foo(\n").expect_err("unclosed");
        assert!(e.line >= 3, "{e:?}");
        let e = parse("def f(x):\n  y = $x\n").expect_err("bad char");
        assert_eq!(e.line, 2);
        let e = parse("def f(x):\n  y = lambda: 1 2\n").expect_err("unsupported");
        assert_eq!(e.line, 2);
        for n in 0..SRC.len() {
            let _ = parse(&SRC[..n]);
        }
    }
}
