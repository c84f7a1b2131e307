//! `report.md` of a plan directory: the verdict, every method side by side,
//! one paragraph on what changed per device and what it bought, and an SVG
//! timeline of UP against the chosen plan.

use std::fmt::Write as _;

use qsync_planner::{Eval, Outcome, TypeEval};

/// Whether every device type of a plan fits its memory.
fn fits(e: &Eval) -> bool {
    e.types.iter().all(|t| t.fits)
}

/// UP's and DBS's throughput, each only where it fits: a plan that does not
/// fit is no baseline to compare with.
fn baselines(out: &Outcome) -> (Option<f64>, Option<f64>) {
    let up = Some(out.up.samples_per_s).filter(|&x| x > 0.0 && fits(&out.up));
    let dbs = out.dbs.eval.as_ref().filter(|e| fits(e)).map(|e| e.samples_per_s).filter(|&x| x > 0.0);
    (up, dbs)
}

/// The methods table in Markdown: one row per method, the chosen one marked;
/// a method that does not fit says so instead of a time.
pub fn table(out: &Outcome) -> String {
    let mut s = String::from(
        "| method | local batches | iteration ms | samples/s | vs UP | vs DBS | indicator sum |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    let (up, dbs) = baselines(out);
    let vs = |b: Option<f64>, x: f64| b.map_or("–".to_string(), |b| format!("{:+.1}%", (x / b - 1.0) * 100.0));
    for (key, e) in out.methods() {
        let name: std::borrow::Cow<str> = match key {
            "up" => "UP (uniform precision)".into(),
            "dbs" => format!("DBS ({}, batch split)", training_precisions(e)).into(),
            "qsync-greedy" => "QSync greedy (paper)".into(),
            "qsync" => "QSync allocator (fastest start)".into(),
            "joint-fastest" => "joint, fastest within bound".into(),
            "joint" => "joint, least indicator at floor".into(),
            other => other.into(),
        };
        let mark = if key == out.chosen { " **(chosen)**" } else { "" };
        if !fits(e) {
            let _ =
                writeln!(s, "| {name}{mark} | {} | – | does not fit | – | – | {:.4e} |", batches(e), e.indicator_sum);
            continue;
        }
        let _ = writeln!(
            s,
            "| {name}{mark} | {} | {:.2} | {:.1} | {} | {} | {:.4e} |",
            batches(e),
            e.iteration_ms,
            e.samples_per_s,
            vs(up, e.samples_per_s),
            vs(dbs, e.samples_per_s),
            e.indicator_sum
        );
    }
    for (name, e) in &out.alone {
        match e {
            Some(e) => {
                let _ = writeln!(
                    s,
                    "| {name} alone ({}) | {} | {:.2} | {:.1} | {} | {} | – |",
                    e.types.first().map_or(String::new(), precisions),
                    batches(e),
                    e.iteration_ms,
                    e.samples_per_s,
                    vs(up, e.samples_per_s),
                    vs(dbs, e.samples_per_s),
                );
            }
            None => {
                let _ = writeln!(s, "| {name} alone | – | – | does not fit | – | – | – |");
            }
        }
    }
    s
}

fn batches(e: &Eval) -> String {
    e.types
        .iter()
        .map(|t| match t.accumulation_steps {
            0 | 1 => format!("{} {}", t.name, t.local_batch),
            k => format!("{} {k}×{}", t.name, t.local_batch),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What one device of a type-alone evaluation trains per step: "64 per
/// device" or "4 passes of 16 per device (gradient accumulation)".
fn alone_step(e: &Eval) -> String {
    match e.types.first() {
        Some(t) if t.accumulation_steps > 1 => format!(
            "{} passes of {} per device, gradient accumulation: one step of {} does not fit",
            t.accumulation_steps,
            t.local_batch,
            t.accumulation_steps * t.local_batch
        ),
        Some(t) => format!("{} per device", t.local_batch),
        None => String::new(),
    }
}

/// Each type's training precision in a DBS-like plan: the narrowest
/// precision it computes in (its GEMMs under AMP), "t4 fp16, v100 fp16".
fn training_precisions(e: &Eval) -> String {
    e.types
        .iter()
        .map(|t| {
            let p = t.plan.iter().map(|(_, p)| p).min_by_key(|p| (p.bits(), p.name())).map_or("fp32", |p| p.name());
            format!("{} {p}", t.name)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn precisions(t: &TypeEval) -> String {
    let total: usize = t.precision_histogram.values().sum();
    if total == 0 {
        return "nothing planned".into();
    }
    t.precision_histogram
        .iter()
        .map(|(k, v)| format!("{:.0}% {k}", *v as f64 * 100.0 / total as f64))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The answer to "is adding these devices worth it, and what do I run?",
/// in one or two sentences, with the numbers.
pub fn verdict(out: &Outcome) -> String {
    let c = &out.chosen_eval;
    let (up, dbs) = baselines(out);
    let label = |e: &Eval| e.types.iter().map(|t| format!("{} x{}", t.name, t.count)).collect::<Vec<_>>().join(" + ");
    if let Some(a) = out.faster_alone() {
        // An all-device plan the run found (not chosen: the objective
        // weighs the indicator too) may still beat the devices alone; then
        // adding them pays, with that plan.
        let mut all: Vec<(&str, &Eval)> = Vec::new();
        all.extend(out.joint_fastest.as_ref().map(|e| ("joint-fastest", e)));
        all.extend(out.dbs.eval.as_ref().map(|e| ("dbs", e)));
        if let Some(sh) = &out.sharded {
            all.extend(sh.methods().into_iter().map(|(k, e)| (k, &e.eval)));
        }
        let fits = |e: &Eval| e.types.iter().all(|t| t.fits);
        if let Some((name, b)) = all
            .into_iter()
            .filter(|(_, e)| fits(e) && e.samples_per_s > a.samples_per_s * (1.0 + 1e-9))
            .max_by(|x, y| x.1.samples_per_s.total_cmp(&y.1.samples_per_s))
        {
            return format!(
                "**Adding the other devices pays only with `{name}`**: it predicts {:.1} samples/s on every device, \
                 {:.2}x {} alone ({:.1} samples/s, {}), where the plan written here (`{}`, {:.1} samples/s, chosen \
                 for its lower indicator) is {:.2}x slower than the devices alone; all train the same global batch \
                 of {} samples per step. `--objective throughput` writes the fastest plan.",
                b.samples_per_s,
                b.samples_per_s / a.samples_per_s.max(1e-12),
                label(a),
                a.samples_per_s,
                alone_step(a),
                out.chosen,
                c.samples_per_s,
                a.samples_per_s / c.samples_per_s.max(1e-12),
                out.global_batch()
            );
        }
        return format!(
            "**Leave the other devices out**: {} alone ({}, {}) predicts {:.1} samples/s, {:.2}x the \
             plan chosen for every device ({:.1} samples/s, `{}`), both training the same global batch of {} \
             samples per step. Adding the others slows training down; the plan written here is that all-device \
             plan, for when you must use them.",
            label(a),
            a.types.first().map_or(String::new(), precisions),
            alone_step(a),
            a.samples_per_s,
            a.samples_per_s / c.samples_per_s.max(1e-12),
            c.samples_per_s,
            out.chosen,
            out.global_batch()
        );
    }
    let sharded = matches!(out.chosen.as_str(), "fsdp" | "fsdp-dbs" | "sharded");
    if up.is_none() && dbs.is_none() && sharded {
        // Sharded because nothing fits under DDP: there is no DDP baseline
        // to compare with, only the FSDP ones.
        let fsdp = out.sharded.as_ref().and_then(|s| s.fsdp.as_ref().or(s.fsdp_dbs.as_ref())).map_or(
            String::from(" No FSDP baseline fits without checkpointing either."),
            |f| {
                format!(
                    " {:+.1}% against FSDP FULL_SHARD ({:.1} samples/s).",
                    (c.samples_per_s / f.eval.samples_per_s.max(1e-12) - 1.0) * 100.0,
                    f.eval.samples_per_s
                )
            },
        );
        return format!(
            "**Run `{}`** on {}: {:.1} samples/s predicted ({:.2} ms per iteration). The model does not fit under data \
             parallelism (every device holding all of it); it is trained sharded (see `sharding` in manifest.json).{fsdp}",
            out.chosen,
            label(c),
            c.samples_per_s,
            c.iteration_ms
        );
    }
    if c.types.len() == 1 {
        let t = &c.types[0];
        return format!(
            "**Train on {} at {}** ({} per device): {:.1} samples/s predicted ({:.2} ms per iteration). A single \
             device type is planned as a training cluster at --train-precision; there is nothing to split.",
            label(c),
            precisions(t),
            t.local_batch,
            c.samples_per_s,
            c.iteration_ms
        );
    }
    let pct = |b: f64| (c.samples_per_s / b.max(1e-12) - 1.0) * 100.0;
    let against = match (up, dbs) {
        (Some(u), Some(d)) => format!("{:+.1}% against the best baseline (UP or DBS)", pct(u.max(d))),
        (Some(u), None) => format!("{:+.1}% against UP (DBS does not fit)", pct(u)),
        (None, Some(d)) => format!("{:+.1}% against DBS (UP does not fit)", pct(d)),
        (None, None) => "neither baseline, UP nor DBS, fits".to_string(),
    };
    let mut s = format!(
        "**Run `{}`** on {}: {:.1} samples/s predicted ({:.2} ms per iteration), {against}.",
        out.chosen,
        label(c),
        c.samples_per_s,
        c.iteration_ms,
    );
    let best_alone =
        out.alone.iter().filter_map(|(_, e)| e.as_ref()).max_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s));
    if let Some(a) = best_alone {
        s += &format!(
            " Adding the other devices pays: {:.2}x the fastest type alone ({}: {:.1} samples/s, {}; both train the \
             same global batch of {} samples per step).",
            c.samples_per_s / a.samples_per_s.max(1e-12),
            label(a),
            a.samples_per_s,
            alone_step(a),
            out.global_batch()
        );
    } else if !out.alone.is_empty() {
        s += " No device type fits the model alone.";
    }
    s
}

/// One paragraph: which device types changed batch or precision against UP,
/// and what the chosen plan gains over the baselines.
pub fn explanation(out: &Outcome) -> String {
    let c = &out.chosen_eval;
    let mut changes = Vec::new();
    for (t, u) in c.types.iter().zip(&out.up.types) {
        let mut what = Vec::new();
        if t.local_batch != u.local_batch {
            what.push(format!("{} samples per device instead of {}", t.local_batch, u.local_batch));
        }
        if t.precision_histogram != u.precision_histogram {
            what.push(format!("computes {} (UP: {})", precisions(t), precisions(u)));
        }
        if !what.is_empty() {
            changes.push(format!("each {} ({}) {}", t.name, t.role, what.join(" and ")));
        }
    }
    let mut s = String::new();
    if changes.is_empty() {
        let _ = write!(s, "The chosen plan is UP's own: no device type changes batch or precision. ");
    } else {
        let _ = write!(s, "Against UP, {}. ", changes.join("; "));
    }
    let (up, dbs) = baselines(out);
    let _ = write!(s, "Predicted {:.1} samples/s", c.samples_per_s);
    match up {
        Some(u) => {
            let _ = write!(s, ", {:+.1}% over UP", (c.samples_per_s / u - 1.0) * 100.0);
        }
        None => {
            let _ = write!(s, " (UP does not fit)");
        }
    }
    match dbs {
        Some(d) => {
            let _ = write!(s, " and {:+.1}% over DBS", (c.samples_per_s / d - 1.0) * 100.0);
        }
        None if out.dbs.eval.is_some() => {
            let _ = write!(s, " (DBS does not fit)");
        }
        None => {}
    }
    let _ = write!(
        s,
        ", with an indicator sum of {:.3e} against UP's {:.3e} (the indicator, QSync's Ω, estimates the gradient \
         variance that lowered precision adds: smaller is closer to FP32 training). ",
        c.indicator_sum, out.up.indicator_sum
    );
    let slowest = c.types.iter().max_by(|a, b| a.compute_ms.total_cmp(&b.compute_ms));
    if let Some(sl) = slowest {
        let _ = write!(
            s,
            "The slowest device type is {} ({:.2} ms of compute in a {:.2} ms iteration). ",
            sl.name, sl.compute_ms, c.iteration_ms
        );
    }
    let global: u64 = c.types.iter().map(|t| u64::from(t.count) * u64::from(t.local_batch)).sum();
    if c.types.iter().any(|t| t.local_batch != c.types[0].local_batch) {
        let _ = write!(
            s,
            "The global batch stays {global}; the runtime weights each device's gradient by its local batch over {global}, \
             so the update equals the uniform-batch one."
        );
    }
    s
}

/// What the indicator column means, for a reader of `report.md`.
pub const INDICATOR_PARAGRAPH: &str = "**The indicator** (QSync's Ω, the `indicator sum` column) estimates the \
variance the plan's lowered precisions add to the gradients, summed over the operators computed below FP32: for \
each one, the rounding error of its activation, weight and incoming gradient at that precision, weighted by where \
in the model it sits. It is 0 for an all-FP32 plan and grows as more, or more sensitive, operators are lowered; a plan with \
half another's indicator perturbs training about half as much. It is a relative measure for comparing plans of \
one model, not an accuracy prediction: statistics come from the weights and from `--stats` (else estimated from \
shapes), and the planner keeps it as small as it can without going below the throughput floor.";

/// `report.md`.
pub fn report(model: &str, out: &Outcome, warnings: &[String]) -> String {
    let mut s = format!("# qsync plan: {model}\n\n");
    let c = &out.chosen_eval;
    let _ = writeln!(s, "{}\n", verdict(out));
    let _ = writeln!(s, "{}\n", explanation(out));
    let _ = writeln!(s, "{}\n", INDICATOR_PARAGRAPH);
    let _ = writeln!(s, "{}", table(out));
    let floor_rule = match out.t_min_rule {
        qsync_planner::TMin::Best => "the best baseline, max(UP, DBS, FSDP, FSDP-DBS)",
        qsync_planner::TMin::Lowest => "the lowest uniform precision that fits",
        qsync_planner::TMin::Fastest => "UP's throughput",
    };
    let _ = writeln!(
        s,
        "Method `{}`, objective `{}`. Throughput floor ({floor_rule}): {:.1} samples/s; indicator bound of the \
         fastest joint plan: {:.4e}. QSync's allocator {}.\n",
        serde_json::to_value(out.method).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
        serde_json::to_value(out.objective).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
        out.t_min,
        out.indicator_bound,
        if out.qsync_fallback { "fell back to greedy's plan (its own did not dominate)" } else { "kept its own plan" }
    );
    if let Some(g) = &out.gap {
        let _ = writeln!(
            s,
            "Optimality gap of QSync's allocator against exhaustive search over {} class-uniform plans: {:+.2}% \
             (optimum {:.4e}).\n",
            g.combinations,
            g.relative_gap * 100.0,
            g.optimal_indicator_sum
        );
    }
    let _ =
        writeln!(s, "## Timeline (UP above, the chosen plan below: forward, backward, optimizer step, then waiting)\n");
    s += &svg(out);
    s += "\n\n## Per device (chosen plan)\n\n| device | role | local batch | precisions | compute ms | memory GiB | capacity GiB | indicator |\n|---|---|---:|---|---:|---:|---:|---:|\n";
    for t in &c.types {
        let h: Vec<String> = t.precision_histogram.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.4e} |",
            t.name,
            t.role,
            t.local_batch,
            h.join(" "),
            t.compute_ms,
            gib(t.peak_memory_bytes),
            gib(t.memory_capacity_bytes),
            t.indicator
        );
    }
    if !warnings.is_empty() {
        s += "\n## Notes\n\n";
        for w in warnings {
            let _ = writeln!(s, "- {w}");
        }
    }
    s
}

fn svg(out: &Outcome) -> String {
    let c = &out.chosen_eval;
    let span = out.up.iteration_ms.max(c.iteration_ms).max(1e-9);
    let (w, row, left) = (760.0, 22.0, 170.0);
    let rows: Vec<(String, &TypeEval, f64)> = out
        .up
        .types
        .iter()
        .map(|t| (format!("UP {}", t.name), t, out.up.iteration_ms))
        .chain(c.types.iter().map(|t| (format!("{} {}", out.chosen, t.name), t, c.iteration_ms)))
        .collect();
    let h = row * rows.len() as f64 + 30.0;
    let x = |ms: f64| left + ms / span * (w - left - 10.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n"
    );
    for (i, (label, t, it)) in rows.iter().enumerate() {
        let y = 5.0 + i as f64 * row;
        let _ = writeln!(s, "<text x=\"2\" y=\"{:.1}\">{label}</text>", y + 13.0);
        // The optimizer step runs once the gradients are synchronized, at
        // the end: its length is the compute not spent in forward and
        // backward. Everything else after the backward is waiting (on the
        // collectives or on stragglers) and is drawn as such.
        let step = (t.compute_ms - t.backward_end_ms).max(0.0).min(t.finish_ms - t.backward_end_ms);
        let step_start = (t.finish_ms - step).max(t.backward_end_ms);
        for (a, b, color) in [
            (0.0, t.forward_end_ms, "#4c78a8"),
            (t.forward_end_ms, t.backward_end_ms, "#f58518"),
            (t.backward_end_ms, step_start, "#dddddd"),
            (step_start, t.finish_ms, "#54a24b"),
            (t.finish_ms, *it, "#dddddd"),
        ] {
            if b > a {
                let _ = writeln!(
                    s,
                    "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{color}\"/>",
                    x(a),
                    (x(b) - x(a)).max(0.5),
                    row - 4.0
                );
            }
        }
    }
    let _ = writeln!(
        s,
        "<text x=\"{left}\" y=\"{:.1}\">0 … {span:.1} ms (blue forward, orange backward, green optimizer, grey waiting)</text>",
        h - 6.0
    );
    s += "</svg>";
    s
}
