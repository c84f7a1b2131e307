//! The e-graph language: dtype-typed values, Cast, and the region's other ops.
//!
//! Every e-node is `Op(Key, children)`. The [`Key`] says what the node is;
//! children are e-classes of *typed values* (the float data inputs, in slot
//! order). Non-float inputs of an op (shape tensors, indices, axes) are not
//! children: they stay as the original IR node has them.
//!
//! - [`Key::Leaf`]: a value from outside the rewritable region (graph input,
//!   initializer, output of a kept op), keyed by its [`ValueId`] so it is
//!   preserved verbatim — an uninterpreted node;
//! - [`Key::Stored`]: a low-precision stored copy of an initializer: of a
//!   constant (`fold-constant` in [`super::rules`]), or of a trained
//!   parameter, refreshed by the optimizer step (`refresh-copy`);
//! - [`Key::Cast`]: ONNX Cast to a dtype, one child;
//! - [`Key::Node`]: output `slot` of IR node `node`, computing in `dt`
//!   (data movement and order-preserving ops — the only ops whose precision
//!   the rules may move);
//! - [`Key::Use`]: how kept node `node` reads its input group `group` (one
//!   or two slots, the children). A use class holds one e-node per way of
//!   reading the group that the rules prove acceptable (see `use-uncast` in
//!   [`super::rules`]); the children's dtypes may differ between them. Its
//!   `dt` is the dtype the node read originally: a use class is not a
//!   value, and the key only keeps the analysis consistent.
//!
//! The [`Typing`] analysis gives every e-class one dtype and element count;
//! rules only ever union e-classes of equal dtype, so a class's dtype is the
//! dtype of every value extraction can pick for it.

use std::fmt;
use std::str::FromStr;

use egg::{define_language, Analysis, DidMerge, EGraph, Id};
use qsync_ir::DType;

/// What an e-node is.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Key {
    /// An IR value kept as is: (value index, dtype, elements, whether a
    /// gradient flows back into it in training).
    Leaf { value: u32, dt: DType, elems: u64, grad: bool },
    /// Initializer `value` stored converted to `dt`; `refreshed`: a trained
    /// parameter's copy, rewritten by every optimizer step (its gradient
    /// flows to the parameter).
    Stored { value: u32, dt: DType, elems: u64, refreshed: bool },
    /// Cast to `to`.
    Cast { to: DType },
    /// Output `slot` of IR node `node` computed at `dt`.
    Node { node: u32, slot: u16, dt: DType, elems: u64 },
    /// Kept node `node` reading its input group `group`.
    Use { node: u32, group: u8, dt: DType },
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Leaf { value, dt, .. } => write!(f, "v{value}:{dt}"),
            Key::Stored { value, dt, refreshed: false, .. } => write!(f, "stored(v{value}):{dt}"),
            Key::Stored { value, dt, refreshed: true, .. } => write!(f, "refreshed(v{value}):{dt}"),
            Key::Cast { to } => write!(f, "cast_{to}"),
            Key::Node { node, slot, dt, .. } => write!(f, "n{node}.{slot}:{dt}"),
            Key::Use { node, group, .. } => write!(f, "use(n{node}.{group})"),
        }
    }
}

impl FromStr for Key {
    type Err = String;
    /// Keys are made by the importer, never parsed.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Err(format!("`{s}`: e-graph keys are not parsed"))
    }
}

define_language! {
    /// An e-node: a key and its value children.
    pub enum CastLang {
        Op(Key, Vec<Id>),
    }
}

impl CastLang {
    /// The node's key.
    pub fn key(&self) -> Key {
        match self {
            CastLang::Op(k, _) => *k,
        }
    }

    /// The node's children.
    pub fn kids(&self) -> &[Id] {
        match self {
            CastLang::Op(_, c) => c,
        }
    }
}

/// An e-class's type.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ClassType {
    pub dt: Option<DType>,
    pub elems: u64,
    /// Whether a gradient flows back through the value in training (it
    /// depends on a trained parameter): a cast of it then has a backward
    /// cast too.
    pub grad: bool,
}

/// The dtype analysis.
#[derive(Clone, Copy, Default, Debug)]
pub struct Typing;

/// The e-graph type used throughout.
pub type CastGraph = EGraph<CastLang, Typing>;

impl Analysis<CastLang> for Typing {
    type Data = ClassType;

    fn make(egraph: &mut CastGraph, enode: &CastLang, _id: Id) -> ClassType {
        let kids_grad = enode.kids().iter().any(|&c| egraph[c].data.grad);
        match enode.key() {
            Key::Leaf { dt, elems, grad, .. } => ClassType { dt: Some(dt), elems, grad },
            Key::Stored { dt, elems, refreshed, .. } => ClassType { dt: Some(dt), elems, grad: refreshed },
            Key::Node { dt, elems, .. } => ClassType { dt: Some(dt), elems, grad: kids_grad },
            Key::Use { dt, .. } => ClassType { dt: Some(dt), elems: 0, grad: kids_grad },
            Key::Cast { to } => {
                let elems = enode.kids().first().map_or(0, |&c| egraph[c].data.elems);
                ClassType { dt: Some(to), elems, grad: kids_grad }
            }
        }
    }

    fn merge(&mut self, a: &mut ClassType, b: ClassType) -> DidMerge {
        // Rules union only equal dtypes (checked in debug builds), and equal
        // values depend on the same parameters; a stored constant (no
        // gradient) only ever joins a class of constants, a refreshed copy
        // (gradient) a cast of its parameter.
        debug_assert!(a.dt.is_none() || b.dt.is_none() || a.dt == b.dt, "merging {a:?} with {b:?}");
        if a.dt.is_none() && b.dt.is_some() {
            *a = b;
            return DidMerge(true, false);
        }
        let grad = a.grad || b.grad;
        let changed_a = grad != a.grad;
        a.grad = grad;
        DidMerge(changed_a, a.dt != b.dt || grad != b.grad)
    }
}

/// The dtype of e-class `c`.
pub fn dtype_of(eg: &CastGraph, c: Id) -> Option<DType> {
    eg[c].data.dt
}
