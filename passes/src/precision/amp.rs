//! `amp`: TensorFlow's auto-mixed-precision painting (the baseline Campo beats).
//!
//! **Reads:** op types (through a `tf-amp` [`Policy`]), float data edges,
//! the target's supported precisions.
//! **Guarantees:** every lowerable node gets a precision: the low one
//! (default f16) or f32, then overrides, then materialization (see
//! [`super::materialize`]). Painting, over float data edges only:
//! 1. allow ops go low;
//! 2. clear ops from which an infer or deny op is reachable downstream
//!    through clear ops are marked "upstream of deny/infer";
//! 3. deny spreads forward through infer ops and those clear ops;
//! 4. infer / clear ops (not deny) lying on a path between two allow ops go low;
//! 5. low spreads through clear ops (not deny), upstream and downstream;
//! 6. nodes lacking a low-precision kernel ([`super::lowerable`], or a target
//!    without the precision) stay f32.
//!
//! Unlisted ops stay f32 and stop every propagation. One Cast per output
//! port is shared by its consumers (materialization's cast cache).
//! **Requires:** `infer-shapes`.

use std::collections::{HashMap, HashSet};

use qsync_ir::{DType, Graph, Model, NodeId};

use super::policy::{Category, Policy, PolicyKind};
use super::{float_preds, float_succs, lowerable, CostOracle, PlanOptions};
use crate::manager::{Pass, PassContext, PassError, PassOutcome};

/// Steps 2–3 of the painting: the deny ops, spread forward through infer
/// ops and through clear ops that lead to an infer or deny op.
pub(crate) fn deny_set(g: &Graph, nodes: &[NodeId], cats: &HashMap<NodeId, Category>) -> HashSet<NodeId> {
    let is = |n: &NodeId, c: Category| cats.get(n) == Some(&c);
    let mut upstream: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<NodeId> =
        nodes.iter().copied().filter(|n| is(n, Category::Infer) || is(n, Category::Deny)).collect();
    while let Some(x) = stack.pop() {
        for p in float_preds(g, x) {
            if is(&p, Category::Clear) && upstream.insert(p) {
                stack.push(p);
            }
        }
    }
    let mut deny: HashSet<NodeId> = nodes.iter().copied().filter(|n| is(n, Category::Deny)).collect();
    let mut stack: Vec<NodeId> = deny.iter().copied().collect();
    while let Some(x) = stack.pop() {
        for s in float_succs(g, x) {
            if (is(&s, Category::Infer) || (is(&s, Category::Clear) && upstream.contains(&s))) && deny.insert(s) {
                stack.push(s);
            }
        }
    }
    deny
}

/// Step 4: the infer / clear ops (not denied) on a float path between two
/// ops of `low`.
pub(crate) fn between_set(
    g: &Graph,
    low: &HashSet<NodeId>,
    deny: &HashSet<NodeId>,
    cats: &HashMap<NodeId, Category>,
) -> HashSet<NodeId> {
    let is = |n: &NodeId, c: Category| cats.get(n) == Some(&c);
    let passable = |n: &NodeId| (is(n, Category::Infer) || is(n, Category::Clear)) && !deny.contains(n);
    let mut downstream: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<NodeId> = low.iter().copied().collect();
    while let Some(x) = stack.pop() {
        for s in float_succs(g, x) {
            if passable(&s) && downstream.insert(s) {
                stack.push(s);
            }
        }
    }
    let mut between: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<NodeId> = low.iter().copied().collect();
    while let Some(x) = stack.pop() {
        for p in float_preds(g, x) {
            if downstream.contains(&p) && between.insert(p) {
                stack.push(p);
            }
        }
    }
    between
}

/// Paint `g` under a `tf-amp` policy; returns the nodes set low.
pub fn plan_amp(g: &mut Graph, policy: &Policy, low: DType, oracle: &dyn CostOracle) -> Vec<NodeId> {
    let nodes = g.node_ids();
    let cat = |g: &Graph, n: NodeId| {
        if lowerable(g, n) {
            policy.category(g.node(n).op.op_type())
        } else {
            Category::Unlisted
        }
    };
    let cats: HashMap<NodeId, Category> = nodes.iter().map(|&n| (n, cat(g, n))).collect();
    let is = |n: &NodeId, c: Category| cats.get(n) == Some(&c);

    // 1.
    let mut allow: HashSet<NodeId> = nodes.iter().copied().filter(|n| is(n, Category::Allow)).collect();
    // 2. and 3.
    let deny = deny_set(g, &nodes, &cats);
    // 4.
    let between = between_set(g, &allow, &deny, &cats);
    allow.extend(between);
    // 5.
    let mut stack: Vec<NodeId> = allow.iter().copied().collect();
    while let Some(x) = stack.pop() {
        for y in float_preds(g, x).into_iter().chain(float_succs(g, x)) {
            if is(&y, Category::Clear) && !deny.contains(&y) && allow.insert(y) {
                stack.push(y);
            }
        }
    }
    // 6. and write the plan.
    let supported = oracle.supports(low);
    let mut lowered = Vec::new();
    for n in nodes {
        if !lowerable(g, n) {
            continue;
        }
        let p = if supported && allow.contains(&n) { low } else { DType::F32 };
        if p == low {
            lowered.push(n);
        }
        g.node_mut(n).precision = Some(p);
    }
    lowered
}

/// The `amp` pass.
#[derive(Debug, Clone)]
pub struct Amp {
    pub policy: Policy,
    pub options: PlanOptions,
}

impl Amp {
    pub fn new(policy: Policy, options: PlanOptions) -> Result<Amp, PassError> {
        if policy.kind != PolicyKind::TfAmp {
            return Err(PassError::FailedGraph {
                pass: "amp".into(),
                message: format!("policy `{}` is not a tf-amp policy", policy.name),
            });
        }
        Ok(Amp { policy, options })
    }
}

impl Pass for Amp {
    fn name(&self) -> &'static str {
        "amp"
    }

    fn run(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        let oracle = super::oracle_for(cx, self.name())?;
        super::require_support(&*oracle, self.options.dtype, self.name(), cx.target.as_deref())?;
        plan_amp(&mut model.graph, &self.policy, self.options.dtype, &*oracle);
        super::apply_overrides(&mut model.graph, &self.options.overrides, &*oracle, self.name())?;
        super::finish(model, self.options.mode, cx, self.name())
    }
}
