//! The exact mean (in f64) and the documented error bound of every scheme,
//! evaluated from all ranks' gradients — the independent check a test or
//! the benchmark holds a synchronization result against.
//!
//! The formulas are those in the module docs of [`crate::sync::half`],
//! [`crate::sync::qgz`] and [`crate::sync::nbit`]; this module evaluates them
//! in f64 from the inputs alone (no value the synchronization computed
//! enters), streaming over ranks so memory stays `O(n)`. They assume finite
//! inputs and a first step (no error-feedback residual yet).

use qsync_kernels::{Half, QBits, Rounding};

use crate::comm::{ClusterShape, NodeMap};
use crate::scheme::{Gather, Kind, SyncConfig};
use crate::sync::block::shards;

const EPS: f64 = 1.0 / 16_777_216.0; // 2^-24

/// Exact mean and per-element bound.
#[derive(Clone, Debug)]
pub struct Reference {
    pub mean: Vec<f64>,
    pub bound: Vec<f64>,
}

/// Largest error of one quantization with scale `s`.
fn q_err(s: f64, rounding: Rounding) -> f64 {
    let k = match rounding {
        Rounding::Nearest => 0.5,
        Rounding::Stochastic => 1.0,
    };
    s * (k + 1.0 / 1024.0)
}

fn qmax(b: QBits) -> f64 {
    f64::from(b.qmax())
}

/// For every element, `f` over the group it belongs to (groups of `group`
/// from each shard's start), spread back to the group's elements.
fn per_group(v: &[f64], p: usize, group: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut out = vec![0.0; v.len()];
    for range in shards(v.len(), p) {
        for (gi, chunk) in v[range.clone()].chunks(group.max(1)).enumerate() {
            let val = f(chunk);
            let start = range.start + gi * group.max(1);
            out[start..start + chunk.len()].iter_mut().for_each(|o| *o = val);
        }
    }
    out
}

fn absmax(c: &[f64]) -> f64 {
    c.iter().fold(0.0, |a, v| a.max(v.abs()))
}

fn maxof(c: &[f64]) -> f64 {
    c.iter().fold(0.0, |a, &v| a.max(v))
}

/// The exact mean of `grad(r)` over the world and the bound of `cfg`'s
/// scheme for it. `grad(r)` must return rank `r`'s gradient of `n` elements.
pub fn reference(cfg: &SyncConfig, shape: ClusterShape, n: usize, grad: &dyn Fn(usize) -> Vec<f32>) -> Reference {
    reference_on(cfg, &NodeMap::from(shape), n, grad)
}

/// [`reference`] for nodes of any size: `map` gives every rank's node.
pub fn reference_on(cfg: &SyncConfig, map: &NodeMap, n: usize, grad: &dyn Fn(usize) -> Vec<f32>) -> Reference {
    let p = map.world();
    let pf = p as f64;
    let rounding = cfg.scheme.rounding;
    let g = cfg.group.max(1);
    let mut sum = vec![0.0f64; n];
    let mut bound_sum = vec![0.0f64; n];
    let as64 = |r: usize| grad(r).into_iter().map(f64::from).collect::<Vec<f64>>();

    match cfg.scheme.kind {
        Kind::Fp32 => {
            let mut abs = vec![0.0; n];
            for r in 0..p {
                for (i, v) in as64(r).into_iter().enumerate() {
                    sum[i] += v;
                    abs[i] += v.abs();
                }
            }
            let mean: Vec<f64> = sum.iter().map(|s| s / pf).collect();
            let bound = mean.iter().zip(&abs).map(|(m, a)| (pf + 1.0) * EPS * a / pf + m.abs() * EPS).collect();
            return Reference { mean, bound };
        }
        Kind::Half(h) => {
            let (u, eta, range) = match h {
                Half::F16 => (1.0 / 2048.0, 2f64.powi(-25), 65504.0),
                Half::BF16 => (1.0 / 256.0, 2f64.powi(-134), f64::from(f32::MAX)),
            };
            let mut e1 = vec![0.0; n];
            let mut abs = vec![0.0; n];
            let mut overflow = vec![false; n];
            for r in 0..p {
                for (i, v) in as64(r).into_iter().enumerate() {
                    sum[i] += v;
                    let share = v.abs() / pf;
                    e1[i] += share * (u + EPS) + eta;
                    abs[i] += share;
                    overflow[i] |= share >= range;
                }
            }
            let mean: Vec<f64> = sum.iter().map(|s| s / pf).collect();
            let bound = (0..n)
                .map(|i| {
                    let e2 = (pf + 1.0) * EPS * abs[i] * (1.0 + u);
                    let e = e1[i] + e2;
                    if overflow[i] || mean[i].abs() + e >= range {
                        f64::INFINITY
                    } else {
                        e + (mean[i].abs() + e) * u + eta
                    }
                })
                .collect();
            return Reference { mean, bound };
        }
        Kind::NBit(bits) => {
            let levels = f64::from((1u32 << bits) - 1);
            let k = match rounding {
                Rounding::Nearest => 0.5,
                Rounding::Stochastic => 1.0,
            };
            let mut per_rank = 0.0;
            for r in 0..p {
                let x = as64(r);
                let mn = x.iter().copied().fold(f64::INFINITY, f64::min);
                let mx = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                x.iter().enumerate().for_each(|(i, v)| sum[i] += v);
                if n > 0 {
                    let gap = (mx - mn) / levels;
                    per_rank += gap * (k + 1.0 / 1024.0) + (mn.abs() + mx.abs()) * 2f64.powi(-21);
                    per_rank += (pf + 1.0) * EPS * mn.abs().max(mx.abs());
                }
            }
            let mean: Vec<f64> = sum.iter().map(|s| s / pf).collect();
            let bound = mean.iter().map(|m| per_rank / pf + m.abs() * EPS).collect();
            return Reference { mean, bound };
        }
        Kind::Qgz { intra, inter: None } => {
            let qm = qmax(intra);
            let mut slop = vec![0.0; n];
            for r in 0..p {
                let x = as64(r);
                let a = per_group(&x, p, g, absmax);
                for i in 0..n {
                    sum[i] += x[i];
                    bound_sum[i] += q_err(a[i] / qm, rounding);
                    slop[i] += a[i] + a[i] / qm;
                }
            }
            for i in 0..n {
                bound_sum[i] += (pf + 1.0) * EPS * slop[i];
            }
        }
        Kind::Qgz { intra, inter: Some(inter) } => {
            let nodes = map.nodes();
            let (qm1, qm2) = (qmax(intra), qmax(inter));
            let mut slop2 = vec![0.0; n];
            for node in 0..nodes {
                let mut partial = vec![0.0f64; n];
                let mut e1 = vec![0.0f64; n];
                let mut slop1 = vec![0.0f64; n];
                let members = map.members(node);
                let l = members.len();
                // A rank alone on its node sends its gradient on as the
                // node's partial, unquantized: no intra-node error.
                let quantized = l > 1;
                for &r in members {
                    let x = as64(r);
                    if quantized {
                        let a = per_group(&x, p, g, absmax);
                        for i in 0..n {
                            e1[i] += q_err(a[i] / qm1, rounding);
                            slop1[i] += a[i] + a[i] / qm1;
                        }
                    }
                    partial.iter_mut().zip(&x).for_each(|(s, v)| *s += v);
                }
                if quantized {
                    for i in 0..n {
                        e1[i] += (l as f64 + 1.0) * EPS * slop1[i];
                    }
                }
                let b: Vec<f64> = per_group(&partial, p, g, absmax)
                    .into_iter()
                    .zip(per_group(&e1, p, g, maxof))
                    .map(|(a, e)| a + e)
                    .collect();
                for i in 0..n {
                    sum[i] += partial[i];
                    bound_sum[i] += e1[i] + q_err(b[i] / qm2, rounding);
                    slop2[i] += b[i] + b[i] / qm2;
                }
            }
            for i in 0..n {
                bound_sum[i] += (nodes as f64 + 1.0) * EPS * slop2[i];
            }
        }
    }

    // qgZ: mean of the reduce-scatter, then the all-gather.
    let mean: Vec<f64> = sum.iter().map(|s| s / pf).collect();
    let e_rs: Vec<f64> = (0..n).map(|i| bound_sum[i] / pf + mean[i].abs() * EPS).collect();
    let gather_bits = match (cfg.scheme.kind, cfg.gather) {
        (_, Gather::F32) => None,
        (Kind::Qgz { inter: Some(b), .. }, _) | (Kind::Qgz { intra: b, inter: None }, _) => Some(b),
        _ => None,
    };
    let bound = match gather_bits {
        None => e_rs,
        Some(b) => {
            let a = per_group(&mean, p, g, absmax);
            let e = per_group(&e_rs, p, g, maxof);
            (0..n).map(|i| e_rs[i] + q_err((a[i] + e[i]) / qmax(b), rounding) + EPS * (a[i] + e[i])).collect()
        }
    };
    Reference { mean, bound }
}

/// Elements whose error exceeds the bound: `(count, max |error|, max bound,
/// largest error/bound ratio)`. Non-finite expected values are skipped
/// (they are checked for propagation separately).
pub fn compare(result: &[f32], reference: &Reference) -> (usize, f64, f64, f64) {
    let mut violations = 0;
    let (mut max_err, mut max_bound, mut ratio) = (0.0f64, 0.0f64, 0.0f64);
    for ((&r, &m), &b) in result.iter().zip(&reference.mean).zip(&reference.bound) {
        if !m.is_finite() {
            continue;
        }
        let err = (f64::from(r) - m).abs();
        let err = if err.is_nan() { f64::INFINITY } else { err };
        if err > b {
            violations += 1;
        }
        max_err = max_err.max(err);
        max_bound = max_bound.max(b);
        if b > 0.0 {
            ratio = ratio.max(err / b);
        } else if err > 0.0 {
            ratio = f64::INFINITY;
        }
    }
    (violations, max_err, max_bound, ratio)
}
