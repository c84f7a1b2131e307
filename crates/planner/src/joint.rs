//! Joint batch split and precision: each device type gets its own local
//! batch *and* its own per-operator precisions.
//!
//! QSync keeps every device at the same local batch and only lowers the
//! precision of the slow ones; dynamic batch sizing (DBS) keeps FP32 and only
//! moves samples. On a cluster where an H100 is several times faster than a
//! T4 even at low precision, neither is enough: the T4 must both quantize and
//! take fewer samples. This module searches both together.
//!
//! **Model of a device type.** Under the predictor's linear batch rule
//! ([`qsync_sim::PredictOptions::reference_batch`]) a type's compute time
//! and peak memory are affine in its local batch: `c + a·b` and `m + k·b`.
//! Two predictions (at the reference batch and at twice it) give both lines
//! exactly, for any plan.
//!
//! **Split.** For one plan per type, [`split`] finds the integer local
//! batches `b_t ≥ 1` with `Σ count_t·b_t = B` (the global batch is kept) and
//! `m_t + k_t·b_t ≤ capacity_t` that minimise the slowest type's compute:
//! the smallest `T` whose capacity `Σ count_t·min(bmax_t, ⌊(T − c_t)/a_t⌋)`
//! reaches `B` (bisection), then an exact removal of the surplus samples
//! (greedy from the slowest type, a bounded change-making DP when greedy
//! cannot hit `B` exactly), moving `T` to the next breakpoint when no exact
//! removal exists. The uniform split is always feasible when the uniform
//! plan fits, so a split exists whenever UP or DBS exists.
//!
//! **Search.** Per inference type the options are its uniform levels and the
//! fastest class plan under memory (the allocator's knapsack); training
//! types keep their training plan. Every combination (at most a few hundred)
//! is split and estimated (slowest compute plus the exposed communication of
//! the uniform plan); candidates are then verified by a full prediction at
//! their split, and precision is recovered with QSync's max-heap at that
//! split (steps kept only when memory fits and throughput stays at the
//! floor). The split changes nothing in the gradient: the runtime weights
//! each device's gradient by `b_t / B`, so the update equals the
//! uniform-batch one.

use qsync_cost::{Plan, Precision};
use qsync_sim::Predictor;

use crate::context::Ctx;
use crate::types::{AllocOptions, Eval, Objective, PlanError};

/// What the joint search found.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// The smallest indicator sum at the floor (objective `Indicator`).
    pub at_floor: Option<Eval>,
    /// The fastest plan within the indicator bound.
    pub fastest: Option<Eval>,
    /// Combinations split and estimated.
    pub combinations: usize,
    /// Candidates verified by a full prediction.
    pub verified: usize,
}

/// Candidates verified by a full prediction, per objective, before the
/// search settles for the best verified one.
const VERIFY: usize = 3;

/// The joint search (module doc): per-type options from the uniform levels
/// and the fastest class plans, every combination split, the best verified
/// and its precision recovered.
#[allow(clippy::too_many_arguments)]
pub(crate) fn search(
    cx: &Ctx<'_>,
    up_plans: &[Plan],
    fastest: &[Option<Plan>],
    levels: &[Precision],
    t_min: f64,
    bound: f64,
    opts: &AllocOptions,
    up_pred: &mut Predictor<'_>,
) -> Result<Found, PlanError> {
    let n = cx.targets.len();
    let global = cx.global_batch();
    let r = up_pred.result();
    let max_compute = r.devices.iter().map(|d| d.compute_us).fold(0.0, f64::max);
    let exposed = (r.iteration_us - max_compute).max(0.0);

    let mut profiles: Vec<Vec<Plan>> = levels
        .iter()
        .map(|&p| (0..n).map(|t| if cx.levels[t].is_none() { up_plans[t].clone() } else { cx.uniform(t, p) }).collect())
        .collect();
    if fastest.iter().any(Option::is_some) {
        profiles.push((0..n).map(|t| fastest[t].clone().unwrap_or_else(|| up_plans[t].clone())).collect());
    }
    // A type's line depends on its own plan only.
    let mut options: Vec<Vec<(Plan, Line, f64)>> = vec![Vec::new(); n];
    let profile_lines = crate::par::map(&profiles, |plans| cx.lines(plans));
    for (plans, lines) in profiles.iter().zip(profile_lines) {
        let lines = lines?;
        for t in 0..n {
            if !options[t].iter().any(|(p, _, _)| *p == plans[t]) {
                let ind = if cx.levels[t].is_some() { cx.indicator_of(&plans[t]) } else { 0.0 };
                options[t].push((plans[t].clone(), lines[t], ind));
            }
        }
    }
    let cands = cx.combinations(&options, global, exposed, opts.combination_limit);
    let mut found = Found { combinations: cands.len(), ..Found::default() };

    // The fastest within the bound.
    let mut within: Vec<&Candidate> =
        cands.iter().filter(|c| c.indicator <= bound * (1.0 + 1e-9) + f64::MIN_POSITIVE).collect();
    within.sort_by(|a, b| a.estimate_us.total_cmp(&b.estimate_us).then(a.indicator.total_cmp(&b.indicator)));
    let mut best: Option<(f64, Predictor<'_>)> = None;
    let verified = crate::par::map(&within[..within.len().min(VERIFY)], |c| cx.verify(c));
    for pred in verified {
        found.verified += 1;
        let mut pred = pred?;
        let r = pred.result();
        let sps = r.samples_per_s;
        if r.devices.iter().all(|d| d.fits) && best.as_ref().is_none_or(|(s, _)| sps > *s) {
            best = Some((sps, pred));
        }
    }
    if let Some((sps, mut pred)) = best {
        cx.recover(&mut pred, sps)?;
        found.fastest = cx.fitting_eval("joint-fastest", &mut pred);
    }

    // The smallest indicator at the floor.
    if opts.objective == Objective::Indicator && t_min > 0.0 {
        let limit_us = global as f64 / t_min * 1e6;
        let mut meet: Vec<&Candidate> = cands.iter().filter(|c| c.estimate_us <= limit_us * (1.0 + 1e-6)).collect();
        meet.sort_by(|a, b| a.indicator.total_cmp(&b.indicator).then(a.estimate_us.total_cmp(&b.estimate_us)));
        for c in meet.iter().take(VERIFY) {
            found.verified += 1;
            let mut pred = cx.verify(c)?;
            let r = pred.result();
            if !(r.devices.iter().all(|d| d.fits) && r.samples_per_s >= t_min * (1.0 - 1e-9)) {
                continue;
            }
            cx.recover(&mut pred, t_min)?;
            found.at_floor = cx.fitting_eval("joint", &mut pred);
            break;
        }
    }
    Ok(found)
}

/// A device type's compute and memory as lines in its local batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Line {
    /// Devices of this type.
    pub count: u32,
    /// Compute µs at batch 0 (launches, weight casts, optimizer step).
    pub fixed_us: f64,
    /// Compute µs per sample.
    pub per_sample_us: f64,
    /// Peak memory bytes at batch 0 (weights, gradients, optimizer state).
    pub fixed_bytes: f64,
    /// Peak memory bytes per sample (saved activations, buffers).
    pub per_sample_bytes: f64,
    /// Available bytes (`None`: unbounded).
    pub capacity_bytes: Option<f64>,
    /// The smallest local batch the type may get (≥ 1).
    pub min_batch: u32,
    /// The largest local batch allowed besides memory (`u32::MAX`: none).
    pub batch_cap: u32,
}

impl Line {
    /// The smallest batch the type may get (`min_batch`, at least 1).
    pub fn min(&self) -> u32 {
        self.min_batch.max(1)
    }

    /// Compute µs at `b` samples.
    pub fn time(&self, b: u32) -> f64 {
        self.fixed_us + self.per_sample_us * f64::from(b)
    }

    /// The largest batch that fits memory and the cap (`u32::MAX` when
    /// unbounded).
    pub fn max_batch(&self) -> u32 {
        self.memory_batch().min(self.batch_cap)
    }

    fn memory_batch(&self) -> u32 {
        match self.capacity_bytes {
            None => u32::MAX,
            Some(cap) if self.per_sample_bytes <= 0.0 => {
                if self.fixed_bytes <= cap {
                    u32::MAX
                } else {
                    0
                }
            }
            Some(cap) => {
                ((cap - self.fixed_bytes) / self.per_sample_bytes).floor().clamp(0.0, f64::from(u32::MAX)) as u32
            }
        }
    }

    /// The largest batch finishing by `t` µs and fitting memory.
    fn batch_by(&self, t: f64) -> u32 {
        let by_time = if self.per_sample_us <= 0.0 {
            if t >= self.fixed_us {
                u32::MAX
            } else {
                0
            }
        } else {
            ((t - self.fixed_us) / self.per_sample_us).floor().clamp(0.0, f64::from(u32::MAX)) as u32
        };
        by_time.min(self.max_batch())
    }
}

/// Integer local batches, one per type, with `Σ count·b = global`, each
/// within the type's bounds (`min_batch ≥ 1`, memory, `batch_cap`),
/// minimising the slowest type's compute.
/// Returns the batches and that compute time (µs), or `None` when no split
/// fits.
pub fn split(lines: &[Line], global: u64) -> Option<(Vec<u32>, f64)> {
    if lines.is_empty() || lines.iter().any(|l| l.count == 0 || l.max_batch() < l.min()) {
        return None;
    }
    let capacity = |t: f64| -> u64 { lines.iter().map(|l| u64::from(l.count) * u64::from(l.batch_by(t))).sum() };
    let mem_cap: u64 = lines.iter().map(|l| u64::from(l.count).saturating_mul(u64::from(l.max_batch()))).sum();
    let min_needed: u64 = lines.iter().map(|l| u64::from(l.count) * u64::from(l.min())).sum();
    if mem_cap < global || global < min_needed {
        return None;
    }
    // Every type runs at least its smallest batch.
    let mut lo = lines.iter().map(|l| l.time(l.min())).fold(0.0f64, f64::max);
    if capacity(lo) >= global {
        // Even the one-sample floor covers the batch.
    } else {
        let mut hi = lo.max(1.0);
        while capacity(hi) < global {
            hi *= 2.0;
            if !hi.is_finite() {
                return None;
            }
        }
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if capacity(mid) >= global {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        lo = hi;
    }
    let mut t = lo;
    for _ in 0..256 {
        let batches: Vec<u32> = lines.iter().map(|l| l.batch_by(t).max(l.min())).collect();
        if let Some(exact) = remove_surplus(lines, &batches, global) {
            let time = exact.iter().zip(lines).map(|(&b, l)| l.time(b)).fold(0.0, f64::max);
            return Some((exact, time));
        }
        // No exact removal at this T: the next breakpoint.
        let next = lines
            .iter()
            .zip(&batches)
            .filter(|(l, &b)| b < l.max_batch())
            .map(|(l, &b)| l.time(b + 1))
            .fold(f64::INFINITY, f64::min);
        if !next.is_finite() {
            return None;
        }
        t = next;
    }
    None
}

/// Lower `batches` (each to ≥ its type's `min_batch`) so that `Σ count·b = global` exactly,
/// preferring to take samples from the slowest types.
fn remove_surplus(lines: &[Line], batches: &[u32], global: u64) -> Option<Vec<u32>> {
    let have: u64 = lines.iter().zip(batches).map(|(l, &b)| u64::from(l.count) * u64::from(b)).sum();
    let surplus = have.checked_sub(global)?;
    if surplus == 0 {
        return Some(batches.to_vec());
    }
    // Greedy from the slowest type.
    let mut order: Vec<usize> = (0..lines.len()).collect();
    order.sort_by(|&a, &b| lines[b].time(batches[b]).total_cmp(&lines[a].time(batches[a])).then(a.cmp(&b)));
    let mut out = batches.to_vec();
    let mut left = surplus;
    for &t in &order {
        let n = u64::from(lines[t].count);
        let r = (left / n).min(u64::from(out[t] - lines[t].min()));
        out[t] -= r as u32;
        left -= r * n;
    }
    if left == 0 {
        return Some(out);
    }
    // Change-making over the reductions: reach exactly `surplus` removed.
    const MAX_SURPLUS: u64 = 1 << 16;
    if surplus > MAX_SURPLUS {
        return None;
    }
    let s = surplus as usize;
    // reach[x] = Some((type, amount, previous x)) for the first way found.
    let mut reach: Vec<Option<(usize, u32, usize)>> = vec![None; s + 1];
    let mut reached = vec![false; s + 1];
    reached[0] = true;
    for &t in &order {
        let n = lines[t].count as usize;
        let max_r = (batches[t] - lines[t].min()) as usize;
        let before = reached.clone();
        for (x, _) in before.iter().enumerate().filter(|(_, &ok)| ok) {
            for r in 1..=max_r {
                let y = x + r * n;
                if y > s {
                    break;
                }
                if !reached[y] {
                    reached[y] = true;
                    reach[y] = Some((t, r as u32, x));
                }
            }
        }
        if reached[s] {
            break;
        }
    }
    if !reached[s] {
        return None;
    }
    let mut out = batches.to_vec();
    let mut x = s;
    while x > 0 {
        let (t, r, prev) = reach[x]?;
        out[t] -= r;
        x = prev;
    }
    Some(out)
}

/// One combination of per-type plans and its split, estimated.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    pub plans: Vec<Plan>,
    pub batches: Vec<u32>,
    /// Estimated iteration µs (slowest compute + exposed communication).
    pub estimate_us: f64,
    pub indicator: f64,
}

impl Ctx<'_> {
    /// Lines of every type under `plans`: two predictions, at the reference
    /// batch and at twice it.
    pub(crate) fn lines(&self, plans: &[Plan]) -> Result<Vec<Line>, PlanError> {
        let b0 = self.reference_batch();
        let at = |b: u32| -> Result<Vec<(f64, f64, Option<f64>)>, PlanError> {
            let mut pred = self.predictor_at(plans, &vec![b; plans.len()])?;
            Ok(pred
                .result()
                .devices
                .iter()
                .map(|d| (d.compute_us, d.peak_memory_bytes as f64, d.memory_capacity_bytes.map(|c| c as f64)))
                .collect())
        };
        let (one, two) = (at(b0)?, at(2 * b0)?);
        let db = f64::from(b0);
        Ok(one
            .iter()
            .zip(&two)
            .zip(&self.targets)
            .map(|((&(c1, m1, cap), &(c2, m2, _)), t)| {
                let per_sample_us = ((c2 - c1) / db).max(0.0);
                let per_sample_bytes = ((m2 - m1) / db).max(0.0);
                Line {
                    count: t.count,
                    fixed_us: (c1 - per_sample_us * db).max(0.0),
                    per_sample_us,
                    fixed_bytes: (m1 - per_sample_bytes * db).max(0.0),
                    per_sample_bytes,
                    capacity_bytes: cap,
                    min_batch: self.batch_bounds.0,
                    batch_cap: self.batch_bounds.1,
                }
            })
            .collect())
    }

    /// Every combination of per-type options, split and estimated.
    /// `options[t]` lists (plan, its line) pairs; `exposed_us` is the
    /// communication not hidden behind compute.
    pub(crate) fn combinations(
        &self,
        options: &[Vec<(Plan, Line, f64)>],
        global: u64,
        exposed_us: f64,
        limit: usize,
    ) -> Vec<Candidate> {
        let total = options.iter().try_fold(1usize, |a, o| a.checked_mul(o.len())).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        if total == 0 || total > limit {
            return out;
        }
        let mut idx = vec![0usize; options.len()];
        for _ in 0..total {
            let lines: Vec<Line> = idx.iter().zip(options).map(|(&k, o)| o[k].1).collect();
            if let Some((batches, t)) = split(&lines, global) {
                out.push(Candidate {
                    plans: idx.iter().zip(options).map(|(&k, o)| o[k].0.clone()).collect(),
                    batches,
                    estimate_us: t + exposed_us,
                    indicator: idx.iter().zip(options).map(|(&k, o)| o[k].2).sum(),
                });
            }
            for (i, o) in idx.iter_mut().zip(options) {
                *i += 1;
                if *i < o.len() {
                    break;
                }
                *i = 0;
            }
        }
        out
    }

    /// A verified prediction of `c` at its split.
    pub(crate) fn verify(&self, c: &Candidate) -> Result<Predictor<'_>, PlanError> {
        self.predictor_at(&c.plans, &c.batches)
    }

    /// Evaluate a predictor's plan under `method`, `None` when some device
    /// does not fit.
    pub(crate) fn fitting_eval(&self, method: &str, pred: &mut Predictor<'_>) -> Option<Eval> {
        if pred.result().devices.iter().all(|d| d.fits) {
            Some(self.eval(method, pred))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(count: u32, fixed: f64, per: f64) -> Line {
        Line {
            count,
            fixed_us: fixed,
            per_sample_us: per,
            fixed_bytes: 0.0,
            per_sample_bytes: 1.0,
            capacity_bytes: None,
            min_batch: 1,
            batch_cap: u32::MAX,
        }
    }

    #[test]
    fn split_keeps_each_types_batch_bounds() {
        // Unbounded, the fast type would take 29 of 30 samples and leave the
        // slow one a single sample; a minimum of 4 moves three back.
        let (fast, slow) = (line(1, 0.0, 1.0), line(1, 0.0, 20.0));
        let (free, _) = split(&[fast, slow], 30).expect("feasible");
        assert_eq!(free, vec![29, 1]);
        let floor = Line { min_batch: 4, ..slow };
        let (b, t) = split(&[fast, floor], 30).expect("feasible");
        assert_eq!(b, vec![26, 4]);
        assert_eq!(t, 80.0);
        // A type pinned to one batch (a graph that fixes it) takes exactly it.
        let pinned = |l: Line| Line { min_batch: 8, batch_cap: 8, ..l };
        let (b, _) = split(&[pinned(fast), pinned(slow)], 16).expect("feasible");
        assert_eq!(b, vec![8, 8]);
        assert!(split(&[pinned(fast), pinned(slow)], 17).is_none(), "pinned batches sum to 16");
        assert!(split(&[fast, Line { min_batch: 31, ..slow }], 30).is_none(), "the minimum alone exceeds the batch");
    }

    /// Brute force over all splits of small clusters.
    fn brute(lines: &[Line], global: u64) -> Option<f64> {
        fn go(lines: &[Line], i: usize, left: u64, worst: f64, best: &mut Option<f64>) {
            if i == lines.len() {
                if left == 0 && best.is_none_or(|b| worst < b) {
                    *best = Some(worst);
                }
                return;
            }
            let n = u64::from(lines[i].count);
            for b in 1..=lines[i].max_batch().min(200) {
                let used = n * u64::from(b);
                if used > left {
                    break;
                }
                go(lines, i + 1, left - used, worst.max(lines[i].time(b)), best);
            }
        }
        let mut best = None;
        go(lines, 0, global, 0.0, &mut best);
        best
    }

    #[test]
    fn split_matches_brute_force() {
        let cases: Vec<(Vec<Line>, u64)> = vec![
            (vec![line(1, 10.0, 1.0), line(1, 10.0, 4.0)], 20),
            (vec![line(2, 5.0, 1.0), line(3, 0.0, 3.0)], 31),
            (vec![line(4, 100.0, 2.5), line(4, 30.0, 9.0), line(2, 0.0, 0.5)], 64),
            (vec![line(3, 1.0, 1.0), line(5, 1.0, 7.0)], 8 * 16),
            (vec![line(1, 0.0, 1.0), line(1, 0.0, 1.0), line(1, 0.0, 1.0)], 10),
        ];
        for (lines, global) in cases {
            let (b, t) = split(&lines, global).expect("feasible");
            let total: u64 = b.iter().zip(&lines).map(|(&b, l)| u64::from(b) * u64::from(l.count)).sum();
            assert_eq!(total, global, "{b:?}");
            assert!(b.iter().all(|&b| b >= 1));
            let best = brute(&lines, global).expect("brute force finds one");
            assert!((t - best).abs() < 1e-9, "split {b:?} takes {t}, optimum {best}");
        }
    }

    #[test]
    fn split_respects_memory_and_reports_infeasible() {
        let mut fast = line(1, 0.0, 1.0);
        fast.capacity_bytes = Some(10.0);
        let slow = line(1, 0.0, 10.0);
        let (b, _) = split(&[fast, slow], 30).expect("feasible");
        assert_eq!(b, vec![10, 20], "the fast device is memory-bound at 10");
        let mut tiny = slow;
        tiny.capacity_bytes = Some(5.0);
        assert!(split(&[fast, tiny], 30).is_none(), "10 + 5 samples fit, 30 requested");
        let mut none = slow;
        none.fixed_bytes = 100.0;
        none.capacity_bytes = Some(50.0);
        assert!(split(&[fast, none], 5).is_none(), "a type that cannot hold one sample");
    }

    #[test]
    fn split_with_counts_hits_the_global_batch_exactly() {
        // 16 + 16 devices, B = 32·32: every solution has b1 + b2 = 64.
        let lines = [line(16, 50.0, 1.0), line(16, 10.0, 6.0)];
        let (b, t) = split(&lines, 32 * 32).expect("feasible");
        assert_eq!(b[0] + b[1], 64);
        assert!((t - brute(&lines, 32 * 32).expect("feasible")).abs() < 1e-9);
    }
}
