//! `dce`: dead-code elimination.
//!
//! Reads: the graph. Removes every node none of whose outputs reaches a graph
//! output, and initializers nothing uses (initializers that are also graph
//! inputs stay: they are part of the model's interface, and so do the
//! masters of refreshed copies that are read). Opaque ops are kept,
//! since the IR cannot know they are free of side effects. Requires nothing
//! before it; guarantees that every remaining known-op node is live.

use qsync_ir::{Model, ValueDef};

use crate::manager::{Pass, PassContext, PassError, PassOutcome};

#[derive(Debug, Default)]
pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&self, model: &mut Model, _cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        let g = &mut model.graph;
        let mut uses = g.use_counts();
        let mut removed_nodes = 0usize;
        // Reverse topological order: a node's users are visited before it, so
        // one sweep removes whole dead chains.
        let mut order = g.schedule();
        order.reverse();
        for n in order {
            let node = g.node(n);
            if node.op.is_opaque() || node.outputs().iter().any(|o| uses[o.index()] > 0) {
                continue;
            }
            // Its captures were uses too: what only its subgraphs read dies with it.
            let inputs: Vec<_> = node.reads().map(|(_, v)| v).collect();
            for v in inputs {
                uses[v.index()] = uses[v.index()].saturating_sub(1);
            }
            g.remove_node(n);
            removed_nodes += 1;
        }
        let dead = |g: &qsync_ir::Graph, v: qsync_ir::ValueId| {
            uses[v.index()] == 0 && !g.inputs().contains(&v) && matches!(g.value(v).def, ValueDef::Init(_))
        };
        // Unread refreshed copies go first; a master stays while a copy of
        // it is read (the optimizer trains the master).
        let mut dead_inits: Vec<_> =
            g.inits().iter().copied().filter(|&v| g.master_of(v).is_some() && dead(g, v)).collect();
        for &v in &dead_inits {
            g.remove_source(v);
        }
        let rest: Vec<_> = g.inits().iter().copied().filter(|&v| dead(g, v) && !g.is_master(v)).collect();
        for &v in &rest {
            g.remove_source(v);
        }
        dead_inits.extend(rest);
        if removed_nodes == 0 && dead_inits.is_empty() {
            return Ok(PassOutcome::unchanged());
        }
        g.compact_order();
        Ok(PassOutcome::changed(format!("removed {removed_nodes} nodes, {} initializers", dead_inits.len())))
    }
}
