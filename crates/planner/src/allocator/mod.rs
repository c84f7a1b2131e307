//! QSync's allocator (Sec. V) and the baselines it is compared with.
//!
//! Problem (1): per inference device type, minimise the indicator sum over
//! its operators subject to memory ≤ its capacity and global throughput ≥
//! T_min ([`TMin`]: by default the throughput of UP, the fastest uniform
//! level that fits; with [`TMin::Lowest`] the paper's own definition, the
//! throughput of the lowest uniform precision that fits).
//!
//! - **UP**: every inference type at one uniform precision level (FP32,
//!   FP16, INT8 — INT8 only for Conv/GEMM, whose neighbours drop to FP16 at
//!   that level); of the levels that fit memory, the fastest — normally the
//!   lowest precision that fits, QSync's T_min. Where the lowest level that
//!   fits is another plan (INT8 slower than FP16), it is reported too
//!   (`up-lowest`): QSync's UP, which [`Method::Up`] chooses, so that the
//!   baseline is written and trained like any other plan.
//! - **Greedy** (QSync as published): start from UP, then recover precision
//!   from a max-heap of indicator decrements, keeping a step only if memory
//!   fits and throughput stays ≥ T_min.
//! - **Ours**: start from the *fastest* plan under the memory cap instead,
//!   then the same recovery. Operators are grouped into classes of
//!   structurally identical operators (op, attributes, input shapes — the
//!   repeated blocks of ResNets and Transformers collapse into one class
//!   each); a class takes one precision for all its members. The fastest
//!   class assignment under the memory budget (capacity minus what the
//!   candidates do not control) is a multiple-choice knapsack: searched
//!   exhaustively when the combinations are few, by DP over discretised
//!   memory otherwise; the DP's allotment is each class's memory budget.
//!   The start is checked by the predictor (the knapsack's memory is a
//!   linear estimate) and the budget shrunk until it really fits. The result
//!   is kept only if it dominates greedy (throughput ≥, indicator ≤);
//!   otherwise greedy's plan is returned and the outcome says so.
//! - **DBS**: every device at the training precision (AMP by default; FP32,
//!   QSync's definition, with `--train-precision fp32`), the global batch
//!   split so the slowest type finishes first, verified by a full prediction
//!   at that split.
//!
//! Training device types (when the cluster is hybrid, the type predicted
//! fastest on the model at FP32, per sample)
//! stay FP32, or AMP (Conv/GEMM in FP16) when asked.

mod baselines;
mod choose;
mod gap;
mod outcome;
mod start;

use std::collections::HashMap;

use qsync_cost::{GraphFacts, Plan, Precision};
use qsync_ir::{Graph, NodeId};
use qsync_sim::{PredictOptions, Predictor, SimResult, Target};

pub use self::outcome::Outcome;
pub use self::start::classes;
pub use crate::context::candidates;
pub use crate::types::{
    AllocOptions, DbsEval, Eval, Gap, Method, Objective, PlanError, TMin, TrainPrecision, TypeEval,
};

use self::baselines::dbs;
use self::choose::{choose, sharded_choice};
use self::gap::optimality_gap;
use self::start::fastest_start;
use crate::context::Ctx;
use crate::indicator::Indicator;

/// Plan a hybrid cluster. `targets` carry device, count, batch, memory
/// fraction and calibration; their plans are ignored.
pub fn allocate(
    g: &Graph,
    facts: &GraphFacts,
    targets: Vec<Target>,
    popts: PredictOptions,
    ind: &Indicator,
    opts: &AllocOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Outcome, PlanError> {
    let mut popts = popts;
    if popts.reference_batch.is_none() {
        let first = targets.first().map_or(1, |t| t.local_batch);
        if targets.iter().any(|t| t.local_batch != first) {
            return Err(PlanError::Infeasible(
                "targets with different local batches need PredictOptions::reference_batch (the batch the graph is costed at)"
                    .into(),
            ));
        }
        popts.reference_batch = Some(first);
    }
    let mut phases: Vec<(String, f64)> = Vec::new();
    let clock = std::cell::Cell::new(std::time::Instant::now());
    let lap = |name: &str, phases: &mut Vec<(String, f64)>| {
        phases.push((name.to_string(), clock.get().elapsed().as_secs_f64()));
        clock.set(std::time::Instant::now());
    };
    let cands = candidates(g, facts);
    let gemm: HashMap<NodeId, bool> =
        cands.iter().map(|&n| (n, facts.node(n).is_ok_and(|f| f.kind.is_gemm_like()))).collect();
    // The training type, when the cluster is hybrid: the type that runs
    // this model fastest at FP32 (its predicted compute time at the same
    // local batch) — not the highest FP32 peak, which ranks an L4 (30 TFLOPS
    // on CUDA cores, 300 GB/s) above an A100 (19.5 TFLOPS, 1.5 TB/s).
    let analysis = std::sync::Arc::new(qsync_sim::GraphAnalysis::new(g, &popts)?);
    let training = if targets.len() > 1 {
        let mut fp32 = targets.clone();
        for t in &mut fp32 {
            t.plan = Plan::new();
        }
        let r = Predictor::with_analysis(g, analysis.clone(), fp32, popts.clone())?.result().clone();
        (0..targets.len()).min_by(|&a, &b| {
            let per_sample = |t: usize| r.devices[t].compute_us / f64::from(targets[t].local_batch.max(1));
            per_sample(a).total_cmp(&per_sample(b)).then(a.cmp(&b))
        })
    } else {
        // A single device type is a training cluster.
        Some(0)
    };
    let mut levels = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        if Some(i) == training {
            levels.push(None);
            continue;
        }
        let mut l: Vec<Precision> = Vec::new();
        for &p in std::iter::once(&Precision::Fp32).chain(opts.precisions.iter()) {
            if t.device.supports(p) && !l.iter().any(|q| q.bits() == p.bits()) {
                l.push(p);
            }
        }
        l.sort_by_key(|p| std::cmp::Reverse(p.bits()));
        levels.push(Some(l));
    }
    let cx = Ctx {
        g,
        facts,
        targets,
        popts,
        ind,
        candidates: cands,
        gemm,
        levels,
        train: opts.train_precision,
        opset: opts.opset,
        analysis,
        batch_bounds: match opts.fixed_local_batch {
            Some(b) => (b.max(1), b.max(1)),
            None => (opts.min_local_batch.max(1), u32::MAX),
        },
        shard_collectives: opts.shard_collectives.clone(),
        shard_error_budget: opts.shard_error_budget,
    };
    let n_types = cx.targets.len();
    let base: Vec<Plan> = (0..n_types)
        .map(|t| if cx.levels[t].is_none() { cx.training_plan(t) } else { Ok(cx.uniform(t, Precision::Fp32)) })
        .collect::<Result<_, _>>()?;

    // UP: every inference type at one uniform level; of the levels that fit,
    // the fastest (normally the lowest precision: QSync's T_min).
    progress("uniform precision (UP)");
    let mut level_sets: Vec<Precision> = cx.levels.iter().flatten().flatten().copied().collect();
    level_sets.sort_by_key(|p| std::cmp::Reverse(p.bits()));
    level_sets.dedup_by_key(|p| p.bits());
    // A cluster of training types only (one device type) has one uniform
    // plan: every type at its training precision.
    if level_sets.is_empty() {
        level_sets.push(Precision::Fp32);
    }
    let mut best: Option<(f64, Vec<Plan>)> = None;
    // Levels run widest first: the last one that fits is the lowest.
    let mut lowest_fitting: Option<f64> = None;
    let mut lowest_plans: Option<Vec<Plan>> = None;
    let mut lowest_failure = String::new();
    let level_results = crate::par::map(&level_sets, |&p| -> Result<(Vec<Plan>, SimResult), PlanError> {
        let plans: Vec<Plan> =
            (0..n_types).map(|t| if cx.levels[t].is_none() { base[t].clone() } else { cx.uniform(t, p) }).collect();
        let r = cx.predictor(&plans)?.result().clone();
        Ok((plans, r))
    });
    for (&p, level) in level_sets.iter().zip(level_results) {
        let (plans, r) = level?;
        if r.devices.iter().all(|d| d.fits) {
            lowest_fitting = Some(r.samples_per_s);
            lowest_plans = Some(plans.clone());
            if best.as_ref().is_none_or(|(b, _)| r.samples_per_s > *b) {
                best = Some((r.samples_per_s, plans));
            }
        } else {
            lowest_failure = r
                .devices
                .iter()
                .filter(|d| !d.fits)
                .map(|d| {
                    format!(
                        "{} needs {:.2} GiB at {p}, {:.2} GiB available",
                        d.name,
                        d.peak_memory_bytes as f64 / (1u64 << 30) as f64,
                        d.memory_capacity_bytes.unwrap_or(0) as f64 / (1u64 << 30) as f64
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
        }
    }
    let Some((_, up_plans)) = best else {
        if opts.method == Method::Up {
            return Err(PlanError::Infeasible(format!(
                "UP does not fit: every uniform level runs out of memory, even the lowest allowed precision \
                 ({lowest_failure})"
            )));
        }
        // DDP holds the whole model on every device: sharding may still fit.
        progress("sharded training (FSDP, ZeRO++)");
        let s = cx.sharded()?;
        let ddp = format!("even at the lowest allowed precision {lowest_failure}");
        let Some((key, chosen)) = sharded_choice(&s, None) else {
            return Err(PlanError::Infeasible(crate::shard::does_not_fit(&s, &ddp)));
        };
        lap("sharded training (FSDP, ZeRO++)", &mut phases);
        // The DDP methods, as predicted (none fits).
        let plans: Vec<Plan> = (0..n_types).map(|t| cx.dbs_plan(t)).collect();
        let mut pred = cx.predictor(&plans)?;
        let up = cx.eval("up", &mut pred);
        let dbs = DbsEval::none_fits(&cx);
        return Ok(Outcome {
            t_min: 0.0,
            t_min_rule: opts.t_min,
            qsync_t_min: 0.0,
            greedy: Eval { method: "qsync-greedy".into(), ..up.clone() },
            ours: Eval { method: "qsync".into(), ..up.clone() },
            up,
            up_lowest: None,
            dbs,
            joint: None,
            joint_fastest: None,
            indicator_bound: opts.indicator_bound.unwrap_or(0.0),
            chosen: key.to_string(),
            chosen_eval: chosen,
            qsync_fallback: false,
            method: opts.method,
            objective: opts.objective,
            gap: None,
            candidates: cx.candidates.len(),
            classes: classes(g, &cx.candidates).len(),
            steps_tried: 0,
            steps_kept: 0,
            joint_combinations: 0,
            joint_verified: 0,
            alone: Vec::new(),
            phases,
            sharded: Some(s),
        });
    };
    let mut up_pred = cx.predictor(&up_plans)?;
    let up = cx.eval("up", &mut up_pred);
    let up_lowest = match lowest_plans.filter(|p| *p != up_plans) {
        Some(p) => Some(cx.eval("up-lowest", &mut cx.predictor(&p)?)),
        None => None,
    };
    lap("uniform precision (UP)", &mut phases);

    progress("dynamic batch sizing (DBS)");
    let dbs = dbs(&cx)?;
    lap("dynamic batch sizing (DBS)", &mut phases);
    let dbs_sps = dbs.eval.as_ref().map_or(0.0, |e| e.samples_per_s);
    let lowest = lowest_fitting.unwrap_or(up.samples_per_s).min(up.samples_per_s);
    let qsync_t_min = match opts.t_min {
        TMin::Lowest => lowest,
        TMin::Best | TMin::Fastest => up.samples_per_s,
    };
    let t_min = match opts.t_min {
        TMin::Best => up.samples_per_s.max(dbs_sps),
        TMin::Fastest => up.samples_per_s,
        TMin::Lowest => lowest,
    };

    progress("fastest start (class knapsack)");
    let cls = classes(g, &cx.candidates);
    let mut fastest: Vec<Option<Plan>> = vec![None; n_types];
    let mut start = up_plans.clone();
    for t in 0..n_types {
        if cx.levels[t].is_none() {
            continue;
        }
        if let Some(p) = fastest_start(&cx, t, &cls, &start, opts)? {
            fastest[t] = Some(p.clone());
            start[t] = p;
        }
    }
    lap("fastest start (class knapsack)", &mut phases);

    // QSync's two recoveries (from UP, and from the fastest start) and the
    // joint search read the results so far and nothing of each other: they
    // run side by side, each phase timed on its own thread.
    progress("QSync greedy recovery, indicator recovery (max-heap), joint batch split and precision");
    let bound = opts.indicator_bound.unwrap_or(up.indicator_sum);
    type Recovered = (Eval, Eval, bool, (usize, usize), [(String, f64); 2]);
    let qsync_side = |cx: &Ctx<'_>| -> Result<Recovered, PlanError> {
        let clock = std::time::Instant::now();
        // Greedy: recovery from UP.
        let mut gp = cx.predictor(&up_plans)?;
        cx.recover(&mut gp, qsync_t_min)?;
        let greedy = cx.eval("qsync-greedy", &mut gp);
        let greedy_s = clock.elapsed().as_secs_f64();
        // QSync's method: fastest start under memory, then recovery.
        let clock = std::time::Instant::now();
        let mut start = start.clone();
        let mut sp = cx.predictor(&start)?;
        let sr = sp.result().clone();
        if !(sr.devices.iter().all(|d| d.fits) && sr.samples_per_s >= qsync_t_min) {
            start = up_plans.clone();
            sp = cx.predictor(&start)?;
        }
        let steps = cx.recover(&mut sp, qsync_t_min)?;
        let mut ours = cx.eval("qsync", &mut sp);
        let dominates = ours.samples_per_s >= greedy.samples_per_s * (1.0 - 1e-12)
            && ours.indicator_sum <= greedy.indicator_sum * (1.0 + 1e-12);
        if !dominates {
            ours = Eval { method: "qsync".into(), ..greedy.clone() };
        }
        let timed = [
            ("QSync greedy recovery".to_string(), greedy_s),
            ("indicator recovery (max-heap)".to_string(), clock.elapsed().as_secs_f64()),
        ];
        Ok((greedy, ours, dominates, steps, timed))
    };
    let joint_side = |cx: &Ctx<'_>, up_pred: &mut Predictor<'_>| {
        let clock = std::time::Instant::now();
        let found = crate::joint::search(cx, &up_plans, &fastest, &level_sets, t_min, bound, opts, up_pred);
        (found, clock.elapsed().as_secs_f64())
    };
    let (qsync_out, (joint, joint_s)) = if cx.targets.len() > 1 {
        std::thread::scope(|scope| {
            let worker = scope.spawn(|| qsync_side(&cx));
            let j = joint_side(&cx, &mut up_pred);
            let q = worker.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
            (q, j)
        })
    } else {
        let q = qsync_side(&cx);
        (q, joint_side(&cx, &mut up_pred))
    };
    let (greedy, ours, dominates, (tried, kept), timed) = qsync_out?;
    let joint = joint?;
    phases.extend(timed);
    phases.push(("joint batch split and precision".to_string(), joint_s));
    clock.set(std::time::Instant::now());

    // Each type alone, for "is adding these GPUs worth it".
    let alone = if n_types > 1 {
        let types: Vec<usize> = (0..n_types).collect();
        crate::par::map(&types, |&t| cx.alone(t).map(|e| (cx.targets[t].device.name.clone(), e)))
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
    } else {
        Vec::new()
    };
    lap("each device type alone", &mut phases);

    // `--method up` writes QSync's UP: the lowest uniform level that fits.
    let (mut chosen, mut chosen_eval) = match (opts.method, &up_lowest) {
        (Method::Up, Some(l)) => ("up-lowest".to_string(), l.clone()),
        (Method::Up, None) => ("up".to_string(), up.clone()),
        _ => choose(opts, &up, &dbs, &greedy, &ours, &joint, t_min, bound, dominates),
    };
    let gap = optimality_gap(&cx, &cls, &up_plans, qsync_t_min, ours.indicator_sum, opts)?;
    lap("optimality gap", &mut phases);
    // The FSDP baselines join UP and DBS under the floor: where one beats
    // every DDP plan, the plan is sharded. Otherwise sharding replaces the
    // DDP plan only where it is predicted faster at no larger indicator sum
    // (QSync's own method stays as published).
    progress("sharded training (FSDP, ZeRO++)");
    let sharded = cx.sharded()?;
    let fsdp_floor =
        [&sharded.fsdp, &sharded.fsdp_dbs].into_iter().flatten().map(|e| e.eval.samples_per_s).fold(0.0, f64::max);
    let mut t_min = t_min;
    if opts.method == Method::Joint {
        if opts.t_min == TMin::Best {
            t_min = t_min.max(fsdp_floor);
        }
        let below = chosen_eval.samples_per_s < fsdp_floor * (1.0 - 1e-9);
        // Above the floor the sharded plan must be faster than the DDP plan
        // chosen, at no larger indicator sum than the objective allows: the
        // DDP plan's own under `indicator`, the bound under `throughput`.
        let ceiling = match opts.objective {
            Objective::Indicator => chosen_eval.indicator_sum,
            Objective::Throughput => bound.max(chosen_eval.indicator_sum),
        };
        let replace = if below {
            sharded_choice(&sharded, None)
        } else {
            sharded_choice(&sharded, Some((&chosen_eval, ceiling)))
        };
        if let Some((k, e)) = replace {
            chosen = k.to_string();
            chosen_eval = e;
        }
    }
    lap("sharded training (FSDP, ZeRO++)", &mut phases);
    Ok(Outcome {
        t_min: match opts.method {
            Method::Qsync => qsync_t_min,
            Method::Up => up_lowest.as_ref().unwrap_or(&up).samples_per_s,
            Method::Joint => t_min,
        },
        t_min_rule: opts.t_min,
        qsync_t_min,
        up,
        up_lowest: up_lowest.clone(),
        greedy,
        ours,
        dbs,
        joint: joint.at_floor,
        joint_fastest: joint.fastest,
        indicator_bound: bound,
        chosen,
        chosen_eval,
        qsync_fallback: !dominates,
        method: opts.method,
        objective: opts.objective,
        gap,
        candidates: cx.candidates.len(),
        classes: cls.len(),
        steps_tried: tried,
        steps_kept: kept,
        joint_combinations: joint.combinations,
        joint_verified: joint.verified,
        alone,
        phases,
        sharded: Some(sharded),
    })
}
