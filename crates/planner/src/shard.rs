//! Sharded training in the planner: the FSDP baselines and the search over
//! stage × hpZ × activation checkpointing × per-type batch, every type at
//! the training precision (AMP by default), priced by
//! [`qsync_sim::shard::predict_sharded`] on the predictor of each batch
//! split.
//!
//! Baselines: `fsdp` — FSDP `FULL_SHARD` at the training precision, the
//! cluster's uniform batch, equal shards, 16-bit all-gathers and FP32
//! reduce-scatters, no checkpointing; `fsdp-dbs` — the same with DBS's
//! batch split (each type's batch in inverse proportion to its per-sample
//! compute time). The search (`sharded`) tries both splits with every stage
//! (`shard-grad-op`, `full-shard` with and without hpZ, `hybrid-shard` where
//! the nodes are alike), uneven shares, and checkpointing off, on for every
//! type, and on only for the types that need it to fit, and, for each, the
//! collectives' precisions [`crate::AllocOptions::shard_collectives`]
//! allows within [`crate::AllocOptions::shard_error_budget`]: the
//! all-gather at the AMP type's 16 bits (FP16 where a type trains in FP16,
//! else BF16) or qwZ, the reduce-scatter in FP32, BF16, qgZ-int8 or
//! qgZ-int4, each priced by its wire bytes and its kernels. The 16-bit /
//! FP32 pair is tried first, so a quantized collective is chosen only where
//! it is strictly faster; with the default (`fp`) nothing else is tried:
//! qwZ and qgZ change the trained weights and gradients, and are an
//! explicit choice. Both baselines are points of that space, so the search
//! is never slower than them.

use qsync_cost::Plan;
use qsync_cost::Precision;
use qsync_sim::shard::{predict_sharded, GatherPrecision, ShardSpec, ShardedResult, Stage, Units};
use qsync_sim::Predictor;

use crate::context::Ctx;
use crate::types::{Eval, PlanError};

/// A sharded plan: the evaluation as every method has it, and the sharding.
#[derive(Clone, Debug)]
pub struct ShardedEval {
    pub eval: Eval,
    pub result: ShardedResult,
}

/// The sharded methods of one run.
#[derive(Clone, Debug)]
pub struct ShardOutcome {
    pub units: Units,
    pub fsdp: Option<ShardedEval>,
    pub fsdp_dbs: Option<ShardedEval>,
    /// The fastest fitting configuration found.
    pub best: Option<ShardedEval>,
    /// Configurations priced.
    pub searched: usize,
    /// The least memory any configuration needed on its fullest device,
    /// over that device's capacity (bytes, bytes), when none fits.
    pub smallest_need: Option<(String, f64, f64)>,
}

impl ShardOutcome {
    /// The methods found, by key.
    pub fn methods(&self) -> Vec<(&'static str, &ShardedEval)> {
        let mut v = Vec::new();
        if let Some(e) = &self.fsdp {
            v.push(("fsdp", e));
        }
        if let Some(e) = &self.fsdp_dbs {
            v.push(("fsdp-dbs", e));
        }
        if let Some(e) = &self.best {
            v.push(("sharded", e));
        }
        v
    }
}

/// DBS's split: each type's batch in inverse proportion to its per-sample
/// compute time, the global batch kept (the remainder to the fastest
/// types), every batch within the bounds.
fn dbs_split(per_sample: &[f64], counts: &[u32], global: u64, bounds: (u32, u32)) -> Vec<u32> {
    let speed: Vec<f64> = per_sample.iter().map(|&c| if c > 0.0 { 1.0 / c } else { 1.0 }).collect();
    let total: f64 = speed.iter().zip(counts).map(|(s, &c)| s * f64::from(c)).sum();
    let mut b: Vec<u32> =
        speed.iter().map(|s| ((global as f64 * s / total).floor() as u32).clamp(bounds.0, bounds.1)).collect();
    let mut order: Vec<usize> = (0..b.len()).collect();
    order.sort_by(|&x, &y| per_sample[x].total_cmp(&per_sample[y]).then(x.cmp(&y)));
    let have = |b: &[u32]| b.iter().zip(counts).map(|(&x, &c)| u64::from(x) * u64::from(c)).sum::<u64>();
    // Whole samples per device: add to the fastest types while a device's
    // worth is missing.
    for &t in order.iter().cycle().take(order.len() * 64) {
        if have(&b) + u64::from(counts[t]) > global || b[t] >= bounds.1 {
            continue;
        }
        b[t] += 1;
    }
    b
}

impl Ctx<'_> {
    fn sharded_eval(&self, method: &str, pred: &mut Predictor<'_>, r: ShardedResult) -> ShardedEval {
        let mut eval = self.eval(method, pred);
        with_sharded_times(&mut eval, &r);
        ShardedEval { eval, result: r }
    }

    /// The FSDP baselines and the sharded search.
    pub(crate) fn sharded(&self) -> Result<ShardOutcome, PlanError> {
        let n = self.targets.len();
        let units = Units::of(self.g, self.facts);
        let plans: Vec<Plan> = (0..n).map(|t| self.dbs_plan(t)).collect();
        let uniform: Vec<u32> = self.targets.iter().map(|t| t.local_batch).collect();
        let mut pred = self.predictor_at(&plans, &uniform)?;
        let r = pred.result().clone();
        let per_sample: Vec<f64> =
            r.devices.iter().zip(&uniform).map(|(d, &b)| d.compute_us / f64::from(b.max(1))).collect();
        let counts: Vec<u32> = self.targets.iter().map(|t| t.count).collect();
        let dbs = if n > 1 && self.batch_bounds.0 != self.batch_bounds.1 {
            dbs_split(&per_sample, &counts, self.global_batch(), self.batch_bounds)
        } else {
            uniform.clone()
        };
        let same_nodes = {
            let shapes: std::collections::BTreeSet<u32> =
                pred.cluster().types.iter().flat_map(|t| t.nodes.iter().copied()).collect();
            shapes.len() == 1
        };
        let mut stages = vec![(Stage::FullShard, false), (Stage::FullShard, true), (Stage::ShardGradOp, false)];
        if same_nodes && pred.cluster().node_count() > 1 {
            stages.push((Stage::HybridShard, false));
        }
        // The 16-bit all-gather moves what AMP computes with: FP16 where
        // any type trains in FP16 (it has no BF16), else BF16.
        let fp16 = plans.iter().any(|p| p.iter().any(|(_, q)| q == Precision::Fp16));
        let sixteen = if fp16 { GatherPrecision::Fp16 } else { GatherPrecision::Bf16 };
        let devices: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        let pairs = self.shard_collectives.pairs(sixteen, devices, self.shard_error_budget);
        let mut out = ShardOutcome { units, fsdp: None, fsdp_dbs: None, best: None, searched: 0, smallest_need: None };
        let mut best: Option<ShardedEval> = None;
        let mut splits = vec![("fsdp", uniform.clone())];
        if dbs != uniform {
            splits.push(("fsdp-dbs", dbs));
        }
        for (key, batches) in splits {
            let mut pred = self.predictor_at(&plans, &batches)?;
            // The baseline: FULL_SHARD, equal shares, nothing else.
            let base = ShardSpec { gather: sixteen, ..ShardSpec::new(Stage::FullShard, n) };
            let r = predict_sharded(&mut pred, &out.units, &base)?;
            out.searched += 1;
            self.note_need(&mut out, &r);
            let e = self.sharded_eval(key, &mut pred, r.clone());
            if e.result.fits() {
                if key == "fsdp" {
                    out.fsdp = Some(e.clone());
                } else {
                    out.fsdp_dbs = Some(e.clone());
                }
                if best.as_ref().is_none_or(|b| e.eval.samples_per_s > b.eval.samples_per_s) {
                    best = Some(e);
                }
            }
            for &(stage, hpz) in &stages {
                for uneven in [false, true] {
                    if uneven && !matches!(stage, Stage::FullShard | Stage::ShardGradOp) {
                        continue;
                    }
                    // Checkpointing: off, on everywhere, on where needed.
                    let mut spec = ShardSpec { stage, hpz, uneven, gather: sixteen, ..ShardSpec::new(stage, n) };
                    let mut tries: Vec<Vec<bool>> = vec![vec![false; n], vec![true; n]];
                    let off = predict_sharded(&mut pred, &out.units, &spec)?;
                    let needed: Vec<bool> = off.devices.iter().map(|d| !d.fits).collect();
                    if needed.iter().any(|&x| x) && needed.iter().any(|&x| !x) {
                        tries.push(needed);
                    }
                    for ck in tries {
                        spec.checkpoint = ck;
                        for &(gather, reduce) in &pairs {
                            spec.gather = gather;
                            spec.reduce = reduce;
                            let r = predict_sharded(&mut pred, &out.units, &spec)?;
                            out.searched += 1;
                            self.note_need(&mut out, &r);
                            if r.fits() && best.as_ref().is_none_or(|b| r.samples_per_s > b.eval.samples_per_s) {
                                best = Some(self.sharded_eval("sharded", &mut pred, r));
                            }
                        }
                    }
                }
            }
        }
        out.best = best.map(|mut b| {
            b.eval.method = "sharded".into();
            b
        });
        Ok(out)
    }

    /// Keep the configuration whose fullest device needs the least memory
    /// over its capacity (for the "does not fit" message).
    fn note_need(&self, out: &mut ShardOutcome, r: &ShardedResult) {
        let worst = r
            .devices
            .iter()
            .max_by(|a, b| (a.memory.total / a.memory.capacity).total_cmp(&(b.memory.total / b.memory.capacity)));
        if let Some(d) = worst {
            let ratio = d.memory.total / d.memory.capacity;
            let better = out.smallest_need.as_ref().is_none_or(|(_, need, cap)| ratio < need / cap);
            if better {
                out.smallest_need = Some((d.name.clone(), d.memory.total, d.memory.capacity));
            }
        }
    }
}

/// The "does not fit anywhere" message.
pub(crate) fn does_not_fit(s: &ShardOutcome, ddp: &str) -> String {
    let gib = |b: f64| b / (1u64 << 30) as f64;
    match &s.smallest_need {
        Some((name, need, cap)) => format!(
            "the model does not fit: under DDP {ddp}; sharded (FSDP, ZeRO++, activation checkpointing) the smallest memory it needs is {:.2} GiB on each {name} against {:.2} GiB available (lower --batch, raise --memory, add devices)",
            gib(*need),
            gib(*cap)
        ),
        None => format!("the model does not fit: {ddp}"),
    }
}

/// `eval` (the DDP evaluation of the same plans) with the sharded run's
/// memory, fit and times in place of the data-parallel ones.
pub(crate) fn with_sharded_times(eval: &mut Eval, r: &ShardedResult) {
    for (te, d) in eval.types.iter_mut().zip(&r.devices) {
        te.peak_memory_bytes = d.memory.total.max(0.0) as u64;
        te.memory_capacity_bytes = d.memory.capacity.max(0.0) as u64;
        te.fits = d.fits;
        te.compute_ms = d.compute_us / 1e3;
        te.forward_end_ms = d.forward_end_us / 1e3;
        te.backward_end_ms = d.backward_end_us / 1e3;
        te.finish_ms = d.finish_us / 1e3;
    }
    eval.iteration_ms = r.iteration_us / 1e3;
    eval.samples_per_s = r.samples_per_s;
}
