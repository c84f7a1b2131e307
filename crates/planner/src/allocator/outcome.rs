//! The outcome of one planning run: every method's evaluation, the chosen
//! plan, and the figures reported beside it.

use crate::types::{DbsEval, Eval, Gap, Method, Objective, TMin};

/// Everything one planning run produces.
#[derive(Debug)]
pub struct Outcome {
    /// The floor the chosen plan keeps (samples/s).
    pub t_min: f64,
    /// How `t_min` was chosen.
    pub t_min_rule: TMin,
    /// The floor QSync's method (uniform batch) kept.
    pub qsync_t_min: f64,
    pub up: Eval,
    /// UP at the lowest uniform level that fits (QSync's UP, the floor of
    /// [`TMin::Lowest`]), when that plan is not `up`'s: the all-INT8 plan
    /// where INT8 is slower than a wider level.
    pub up_lowest: Option<Eval>,
    pub greedy: Eval,
    /// QSync's allocator (ours: fastest start and recovery, or greedy's plan
    /// when ours does not dominate it).
    pub ours: Eval,
    pub dbs: DbsEval,
    /// The joint plan at the floor (`Objective::Indicator`), when found.
    pub joint: Option<Eval>,
    /// The fastest joint plan within the indicator bound, when found.
    pub joint_fastest: Option<Eval>,
    /// The indicator bound of the fastest joint plan.
    pub indicator_bound: f64,
    /// The method whose plan is chosen: a key of [`Outcome::methods`].
    pub chosen: String,
    /// The chosen plan.
    pub chosen_eval: Eval,
    /// Whether QSync's own method fell back to greedy's plan.
    pub qsync_fallback: bool,
    pub method: Method,
    pub objective: Objective,
    pub gap: Option<Gap>,
    pub candidates: usize,
    pub classes: usize,
    /// Recovery steps tried / kept (ours).
    pub steps_tried: usize,
    pub steps_kept: usize,
    /// Joint combinations split and estimated, and how many were verified.
    pub joint_combinations: usize,
    pub joint_verified: usize,
    /// Each device type alone (its own devices at the training precision,
    /// training the same global batch — with gradient accumulation where one
    /// step of it does not fit), in the targets' order: what the cluster
    /// without the other types would do. Empty for a single type. `None`
    /// where the type alone does not fit.
    pub alone: Vec<(String, Option<Eval>)>,
    /// Seconds per phase, in order.
    pub phases: Vec<(String, f64)>,
    /// The sharded methods (FSDP baselines and the sharded search). The
    /// chosen plan is sharded (`chosen` is `fsdp`, `fsdp-dbs` or `sharded`)
    /// where DDP fits nowhere, or where the sharded plan is predicted faster
    /// than the DDP plan chosen, at no larger indicator sum (under
    /// `--objective throughput`: within the indicator bound).
    pub sharded: Option<crate::shard::ShardOutcome>,
}

impl Outcome {
    /// Every method's evaluation, by key: `up`, `dbs`, `qsync-greedy`,
    /// `qsync`, `joint-fastest`, `joint` (the last two when found), then the
    /// sharded ones that fit (`fsdp`, `fsdp-dbs`, `sharded`).
    pub fn methods(&self) -> Vec<(&'static str, &Eval)> {
        let mut v: Vec<(&'static str, &Eval)> = vec![("up", &self.up)];
        if let Some(l) = &self.up_lowest {
            v.push(("up-lowest", l));
        }
        if let Some(d) = &self.dbs.eval {
            v.push(("dbs", d));
        }
        v.push(("qsync-greedy", &self.greedy));
        v.push(("qsync", &self.ours));
        if let Some(j) = &self.joint_fastest {
            v.push(("joint-fastest", j));
        }
        if let Some(j) = &self.joint {
            v.push(("joint", j));
        }
        if let Some(s) = &self.sharded {
            v.extend(s.methods().into_iter().map(|(k, e)| (k, &e.eval)));
        }
        v
    }

    /// The fastest single device type alone, when it is predicted faster
    /// than the chosen plan: leaving the other types out is then the better
    /// answer to "is adding these GPUs worth it".
    pub fn faster_alone(&self) -> Option<&Eval> {
        self.best_alone().filter(|e| e.samples_per_s > self.chosen_eval.samples_per_s * (1.0 + 1e-9))
    }

    /// The fastest device type alone (of those that fit).
    pub fn best_alone(&self) -> Option<&Eval> {
        self.alone.iter().filter_map(|(_, e)| e.as_ref()).max_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s))
    }

    /// The global batch every plan keeps.
    pub fn global_batch(&self) -> u64 {
        self.up.types.iter().map(|t| u64::from(t.count) * u64::from(t.local_batch)).sum()
    }
}
