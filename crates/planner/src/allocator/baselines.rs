//! The baselines that move samples or leave devices out: DBS (every type at
//! the training precision, the global batch split) and each device type
//! alone (its own devices training the whole global batch).

use std::collections::BTreeMap;

use qsync_cost::Plan;
use qsync_sim::{Predictor, Target};

use crate::context::Ctx;
use crate::types::{DbsEval, Eval, PlanError};

impl DbsEval {
    /// DBS where no batch split fits: no time, every type marked as not
    /// fitting.
    pub(super) fn none_fits(cx: &Ctx<'_>) -> DbsEval {
        DbsEval {
            iteration_ms: f64::INFINITY,
            samples_per_s: 0.0,
            indicator_sum: 0.0,
            batch_split: BTreeMap::new(),
            fits: cx.targets.iter().map(|t| (t.device.name.clone(), false)).collect(),
            eval: None,
        }
    }
}

/// DBS: every type trains at the training precision ([`Ctx::dbs_plan`]),
/// the global batch split so that the slowest type finishes first
/// ([`crate::joint::split`] on those plans' lines), verified by a full
/// prediction at that split.
pub(super) fn dbs(cx: &Ctx<'_>) -> Result<DbsEval, PlanError> {
    let plans: Vec<Plan> = (0..cx.targets.len()).map(|t| cx.dbs_plan(t)).collect();
    let lines = cx.lines(&plans)?;
    let Some((batches, _)) = crate::joint::split(&lines, cx.global_batch()) else {
        return Ok(DbsEval::none_fits(cx));
    };
    let mut pred = cx.predictor_at(&plans, &batches)?;
    let e = cx.eval("dbs", &mut pred);
    Ok(DbsEval {
        iteration_ms: e.iteration_ms,
        samples_per_s: e.samples_per_s,
        indicator_sum: e.indicator_sum,
        batch_split: e.types.iter().map(|t| (t.name.clone(), t.local_batch)).collect(),
        fits: e.types.iter().map(|t| (t.name.clone(), t.fits)).collect(),
        eval: if e.types.iter().all(|t| t.fits) { Some(e) } else { None },
    })
}

impl Ctx<'_> {
    /// Device type `t` alone, trained at the training precision on the
    /// cluster's global batch `B` — so that it is compared with the whole
    /// cluster per sample, paying its synchronization once per `B` samples:
    /// each of its `c` devices takes `⌈B/c⌉` samples a step. Where that does
    /// not fit, gradient accumulation: `k` passes of `⌈⌈B/c⌉/k⌉` samples, the
    /// smallest `k` whose micro-batch fits (the largest fitting micro-batch is
    /// found by bisection: memory grows with the batch). An accumulated step
    /// costs `k − 1` forward-backward passes without synchronization, then
    /// one ordinary iteration. A graph that fixes its batch accumulates at
    /// that batch. `None` when not even the smallest micro-batch fits.
    pub(crate) fn alone(&self, t: usize) -> Result<Option<Eval>, PlanError> {
        let mut target = self.targets[t].clone();
        target.plan = self.training_plan(t)?;
        let global: u64 = self.targets.iter().map(|x| u64::from(x.count) * u64::from(x.local_batch)).sum();
        let per_device = global.div_ceil(u64::from(target.count.max(1))).min(u64::from(u32::MAX)) as u32;
        let name = format!("alone:{}", self.targets[t].device.name);
        let try_micro = |micro: u32| -> Result<Eval, PlanError> {
            let mut tg = target.clone();
            tg.local_batch = micro;
            let mut pred = Predictor::with_analysis(self.g, self.analysis.clone(), vec![tg], self.popts.clone())?;
            Ok(self.eval_types(&name, &mut pred, Some(t)))
        };
        let fits = |e: &Eval| e.types.iter().all(|d| d.fits);
        let (lo, hi) = self.batch_bounds;
        // The type alone sharded, at the whole per-device batch (where DDP
        // does not hold it, against DDP's accumulation below).
        let mut sharded = None;
        let micro = if lo == hi {
            // The graph fixes its batch: accumulate at it.
            let e = try_micro(lo)?;
            if !fits(&e) {
                return Ok(None);
            }
            lo
        } else {
            let top = per_device.max(lo);
            let e = try_micro(top)?;
            // The type alone may shard too (as the whole cluster may): the
            // faster of the two, so that the comparison is like for like.
            let mut tg = target.clone();
            tg.local_batch = top;
            sharded = self.alone_sharded(t, tg, &name)?;
            if fits(&e) {
                return Ok(Some(match sharded {
                    Some(s) if s.samples_per_s > e.samples_per_s => s,
                    _ => e,
                }));
            }
            // Largest micro-batch in [lo, top) that fits.
            let (mut good, mut bad) = (None, top);
            let mut low = lo;
            while low < bad {
                let mid = low + (bad - low) / 2;
                if fits(&try_micro(mid)?) {
                    good = Some(mid);
                    low = mid + 1;
                } else {
                    bad = mid;
                }
            }
            match good {
                Some(g) => g,
                None => return Ok(sharded),
            }
        };
        let k = per_device.div_ceil(micro.max(1)).max(1);
        let micro = per_device.div_ceil(k).max(lo);
        let mut e = try_micro(micro)?;
        if !fits(&e) {
            return Ok(sharded);
        }
        if k > 1 {
            let extra_ms: f64 = e.types.iter().map(|d| d.backward_end_ms).fold(0.0, f64::max) * f64::from(k - 1);
            let samples = e.samples_per_s * e.iteration_ms / 1e3 * f64::from(k);
            e.iteration_ms += extra_ms;
            e.samples_per_s = samples / (e.iteration_ms / 1e3);
            for d in &mut e.types {
                d.accumulation_steps = k;
                d.finish_ms += extra_ms;
            }
        }
        Ok(Some(match sharded {
            Some(s) if s.samples_per_s > e.samples_per_s => s,
            _ => e,
        }))
    }

    /// Type `t` alone (`tg`, its batch set) sharded: the fastest fitting
    /// stage (full-shard with and without hpZ, shard-grad-op, hybrid-shard
    /// over several nodes), checkpointing off or on.
    fn alone_sharded(&self, t: usize, tg: Target, name: &str) -> Result<Option<Eval>, PlanError> {
        use qsync_sim::shard::{predict_sharded, ShardSpec, Stage, Units};
        let units = Units::of(self.g, self.facts);
        let mut pred = Predictor::with_analysis(self.g, self.analysis.clone(), vec![tg.clone()], self.popts.clone())?;
        let mut stages = vec![(Stage::FullShard, false), (Stage::FullShard, true), (Stage::ShardGradOp, false)];
        if tg.count > tg.per_node.max(1) {
            stages.push((Stage::HybridShard, false));
        }
        let mut best: Option<qsync_sim::ShardedResult> = None;
        for (stage, hpz) in stages {
            for ck in [false, true] {
                let spec = ShardSpec { hpz, checkpoint: vec![ck], ..ShardSpec::new(stage, 1) };
                let r = predict_sharded(&mut pred, &units, &spec)?;
                if r.fits() && best.as_ref().is_none_or(|b| r.samples_per_s > b.samples_per_s) {
                    best = Some(r);
                }
            }
        }
        Ok(best.map(|r| {
            let mut e = self.eval_types(name, &mut pred, Some(t));
            crate::shard::with_sharded_times(&mut e, &r);
            e
        }))
    }
}
