//! Rewrite rules and the policy that makes them sound.
//!
//! Every rule is an *equality*: it adds e-nodes computing exactly the same
//! tensor (bit for bit, up to the sign of zero where noted) to an e-class;
//! extraction then picks the cheapest. No rule ever unions e-classes of
//! different dtypes, so the dtype every kept op reads and every graph output
//! has is fixed by construction.
//!
//! | rule | rewrite | preserves | why it is sound |
//! |------|---------|-----------|-----------------|
//! | `cast-identity` | `cast_t(x:t) = x` | bits | a cast to its own type copies |
//! | `cast-exact-chain` | `cast_a(cast_b(x:s)) = cast_a(x)` when s→b is exact | bits | `cast_b` keeps the value (f16/bf16→f32/f64, f32→f64, i8→f16/bf16/f32/f64 are injective and value-preserving), so the outer cast sees the same number; the round trips f16→f32→f16, bf16→f32→bf16, i8→f32→i8 are the case a = s |
//! | `cast-hoist` | `cast_t(op_s(x..)) = op_t(cast_t(x)..)` | bits (movement); values (order-preserving) | movement ops (Reshape, Transpose, Flatten, Slice, Gather data, Concat, Split, Squeeze, Unsqueeze, Expand, Identity) only copy elements, and a cast is elementwise; Relu, MaxPool, Max, Min select one of their inputs (or 0), and rounding is monotone, so `round(max(a,b)) = max(round a, round b)` — only `Relu(-tiny)` may give -0 instead of +0 |
//! | `cast-sink` | `op_t(cast_t(y_1)..cast_t(y_k)) = cast_t(op_s(y_1..y_k))` | as `cast-hoist` | the same equality read backwards; sinks a cast below fan-in (Concat / Max of k casts becomes one cast) |
//! | `fold-constant` | `cast_t(w) = stored_t(w)` for a constant initializer, a `Constant` node output, or a small value computed from those alone (see below) | bits | the stored copy is the cast computed once, offline (round to nearest even, as Cast does) |
//! | `refresh-copy` | `cast_t(w) = refreshed_t(w)` for a trained FP32 parameter `w`, t ∈ {f16, bf16}, in training, where the memory model allows it (below) | bits | the copy is `w` rounded to t (nearest even, as Cast does) and rewritten after every optimizer step, so every forward reads exactly the cast of the current `w`; its gradient is `w`'s, as the cast's backward passes it |
//! | `use-uncast` (exact) | a kept op reading `cast_t(x)` reads `x` instead, for `IsNaN` (any float cast) and `Shape`/`Size` (any cast) | bits | `IsNaN` asks a question every float cast answers the same way (NaN stays NaN; a finite value rounds to a finite value or ±inf, never NaN); `Shape`/`Size` read no element |
//! | `use-uncast` (parameters) | `BatchNormalization` at f16/bf16 reads FP32 `scale`,`bias` (T1) and `mean`,`var` (T2) instead of their low casts; opset ≥ 15 only | values, more precisely: *not bits* | since opset 15 ONNX types the parameters (T1, T2) apart from the data (T), as cuDNN and every framework's mixed-precision BatchNorm keep them FP32; the op still reads and writes its activations at the planned precision, and its parameters are no longer rounded. Off under `exact` |
//!
//! **Policy.** `cast-hoist` / `cast-sink` move an op from precision s to t;
//! they fire only when the plan's policy allows that op at *both*
//! precisions ([`RuleCx::allows`]): t is the op's current dtype, or the op is
//! lowerable, the target supports t, and the policy does not deny the op.
//! Ops outside the two lists above never change precision: they are leaves.
//! *Duplicate casts merge* by hash-consing (one e-node per cast of an
//! e-class); *hoisting above fan-out* and *sinking below fan-in* fall out of
//! `cast-hoist` / `cast-sink` plus DAG-aware extraction, which counts a
//! shared cast once.
//!
//! **Constants and weights.** A cast of a *constant* — an initializer that
//! is not trained (scalars and single-element tensors in training mode;
//! every initializer in inference mode) or the output of a `Constant` node
//! (never trained, in either mode) — folds into a stored copy computed once
//! (`fold-constant`); extraction weighs the copy's memory
//! (bytes × [`super::extract::MEMORY_COST_PER_BYTE`]) against the
//! per-iteration cast's time from the cost oracle.
//! A value computed only
//! from such constants (an exporter's `Sqrt(Constant)` attention scale, a
//! mask built from `Constant`s) is a constant too when it is small (at most
//! [`super::pass::KNOWN_MAX_ELEMS`] elements) and every op on the way is
//! evaluated exactly here — the IEEE correctly rounded ones (`+ − × ÷ √`,
//! casts) and data movement; its cast folds like any other, and the ops
//! that computed it go when nothing else reads them.
//!
//! A *trained* parameter changes every step, so its stored copy must be
//! rewritten every step too (`refresh-copy`): the graph reads an f16/bf16
//! initializer paired with its FP32 master ([`qsync_ir::Graph::add_refreshed_copy`]),
//! and the optimizer step, which already sweeps the master, writes the
//! rounded copy in the same pass. That replaces the per-iteration forward
//! cast and the backward cast of the weight's gradient (two kernels, a read
//! of 4 + a write of 2 bytes per element each way) by a fused 2-byte write.
//! Extraction decides with the oracle's costs
//! ([`crate::precision::CostOracle::refresh_time`] against twice
//! `cast_time`); the memory model decides where it is offered at all. A
//! copy is persistent, while a per-iteration cast lives from its forward
//! use to its backward use, so the copy raises the peak unless every op
//! reading the cast keeps it for the backward anyway (Conv and MatMul-class
//! ops, normalization scales; `qsync_cost::facts::keeps_input`, the rule
//! the memory model counts saved values with). A weight with any other
//! low-precision reader — an embedding table read by Gather, a bias read by
//! Add — adds its bytes to the peak, and is offered only within the
//! target's memory headroom (`CostOracle::memory_headroom`), most time
//! saved per byte first; without a memory model it keeps its per-iteration
//! cast. A weight cast behind element-preserving movement ops (an
//! exporter's `Cast(Transpose(W))`) is a candidate too: `cast-hoist` brings
//! the cast onto the weight, where the copy serves it.
//!
//! **Uses.** A kept op's input is normally a fixed e-class: the op reads
//! exactly that dtype. For the ops above whose reading does not depend on
//! it (or, for BatchNormalization's parameters, where ONNX lets it differ)
//! the importer makes a [`Key::Use`] class instead, and `use-uncast` adds
//! the uncast readings; extraction pays for whichever it picks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use egg::{Applier, Id, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};
use qsync_ir::DType;

use super::language::{dtype_of, CastGraph, CastLang, Key, Typing};

/// Whether casting `from` → `to` keeps every value exactly.
pub fn exact_widening(from: DType, to: DType) -> bool {
    use DType::*;
    matches!((from, to), (F16 | BF16, F32 | F64) | (F32, F64) | (I8, F16 | BF16 | F32 | F64))
}

/// What the rules may do, precomputed from the graph and plan.
#[derive(Clone, Debug, Default)]
pub struct RuleCx {
    /// Per rewritable node: the dtypes the policy allows it at.
    pub allowed: BTreeMap<u32, Vec<DType>>,
    /// Initializers (value index) that may be stored converted.
    pub foldable: BTreeSet<u32>,
    /// Trained FP32 parameters (value index) that may be read through a
    /// refreshed copy.
    pub refreshable: BTreeSet<u32>,
    /// Per use (node, group): the dtypes the group may read instead.
    pub uses: BTreeMap<(u32, u8), Vec<DType>>,
}

impl RuleCx {
    /// Whether node `n` may compute at `dt`.
    pub fn allows(&self, n: u32, dt: DType) -> bool {
        self.allowed.get(&n).is_some_and(|v| v.contains(&dt))
    }
}

/// The rules, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Identity,
    ExactChain,
    Hoist,
    Sink,
    Fold,
    Refresh,
    Uncast,
}

/// One rule: a searcher (which e-classes may match) and an applier (which
/// re-reads the class and adds the equal e-nodes).
#[derive(Clone, Debug)]
struct Rule {
    kind: Kind,
    cx: Arc<RuleCx>,
}

fn nodes(eg: &CastGraph, c: Id) -> Vec<CastLang> {
    eg[c].nodes.clone()
}

fn casts_in(eg: &CastGraph, c: Id) -> impl Iterator<Item = (DType, Id)> + '_ {
    eg[c].nodes.iter().filter_map(|n| match n.key() {
        Key::Cast { to } => Some((to, n.kids()[0])),
        _ => None,
    })
}

impl Rule {
    fn matches(&self, eg: &CastGraph, c: Id) -> bool {
        let has_cast = casts_in(eg, c).next().is_some();
        match self.kind {
            Kind::Identity | Kind::ExactChain | Kind::Hoist | Kind::Fold | Kind::Refresh => has_cast,
            Kind::Sink => eg[c].nodes.iter().any(|n| matches!(n.key(), Key::Node { .. })),
            Kind::Uncast => eg[c].nodes.iter().any(|n| matches!(n.key(), Key::Use { .. })),
        }
    }

    /// Add everything equal to class `c` this rule knows; returns whether
    /// anything was unioned.
    fn apply(&self, eg: &mut CastGraph, c: Id) -> bool {
        let mut out = Vec::new();
        let c_dt = dtype_of(eg, c);
        for node in nodes(eg, c) {
            let kids = node.kids().to_vec();
            match (self.kind, node.key()) {
                (Kind::Identity, Key::Cast { to }) if dtype_of(eg, kids[0]) == Some(to) => out.push(kids[0]),
                (Kind::ExactChain, Key::Cast { to }) => {
                    for (mid, x) in casts_in(eg, kids[0]).collect::<Vec<_>>() {
                        let Some(src) = dtype_of(eg, x) else { continue };
                        if exact_widening(src, mid) {
                            out.push(if src == to { x } else { eg.add(CastLang::Op(Key::Cast { to }, vec![x])) });
                        }
                    }
                }
                (Kind::Hoist, Key::Cast { to }) if to.is_float() => {
                    for inner in nodes(eg, kids[0]) {
                        let Key::Node { node: n, slot, dt: s, elems } = inner.key() else { continue };
                        if s == to || !self.cx.allows(n, s) || !self.cx.allows(n, to) {
                            continue;
                        }
                        let new_kids: Vec<Id> =
                            inner.kids().iter().map(|&k| eg.add(CastLang::Op(Key::Cast { to }, vec![k]))).collect();
                        out.push(eg.add(CastLang::Op(Key::Node { node: n, slot, dt: to, elems }, new_kids)));
                    }
                }
                (Kind::Sink, Key::Node { node: n, slot, dt: t, elems }) => {
                    let Some(first) = kids.first() else { continue };
                    let sources: Vec<DType> =
                        casts_in(eg, *first).filter(|(to, _)| *to == t).filter_map(|(_, y)| dtype_of(eg, y)).collect();
                    for s in sources {
                        if s == t || !s.is_float() || !self.cx.allows(n, s) || !self.cx.allows(n, t) {
                            continue;
                        }
                        let ys: Option<Vec<Id>> = kids
                            .iter()
                            .map(|&k| {
                                casts_in(eg, k).find(|&(to, y)| to == t && dtype_of(eg, y) == Some(s)).map(|(_, y)| y)
                            })
                            .collect();
                        let Some(ys) = ys else { continue };
                        let inner = eg.add(CastLang::Op(Key::Node { node: n, slot, dt: s, elems }, ys));
                        out.push(eg.add(CastLang::Op(Key::Cast { to: t }, vec![inner])));
                    }
                }
                (Kind::Fold, Key::Cast { to }) if matches!(to, DType::F16 | DType::BF16 | DType::F32) => {
                    for leaf in nodes(eg, kids[0]) {
                        if let Key::Leaf { value, elems, .. } = leaf.key() {
                            if self.cx.foldable.contains(&value) {
                                let key = Key::Stored { value, dt: to, elems, refreshed: false };
                                out.push(eg.add(CastLang::Op(key, vec![])));
                            }
                        }
                    }
                }
                (Kind::Refresh, Key::Cast { to }) if matches!(to, DType::F16 | DType::BF16) => {
                    for leaf in nodes(eg, kids[0]) {
                        if let Key::Leaf { value, elems, dt: DType::F32, .. } = leaf.key() {
                            if self.cx.refreshable.contains(&value) {
                                let key = Key::Stored { value, dt: to, elems, refreshed: true };
                                out.push(eg.add(CastLang::Op(key, vec![])));
                            }
                        }
                    }
                }
                (Kind::Uncast, Key::Use { node: n, group, .. }) => {
                    let Some(accept) = self.cx.uses.get(&(n, group)) else { continue };
                    for &d in accept {
                        // Every child of the group must be a cast of a value of dtype `d`.
                        let xs: Option<Vec<Id>> = kids
                            .iter()
                            .map(|&k| {
                                if dtype_of(eg, k) == Some(d) {
                                    return Some(k);
                                }
                                casts_in(eg, k).find(|&(_, x)| dtype_of(eg, x) == Some(d)).map(|(_, x)| x)
                            })
                            .collect();
                        if let Some(xs) = xs.filter(|xs| xs.as_slice() != kids.as_slice()) {
                            out.push(eg.add(CastLang::Op(node.key(), xs)));
                        }
                    }
                }
                _ => {}
            }
        }
        let mut changed = false;
        for id in out {
            debug_assert_eq!(dtype_of(eg, id), c_dt);
            if dtype_of(eg, id) == c_dt {
                changed |= eg.union(c, id);
            }
        }
        changed
    }
}

impl Searcher<CastLang, Typing> for Rule {
    fn search_eclass_with_limit(
        &self,
        eg: &CastGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, CastLang>> {
        (limit > 0 && self.matches(eg, eclass)).then(|| SearchMatches {
            eclass,
            substs: vec![Subst::default()],
            ast: None,
        })
    }

    fn vars(&self) -> Vec<Var> {
        Vec::new()
    }
}

impl Applier<CastLang, Typing> for Rule {
    fn apply_one(
        &self,
        eg: &mut CastGraph,
        eclass: Id,
        _: &Subst,
        _: Option<&PatternAst<CastLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        let c = eg.find(eclass);
        if self.apply(eg, c) {
            vec![c]
        } else {
            Vec::new()
        }
    }
}

/// Every rule, in a fixed order.
pub fn rules(cx: &Arc<RuleCx>) -> Vec<Rewrite<CastLang, Typing>> {
    [
        ("cast-identity", Kind::Identity),
        ("cast-exact-chain", Kind::ExactChain),
        ("cast-hoist", Kind::Hoist),
        ("cast-sink", Kind::Sink),
        ("fold-constant", Kind::Fold),
        ("refresh-copy", Kind::Refresh),
        ("use-uncast", Kind::Uncast),
    ]
    .into_iter()
    .map(|(name, kind)| {
        let r = Rule { kind, cx: cx.clone() };
        Rewrite::new(name, r.clone(), r).expect("rules bind no variables")
    })
    .collect()
}
