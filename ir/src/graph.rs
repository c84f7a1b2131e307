//! The graph: nodes on a petgraph `StableDiGraph` (edges run from producer to
//! consumer and carry the consumer's input slot), and an arena of typed values.
//!
//! Every value has exactly one definition — a graph input, an initializer, or
//! an output slot of a node — recorded in [`ValueDef`]. Node inputs are the
//! source of truth for data flow; the petgraph edges mirror them and are kept
//! in sync by the mutation methods here, which is why `Node`'s inputs and
//! outputs are only reachable through accessors.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt;

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use crate::{Attr, DType, Op, Tensor, TensorType};

/// Index of a node. Stable across removals of other nodes.
pub type NodeId = NodeIndex<u32>;

/// Index of a value in the graph's arena.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ValueId(u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// Where a value comes from.
#[derive(Clone, PartialEq, Debug)]
pub enum ValueDef {
    /// A graph input (not an initializer).
    Input,
    /// An initializer: a constant stored with the model (weights, constants).
    Init(Tensor),
    /// Output `slot` of a node.
    Node(NodeId, usize),
    /// Referenced but never defined (a dangling name in the source).
    Undefined,
    /// Its definition was removed; any remaining use is an error.
    Removed,
}

/// A value: a name (unique within the graph; the verifier checks), a type,
/// and its definition.
#[derive(Clone, PartialEq, Debug)]
pub struct ValueData {
    pub name: String,
    pub ty: TensorType,
    pub def: ValueDef,
}

impl ValueData {
    pub fn init(&self) -> Option<&Tensor> {
        match &self.def {
            ValueDef::Init(t) => Some(t),
            _ => None,
        }
    }
}

/// Use slots at and above this number are a node's captures: capture `i`
/// is read through slot `CAPTURE_SLOT + i` in [`Graph::users`],
/// [`Node::input`] and [`Graph::set_input`] (and weighs its petgraph edge).
pub const CAPTURE_SLOT: usize = 1 << 24;

/// A value of the enclosing graph that a node's subgraphs (If branches,
/// Loop and Scan bodies, at any depth) read by name without passing it as
/// an input. It is a use like any input: it orders the schedule, keeps its
/// producer alive and follows rewrites ([`Graph::replace_all_uses`]).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Capture {
    /// The name the subgraph bodies use. When a rewrite gives the node
    /// another `value` (or renames it), the exporter renames the references
    /// inside the bodies to the value's current name.
    pub name: String,
    pub value: ValueId,
}

/// Where a node came from in the source framework: the PyTorch module
/// whose `forward` produced it and the call inside that forward, as the
/// exporters record them (the dynamo exporter's `name_scopes`, the legacy
/// exporter's `/a/b/Op_N` names, TorchScript attribute paths). It is what
/// lets a plan be applied back to the module it was exported from.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Scope {
    /// Dotted module path from the exported root (`""` for the root itself),
    /// e.g. `layer1.0.conv1`.
    pub module: String,
    /// The call within that module's forward (`conv2d_1`, `MatMul_1`,
    /// `scaled_dot_product_attention`): nodes with the same call came from
    /// one framework operation.
    pub call: String,
}

/// An operator application.
#[derive(Clone, Debug)]
pub struct Node {
    /// The node's name (the ONNX node name; unique names are the importer's job).
    pub name: String,
    pub op: Op,
    /// Attributes by name; a `BTreeMap` so that printing and export are ordered.
    pub attrs: BTreeMap<String, Attr>,
    /// The precision the node computes in, when a pass has assigned one.
    pub precision: Option<DType>,
    inputs: Vec<Option<ValueId>>,
    outputs: Vec<ValueId>,
    captures: Vec<Capture>,
    /// Insertion sequence number: the tie-break that makes orders deterministic.
    seq: u64,
    /// Provenance, when the frontend knows it. Not semantics: equality and
    /// the text format ignore it, and passes' new nodes have none.
    pub scope: Option<Scope>,
}

impl PartialEq for Node {
    fn eq(&self, o: &Node) -> bool {
        self.name == o.name
            && self.op == o.op
            && self.attrs == o.attrs
            && self.precision == o.precision
            && self.inputs == o.inputs
            && self.outputs == o.outputs
            && self.captures == o.captures
            && self.seq == o.seq
    }
}

impl Node {
    /// Inputs in slot order; `None` is an omitted optional input.
    pub fn inputs(&self) -> &[Option<ValueId>] {
        &self.inputs
    }

    /// The value read at `slot`: an input, or a capture at
    /// [`CAPTURE_SLOT`]` + i`.
    pub fn input(&self, slot: usize) -> Option<ValueId> {
        match slot.checked_sub(CAPTURE_SLOT) {
            Some(i) => self.captures.get(i).map(|c| c.value),
            None => self.inputs.get(slot).copied().flatten(),
        }
    }

    /// The outer values this node's subgraphs read, in a fixed order.
    pub fn captures(&self) -> &[Capture] {
        &self.captures
    }

    /// Every value the node reads with its use slot: the inputs, then the
    /// captures (at [`CAPTURE_SLOT`]` + i`).
    pub fn reads(&self) -> impl Iterator<Item = (usize, ValueId)> + '_ {
        let inputs = self.inputs.iter().enumerate().filter_map(|(s, v)| v.map(|v| (s, v)));
        inputs.chain(self.captures.iter().enumerate().map(|(i, c)| (CAPTURE_SLOT + i, c.value)))
    }

    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }

    pub fn attr(&self, name: &str) -> Option<&Attr> {
        self.attrs.get(name)
    }

    pub fn attr_int(&self, name: &str) -> Option<i64> {
        self.attrs.get(name).and_then(Attr::as_int)
    }

    pub fn attr_ints(&self, name: &str) -> Option<&[i64]> {
        self.attrs.get(name).and_then(Attr::as_ints)
    }

    pub fn attr_float(&self, name: &str) -> Option<f32> {
        self.attrs.get(name).and_then(Attr::as_float)
    }

    pub fn attr_str(&self, name: &str) -> Option<&str> {
        self.attrs.get(name).and_then(Attr::as_str)
    }
}

/// Everything needed to add a node; output values are created by
/// [`Graph::add_node`] with the given names and types.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    pub op: Op,
    pub attrs: BTreeMap<String, Attr>,
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<(String, TensorType)>,
    pub precision: Option<DType>,
    /// Values of the enclosing graph read by the node's subgraphs.
    pub captures: Vec<Capture>,
}

impl NodeSpec {
    pub fn new(name: impl Into<String>, op: Op) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            op,
            attrs: BTreeMap::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            precision: None,
            captures: Vec::new(),
        }
    }

    pub fn input(mut self, v: ValueId) -> Self {
        self.inputs.push(Some(v));
        self
    }

    pub fn output(mut self, name: impl Into<String>, ty: TensorType) -> Self {
        self.outputs.push((name.into(), ty));
        self
    }

    pub fn attr(mut self, name: &str, a: Attr) -> Self {
        self.attrs.insert(name.to_string(), a);
        self
    }
}

/// A dataflow graph.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub name: String,
    dag: StableDiGraph<Node, u32>,
    values: Vec<ValueData>,
    names: HashMap<String, ValueId>,
    inputs: Vec<ValueId>,
    inits: Vec<ValueId>,
    outputs: Vec<ValueId>,
    next_seq: u64,
    /// Undefined values already used as inputs (their edges come at definition).
    forward_used: std::collections::HashSet<ValueId>,
    /// Refreshed copies: low-precision initializer → its FP32 master (see
    /// [`Graph::add_refreshed_copy`]).
    copies: BTreeMap<ValueId, ValueId>,
    /// Every reader of each value as `(node, input slot)`, by
    /// `ValueId::index`, kept in step with the nodes' inputs. The edges of
    /// `dag` only know the readers of node outputs; without this, the
    /// readers of an initializer or input took a scan of every node, and
    /// passes asking for them per weight were quadratic in the graph.
    uses: Vec<Vec<(NodeId, u32)>>,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph { name: name.into(), ..Graph::default() }
    }

    // ---- values -------------------------------------------------------------

    fn push_value(&mut self, name: String, ty: TensorType, def: ValueDef) -> ValueId {
        let id = ValueId(u32::try_from(self.values.len()).unwrap_or(u32::MAX));
        self.names.entry(name.clone()).or_insert(id);
        self.values.push(ValueData { name, ty, def });
        id
    }

    /// Add a graph input.
    pub fn add_input(&mut self, name: impl Into<String>, ty: TensorType) -> ValueId {
        let id = self.push_value(name.into(), ty, ValueDef::Input);
        self.inputs.push(id);
        id
    }

    /// Add an initializer; its type is the tensor's.
    pub fn add_init(&mut self, name: impl Into<String>, t: Tensor) -> ValueId {
        let ty = TensorType::new(t.dtype, t.dims.iter().map(|&d| d.into()).collect());
        let id = self.push_value(name.into(), ty, ValueDef::Init(t));
        self.inits.push(id);
        id
    }

    /// Mark an existing value (normally an initializer) as a graph input too,
    /// as older ONNX models do to give inputs default values.
    pub fn push_input(&mut self, v: ValueId) {
        self.inputs.push(v);
    }

    /// Record an existing value (given its tensor by [`Graph::set_init`]) as
    /// an initializer; used when the definition follows a forward reference.
    pub fn push_init_existing(&mut self, v: ValueId) {
        if !self.inits.contains(&v) {
            self.inits.push(v);
        }
    }

    /// Turn an undefined value into a graph input.
    pub fn define_input(&mut self, v: ValueId) {
        self.values[v.index()].def = ValueDef::Input;
        self.inputs.push(v);
    }

    /// A value named `name` that is used but has no definition yet; a later
    /// definition under the same name does not replace it (the verifier
    /// reports both). The parser and importers use this for forward references.
    pub fn add_undefined(&mut self, name: impl Into<String>) -> ValueId {
        self.push_value(name.into(), TensorType::unknown(), ValueDef::Undefined)
    }

    /// Give an undefined value its definition as output `slot` of `node`.
    fn define(&mut self, v: ValueId, def: ValueDef) {
        self.values[v.index()].def = def;
    }

    pub fn value(&self, v: ValueId) -> &ValueData {
        &self.values[v.index()]
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.values[v.index()].ty
    }

    pub fn set_ty(&mut self, v: ValueId, ty: TensorType) {
        self.values[v.index()].ty = ty;
    }

    pub fn value_name(&self, v: ValueId) -> &str {
        &self.values[v.index()].name
    }

    /// The value first defined (or referenced) under `name`.
    pub fn value_by_name(&self, name: &str) -> Option<ValueId> {
        self.names.get(name).copied()
    }

    /// Replace an initializer's tensor (its type follows the tensor).
    pub fn set_init(&mut self, v: ValueId, t: Tensor) {
        let ty = TensorType::new(t.dtype, t.dims.iter().map(|&d| d.into()).collect());
        let data = &mut self.values[v.index()];
        data.ty = ty;
        data.def = ValueDef::Init(t);
    }

    pub fn rename_value(&mut self, v: ValueId, name: impl Into<String>) {
        let name = name.into();
        let old = std::mem::replace(&mut self.values[v.index()].name, name.clone());
        if self.names.get(&old) == Some(&v) {
            self.names.remove(&old);
        }
        self.names.entry(name).or_insert(v);
    }

    /// A name not used by any value: `base`, else `base.1`, `base.2`, …
    pub fn fresh_value_name(&self, base: &str) -> String {
        if !self.names.contains_key(base) {
            return base.to_string();
        }
        (1..).map(|i| format!("{base}.{i}")).find(|n| !self.names.contains_key(n)).unwrap_or_default()
    }

    /// Number of value slots, live or not (an upper bound for dense maps).
    pub fn value_capacity(&self) -> usize {
        self.values.len()
    }

    /// Every value that is still defined (inputs, initializers, node outputs).
    pub fn live_values(&self) -> impl Iterator<Item = ValueId> + '_ {
        (0..self.values.len())
            .map(|i| ValueId(i as u32))
            .filter(|v| matches!(self.values[v.index()].def, ValueDef::Input | ValueDef::Init(_) | ValueDef::Node(..)))
    }

    /// Every value in the arena, including undefined and removed ones.
    pub fn all_values(&self) -> impl Iterator<Item = ValueId> + '_ {
        (0..self.values.len()).map(|i| ValueId(i as u32))
    }

    pub fn inputs(&self) -> &[ValueId] {
        &self.inputs
    }

    pub fn inits(&self) -> &[ValueId] {
        &self.inits
    }

    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }

    pub fn set_outputs(&mut self, outs: Vec<ValueId>) {
        self.outputs = outs;
    }

    /// Add initializer `t` as a *refreshed copy* of trained parameter
    /// `master`: the graph reads the copy; the master stays an initializer
    /// (the optimizer's), and after every optimizer step the trainer rewrites
    /// the copy as `master` rounded to the copy's dtype. Its gradient is the
    /// master's. The verifier checks the pairing.
    pub fn add_refreshed_copy(&mut self, master: ValueId, name: impl Into<String>, t: Tensor) -> ValueId {
        let v = self.add_init(name, t);
        self.copies.insert(v, master);
        v
    }

    /// Record existing initializer `copy` as a refreshed copy of `master`.
    pub fn link_refreshed_copy(&mut self, copy: ValueId, master: ValueId) {
        self.copies.insert(copy, master);
    }

    /// The master of refreshed copy `v`.
    pub fn master_of(&self, v: ValueId) -> Option<ValueId> {
        self.copies.get(&v).copied()
    }

    /// Refreshed copies and their masters, ordered by copy.
    pub fn refreshed_copies(&self) -> impl Iterator<Item = (ValueId, ValueId)> + '_ {
        self.copies.iter().map(|(&c, &m)| (c, m))
    }

    /// Whether initializer `v` is the master of some refreshed copy.
    pub fn is_master(&self, v: ValueId) -> bool {
        self.copies.values().any(|&m| m == v)
    }

    /// Remove an initializer (or input) that nothing uses any more, and any
    /// refreshed-copy pairing it is part of.
    pub fn remove_source(&mut self, v: ValueId) {
        self.copies.retain(|&c, &mut m| c != v && m != v);
        self.inits.retain(|&x| x != v);
        self.inputs.retain(|&x| x != v);
        self.values[v.index()].def = ValueDef::Removed;
        let name = self.values[v.index()].name.clone();
        if self.names.get(&name) == Some(&v) {
            self.names.remove(&name);
        }
    }

    /// The node producing `v`, if a node does.
    pub fn producer(&self, v: ValueId) -> Option<(NodeId, usize)> {
        match self.values[v.index()].def {
            ValueDef::Node(n, slot) => Some((n, slot)),
            _ => None,
        }
    }

    // ---- nodes --------------------------------------------------------------

    /// Add a node, creating its output values. Inputs may be any value,
    /// defined or not.
    pub fn add_node(&mut self, spec: NodeSpec) -> NodeId {
        let seq = self.next_seq;
        self.next_seq += 1;
        let node = Node {
            name: spec.name,
            op: spec.op,
            attrs: spec.attrs,
            precision: spec.precision,
            inputs: Vec::new(),
            outputs: Vec::new(),
            captures: Vec::new(),
            seq,
            scope: None,
        };
        let id = self.dag.add_node(node);
        let mut outs = Vec::with_capacity(spec.outputs.len());
        for (slot, (name, ty)) in spec.outputs.into_iter().enumerate() {
            outs.push(self.push_value(name, ty, ValueDef::Node(id, slot)));
        }
        self.dag[id].outputs = outs;
        for v in spec.inputs {
            self.push_node_input(id, v);
        }
        for (i, c) in spec.captures.into_iter().enumerate() {
            let v = c.value;
            self.dag[id].captures.push(c);
            self.link(id, CAPTURE_SLOT + i, Some(v));
        }
        id
    }

    /// Add a node whose outputs are existing undefined values (forward
    /// references resolved by the parser / importers).
    pub fn add_node_defining(&mut self, spec: NodeSpec, outputs: Vec<ValueId>) -> NodeId {
        let mut spec = spec;
        let types: Vec<TensorType> = spec.outputs.drain(..).map(|(_, t)| t).collect();
        let id = self.add_node(spec);
        for (slot, v) in outputs.iter().enumerate() {
            self.define(*v, ValueDef::Node(id, slot));
            if let Some(t) = types.get(slot) {
                self.values[v.index()].ty = t.clone();
            }
        }
        self.dag[id].outputs = outputs.clone();
        // Uses recorded before the definition existed have no edge yet.
        if !outputs.iter().any(|v| self.forward_used.remove(v)) {
            return id;
        }
        let earlier: Vec<(NodeId, usize, ValueId)> = self
            .dag
            .node_indices()
            .flat_map(|n| self.dag[n].reads().filter(|(_, v)| outputs.contains(v)).map(move |(s, v)| (n, s, v)))
            .collect();
        for (n, slot, v) in earlier {
            self.unlink(n, slot);
            self.link(n, slot, Some(v));
        }
        id
    }

    fn push_node_input(&mut self, n: NodeId, v: Option<ValueId>) {
        let slot = self.dag[n].inputs.len();
        self.dag[n].inputs.push(v);
        self.link(n, slot, v);
    }

    fn add_use(&mut self, v: ValueId, n: NodeId, slot: usize) {
        if self.uses.len() <= v.index() {
            self.uses.resize_with(v.index() + 1, Vec::new);
        }
        self.uses[v.index()].push((n, slot as u32));
    }

    fn drop_use(&mut self, v: ValueId, n: NodeId, slot: usize) {
        if let Some(list) = self.uses.get_mut(v.index()) {
            if let Some(i) = list.iter().position(|&u| u == (n, slot as u32)) {
                list.swap_remove(i);
            }
        }
    }

    fn link(&mut self, n: NodeId, slot: usize, v: Option<ValueId>) {
        if let Some(v) = v {
            if matches!(self.values[v.index()].def, ValueDef::Undefined) {
                self.forward_used.insert(v);
            }
            self.add_use(v, n, slot);
        }
        if let Some((p, _)) = v.and_then(|v| self.producer(v)) {
            self.dag.add_edge(p, n, slot as u32);
        }
    }

    fn unlink(&mut self, n: NodeId, slot: usize) {
        if let Some(v) = self.dag[n].input(slot) {
            self.drop_use(v, n, slot);
        }
        let edge =
            self.dag.edges_directed(n, Direction::Incoming).find(|e| *e.weight() as usize == slot).map(|e| e.id());
        if let Some(e) = edge {
            self.dag.remove_edge(e);
        }
    }

    /// Re-wire input `slot` of `n` to `v`. A capture slot
    /// ([`CAPTURE_SLOT`]` + i`) is re-wired to `v` keeping the name its
    /// subgraphs use; a capture cannot be omitted, so `None` leaves it.
    pub fn set_input(&mut self, n: NodeId, slot: usize, v: Option<ValueId>) {
        if let Some(i) = slot.checked_sub(CAPTURE_SLOT) {
            let (Some(v), true) = (v, i < self.dag[n].captures.len()) else { return };
            self.unlink(n, slot);
            self.dag[n].captures[i].value = v;
            self.link(n, slot, Some(v));
            return;
        }
        self.unlink(n, slot);
        let inputs = &mut self.dag[n].inputs;
        if slot >= inputs.len() {
            inputs.resize(slot + 1, None);
        }
        inputs[slot] = v;
        self.link(n, slot, v);
    }

    /// Drop trailing omitted inputs or append new ones.
    pub fn push_input_to(&mut self, n: NodeId, v: Option<ValueId>) {
        self.push_node_input(n, v);
    }

    /// Make every use of `old` (node inputs, captures and graph outputs) use `new`.
    pub fn replace_all_uses(&mut self, old: ValueId, new: ValueId) {
        for (n, slot) in self.users(old) {
            self.set_input(n, slot, Some(new));
        }
        for o in &mut self.outputs {
            if *o == old {
                *o = new;
            }
        }
    }

    /// Remove a node; its outputs become `Removed`.
    pub fn remove_node(&mut self, n: NodeId) -> Option<Node> {
        let node = self.dag.remove_node(n)?;
        for (slot, v) in node.reads() {
            self.drop_use(v, n, slot);
        }
        for &v in &node.outputs {
            self.values[v.index()].def = ValueDef::Removed;
            let name = self.values[v.index()].name.clone();
            if self.names.get(&name) == Some(&v) {
                self.names.remove(&name);
            }
        }
        Some(node)
    }

    pub fn node(&self, n: NodeId) -> &Node {
        &self.dag[n]
    }

    /// Mutable access to a node's name, op, attributes and precision (its
    /// inputs and outputs change only through the graph's methods).
    pub fn node_mut(&mut self, n: NodeId) -> &mut Node {
        &mut self.dag[n]
    }

    pub fn contains_node(&self, n: NodeId) -> bool {
        self.dag.contains_node(n)
    }

    pub fn node_count(&self) -> usize {
        self.dag.node_count()
    }

    /// Node ids in insertion order (not necessarily topological).
    pub fn node_ids(&self) -> Vec<NodeId> {
        let mut ids: Vec<NodeId> = self.dag.node_indices().collect();
        ids.sort_by_key(|&n| self.dag[n].seq);
        ids
    }

    /// The underlying petgraph graph (edges producer → consumer, weight = input slot).
    pub fn dag(&self) -> &StableDiGraph<Node, u32> {
        &self.dag
    }

    /// Consumers of `v` as `(node, input slot)`, in node insertion order;
    /// a node whose subgraphs capture `v` is one, at slot
    /// [`CAPTURE_SLOT`]` + i`.
    pub fn users(&self, v: ValueId) -> Vec<(NodeId, usize)> {
        let mut out: Vec<(NodeId, usize)> =
            self.uses.get(v.index()).map(|l| l.iter().map(|&(n, s)| (n, s as usize)).collect()).unwrap_or_default();
        out.sort_by_key(|&(n, s)| (self.dag[n].seq, s));
        out
    }

    /// Whether any node reads `v` (as an input or a capture).
    pub fn has_users(&self, v: ValueId) -> bool {
        self.uses.get(v.index()).is_some_and(|l| !l.is_empty())
    }

    /// Use counts of every value (node inputs, captures and graph outputs),
    /// indexed by `ValueId::index`.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut counts = vec![0usize; self.values.len()];
        for n in self.dag.node_indices() {
            for (_, v) in self.dag[n].reads() {
                counts[v.index()] += 1;
            }
        }
        for v in &self.outputs {
            counts[v.index()] += 1;
        }
        counts
    }

    /// A topological order of the nodes, deterministic: among ready nodes the
    /// one inserted first goes first. `Err` holds the nodes left on cycles
    /// (or downstream of one), in insertion order.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, Vec<NodeId>> {
        let mut indeg: HashMap<NodeId, usize> = HashMap::with_capacity(self.dag.node_count());
        let mut ready = BinaryHeap::new();
        for n in self.dag.node_indices() {
            let d = self.dag.edges_directed(n, Direction::Incoming).count();
            indeg.insert(n, d);
            if d == 0 {
                ready.push(Reverse((self.dag[n].seq, n.index())));
            }
        }
        let mut order = Vec::with_capacity(self.dag.node_count());
        while let Some(Reverse((_, idx))) = ready.pop() {
            let n = NodeIndex::new(idx);
            order.push(n);
            for e in self.dag.edges_directed(n, Direction::Outgoing) {
                let t = e.target();
                if let Some(d) = indeg.get_mut(&t) {
                    *d -= 1;
                    if *d == 0 {
                        ready.push(Reverse((self.dag[t].seq, t.index())));
                    }
                }
            }
        }
        if order.len() == self.dag.node_count() {
            Ok(order)
        } else {
            let mut rest: Vec<NodeId> = indeg.into_iter().filter(|&(_, d)| d > 0).map(|(n, _)| n).collect();
            rest.sort_by_key(|&n| self.dag[n].seq);
            Err(rest)
        }
    }

    /// Nodes in topological order, or insertion order when there is a cycle
    /// (the verifier reports cycles; printing must still work).
    pub fn schedule(&self) -> Vec<NodeId> {
        self.topo_order().unwrap_or_else(|_| self.node_ids())
    }

    /// Renumber sequence numbers to the current schedule, so that later
    /// insertions land after everything that exists now.
    pub fn compact_order(&mut self) {
        for (i, n) in self.schedule().into_iter().enumerate() {
            self.dag[n].seq = i as u64;
        }
        self.next_seq = self.dag.node_count() as u64;
    }
}

/// A model: a graph plus the ONNX model-level fields that must survive export.
#[derive(Clone, Debug, Default)]
pub struct Model {
    pub graph: Graph,
    pub ir_version: i64,
    /// Opset imports as `(domain, version)`; the default domain is `""`.
    pub opsets: Vec<(String, i64)>,
    pub producer_name: String,
    pub producer_version: String,
    pub domain: String,
    pub model_version: i64,
    pub doc_string: String,
    pub metadata: Vec<(String, String)>,
    /// Model-local functions, kept opaque as encoded `FunctionProto`s.
    pub functions: Vec<Vec<u8>>,
    /// Directory that external-data locations are relative to (not printed).
    pub base_dir: Option<std::path::PathBuf>,
    /// Names of the intermediate values whose types the source file declared
    /// (ONNX `value_info`), so that export annotates the same values and no
    /// others: runtimes pick shape-dependent fusions from these annotations,
    /// and a round trip must not change numerics. `None` (a model built in
    /// memory or parsed from text IR): export annotates every typed value.
    pub annotated: Option<std::collections::BTreeSet<String>>,
}

impl Model {
    pub fn new(graph: Graph) -> Model {
        Model { graph, ir_version: 8, opsets: vec![(String::new(), 17)], ..Model::default() }
    }

    /// The default-domain opset version.
    pub fn opset(&self) -> i64 {
        self.opsets.iter().find(|(d, _)| d.is_empty() || d == "ai.onnx").map_or(0, |(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{parse_model, print_model};

    const SRC: &str = "opset \"\" 17
graph \"g\" {
  input %x: f32[2]
  input %c: bool[]
  %y: f32[2] = If \"if\"(%c) {then_branch=graph<\"\">} captures(%r, %x)
  %r: f32[2] = Relu \"relu\"(%x)
  output %y
}
";

    fn ids(g: &Graph) -> (NodeId, NodeId) {
        let find = |name: &str| g.node_ids().into_iter().find(|&n| g.node(n).name == name).expect("node");
        (find("if"), find("relu"))
    }

    #[test]
    fn captures_are_uses_that_order_the_schedule() {
        let m = parse_model(SRC).expect("parse");
        let g = &m.graph;
        let (iff, relu) = ids(g);
        let r = g.value_by_name("r").expect("r");
        let x = g.value_by_name("x").expect("x");
        assert_eq!(g.users(r), [(iff, CAPTURE_SLOT)]);
        assert_eq!(g.users(x), [(iff, CAPTURE_SLOT + 1), (relu, 0)]);
        assert!(g.has_users(r));
        assert_eq!(g.use_counts()[r.index()], 1);
        assert_eq!(g.node(iff).input(CAPTURE_SLOT), Some(r));
        // Inserted first, scheduled after the producer of what it captures.
        assert_eq!(g.topo_order().expect("acyclic"), [relu, iff]);
        // The text form round trips.
        let printed = print_model(&m);
        assert_eq!(print_model(&parse_model(&printed).expect("reparse")), printed);
    }

    #[test]
    fn rewrites_move_captures_and_keep_the_subgraph_name() {
        let mut m = parse_model(SRC).expect("parse");
        let g = &mut m.graph;
        let (iff, relu) = ids(g);
        let r = g.value_by_name("r").expect("r");
        let x = g.value_by_name("x").expect("x");
        let neg = g.add_node(NodeSpec::new("neg", Op::Neg).input(x).output("n", TensorType::unknown()));
        let n = g.node(neg).outputs()[0];
        g.replace_all_uses(r, n);
        assert!(!g.has_users(r));
        assert_eq!(g.users(n), [(iff, CAPTURE_SLOT)]);
        assert_eq!(g.node(iff).captures()[0], Capture { name: "r".into(), value: n });
        assert_eq!(g.topo_order().expect("acyclic"), [relu, neg, iff]);
        assert!(print_model(&m).contains("captures(%n as %r, %x)"), "{}", print_model(&m));
        // Removing the capturing node drops its uses.
        let g = &mut m.graph;
        g.remove_node(iff);
        assert!(!g.has_users(n));
        assert_eq!(g.users(x), [(relu, 0), (neg, 0)]);
    }
}
