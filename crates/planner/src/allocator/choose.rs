//! Which plan is written: QSync's method as published, or the best of every
//! method under the objective, and where a sharded plan replaces it.

use crate::types::{AllocOptions, DbsEval, Eval, Method, Objective};

/// The sharded plan to choose: the fastest fitting sharded method
/// (baselines first on ties) — against `ddp`, only if faster at no larger
/// indicator sum.
pub(super) fn sharded_choice(
    s: &crate::shard::ShardOutcome,
    ddp: Option<(&Eval, f64)>,
) -> Option<(&'static str, Eval)> {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
    let mut best: Option<(&'static str, &Eval)> = None;
    for (k, e) in s.methods() {
        let e = &e.eval;
        if best.is_none_or(|(_, b)| e.samples_per_s > b.samples_per_s && !close(e.samples_per_s, b.samples_per_s)) {
            best = Some((k, e));
        }
    }
    let (k, e) = best?;
    if let Some((d, ceiling)) = ddp {
        let faster = e.samples_per_s > d.samples_per_s && !close(e.samples_per_s, d.samples_per_s);
        let no_worse = e.indicator_sum <= ceiling * (1.0 + 1e-9) + f64::MIN_POSITIVE;
        if !(faster && no_worse) {
            return None;
        }
    }
    Some((k, Eval { method: k.to_string(), ..e.clone() }))
}

/// The chosen plan: QSync's method as published, or the best of every
/// method under the objective —
/// `Indicator`: the smallest indicator sum at or above the floor (ties: the
/// faster); `Throughput`: the fastest within the indicator bound (ties: the
/// smaller indicator).
#[allow(clippy::too_many_arguments)]
pub(super) fn choose(
    opts: &AllocOptions,
    up: &Eval,
    dbs: &DbsEval,
    greedy: &Eval,
    ours: &Eval,
    joint: &crate::joint::Found,
    t_min: f64,
    bound: f64,
    dominates: bool,
) -> (String, Eval) {
    if opts.method == Method::Qsync {
        return if dominates { ("qsync".into(), ours.clone()) } else { ("qsync-greedy".into(), greedy.clone()) };
    }
    // Baselines first: a joint plan that only ties a baseline is reported
    // as that baseline, so the plan never claims what a simpler one does.
    let mut pool: Vec<(&str, &Eval)> = vec![("up", up)];
    if let Some(d) = &dbs.eval {
        pool.push(("dbs", d));
    }
    pool.push(("qsync-greedy", greedy));
    pool.push(("qsync", ours));
    if let Some(j) = &joint.fastest {
        pool.push(("joint-fastest", j));
    }
    if let Some(j) = &joint.at_floor {
        pool.push(("joint", j));
    }
    let fits = |e: &Eval| e.types.iter().all(|t| t.fits);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
    let mut best: Option<(&str, &Eval)> = None;
    for &(k, e) in &pool {
        let ok = fits(e)
            && match opts.objective {
                Objective::Indicator => e.samples_per_s >= t_min * (1.0 - 1e-9),
                Objective::Throughput => e.indicator_sum <= bound * (1.0 + 1e-9) + f64::MIN_POSITIVE,
            };
        if !ok {
            continue;
        }
        let better = best.is_none_or(|(_, b)| match opts.objective {
            Objective::Indicator => {
                e.indicator_sum < b.indicator_sum && !close(e.indicator_sum, b.indicator_sum)
                    || close(e.indicator_sum, b.indicator_sum)
                        && e.samples_per_s > b.samples_per_s
                        && !close(e.samples_per_s, b.samples_per_s)
            }
            Objective::Throughput => {
                e.samples_per_s > b.samples_per_s && !close(e.samples_per_s, b.samples_per_s)
                    || close(e.samples_per_s, b.samples_per_s)
                        && e.indicator_sum < b.indicator_sum
                        && !close(e.indicator_sum, b.indicator_sum)
            }
        });
        if better {
            best = Some((k, e));
        }
    }
    // UP fits (the planner stops earlier otherwise), so the pool is never
    // empty of a fitting plan under Throughput with UP's own bound; the
    // floor is met by UP or DBS, whichever set it.
    let (k, e) = best.unwrap_or(("up", up));
    (k.to_string(), Eval { method: k.to_string(), ..e.clone() })
}
