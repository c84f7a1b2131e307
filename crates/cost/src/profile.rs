//! Calibration profiles: measured costs that override the analytic model.
//!
//! A profile is JSON. Times are in microseconds; shapes are the concrete
//! shapes of the node's inputs in slot order (`null` for an omitted optional
//! input), exactly as [`NodeFacts::profile_key`](crate::NodeFacts) builds them:
//!
//! ```json
//! {
//!   "device": "t4",
//!   "ops": [
//!     { "op": "Gemm", "inputs": [[128, 768], [3072, 768], [3072]], "precision": "fp16",
//!       "fwd_us": 41.5, "bwd_input_us": 39.0, "bwd_weight_us": 40.2 }
//!   ],
//!   "casts": [
//!     { "from": "fp32", "to": "fp16", "samples": [[1048576, 21.0], [4194304, 74.5]] }
//!   ]
//! }
//! ```
//!
//! `bwd_input_us` / `bwd_weight_us` may be left out (the analytic value is
//! used). Cast samples are `[elements, microseconds]`; a `to` of `int8` is
//! QSync's whole quantization (min/max, scale, quantize), a `from` of `int8`
//! its dequantization. Each (from, to) needs at least two distinct sizes.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cast::{fit_linear, LinearFit};
use crate::{CostError, Precision, Result};

/// One measured operator.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpSample {
    pub op: String,
    pub inputs: Vec<Option<Vec<i64>>>,
    pub precision: Precision,
    pub fwd_us: f64,
    #[serde(default)]
    pub bwd_input_us: Option<f64>,
    #[serde(default)]
    pub bwd_weight_us: Option<f64>,
}

impl OpSample {
    /// The lookup key, matching `NodeFacts::profile_key`.
    pub fn key(&self) -> String {
        let shapes: Vec<String> = self
            .inputs
            .iter()
            .map(|s| match s {
                Some(s) => s.iter().map(i64::to_string).collect::<Vec<_>>().join("x"),
                None => "_".into(),
            })
            .collect();
        format!("{}|{}", self.op, shapes.join(","))
    }
}

/// Timing samples of one cast pair.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CastSamples {
    pub from: Precision,
    pub to: Precision,
    /// `[elements, microseconds]`.
    pub samples: Vec<(f64, f64)>,
}

/// A calibration profile for one device.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub ops: Vec<OpSample>,
    #[serde(default)]
    pub casts: Vec<CastSamples>,
}

/// Measured seconds of one op at one precision.
#[derive(Copy, Clone, PartialEq, Debug)]
pub struct Measured {
    pub fwd: f64,
    pub bwd_input: Option<f64>,
    pub bwd_weight: Option<f64>,
}

/// A fitted cast model with its error.
#[derive(Copy, Clone, PartialEq, Debug, Serialize)]
pub struct CastFit {
    pub from: Precision,
    pub to: Precision,
    /// The fit in seconds (r: s/element, c: s).
    pub fit: LinearFit,
}

impl Profile {
    /// Parse and check a profile; `file` names it in errors.
    pub fn from_json(text: &str, file: &str) -> Result<Profile> {
        let p: Profile =
            serde_json::from_str(text).map_err(|e| CostError::Profile { file: file.into(), message: e.to_string() })?;
        let bad = |m: String| CostError::Profile { file: file.into(), message: m };
        for (i, o) in p.ops.iter().enumerate() {
            for (what, v) in
                [("fwd_us", Some(o.fwd_us)), ("bwd_input_us", o.bwd_input_us), ("bwd_weight_us", o.bwd_weight_us)]
            {
                if let Some(v) = v {
                    if !(v.is_finite() && v >= 0.0) {
                        return Err(bad(format!("ops[{i}] ({}): {what} must be a non-negative number, got {v}", o.op)));
                    }
                }
            }
            if o.inputs.iter().flatten().flatten().any(|&d| d < 0) {
                return Err(bad(format!("ops[{i}] ({}): negative dimension", o.op)));
            }
        }
        for (i, c) in p.casts.iter().enumerate() {
            if c.samples.iter().any(|&(x, y)| !(x.is_finite() && y.is_finite() && x >= 0.0 && y >= 0.0)) {
                return Err(bad(format!(
                    "casts[{i}] ({} -> {}): samples must be non-negative [elements, us] pairs",
                    c.from, c.to
                )));
            }
        }
        Ok(p)
    }

    pub fn load_file(path: impl AsRef<Path>) -> Result<Profile> {
        let path = path.as_ref();
        let text =
            std::fs::read_to_string(path).map_err(|source| CostError::Io { path: path.to_path_buf(), source })?;
        Profile::from_json(&text, &path.display().to_string())
    }

    /// Measured op times by key and precision (later entries win).
    pub fn op_table(&self) -> HashMap<String, [Option<Measured>; 7]> {
        let mut t: HashMap<String, [Option<Measured>; 7]> = HashMap::new();
        for o in &self.ops {
            let m = Measured {
                fwd: o.fwd_us * 1e-6,
                bwd_input: o.bwd_input_us.map(|v| v * 1e-6),
                bwd_weight: o.bwd_weight_us.map(|v| v * 1e-6),
            };
            t.entry(o.key()).or_default()[o.precision.index()] = Some(m);
        }
        t
    }

    /// Least-squares fits of every cast pair (samples of a pair listed
    /// several times are pooled).
    pub fn cast_fits(&self) -> Result<Vec<CastFit>> {
        // (from, to, samples as (elements, seconds)).
        type Pair = (Precision, Precision, Vec<(f64, f64)>);
        let mut pairs: Vec<Pair> = Vec::new();
        for c in &self.casts {
            let pts = c.samples.iter().map(|&(x, us)| (x, us * 1e-6));
            match pairs.iter_mut().find(|(f, t, _)| *f == c.from && *t == c.to) {
                Some((_, _, v)) => v.extend(pts),
                None => pairs.push((c.from, c.to, pts.collect())),
            }
        }
        pairs
            .into_iter()
            .map(|(from, to, pts)| {
                let fit = fit_linear(&pts).map_err(|e| CostError::Fit(format!("cast {from} -> {to}: {e}")))?;
                Ok(CastFit { from, to, fit })
            })
            .collect()
    }
}
