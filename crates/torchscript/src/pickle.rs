//! A pickle reader for what `torch.jit` writes: protocol 2 (and the protocol
//! 4 framing opcodes), persistent ids for storages, and the handful of
//! globals archives use (`torch._utils._rebuild_tensor_v2`,
//! `collections.OrderedDict`, `torch.jit._pickle.*`, storage types). Other
//! globals become [`PyVal::Object`]s (modules are `NEWOBJ` + `BUILD`).
//!
//! Lists, dicts and objects are shared (`Rc<RefCell>`) because the memo may
//! hand out a container that later opcodes still fill. Every read is bounds
//! checked: bad bytes give a [`PickleError`], never a panic.
//!
//! The machine builds containers iteratively, so a hostile pickle can still
//! describe a tuple nested a million deep or an object whose state holds
//! itself. [`load`] therefore measures the decoded value without recursion
//! and refuses one nested deeper than [`MAX_DEPTH`] or containing a cycle,
//! so that everything after it (the importer walks module state
//! recursively) sees only finite, shallow trees; rejected values and the
//! machine's leftovers are taken apart iteratively, because even dropping a
//! deep `Rc` chain recurses once per level.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use qsync_ir::DType;

/// A decoded Python value.
#[derive(Clone, Debug)]
pub enum PyVal {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Rc<Vec<PyVal>>),
    List(Rc<RefCell<Vec<PyVal>>>),
    Dict(Rc<RefCell<Vec<(PyVal, PyVal)>>>),
    /// A global reference `module.name` (a class or function).
    Global(Rc<(String, String)>),
    /// An instance: its class, constructor arguments and `BUILD` state.
    Object(Rc<RefCell<Object>>),
    Storage(Rc<StorageRef>),
    Tensor(Rc<TensorRef>),
}

#[derive(Clone, Debug)]
pub struct Object {
    pub module: String,
    pub name: String,
    pub args: Vec<PyVal>,
    pub state: PyVal,
}

/// A storage reference: `data/<key>` holding `numel` elements of `dtype`.
#[derive(Clone, Debug, PartialEq)]
pub struct StorageRef {
    pub dtype: DType,
    pub key: String,
    pub numel: u64,
}

/// A tensor view of a storage.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRef {
    pub storage: Rc<StorageRef>,
    pub offset: i64,
    pub sizes: Vec<i64>,
    pub strides: Vec<i64>,
    pub requires_grad: bool,
}

impl PyVal {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            PyVal::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            PyVal::Int(i) => Some(*i),
            PyVal::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    /// Elements of a tuple or list.
    pub fn items(&self) -> Option<Vec<PyVal>> {
        match self {
            PyVal::Tuple(t) => Some(t.as_ref().clone()),
            PyVal::List(l) => Some(l.borrow().clone()),
            _ => None,
        }
    }

    fn ints(&self) -> Option<Vec<i64>> {
        self.items()?.iter().map(PyVal::as_int).collect()
    }
}

/// A decoding failure at a byte offset.
#[derive(Clone, Debug, PartialEq)]
pub struct PickleError {
    pub offset: usize,
    pub msg: String,
}

type PResult<T> = Result<T, PickleError>;

/// The element type a torch storage class name stands for.
pub fn storage_dtype(name: &str) -> Option<DType> {
    Some(match name {
        "FloatStorage" => DType::F32,
        "DoubleStorage" => DType::F64,
        "HalfStorage" => DType::F16,
        "BFloat16Storage" => DType::BF16,
        "LongStorage" => DType::I64,
        "IntStorage" => DType::I32,
        "ShortStorage" => DType::I16,
        "CharStorage" => DType::I8,
        "ByteStorage" => DType::U8,
        "BoolStorage" => DType::Bool,
        _ => return None,
    })
}

struct Vm<'a> {
    b: &'a [u8],
    pos: usize,
    stack: Vec<PyVal>,
    marks: Vec<usize>,
    memo: Vec<Option<PyVal>>,
    /// Heights of the tuples built so far (keyed by allocation; the clone
    /// keeps the address from being reused), so that a tuple nested past
    /// [`MAX_DEPTH`] is refused as it is built rather than after the whole
    /// chain exists. Tuples are immutable, so their height is exact; lists
    /// and dicts grow later and are measured by the final check.
    tuple_heights: HashMap<usize, (usize, PyVal)>,
}

/// The limit on memo indices, so a corrupt index cannot allocate gigabytes.
const MAX_MEMO: usize = 1 << 22;

impl<'a> Vm<'a> {
    fn err<T>(&self, msg: impl Into<String>) -> PResult<T> {
        Err(PickleError { offset: self.pos, msg: msg.into() })
    }

    fn take(&mut self, n: usize) -> PResult<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len());
        match end {
            Some(e) => {
                let s = &self.b[self.pos..e];
                self.pos = e;
                Ok(s)
            }
            None => self.err(format!("truncated: wanted {n} bytes, {} left", self.b.len() - self.pos)),
        }
    }

    fn u8(&mut self) -> PResult<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> PResult<u16> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    fn u32(&mut self) -> PResult<u32> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn u64(&mut self) -> PResult<u64> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }

    fn line(&mut self) -> PResult<String> {
        let rest = &self.b[self.pos..];
        let Some(n) = rest.iter().position(|&c| c == b'\n') else {
            return self.err("truncated: unterminated text line");
        };
        let s = String::from_utf8_lossy(&rest[..n]).into_owned();
        self.pos += n + 1;
        Ok(s)
    }

    fn utf8(&mut self, n: usize) -> PResult<String> {
        let s = self.take(n)?;
        match std::str::from_utf8(s) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => self.err("string is not valid UTF-8"),
        }
    }

    fn pop(&mut self) -> PResult<PyVal> {
        match self.stack.pop() {
            Some(v) => Ok(v),
            None => self.err("stack underflow"),
        }
    }

    fn top(&mut self) -> PResult<&mut PyVal> {
        let pos = self.pos;
        self.stack.last_mut().ok_or(PickleError { offset: pos, msg: "stack underflow".into() })
    }

    fn pop_mark(&mut self) -> PResult<Vec<PyVal>> {
        let Some(m) = self.marks.pop() else { return self.err("no MARK on the stack") };
        if m > self.stack.len() {
            return self.err("MARK above the stack top");
        }
        Ok(self.stack.split_off(m))
    }

    fn put(&mut self, idx: usize) -> PResult<()> {
        if idx >= MAX_MEMO {
            return self.err(format!("memo index {idx} too large"));
        }
        let v = self.top()?.clone();
        if self.memo.len() <= idx {
            self.memo.resize(idx + 1, None);
        }
        self.memo[idx] = Some(v);
        Ok(())
    }

    fn get(&mut self, idx: usize) -> PResult<()> {
        match self.memo.get(idx).cloned().flatten() {
            Some(v) => {
                self.stack.push(v);
                Ok(())
            }
            None => self.err(format!("memo index {idx} was never stored")),
        }
    }

    fn run(&mut self) -> PResult<PyVal> {
        loop {
            let op = self.u8()?;
            match op {
                0x80 => {
                    let p = self.u8()?;
                    if p > 5 {
                        return self.err(format!("unsupported pickle protocol {p}"));
                    }
                }
                0x95 => {
                    self.u64()?; // FRAME: a length hint only
                }
                b'.' => return self.pop(),
                b'(' => self.marks.push(self.stack.len()),
                b'N' => self.stack.push(PyVal::None),
                0x88 => self.stack.push(PyVal::Bool(true)),
                0x89 => self.stack.push(PyVal::Bool(false)),
                b'K' => {
                    let v = self.u8()?;
                    self.stack.push(PyVal::Int(i64::from(v)));
                }
                b'M' => {
                    let v = self.u16()?;
                    self.stack.push(PyVal::Int(i64::from(v)));
                }
                b'J' => {
                    let v = self.u32()? as i32;
                    self.stack.push(PyVal::Int(i64::from(v)));
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a { usize::from(self.u8()?) } else { self.u32()? as usize };
                    if n > 8 {
                        return self.err(format!("LONG of {n} bytes does not fit in 64 bits"));
                    }
                    let s = self.take(n)?;
                    let mut a = if s.last().is_some_and(|&x| x & 0x80 != 0) { [0xffu8; 8] } else { [0u8; 8] };
                    a[..n].copy_from_slice(s);
                    self.stack.push(PyVal::Int(i64::from_le_bytes(a)));
                }
                b'I' | b'L' => {
                    let l = self.line()?;
                    let t = l.trim_end_matches('L');
                    let v = match t {
                        "00" => PyVal::Bool(false),
                        "01" => PyVal::Bool(true),
                        _ => match t.parse::<i64>() {
                            Ok(i) => PyVal::Int(i),
                            Err(_) => return self.err(format!("bad INT literal `{l}`")),
                        },
                    };
                    self.stack.push(v);
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.take(8)?.try_into().unwrap_or([0; 8]));
                    self.stack.push(PyVal::Float(v));
                }
                b'F' => {
                    let l = self.line()?;
                    match l.trim().parse::<f64>() {
                        Ok(f) => self.stack.push(PyVal::Float(f)),
                        Err(_) => return self.err(format!("bad FLOAT literal `{l}`")),
                    }
                }
                b'X' => {
                    let n = self.u32()? as usize;
                    let s = self.utf8(n)?;
                    self.stack.push(PyVal::Str(s));
                }
                0x8c => {
                    let n = usize::from(self.u8()?);
                    let s = self.utf8(n)?;
                    self.stack.push(PyVal::Str(s));
                }
                0x8d => {
                    let n = usize::try_from(self.u64()?).unwrap_or(usize::MAX);
                    let s = self.utf8(n)?;
                    self.stack.push(PyVal::Str(s));
                }
                b'T' | b'U' | b'B' | b'C' | 0x8e => {
                    let n = match op {
                        b'T' | b'B' => self.u32()? as usize,
                        0x8e => usize::try_from(self.u64()?).unwrap_or(usize::MAX),
                        _ => usize::from(self.u8()?),
                    };
                    let s = self.take(n)?.to_vec();
                    let v = if matches!(op, b'T' | b'U') {
                        PyVal::Str(String::from_utf8_lossy(&s).into_owned())
                    } else {
                        PyVal::Bytes(s)
                    };
                    self.stack.push(v);
                }
                b')' => self.stack.push(PyVal::Tuple(Rc::new(Vec::new()))),
                b']' => self.stack.push(PyVal::List(Rc::new(RefCell::new(Vec::new())))),
                b'}' => self.stack.push(PyVal::Dict(Rc::new(RefCell::new(Vec::new())))),
                b't' => {
                    let items = self.pop_mark()?;
                    let t = self.tuple(items)?;
                    self.stack.push(t);
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    if self.stack.len() < n {
                        return self.err("stack underflow in TUPLEn");
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    let t = self.tuple(items)?;
                    self.stack.push(t);
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.stack.push(PyVal::List(Rc::new(RefCell::new(items))));
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let pairs =
                        pairs(items).ok_or(PickleError { offset: self.pos, msg: "odd item count in DICT".into() })?;
                    self.stack.push(PyVal::Dict(Rc::new(RefCell::new(pairs))));
                }
                b'a' => {
                    let v = self.pop()?;
                    self.append(vec![v])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.append(items)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![(k, v)])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let p = pairs(items)
                        .ok_or(PickleError { offset: self.pos, msg: "odd item count in SETITEMS".into() })?;
                    self.set_items(p)?;
                }
                b'q' => {
                    let i = usize::from(self.u8()?);
                    self.put(i)?;
                }
                b'r' => {
                    let i = self.u32()? as usize;
                    self.put(i)?;
                }
                0x94 => {
                    let i = self.memo.len();
                    self.put(i)?;
                }
                b'p' => {
                    let l = self.line()?;
                    let Ok(i) = l.trim().parse::<usize>() else { return self.err("bad PUT index") };
                    self.put(i)?;
                }
                b'h' => {
                    let i = usize::from(self.u8()?);
                    self.get(i)?;
                }
                b'j' => {
                    let i = self.u32()? as usize;
                    self.get(i)?;
                }
                b'g' => {
                    let l = self.line()?;
                    let Ok(i) = l.trim().parse::<usize>() else { return self.err("bad GET index") };
                    self.get(i)?;
                }
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top()?.clone();
                    self.stack.push(v);
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.stack.push(PyVal::Global(Rc::new((module, name))));
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (PyVal::Str(m), PyVal::Str(n)) => self.stack.push(PyVal::Global(Rc::new((m, n)))),
                        _ => return self.err("STACK_GLOBAL wants two strings"),
                    }
                }
                b'R' => {
                    let args = self.pop()?;
                    let f = self.pop()?;
                    let v = self.reduce(f, args)?;
                    self.stack.push(v);
                }
                0x81 => {
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    let PyVal::Global(g) = cls else { return self.err("NEWOBJ of a non-class") };
                    let args = args.items().unwrap_or_default();
                    let obj = Object { module: g.0.clone(), name: g.1.clone(), args, state: PyVal::None };
                    self.stack.push(PyVal::Object(Rc::new(RefCell::new(obj))));
                }
                b'b' => {
                    let state = self.pop()?;
                    // OrderedDict and friends built by REDUCE carry no state worth keeping.
                    if let PyVal::Object(o) = self.top()? {
                        o.borrow_mut().state = state;
                    }
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let v = self.persistent(pid)?;
                    self.stack.push(v);
                }
                other => return self.err(format!("unknown or unsupported opcode 0x{other:02x}")),
            }
        }
    }

    fn tuple(&mut self, items: Vec<PyVal>) -> PResult<PyVal> {
        let below = items
            .iter()
            .filter_map(|v| identity(v).map(|id| self.tuple_heights.get(&id).map_or(1, |h| h.0)))
            .max()
            .unwrap_or(0);
        if below + 1 > MAX_DEPTH {
            return self.err(format!("pickled value nests containers deeper than {MAX_DEPTH} levels"));
        }
        let t = PyVal::Tuple(Rc::new(items));
        if below > 0 {
            if let Some(id) = identity(&t) {
                self.tuple_heights.insert(id, (below + 1, t.clone()));
            }
        }
        Ok(t)
    }

    fn append(&mut self, items: Vec<PyVal>) -> PResult<()> {
        match self.top()? {
            PyVal::List(l) => {
                l.borrow_mut().extend(items);
                Ok(())
            }
            _ => self.err("APPEND to a non-list"),
        }
    }

    fn set_items(&mut self, items: Vec<(PyVal, PyVal)>) -> PResult<()> {
        match self.top()? {
            PyVal::Dict(d) => {
                d.borrow_mut().extend(items);
                Ok(())
            }
            _ => self.err("SETITEM on a non-dict"),
        }
    }

    fn persistent(&mut self, pid: PyVal) -> PResult<PyVal> {
        let items = pid.items().unwrap_or_default();
        let kind = items.first().and_then(PyVal::as_str);
        if kind != Some("storage") || items.len() < 5 {
            return self.err("persistent id is not a ('storage', type, key, location, numel) tuple");
        }
        let dtype = match &items[1] {
            PyVal::Global(g) => storage_dtype(&g.1),
            _ => None,
        };
        let Some(dtype) = dtype else {
            // Named, not `Debug`-printed: the value may be deep or cyclic.
            let name = match &items[1] {
                PyVal::Global(g) => format!("{}.{}", g.0, g.1),
                _ => "a non-class value".to_string(),
            };
            return self.err(format!("unsupported storage type {name}"));
        };
        let key = match &items[2] {
            PyVal::Str(s) => s.clone(),
            PyVal::Int(i) => i.to_string(),
            _ => return self.err("storage key is not a string"),
        };
        let Some(numel) = items[4].as_int().and_then(|n| u64::try_from(n).ok()) else {
            return self.err("bad storage size");
        };
        Ok(PyVal::Storage(Rc::new(StorageRef { dtype, key, numel })))
    }

    fn reduce(&mut self, f: PyVal, args: PyVal) -> PResult<PyVal> {
        let PyVal::Global(g) = f else { return self.err("REDUCE of a non-callable") };
        let a = args.items().unwrap_or_default();
        match (g.0.as_str(), g.1.as_str()) {
            ("torch._utils", "_rebuild_tensor_v2" | "_rebuild_tensor") => {
                let (Some(PyVal::Storage(s)), Some(off), Some(sizes), Some(strides)) = (
                    a.first(),
                    a.get(1).and_then(PyVal::as_int),
                    a.get(2).and_then(PyVal::ints),
                    a.get(3).and_then(PyVal::ints),
                ) else {
                    return self.err("_rebuild_tensor_v2 with unexpected arguments");
                };
                // PyTorch makes no view with a negative size, stride or
                // storage offset; one here is refused, naming the storage.
                let view = || format!("tensor view of storage `data/{}`", s.key);
                if sizes.len() != strides.len() {
                    return self.err(format!("{}: {} sizes but {} strides", view(), sizes.len(), strides.len()));
                }
                if let Some(d) = sizes.iter().find(|&&d| d < 0) {
                    return self.err(format!("{}: negative size {d} in {sizes:?}", view()));
                }
                if let Some(st) = strides.iter().find(|&&st| st < 0) {
                    return self.err(format!("{}: negative stride {st} in {strides:?}", view()));
                }
                if off < 0 {
                    return self.err(format!("{}: negative storage offset {off}", view()));
                }
                let requires_grad = matches!(a.get(4), Some(PyVal::Bool(true)));
                Ok(PyVal::Tensor(Rc::new(TensorRef { storage: s.clone(), offset: off, sizes, strides, requires_grad })))
            }
            ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => match a.first() {
                Some(t @ PyVal::Tensor(_)) => Ok(t.clone()),
                _ => self.err("_rebuild_parameter of a non-tensor"),
            },
            ("collections", "OrderedDict") | ("builtins", "dict") => Ok(PyVal::Dict(Rc::new(RefCell::new(Vec::new())))),
            ("torch.jit._pickle", "restore_type_tag") => Ok(a.into_iter().next().unwrap_or(PyVal::None)),
            ("torch.jit._pickle", n) if n.starts_with("build_") => Ok(a.into_iter().next().unwrap_or(PyVal::None)),
            ("torch._utils", n) if n.starts_with("_rebuild_q") || n.starts_with("_rebuild_sparse") => {
                self.err(format!("unsupported tensor kind {}.{}", g.0, g.1))
            }
            _ => Ok(PyVal::Object(Rc::new(RefCell::new(Object {
                module: g.0.clone(),
                name: g.1.clone(),
                args: a,
                state: PyVal::None,
            })))),
        }
    }
}

fn pairs(items: Vec<PyVal>) -> Option<Vec<(PyVal, PyVal)>> {
    if !items.len().is_multiple_of(2) {
        return None;
    }
    let mut it = items.into_iter();
    let mut out = Vec::new();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Some(out)
}

/// The deepest nesting of containers a decoded value may have. Real
/// archives nest modules a few dozen levels at most.
pub const MAX_DEPTH: usize = 200;

/// Decode one pickle: a value nested at most [`MAX_DEPTH`] deep and free of
/// cycles, or an error.
pub fn load(bytes: &[u8]) -> Result<PyVal, PickleError> {
    let v = {
        let mut vm = Vm {
            b: bytes,
            pos: 0,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Vec::new(),
            tuple_heights: HashMap::new(),
        };
        vm.run()?
    };
    match check_shape(&v) {
        Ok(()) => Ok(v),
        Err(msg) => {
            dismantle(vec![v], true);
            Err(PickleError { offset: bytes.len(), msg })
        }
    }
}

impl Drop for Vm<'_> {
    fn drop(&mut self) {
        // What is left on the stack or in the memo may be arbitrarily deep;
        // only uniquely held parts are taken apart, because the memo shares
        // containers with the value `load` returns.
        let mut rest = std::mem::take(&mut self.stack);
        rest.extend(self.memo.drain(..).flatten());
        rest.extend(self.tuple_heights.drain().map(|(_, (_, v))| v));
        dismantle(rest, false);
    }
}

/// The containers directly inside `v`.
fn children(v: &PyVal) -> Vec<PyVal> {
    match v {
        PyVal::Tuple(t) => t.as_ref().clone(),
        PyVal::List(l) => l.try_borrow().map(|l| l.clone()).unwrap_or_default(),
        PyVal::Dict(d) => {
            d.try_borrow().map(|d| d.iter().flat_map(|(k, v)| [k.clone(), v.clone()]).collect()).unwrap_or_default()
        }
        PyVal::Object(o) => o
            .try_borrow()
            .map(|o| o.args.iter().cloned().chain(std::iter::once(o.state.clone())).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The identity of a shared container (its allocation), for cycle checks.
fn identity(v: &PyVal) -> Option<usize> {
    match v {
        PyVal::Tuple(t) => Some(Rc::as_ptr(t) as *const () as usize),
        PyVal::List(l) => Some(Rc::as_ptr(l) as *const () as usize),
        PyVal::Dict(d) => Some(Rc::as_ptr(d) as *const () as usize),
        PyVal::Object(o) => Some(Rc::as_ptr(o) as *const () as usize),
        _ => None,
    }
}

/// Refuse a value nested deeper than [`MAX_DEPTH`] or one that contains
/// itself. Iterative depth-first walk: a container is *open* while it is on
/// the current path (meeting it again is a cycle) and gets its height (the
/// longest chain below it) once closed, so a DAG of shared references costs
/// its size, not its number of paths, and a shared subtree reached along a
/// long path still counts its full depth.
fn check_shape(root: &PyVal) -> Result<(), String> {
    enum Mark {
        Open,
        Closed(usize),
    }
    let cycle = |v: &PyVal| {
        let what = match v {
            PyVal::Object(o) => o.try_borrow().map(|o| format!("object {}.{}", o.module, o.name)).ok(),
            _ => None,
        };
        format!(
            "pickled {} contains itself (a reference cycle); module state must be a tree",
            what.unwrap_or_else(|| "container".into())
        )
    };
    let mut seen: HashMap<usize, Mark> = HashMap::new();
    // (value, children already pushed); the entries with `true` are the path.
    let mut stack: Vec<(PyVal, bool)> = vec![(root.clone(), false)];
    let mut path = 0usize;
    while let Some((v, expanded)) = stack.pop() {
        let Some(id) = identity(&v) else { continue };
        if expanded {
            path -= 1;
            let below = children(&v)
                .iter()
                .filter_map(|k| match identity(k).and_then(|k| seen.get(&k)) {
                    Some(Mark::Closed(h)) => Some(*h),
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            if below + 1 > MAX_DEPTH {
                return Err(format!("pickled value nests containers deeper than {MAX_DEPTH} levels"));
            }
            seen.insert(id, Mark::Closed(below + 1));
            continue;
        }
        match seen.get(&id) {
            Some(Mark::Closed(_)) => continue,
            Some(Mark::Open) => return Err(cycle(&v)),
            None => {}
        }
        path += 1;
        if path > MAX_DEPTH {
            return Err(format!("pickled value nests containers deeper than {MAX_DEPTH} levels"));
        }
        seen.insert(id, Mark::Open);
        let kids = children(&v);
        stack.push((v, true));
        for k in kids {
            match identity(&k).map(|kid| seen.get(&kid)) {
                None | Some(Some(Mark::Closed(_))) => {}
                Some(Some(Mark::Open)) => return Err(cycle(&k)),
                Some(None) => stack.push((k, false)),
            }
        }
    }
    Ok(())
}

/// Drop values without recursion. Containers held only here are emptied
/// onto a work list before they are freed; shared ones just lose a
/// reference. With `break_cycles`, shared mutable containers are emptied
/// too (the caller discards everything reachable), so cycles are freed.
fn dismantle(mut work: Vec<PyVal>, break_cycles: bool) {
    while let Some(v) = work.pop() {
        match v {
            PyVal::Tuple(t) => {
                if let Ok(items) = Rc::try_unwrap(t) {
                    work.extend(items);
                }
            }
            PyVal::List(l) => match Rc::try_unwrap(l) {
                Ok(cell) => work.extend(cell.into_inner()),
                Err(l) if break_cycles => {
                    if let Ok(mut b) = l.try_borrow_mut() {
                        work.extend(std::mem::take(&mut *b));
                    }
                }
                Err(_) => {}
            },
            PyVal::Dict(d) => match Rc::try_unwrap(d) {
                Ok(cell) => work.extend(cell.into_inner().into_iter().flat_map(|(k, v)| [k, v])),
                Err(d) if break_cycles => {
                    if let Ok(mut b) = d.try_borrow_mut() {
                        work.extend(std::mem::take(&mut *b).into_iter().flat_map(|(k, v)| [k, v]));
                    }
                }
                Err(_) => {}
            },
            PyVal::Object(o) => match Rc::try_unwrap(o) {
                Ok(cell) => {
                    let o = cell.into_inner();
                    work.extend(o.args);
                    work.push(o.state);
                }
                Err(o) if break_cycles => {
                    if let Ok(mut b) = o.try_borrow_mut() {
                        work.extend(std::mem::take(&mut b.args));
                        work.push(std::mem::replace(&mut b.state, PyVal::None));
                    }
                }
                Err(_) => {}
            },
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_basic_values() {
        // (1, 'ab', [2.5], {'k': None}, True)
        let b = b"\x80\x02(K\x01X\x02\x00\x00\x00ab]G@\x04\x00\x00\x00\x00\x00\x00a}X\x01\x00\x00\x00kNs\x88t.";
        let v = load(b).expect("decodes");
        let items = v.items().expect("tuple");
        assert_eq!(items.len(), 5);
        assert_eq!(items[0].as_int(), Some(1));
        assert_eq!(items[1].as_str(), Some("ab"));
        assert!(matches!(&items[2].items().expect("list")[0], PyVal::Float(f) if *f == 2.5));
        assert!(matches!(items[4], PyVal::Bool(true)));
    }

    #[test]
    fn rebuilds_tensors_from_persistent_storages() {
        let b = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQK\x00K\x02K\x03\x86K\x03K\x01\x86\x89ccollections\nOrderedDict\n)RtR.";
        let PyVal::Tensor(t) = load(b).expect("decodes") else { panic!("not a tensor") };
        assert_eq!(t.sizes, vec![2, 3]);
        assert_eq!(t.strides, vec![3, 1]);
        assert_eq!(t.storage.dtype, DType::F32);
        assert_eq!(t.storage.key, "0");
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        // None wrapped in a million TUPLE1s: deeper than any stack.
        let mut b = b"\x80\x02N".to_vec();
        b.extend(std::iter::repeat_n(0x85u8, 1_000_000));
        b.push(b'.');
        let e = load(&b).expect_err("too deep");
        assert!(e.msg.contains("deeper than"), "{}", e.msg);
        // The same chain left unfinished: the machine's stack is dropped
        // without recursion too.
        b.pop();
        assert!(load(&b).is_err());
        // At the limit it decodes.
        let mut ok = b"\x80\x02N".to_vec();
        ok.extend(std::iter::repeat_n(0x85u8, MAX_DEPTH));
        ok.push(b'.');
        assert!(load(&ok).is_ok());
        ok.insert(3, 0x85);
        assert!(load(&ok).is_err(), "one level past the limit");
    }

    #[test]
    fn cycles_are_refused_and_sharing_is_not() {
        // l = []; l.append(l)
        let e = load(b"\x80\x02]q\x00h\x00a.").expect_err("cycle");
        assert!(e.msg.contains("contains itself"), "{}", e.msg);
        // An object whose BUILD state holds the object.
        let obj = b"\x80\x02c__torch__\nM\n)\x81q\x00}q\x01X\x01\x00\x00\x00sh\x00sb.";
        let e = load(obj).expect_err("cycle through state");
        assert!(e.msg.contains("__torch__.M"), "{}", e.msg);
        // (l, l): shared, not cyclic.
        let v = load(b"\x80\x02]q\x00h\x00\x86.").expect("shared list decodes");
        assert_eq!(v.items().map(|i| i.len()), Some(2));
    }

    #[test]
    fn malformed_pickles_are_errors() {
        let good = b"\x80\x02(K\x01X\x02\x00\x00\x00abt.";
        for n in 0..good.len() {
            assert!(load(&good[..n]).is_err(), "prefix {n} decoded");
        }
        let e = load(b"\x80\x02\xff.").expect_err("unknown opcode");
        assert!(e.msg.contains("unknown"), "{}", e.msg);
        assert!(load(b"h\x05.").is_err());
        assert!(load(b"t.").is_err());
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            let bytes: Vec<u8> = (0..64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = load(&bytes);
        }
    }
}
