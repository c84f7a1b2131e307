//! Extraction: the cheapest equal graph, costed DAG-aware.
//!
//! Own costs come from the [`CostOracle`]: a Cast costs
//! `cast_time(from, to, elements)`, a region op `op_time(node, dtype)`
//! shared equally among its outputs (a Split is one kernel), a leaf or a use
//! nothing, a stored constant its bytes × [`MEMORY_COST_PER_BYTE`], a
//! refreshed copy that plus the optimizer step's time to rewrite it
//! ([`CostOracle::refresh_time`]).
//! The cost of a selection (one e-node per e-class reached from the roots)
//! is the sum of own costs over the *distinct* e-classes it reaches: a cast
//! shared by several consumers is counted once.
//!
//! Candidates: the bottom-up tree-cost choice (egg's extractor with the same
//! own costs), refined by [`dag_refine`], which re-picks each class's node by
//! the DAG cost it adds given what the rest of the selection already pays
//! for. The pass keeps the input whenever no candidate is strictly cheaper.
//! On small e-graphs the ILP ([`ilp_cost`], `good_lp` + the pure-Rust
//! `microlp` solver) computes the optimum, which tests use to check the
//! extractor.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use egg::{CostFunction, Extractor, Id, Language};
use qsync_ir::{DType, Graph, NodeId};

use super::language::{dtype_of, CastGraph, CastLang, Key};
use crate::precision::CostOracle;

/// Memory cost of keeping one byte of a stored constant, in seconds-equivalent.
pub const MEMORY_COST_PER_BYTE: f64 = 1e-13;

/// Added to every cast so that, at equal time, fewer casts win.
pub const CAST_EPSILON: f64 = 1e-12;

/// Own costs of e-nodes.
pub struct Costs<'a> {
    pub g: &'a Graph,
    pub eg: &'a CastGraph,
    pub oracle: &'a dyn CostOracle,
    cache: HashMap<(u32, DType), f64>,
    /// Multiplier on the time of a cast whose input carries a gradient (2 in
    /// training: the forward and the gradient cast; other casts count once).
    weight: f64,
}

impl std::fmt::Debug for Costs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Costs")
    }
}

impl<'a> Costs<'a> {
    pub fn new(g: &'a Graph, eg: &'a CastGraph, oracle: &'a dyn CostOracle) -> Self {
        Costs { g, eg, oracle, cache: HashMap::new(), weight: 1.0 }
    }

    /// Scale cast times by `w`.
    pub fn cast_weight(mut self, w: f64) -> Self {
        self.weight = w;
        self
    }

    /// The node's own cost, excluding its children.
    pub fn own(&mut self, n: &CastLang) -> f64 {
        match n.key() {
            Key::Leaf { .. } | Key::Use { .. } => 0.0,
            Key::Stored { dt, elems, refreshed: false, .. } => dt.storage_bytes(elems) as f64 * MEMORY_COST_PER_BYTE,
            // Stored too, and rewritten by every optimizer step.
            Key::Stored { dt, elems, refreshed: true, .. } => {
                dt.storage_bytes(elems) as f64 * MEMORY_COST_PER_BYTE + self.oracle.refresh_time(dt, elems)
            }
            Key::Cast { to } => {
                let c = n.kids()[0];
                let from = dtype_of(self.eg, c).unwrap_or(DType::F32);
                // The backward cast exists only where a gradient flows.
                let w = if self.eg[c].data.grad { self.weight } else { 1.0 };
                w * self.oracle.cast_time(from, to, self.eg[c].data.elems) + CAST_EPSILON
            }
            Key::Node { node, dt, .. } => {
                // A multi-output op (Split) is one kernel: each output
                // class pays its share.
                let (g, oracle) = (self.g, self.oracle);
                let n = NodeId::new(node as usize);
                let outs = g.node(n).outputs().len().max(1) as f64;
                *self.cache.entry((node, dt)).or_insert_with(|| oracle.op_time(g, n, dt) / outs)
            }
        }
    }
}

impl CostFunction<CastLang> for Costs<'_> {
    type Cost = f64;
    fn cost<C>(&mut self, enode: &CastLang, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        let own = self.own(enode);
        enode.fold(own, |acc, c| acc + costs(c))
    }
}

/// A selection: the chosen e-node of each canonical e-class.
pub type Choice = BTreeMap<Id, CastLang>;

/// The DAG cost of `choice` from `roots` (each reached class once), or
/// `None` when the selection is cyclic or incomplete.
pub fn dag_cost(costs: &mut Costs<'_>, choice: &Choice, roots: &[Id]) -> Option<f64> {
    let eg = costs.eg;
    // 0 = unvisited, 1 = in progress, 2 = done; by class id.
    let size = eg.classes().map(|c| usize::from(c.id) + 1).max().unwrap_or(0);
    let mut state = vec![0u8; size];
    let mut total = 0.0;
    let mut stack: Vec<(Id, bool)> = roots.iter().map(|&r| (eg.find(r), false)).collect();
    while let Some((c, done)) = stack.pop() {
        let i = usize::from(c);
        if done {
            state[i] = 2;
            continue;
        }
        match state[i] {
            2 => continue,
            1 => return None,
            _ => {}
        }
        let n = choice.get(&c)?;
        state[i] = 1;
        total += costs.own(n);
        stack.push((c, true));
        for &k in n.kids() {
            let k = eg.find(k);
            match state[usize::from(k)] {
                1 => return None,
                2 => {}
                _ => stack.push((k, false)),
            }
        }
    }
    Some(total)
}

/// The tree-cost selection (egg's bottom-up extractor) over every class.
pub fn tree_choice(costs: Costs<'_>) -> Choice {
    let eg = costs.eg;
    let ex = Extractor::new(eg, costs);
    eg.classes().map(|c| (c.id, ex.find_best_node(c.id).clone())).collect()
}

/// Greedy DAG refinement: for each reached class, try each alternative
/// e-node and keep it when the whole selection's DAG cost drops. Stops after
/// `rounds` sweeps or when nothing improves.
///
/// Each trial is priced incrementally ([`Refiner`]): only the classes that
/// the swap makes reached or unreached are touched, so a sweep costs about
/// the size of the reached region rather than its square (the whole-graph
/// re-costing per trial made the pass quadratic: a minute on a 10k-node
/// transformer). The decisions are those of re-costing the whole selection
/// per trial: a swap is kept iff it lowers the DAG cost by more than 1e-15,
/// and one that closes a cycle is rejected. The returned cost is a fresh
/// [`dag_cost`] of the result.
pub fn dag_refine(costs: &mut Costs<'_>, mut choice: Choice, roots: &[Id], rounds: usize) -> (Choice, f64) {
    let eg = costs.eg;
    let Some(mut rf) = Refiner::new(costs, &choice, roots) else {
        // A cyclic or incomplete start: only whole-selection costing can
        // tell which swaps repair it.
        return dag_refine_full(costs, choice, roots, rounds);
    };
    for _ in 0..rounds {
        let mut improved = false;
        let classes: Vec<Id> = reached(eg, &choice, roots).into_iter().collect();
        for c in classes {
            for alt in eg[c].nodes.iter() {
                // A class an earlier swap left unreached adds nothing
                // whatever it picks: whole-selection costing rejects every
                // alternative there too.
                if !rf.is_reached(c) {
                    break;
                }
                let alt = alt.clone().map_children(|k| eg.find(k));
                let Some(old) = choice.get(&c).cloned() else { break };
                if old == alt || alt.kids().iter().any(|&k| !choice.contains_key(&k)) {
                    continue;
                }
                if rf.reaches(eg, &choice, alt.kids(), c) {
                    continue; // the swap would close a cycle through `c`
                }
                let delta = rf.swap(costs, &mut choice, c, alt);
                if delta < -1e-15 {
                    improved = true;
                } else {
                    let back = old;
                    rf.swap(costs, &mut choice, c, back);
                }
            }
        }
        if !improved {
            break;
        }
    }
    let cost = dag_cost(costs, &choice, roots).unwrap_or(f64::INFINITY);
    (choice, cost)
}

/// [`dag_refine`] re-costing the whole selection per trial: for starts that
/// are cyclic or incomplete, where the incremental bookkeeping has no
/// consistent state to begin from.
fn dag_refine_full(costs: &mut Costs<'_>, mut choice: Choice, roots: &[Id], rounds: usize) -> (Choice, f64) {
    let eg = costs.eg;
    let mut best = dag_cost(costs, &choice, roots).unwrap_or(f64::INFINITY);
    for _ in 0..rounds {
        let mut improved = false;
        let classes: Vec<Id> = reached(eg, &choice, roots).into_iter().collect();
        for c in classes {
            for alt in eg[c].nodes.iter() {
                let alt = alt.clone().map_children(|k| eg.find(k));
                if choice.get(&c) == Some(&alt) {
                    continue;
                }
                let old = choice.insert(c, alt);
                match dag_cost(costs, &choice, roots) {
                    Some(v) if v < best - 1e-15 => {
                        best = v;
                        improved = true;
                    }
                    _ => {
                        if let Some(o) = old {
                            choice.insert(c, o);
                        }
                    }
                }
            }
        }
        if !improved {
            break;
        }
    }
    (choice, best)
}

/// Reference counts of an acyclic, complete selection: how many chosen
/// e-nodes (and roots) read each class. A class is reached iff its count is
/// positive, so the DAG cost is the sum of the reached classes' own costs,
/// and a swap at one class changes it by the own costs of the classes whose
/// counts cross zero.
struct Refiner {
    count: Vec<u32>,
    /// Visit marks for [`Refiner::reaches`], by generation (no clearing).
    mark: Vec<u32>,
    generation: u32,
    stack: Vec<Id>,
}

impl Refiner {
    /// Counts for `choice`; `None` when it is cyclic or incomplete.
    fn new(costs: &mut Costs<'_>, choice: &Choice, roots: &[Id]) -> Option<Refiner> {
        dag_cost(costs, choice, roots)?;
        let eg = costs.eg;
        let size = eg.classes().map(|c| usize::from(c.id) + 1).max().unwrap_or(0);
        let mut rf = Refiner { count: vec![0; size], mark: vec![0; size], generation: 0, stack: Vec::new() };
        for &r in roots {
            rf.enter(eg, choice, eg.find(r), None);
        }
        Some(rf)
    }

    fn is_reached(&self, c: Id) -> bool {
        self.count.get(usize::from(c)).is_some_and(|&n| n > 0)
    }

    /// Add one reference to `c`; classes that become reached add their own
    /// cost to `delta` and reference their children.
    fn enter(&mut self, eg: &CastGraph, choice: &Choice, c: Id, mut delta: Option<(&mut Costs<'_>, &mut f64)>) {
        self.stack.push(c);
        while let Some(c) = self.stack.pop() {
            let i = usize::from(c);
            self.count[i] += 1;
            if self.count[i] == 1 {
                if let Some(n) = choice.get(&c) {
                    if let Some((costs, d)) = delta.as_mut() {
                        **d += costs.own(n);
                    }
                    self.stack.extend(n.kids().iter().map(|&k| eg.find(k)));
                }
            }
        }
    }

    /// Drop one reference to `c`; classes no longer reached subtract their
    /// own cost and release their children.
    fn leave(&mut self, eg: &CastGraph, choice: &Choice, c: Id, costs: &mut Costs<'_>, delta: &mut f64) {
        self.stack.push(c);
        while let Some(c) = self.stack.pop() {
            let i = usize::from(c);
            self.count[i] -= 1;
            if self.count[i] == 0 {
                if let Some(n) = choice.get(&c) {
                    *delta -= costs.own(n);
                    self.stack.extend(n.kids().iter().map(|&k| eg.find(k)));
                }
            }
        }
    }

    /// Whether `target` is reachable from `from` under `choice` (a swap at
    /// `target` to a node with children `from` would then close a cycle).
    fn reaches(&mut self, eg: &CastGraph, choice: &Choice, from: &[Id], target: Id) -> bool {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.mark.iter_mut().for_each(|m| *m = 0);
            self.generation = 1;
        }
        let mut stack: Vec<Id> = from.to_vec();
        while let Some(c) = stack.pop() {
            if c == target {
                return true;
            }
            let i = usize::from(c);
            if self.mark[i] == self.generation {
                continue;
            }
            self.mark[i] = self.generation;
            if let Some(n) = choice.get(&c) {
                stack.extend(n.kids().iter().map(|&k| eg.find(k)));
            }
        }
        false
    }

    /// Make `node` class `c`'s choice (children canonical); returns the
    /// change of the DAG cost. The new children are entered before the old
    /// ones are released, so a class both read is never counted out and in.
    fn swap(&mut self, costs: &mut Costs<'_>, choice: &mut Choice, c: Id, node: CastLang) -> f64 {
        let eg = costs.eg;
        let mut delta = costs.own(&node);
        let old = choice.insert(c, node.clone());
        if let Some(o) = &old {
            delta -= costs.own(o);
        }
        for &k in node.kids() {
            self.enter(eg, choice, k, Some((&mut *costs, &mut delta)));
        }
        if let Some(o) = old {
            for &k in o.kids() {
                self.leave(eg, choice, eg.find(k), costs, &mut delta);
            }
        }
        delta
    }
}

/// Classes reached from `roots` under `choice`, sorted.
pub fn reached(eg: &CastGraph, choice: &Choice, roots: &[Id]) -> BTreeSet<Id> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<Id> = roots.iter().map(|&r| eg.find(r)).collect();
    while let Some(c) = stack.pop() {
        if !seen.insert(c) {
            continue;
        }
        if let Some(n) = choice.get(&c) {
            stack.extend(n.kids().iter().map(|&k| eg.find(k)));
        }
    }
    seen
}

/// The optimal DAG cost by ILP (pure-Rust `microlp`): a binary per e-node,
/// a binary per class, each root's class chosen, a chosen class picks one of
/// its nodes, a chosen node's children are chosen, and a topological order
/// variable per class forbids cycles. `None` when the solver fails.
pub fn ilp_cost(costs: &mut Costs<'_>, roots: &[Id]) -> Option<f64> {
    use good_lp::{constraint, microlp, variable, Expression, ProblemVariables, Solution, SolverModel};
    let eg = costs.eg;
    let classes: Vec<Id> = eg.classes().map(|c| c.id).collect();
    let big = classes.len() as f64 + 1.0;
    let mut vars = ProblemVariables::new();
    let cls: HashMap<Id, _> = classes.iter().map(|&c| (c, vars.add(variable().binary()))).collect();
    let ord: HashMap<Id, _> = classes.iter().map(|&c| (c, vars.add(variable().min(0.0).max(big)))).collect();
    // Costs are seconds (casts ~1e-6, the tie-break epsilon 1e-12): the
    // solver sees nanoseconds so its tolerances do not swallow them.
    const SCALE: f64 = 1e9;
    let mut nodes = Vec::new();
    for &c in &classes {
        for n in eg[c].nodes.iter() {
            let cost = costs.own(n) * SCALE;
            nodes.push((c, n.clone(), cost, vars.add(variable().binary())));
        }
    }
    let objective: Expression = nodes.iter().map(|(_, _, cost, v)| *cost * *v).sum();
    let mut model = vars.minimise(objective).using(microlp);
    for &r in roots {
        model = model.with(constraint!(cls[&eg.find(r)] == 1.0));
    }
    for &c in &classes {
        let picks: Expression = nodes.iter().filter(|(nc, ..)| *nc == c).map(|(_, _, _, v)| *v).sum();
        model = model.with(constraint!(picks == cls[&c]));
    }
    for (c, n, _, v) in &nodes {
        for &k in n.kids() {
            let k = eg.find(k);
            model = model.with(constraint!(cls[&k] >= *v));
            model = model.with(constraint!(ord[c] - ord[&k] + big * (1.0 - *v) >= 1.0));
        }
    }
    let sol = model.solve().ok()?;
    Some(nodes.iter().map(|(_, _, cost, v)| cost / SCALE * sol.value(*v).round()).sum())
}
