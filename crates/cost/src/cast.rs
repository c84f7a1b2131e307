//! Cast costs: `time = r · elements + C` per (from, to) pair (Campo eq. 1),
//! with QSync's fixed-point variants: quantizing to INT8 (or scaled FP8) is
//! a two-stage min/max reduction, a scale computation and a quantize pass;
//! dequantizing is one elementwise pass. Each stage is linear in the tensor
//! size, so their sum is one linear model per pair.
//!
//! Analytic defaults come from DRAM bandwidth and launch overhead; a
//! calibration [`Profile`](crate::Profile) replaces them with least-squares
//! fits ([`fit_linear`]).

use serde::Serialize;

use crate::{CostError, Device, Precision, Result};

/// `seconds = r · elements + c`.
#[derive(Copy, Clone, PartialEq, Debug, Default, Serialize)]
pub struct LinearModel {
    /// Seconds per element.
    pub r: f64,
    /// Fixed seconds per cast (launch and setup).
    pub c: f64,
}

impl LinearModel {
    pub fn eval(&self, elements: f64) -> f64 {
        self.r * elements + self.c
    }
}

/// A least-squares fit with its error.
#[derive(Copy, Clone, PartialEq, Debug, Serialize)]
pub struct LinearFit {
    pub model: LinearModel,
    /// Coefficient of determination (1 = perfect).
    pub r2: f64,
    /// Largest |predicted − measured| / measured over the samples.
    pub max_rel_err: f64,
    pub samples: usize,
}

/// Ordinary least squares of `y = r·x + c` over `(x, y)` samples.
pub fn fit_linear(samples: &[(f64, f64)]) -> Result<LinearFit> {
    if samples.len() < 2 {
        return Err(CostError::Fit(format!("need at least 2 samples, got {}", samples.len())));
    }
    if samples.iter().any(|(x, y)| !x.is_finite() || !y.is_finite()) {
        return Err(CostError::Fit("samples must be finite".into()));
    }
    let n = samples.len() as f64;
    let mx = samples.iter().map(|s| s.0).sum::<f64>() / n;
    let my = samples.iter().map(|s| s.1).sum::<f64>() / n;
    let sxx: f64 = samples.iter().map(|s| (s.0 - mx).powi(2)).sum();
    let sxy: f64 = samples.iter().map(|s| (s.0 - mx) * (s.1 - my)).sum();
    if sxx <= 0.0 {
        return Err(CostError::Fit("all samples have the same size: the slope is undetermined".into()));
    }
    let r = sxy / sxx;
    let model = LinearModel { r, c: my - r * mx };
    let ss_res: f64 = samples.iter().map(|s| (s.1 - model.eval(s.0)).powi(2)).sum();
    let ss_tot: f64 = samples.iter().map(|s| (s.1 - my).powi(2)).sum();
    let r2 = if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 1.0 };
    let max_rel_err =
        samples.iter().filter(|s| s.1 != 0.0).map(|s| ((model.eval(s.0) - s.1) / s.1).abs()).fold(0.0, f64::max);
    Ok(LinearFit { model, r2, max_rel_err, samples: samples.len() })
}

/// Whether converting *to* `p` needs a scale (an amax / min-max reduction).
pub fn is_scaled(p: Precision) -> bool {
    matches!(p, Precision::Int8 | Precision::Fp8e4m3 | Precision::Fp8e5m2)
}

/// Linear cast models for every (from, to) pair on one device.
#[derive(Clone, PartialEq, Debug)]
pub struct CastModel {
    table: [[LinearModel; 7]; 7],
}

impl CastModel {
    /// Bandwidth-bound defaults: a float cast reads and writes each element
    /// once; quantization adds a min/max pass over the input (two kernels:
    /// per-block reduction, then the tree over blocks) and a scale kernel.
    pub fn analytic(dev: &Device) -> CastModel {
        let bw = dev.mem_bytes_per_s() * dev.efficiency.memory;
        let launch = dev.launch_s();
        let mut table = [[LinearModel::default(); 7]; 7];
        for from in Precision::ALL {
            for to in Precision::ALL {
                let same_storage = from.storage_dtype() == to.storage_dtype();
                table[from.index()][to.index()] = if same_storage {
                    LinearModel::default()
                } else if is_scaled(to) {
                    LinearModel { r: (2.0 * from.bytes() + to.bytes()) / bw, c: 3.0 * launch }
                } else {
                    LinearModel { r: (from.bytes() + to.bytes()) / bw, c: launch }
                };
            }
        }
        CastModel { table }
    }

    /// The model for `from → to`.
    pub fn model(&self, from: Precision, to: Precision) -> LinearModel {
        self.table[from.index()][to.index()]
    }

    /// Replace the model for `from → to` (calibration).
    pub fn set(&mut self, from: Precision, to: Precision, m: LinearModel) {
        self.table[from.index()][to.index()] = m;
    }

    /// Seconds to cast `elements` values from `from` to `to` (0 when equal storage).
    pub fn cast(&self, from: Precision, to: Precision, elements: f64) -> f64 {
        let m = self.model(from, to);
        if elements <= 0.0 || (m.r == 0.0 && m.c == 0.0) {
            0.0
        } else {
            m.eval(elements).max(0.0)
        }
    }

    /// QSync's float → INT8 quantization (min/max, scale, quantize).
    pub fn quantize(&self, from: Precision, elements: f64) -> f64 {
        self.cast(from, Precision::Int8, elements)
    }

    /// QSync's INT8 → float dequantization.
    pub fn dequantize(&self, to: Precision, elements: f64) -> f64 {
        self.cast(Precision::Int8, to, elements)
    }
}
