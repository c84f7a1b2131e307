//! The optimality gap on small graphs: our indicator sum against the best
//! class-uniform plan found exhaustively.

use qsync_cost::Plan;
use qsync_ir::NodeId;

use crate::context::Ctx;
use crate::types::{AllocOptions, Gap, PlanError};

/// Exhaustive search over class-uniform plans of the one inference type,
/// when the combinations are few: the best indicator sum under the
/// constraints, against ours.
pub(super) fn optimality_gap(
    cx: &Ctx<'_>,
    cls: &[Vec<NodeId>],
    up: &[Plan],
    t_min: f64,
    ours: f64,
    opts: &AllocOptions,
) -> Result<Option<Gap>, PlanError> {
    let inf: Vec<usize> = (0..cx.targets.len()).filter(|&t| cx.levels[t].is_some()).collect();
    let [t] = inf.as_slice() else { return Ok(None) };
    let t = *t;
    let levels = cx.levels[t].clone().unwrap_or_default();
    let combos = (levels.len() as u64).checked_pow(cls.len() as u32).unwrap_or(u64::MAX);
    if combos > opts.gap_limit {
        return Ok(None);
    }
    let mut pred = cx.predictor(up)?;
    let mut best = f64::INFINITY;
    let mut idx = vec![0usize; cls.len()];
    for _ in 0..combos {
        let mut plan = Plan::new();
        for (c, &k) in cls.iter().zip(&idx) {
            for &n in c {
                let p = cx.at_level(t, n, levels[k]);
                plan.set(n, p);
                pred.set_precision(t, n, p)?;
            }
        }
        let r = pred.result();
        if r.devices.iter().all(|d| d.fits) && r.samples_per_s >= t_min * (1.0 - 1e-9) {
            best = best.min(cx.indicator_of(&plan));
        }
        for i in idx.iter_mut() {
            *i += 1;
            if *i < levels.len() {
                break;
            }
            *i = 0;
        }
    }
    if !best.is_finite() {
        return Ok(None);
    }
    let rel = if best > 0.0 {
        (ours - best) / best
    } else if ours > 0.0 {
        f64::INFINITY
    } else {
        0.0
    };
    Ok(Some(Gap { combinations: combos, optimal_indicator_sum: best, ours_indicator_sum: ours, relative_gap: rel }))
}
