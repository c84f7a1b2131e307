//! QSync's max-heap recovery (Sec. V): from a plan that fits, raise the
//! precision of the operator whose indicator drops most, one step at a time
//! per inference type, keeping a step only while memory fits and throughput
//! keeps the floor. QSync's greedy and ours recover from their starts, the
//! joint search at its split.

use std::collections::BinaryHeap;

use qsync_cost::Precision;
use qsync_ir::NodeId;
use qsync_sim::Predictor;

use crate::context::Ctx;
use crate::types::PlanError;

impl Ctx<'_> {
    /// Max-heap recovery (QSync Sec. V) on `pred`, in place. Returns (tried, kept).
    pub(crate) fn recover(&self, pred: &mut Predictor<'_>, t_min: f64) -> Result<(usize, usize), PlanError> {
        let mut heaps: Vec<BinaryHeap<Step>> = Vec::new();
        for t in 0..self.targets.len() {
            let mut h = BinaryHeap::new();
            if self.levels[t].is_some() {
                let plan = pred.plan(t).cloned().unwrap_or_default();
                for &n in &self.candidates {
                    if let Some(s) = self.next_step(t, n, plan.get(n).unwrap_or(Precision::Fp32)) {
                        h.push(s);
                    }
                }
            }
            heaps.push(h);
        }
        let (mut tried, mut kept) = (0, 0);
        loop {
            let mut any = false;
            for (t, heap) in heaps.iter_mut().enumerate() {
                let Some(s) = heap.pop() else { continue };
                any = true;
                tried += 1;
                pred.set_precision(t, s.node, s.to)?;
                let r = pred.result();
                let ok = r.devices.iter().all(|d| d.fits) && r.samples_per_s >= t_min * (1.0 - 1e-9);
                if ok {
                    kept += 1;
                    if let Some(next) = self.next_step(t, s.node, s.to) {
                        heap.push(next);
                    }
                } else {
                    pred.set_precision(t, s.node, s.from)?;
                }
            }
            if !any {
                return Ok((tried, kept));
            }
        }
    }

    fn next_step(&self, t: usize, n: NodeId, from: Precision) -> Option<Step> {
        let to = self.allowed(t, n).into_iter().rev().find(|q| q.bits() > from.bits())?;
        let dec = self.ind.omega(n, from) - self.ind.omega(n, to);
        Some(Step { dec, node: n, from, to })
    }
}

#[derive(Debug, Clone, Copy)]
struct Step {
    dec: f64,
    node: NodeId,
    from: Precision,
    to: Precision,
}

impl PartialEq for Step {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for Step {}
impl PartialOrd for Step {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Step {
    /// Largest decrement first; ties to the earlier node (determinism).
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.dec.total_cmp(&o.dec).then_with(|| o.node.index().cmp(&self.node.index()))
    }
}
