//! [`CostModelOracle`]: the [`CostOracle`] backed by the cost model crate
//! (`qsync-cost`): a device from the bundled database, roofline op costs with
//! Tensor Core eligibility from the device's alignment, and Campo eq. 1 cast
//! costs. It is what every planner uses when a target is named.
//!
//! **Reads:** value types, op attributes, initializers (which are trained
//! parameters, hence which values carry gradients).
//! **Guarantees:** pure answers for one graph state; facts ([`GraphFacts`])
//! are built once per graph state and cached. The cache key is the graph's
//! address, value capacity and node count: every insertion (a cast, a
//! Pad / Slice) changes the last two, so materialized or padded graphs get
//! fresh facts. A rewrite that keeps both (changing a shape in place) must
//! call [`CostModelOracle::invalidate`].
//! **Requires:** shapes known. Symbolic dims are bound from the
//! [`InferOptions`] (`--batch`, `--dim`) first, then to defaults: the
//! leading symbol of the graph inputs (the batch) to [`DEFAULT_BATCH`], any
//! other symbol to [`DEFAULT_DIM`]. A graph whose facts cannot be built (a
//! float value of unknown shape) is costed by the [`AnalyticOracle`] for the
//! same target instead, so planning never fails for lack of a shape.

use std::cell::RefCell;
use std::rc::Rc;

use qsync_cost::{estimate_memory, Bindings, CostModel, DeviceDb, GraphFacts, Optimizer, Plan, Precision};
use qsync_ir::infer::InferOptions;
use qsync_ir::{DType, Graph, NodeId, Op};

use super::oracle::{AnalyticOracle, CostOracle, Prediction};

/// Default value of the leading (batch) symbolic dimension.
pub const DEFAULT_BATCH: i64 = 32;
/// Default value of every other symbolic dimension (`seq`, …).
pub const DEFAULT_DIM: i64 = 128;

type Key = (usize, usize, usize);

/// The cost model on one device, as a planner's oracle.
pub struct CostModelOracle {
    model: CostModel,
    target: String,
    opts: InferOptions,
    fallback: AnalyticOracle,
    cache: RefCell<Option<(Key, Option<Facts>)>>,
}

/// The bindings and facts of one graph state, shared while it is unchanged.
type Facts = Rc<(Bindings, GraphFacts)>;

impl std::fmt::Debug for CostModelOracle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CostModelOracle").field("target", &self.target).field("opts", &self.opts).finish()
    }
}

impl CostModelOracle {
    /// The oracle for a bundled device (`v100`, `t4`, …); `opts` binds
    /// symbolic dims before the defaults apply.
    pub fn for_target(name: &str, opts: &InferOptions) -> Result<CostModelOracle, String> {
        let db = DeviceDb::bundled().map_err(|e| e.to_string())?;
        let dev = db.get(name).map_err(|e| e.to_string())?;
        let model = CostModel::new(dev, None).map_err(|e| e.to_string())?;
        let fallback = AnalyticOracle::for_target(name).unwrap_or_default();
        Ok(CostModelOracle { model, target: name.to_string(), opts: opts.clone(), fallback, cache: RefCell::new(None) })
    }

    pub fn target(&self) -> &str {
        &self.target
    }

    /// Forget the cached facts (after an in-place shape change).
    pub fn invalidate(&self) {
        self.cache.borrow_mut().take();
    }

    /// The bindings used for `g`: user's first, then the defaults.
    pub fn bindings_for(&self, g: &Graph) -> Bindings {
        let mut b = Bindings::new();
        for (k, v) in &self.opts.dims {
            b.set(k, *v);
        }
        let leading = g.inputs().iter().find_map(|&v| {
            let d = g.ty(v).shape.as_ref()?.first()?.clone();
            (d.as_const().is_none()).then(|| d.symbols().into_iter().next()).flatten()
        });
        if let Some(s) = &leading {
            if b.get(s).is_none() {
                b.set(s, self.opts.batch.unwrap_or(DEFAULT_BATCH));
            }
        }
        for v in g.live_values() {
            for d in g.ty(v).shape.iter().flatten() {
                if d.as_const().is_some() {
                    continue;
                }
                for s in d.symbols() {
                    if b.get(&s).is_none() {
                        b.set(&s, DEFAULT_DIM);
                    }
                }
            }
        }
        b
    }

    fn facts(&self, g: &Graph) -> Option<Rc<(Bindings, GraphFacts)>> {
        let key = (g as *const Graph as usize, g.value_capacity(), g.node_count());
        if let Some((k, f)) = self.cache.borrow().as_ref() {
            if *k == key {
                return f.clone();
            }
        }
        let b = self.bindings_for(g);
        let f = GraphFacts::new(g, &b).ok().map(|f| Rc::new((b, f)));
        *self.cache.borrow_mut() = Some((key, f.clone()));
        f
    }

    fn precision(p: DType) -> Option<Precision> {
        Precision::from_dtype(p)
    }
}

impl CostOracle for CostModelOracle {
    fn op_time(&self, g: &Graph, n: NodeId, p: DType) -> f64 {
        let Some(f) = self.facts(g) else { return self.fallback.op_time(g, n, p) };
        let Some(q) = Self::precision(p) else { return f64::INFINITY };
        self.model.op_cost(&f.1, n, q).map_or(f64::INFINITY, |c| c.total())
    }

    fn cast_time(&self, from: DType, to: DType, elements: u64) -> f64 {
        match (Self::precision(from), Self::precision(to)) {
            (Some(a), Some(b)) if a != b => self.model.cast_cost(a, b, elements as f64),
            (Some(_), Some(_)) if from == to => 0.0,
            _ => self.fallback.cast_time(from, to, elements),
        }
    }

    fn supports(&self, p: DType) -> bool {
        Self::precision(p).is_some_and(|q| self.model.device().supports(q))
    }

    fn tensor_core_eligible(&self, g: &Graph, n: NodeId, p: DType) -> bool {
        let Some(f) = self.facts(g) else { return self.fallback.tensor_core_eligible(g, n, p) };
        match (Self::precision(p), f.1.node(n)) {
            (Some(q), Ok(nf)) => self.model.tensor_core_eligible(nf, q),
            _ => false,
        }
    }

    fn elements(&self, g: &Graph, v: qsync_ir::ValueId) -> u64 {
        match self.facts(g) {
            Some(f) => f.1.elements(v).map_or_else(|| self.fallback.elements(g, v), |e| e as u64),
            None => self.fallback.elements(g, v),
        }
    }

    /// Device memory minus the memory model's training total
    /// ([`qsync_cost::estimate_memory`], Adam, the device's default usable
    /// fraction) for `g` with every node at the precision it computes in.
    fn memory_headroom(&self, g: &Graph) -> Option<f64> {
        let f = self.facts(g)?;
        let mut plan = Plan::new();
        for &n in f.1.order() {
            if let Some(q) = Self::precision(super::oracle::compute_precision(g, n)) {
                plan.set(n, q);
            }
        }
        let m = estimate_memory(g, &f.1, &plan.resolve(g), self.model.device(), Optimizer::default(), None).ok()?;
        Some(m.capacity - m.total)
    }

    /// Forward and backward from the op costs' phases; a Cast costs its
    /// forward conversion and, when its input carries a gradient, the
    /// gradient's conversion back; refreshed copies their rewrite.
    fn predict(&self, g: &Graph) -> Prediction {
        let Some(f) = self.facts(g) else { return self.fallback.predict(g) };
        let mut pr = Prediction::default();
        for n in g.node_ids() {
            let node = g.node(n);
            if node.op == Op::Cast {
                let (Some(i), Some(o)) = (node.input(0), node.outputs().first().copied()) else { continue };
                let (Some(a), Some(b)) = (g.ty(i).dtype, g.ty(o).dtype) else { continue };
                let e = f.1.elements(i).unwrap_or(0.0) as u64;
                let t = self.cast_time(a, b, e);
                pr.forward += t;
                if f.1.requires_grad(i) {
                    pr.backward += self.cast_time(b, a, e);
                }
                continue;
            }
            let p = super::oracle::compute_precision(g, n);
            let q = Self::precision(p).filter(|q| self.model.device().supports(*q)).unwrap_or(Precision::Fp32);
            if let Ok(c) = self.model.op_cost(&f.1, n, q) {
                pr.forward += c.fwd;
                pr.backward += c.bwd_input + c.bwd_weight;
            }
        }
        pr.refresh = super::oracle::refresh_total(self, g);
        pr
    }
}
