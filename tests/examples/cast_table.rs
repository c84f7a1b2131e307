//! The cast table: casts and predicted cast time per shared model
//! for naive insertion (`uniform=f16`), `amp`, `campo`, `campo,egraph-casts`,
//! `amp,egraph-casts`, and onnxconverter-common.
//!
//! `cast_table blocklists OUT.json`: per model, the op types `amp` keeps in
//! FP32 (the op_block_list given to onnxconverter-common).
//! `cast_table table [CONVERTER.json [FIXED.json]]`: the Markdown table;
//! CONVERTER.json maps model → casts onnxconverter-common added with amp's
//! FP32 op types blocked, FIXED.json with [`AMP_LIKE_BLOCK_LIST`].
#![allow(clippy::print_stdout)]

use std::collections::{BTreeMap, BTreeSet};

use qsync_ir::{DType, Model, Op};
use qsync_passes::precision::oracle::numel;
use qsync_passes::precision::{lowerable, AnalyticOracle, CostOracle};
use qsync_passes::{pipeline_from_spec, PassContext};

/// A fixed AMP-like FP32 op list for onnxconverter-common (the op types
/// mixed-precision frameworks keep in FP32: normalizations, softmax,
/// reductions, and the transcendental/precision-sensitive elementwise ops).
pub const AMP_LIKE_BLOCK_LIST: &[&str] = &[
    "BatchNormalization",
    "Div",
    "Erf",
    "Exp",
    "GroupNormalization",
    "InstanceNormalization",
    "LayerNormalization",
    "Log",
    "LogSoftmax",
    "Pow",
    "Reciprocal",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Softmax",
    "Sqrt",
];

fn planned(path: &std::path::Path, spec: &str) -> Model {
    let mut m = qsync_onnx::import_file(path).unwrap_or_else(|e| panic!("{e}"));
    let pm = pipeline_from_spec(&format!("infer-shapes,{spec}")).expect("pipeline");
    let mut cx = PassContext { target: Some("t4".into()), ..PassContext::default() };
    pm.run(&mut m, &mut cx).unwrap_or_else(|e| panic!("{} {spec}: {e}", path.display()));
    m
}

/// (casts added over `base`, weight casts, predicted cast time in µs on t4: forward +
/// gradient cast, plus the optimizer step's rewrite of refreshed copies,
/// refreshed copies).
fn casts(m: &Model, base: i64) -> (i64, i64, f64, i64) {
    let g = &m.graph;
    let oracle = AnalyticOracle::for_target("t4").expect("t4");
    let (mut n, mut w) = (0i64, 0i64);
    let mut t = qsync_passes::precision::oracle::refresh_total(&oracle, g);
    for id in g.node_ids() {
        let node = g.node(id);
        if node.op != Op::Cast {
            continue;
        }
        let (Some(i), Some(&o)) = (node.input(0), node.outputs().first()) else { continue };
        n += 1;
        w += i64::from(g.value(i).init().is_some());
        let (from, to) = (g.ty(i).dtype.unwrap_or(DType::F32), g.ty(o).dtype.unwrap_or(DType::F32));
        t += 2.0 * oracle.cast_time(from, to, numel(g.ty(i)));
    }
    (n - base, w, t * 1e6, g.refreshed_copies().count() as i64)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let models = qsync_tests::onnx_models();
    match args.first().map(String::as_str) {
        Some("breakdown") => {
            // Where each model's casts come from after `args[1]` (default amp):
            // by what the cast reads and which op types read the cast.
            let spec = args.get(1).map_or("amp", String::as_str);
            for p in &models {
                let m = planned(p, spec);
                let g = &m.graph;
                let mut by: BTreeMap<String, usize> = BTreeMap::new();
                for id in g.node_ids() {
                    let node = g.node(id);
                    if node.op != Op::Cast {
                        continue;
                    }
                    let Some(i) = node.input(0) else { continue };
                    let src = if g.value(i).init().is_some() {
                        "init".to_string()
                    } else if let Some((pn, _)) = g.producer(i) {
                        g.node(pn).op.op_type().to_string()
                    } else {
                        "input".to_string()
                    };
                    let users: BTreeSet<String> = node
                        .outputs()
                        .iter()
                        .flat_map(|&o| g.users(o))
                        .map(|(u, slot)| format!("{}#{slot}", g.node(u).op.op_type()))
                        .collect();
                    let users: Vec<String> = users.into_iter().collect();
                    *by.entry(format!("{src} -> {}", users.join("|"))).or_default() += 1;
                }
                println!("{} ({spec}):", p.display());
                for (k, v) in by {
                    println!("  {v:4} {k}");
                }
            }
        }
        Some("amp-like") => {
            let list: Vec<String> = AMP_LIKE_BLOCK_LIST.iter().map(|s| format!("\"{s}\"")).collect();
            std::fs::write(&args[1], format!("[{}]\n", list.join(", "))).expect("write the AMP-like list");
        }
        Some("blocklists") => {
            let mut out = BTreeMap::new();
            for p in &models {
                let m = planned(p, "amp");
                let g = &m.graph;
                let kept: BTreeSet<String> = g
                    .node_ids()
                    .into_iter()
                    .filter(|&n| lowerable(g, n) && g.node(n).precision.is_none_or(|d| d == DType::F32))
                    .map(|n| g.node(n).op.op_type().to_string())
                    .collect();
                out.insert(p.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default(), kept);
            }
            std::fs::write(&args[1], serde_json_like(&out)).expect("write blocklists");
        }
        _ => {
            let counts = |i: usize| -> BTreeMap<String, i64> {
                args.get(i).and_then(|f| std::fs::read_to_string(f).ok()).map(|t| parse_counts(&t)).unwrap_or_default()
            };
            let (conv, fixed) = (counts(1), counts(2));
            println!("| model | (a) naive uniform=f16 | (b) amp | (c) campo | (d) campo+egraph-casts | (d) vs amp | (d) refreshed copies | (d) + copies vs amp | amp+egraph-casts | (b) amp activation casts added (in the graph) | (d) activation casts added (in the graph) | activation casts in the graph vs amp | (e) onnxconverter-common activation casts, amp's FP32 ops | (e') same, fixed AMP-like list |");
            println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
            let mut ratios = Vec::new();
            let mut with_copies = Vec::new();
            let mut act_ratios = Vec::new();
            let (mut sum_b, mut sum_d) = (0i64, 0i64);
            for p in &models {
                let name = p.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default();
                let (base, base_w, _, _) = casts(&planned(p, "dce"), 0);
                let base_act = base - base_w;
                let a = casts(&planned(p, "uniform=f16"), base);
                let b = casts(&planned(p, "amp"), base);
                let c = casts(&planned(p, "campo"), base);
                let d = casts(&planned(p, "campo,egraph-casts"), base);
                let ae = casts(&planned(p, "amp,egraph-casts"), base);
                // Reductions compare the casts in the whole graph (the
                // exporter's own included: egraph-casts may remove those).
                let (b_all, d_all) = (b.0 + base, d.0 + base);
                let ratio = if b_all > 0 { 1.0 - d_all as f64 / b_all as f64 } else { 0.0 };
                ratios.push(ratio);
                // The conservative count: every refreshed copy as a cast.
                let ratio_c = if b_all > 0 { 1.0 - (d_all + d.3) as f64 / b_all as f64 } else { 0.0 };
                with_copies.push(ratio_c);
                (sum_b, sum_d) = (sum_b + b_all, sum_d + d_all);
                let e = conv.get(&name).map_or("—".to_string(), |c| c.to_string());
                let e2 = fixed.get(&name).map_or("—".to_string(), |c| c.to_string());
                // Activation casts in the whole graph (the exporter's own
                // included: egraph-casts may remove those too), and net added.
                let (b_act, d_act) = (b.0 + base - b.1, d.0 + base - d.1);
                let (b_net, d_net) = (b_act - base_act, d_act - base_act);
                let act_ratio = if b_act > 0 { 1.0 - d_act as f64 / b_act as f64 } else { 0.0 };
                act_ratios.push(act_ratio);
                println!(
                    "| {name} | {} ({:.0} µs) | {} ({:.0} µs) | {} ({:.0} µs) | {} ({:.0} µs) | {:+.1}% | {} | {:+.1}% | {} ({:.0} µs) | {b_net} ({b_act}) | {d_net} ({d_act}) | {:+.1}% | {e} | {e2} |",
                    a.0,
                    a.2,
                    b.0,
                    b.2,
                    c.0,
                    c.2,
                    d.0,
                    d.2,
                    -100.0 * ratio,
                    d.3,
                    -100.0 * ratio_c,
                    ae.0,
                    ae.2,
                    -100.0 * act_ratio
                );
            }
            let avg = ratios.iter().sum::<f64>() / ratios.len().max(1) as f64;
            let act_avg = act_ratios.iter().sum::<f64>() / act_ratios.len().max(1) as f64;
            let copies_avg = with_copies.iter().sum::<f64>() / with_copies.len().max(1) as f64;
            println!(
                "\nCast reduction of campo+egraph-casts vs amp: mean over models {:.1}% (activation casts in the graph: {:.1}%; counting every refreshed copy as a cast: {:.1}%); all models pooled {:.1}% ({sum_d} vs {sum_b} casts in the graphs)",
                100.0 * avg,
                100.0 * act_avg,
                100.0 * copies_avg,
                100.0 * (1.0 - sum_d as f64 / sum_b.max(1) as f64)
            );
        }
    }
}

fn serde_json_like(m: &BTreeMap<String, BTreeSet<String>>) -> String {
    let items: Vec<String> = m
        .iter()
        .map(|(k, v)| format!("\"{k}\": [{}]", v.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ")))
        .collect();
    format!("{{{}}}\n", items.join(",\n"))
}

fn parse_counts(t: &str) -> BTreeMap<String, i64> {
    t.trim()
        .trim_matches(|c| c == '{' || c == '}')
        .split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once(':')?;
            Some((k.trim().trim_matches('"').to_string(), v.trim().parse().ok()?))
        })
        .collect()
}
