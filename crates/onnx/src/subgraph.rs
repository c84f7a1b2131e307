//! Subgraph scopes: which names of the enclosing graph a node's subgraph
//! attributes (If branches, Loop and Scan bodies, at any depth) read, and
//! renaming those reads on export.
//!
//! A subgraph may read any value of an enclosing graph by name without it
//! being a node input. The importer records those reads as the node's
//! captures ([`qsync_ir::Capture`]), so that scheduling, dead-code removal
//! and rewrites treat them as uses; when a rewrite has given a captured
//! value another name (or replaced it), the exporter renames the reads in
//! the encoded bodies ([`rename_free`]).

use std::collections::{BTreeMap, HashSet};

use crate::proto::{AttributeProto, GraphProto};

/// The names `g` reads but does not define (its inputs, initializers and
/// node outputs are its own), including those its nested subgraphs read
/// from it or further out, in first-read order without repeats. The empty
/// name (an omitted optional input) is never one.
pub fn free_names(g: &GraphProto) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    collect_free(g, &mut out, &mut seen);
    out
}

/// The free names of every subgraph in `attrs`, in attribute order.
pub fn attrs_free_names(attrs: &[AttributeProto]) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for g in attrs.iter().flat_map(attr_graphs) {
        for name in free_names(g) {
            if seen.insert(name.clone()) {
                out.push(name);
            }
        }
    }
    out
}

fn attr_graphs(a: &AttributeProto) -> impl Iterator<Item = &GraphProto> {
    a.g.as_deref().into_iter().chain(a.graphs.iter())
}

fn defined(g: &GraphProto) -> HashSet<&str> {
    let mut d: HashSet<&str> = HashSet::new();
    d.extend(g.input.iter().map(|v| v.name.as_str()));
    d.extend(g.initializer.iter().map(|t| t.name.as_str()));
    d.extend(g.sparse_initializer.iter().filter_map(|s| s.values.as_ref()).map(|t| t.name.as_str()));
    d.extend(g.node.iter().flat_map(|n| n.output.iter().map(String::as_str)));
    d
}

// Recursion depth is bounded by prost's decoding limit (100 nested messages).
fn collect_free(g: &GraphProto, out: &mut Vec<String>, seen: &mut HashSet<String>) {
    let local = defined(g);
    let mut push = |name: &str, out: &mut Vec<String>| {
        if !name.is_empty() && !local.contains(name) && seen.insert(name.to_string()) {
            out.push(name.to_string());
        }
    };
    for n in &g.node {
        for i in &n.input {
            push(i, out);
        }
        for sub in n.attribute.iter().flat_map(attr_graphs) {
            let mut inner = Vec::new();
            collect_free(sub, &mut inner, &mut HashSet::new());
            for name in inner {
                push(&name, out);
            }
        }
    }
    for o in &g.output {
        push(&o.name, out);
    }
}

/// Whether `g` or any graph nested in it defines `name` (an input,
/// initializer or node output of its own).
pub fn defines_anywhere(g: &GraphProto, name: &str) -> bool {
    defined(g).contains(name)
        || g.node.iter().flat_map(|n| n.attribute.iter().flat_map(attr_graphs)).any(|sub| defines_anywhere(sub, name))
}

/// Rename the reads of outer names in `g` (and its nested subgraphs) by
/// `map` (old → new). A name `g` defines itself is its own, not the outer
/// one, and is left alone there and below.
pub fn rename_free(g: &mut GraphProto, map: &BTreeMap<String, String>) {
    let local: HashSet<String> = defined(g).into_iter().map(str::to_string).collect();
    let map: BTreeMap<String, String> =
        map.iter().filter(|(k, _)| !local.contains(*k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    if map.is_empty() {
        return;
    }
    for n in &mut g.node {
        for i in &mut n.input {
            if let Some(new) = map.get(i) {
                *i = new.clone();
            }
        }
        for a in &mut n.attribute {
            if let Some(sub) = a.g.as_deref_mut() {
                rename_free(sub, &map);
            }
            for sub in &mut a.graphs {
                rename_free(sub, &map);
            }
        }
    }
    for o in &mut g.output {
        if let Some(new) = map.get(&o.name) {
            o.name = new.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{NodeProto, ValueInfoProto};

    fn node(inputs: &[&str], outputs: &[&str], subs: Vec<GraphProto>) -> NodeProto {
        NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: vec![AttributeProto { name: "body".into(), graphs: subs, ..AttributeProto::default() }],
            ..NodeProto::default()
        }
    }

    fn graph(nodes: Vec<NodeProto>, inputs: &[&str], outputs: &[&str]) -> GraphProto {
        let vi = |s: &&str| ValueInfoProto { name: s.to_string(), ..ValueInfoProto::default() };
        GraphProto {
            node: nodes,
            input: inputs.iter().map(vi).collect(),
            output: outputs.iter().map(vi).collect(),
            ..GraphProto::default()
        }
    }

    #[test]
    fn free_names_see_nested_reads_and_skip_local_definitions() {
        // inner reads `a` (outer), `t` (defined by the middle graph) and `i` (its own input).
        let inner = graph(vec![node(&["a", "t", "i", ""], &["u"], vec![])], &["i"], &["u"]);
        let middle = graph(vec![node(&["b"], &["t"], vec![]), node(&[], &["r"], vec![inner])], &[], &["r", "c"]);
        assert_eq!(free_names(&middle), ["b", "a", "c"]);
    }

    #[test]
    fn rename_reaches_nested_reads_but_not_shadowed_names() {
        let inner = graph(vec![node(&["a", "t"], &["u"], vec![])], &[], &["u", "a"]);
        let mut middle = graph(vec![node(&["t0"], &["t"], vec![]), node(&["a"], &["r"], vec![inner])], &[], &["r"]);
        let map: BTreeMap<String, String> =
            [("a".to_string(), "a.cast_f32".to_string()), ("t".to_string(), "t2".to_string())].into();
        rename_free(&mut middle, &map);
        assert_eq!(free_names(&middle), ["t0", "a.cast_f32"]);
        let inner = &middle.node[1].attribute[0].graphs[0];
        assert_eq!(inner.node[0].input, ["a.cast_f32", "t"]);
        assert_eq!(inner.output[1].name, "a.cast_f32");
    }
}
