//! Quantization scales of the QDQ pairs that materialization writes for
//! INT8 and FP8 compute.
//!
//! Every scale is symmetric, per tensor, zero point 0: `scale = absmax /
//! qmax`, with `qmax` the largest magnitude of the quantized type (127 for
//! INT8, 448 for FP8 E4M3), so the tensor's largest magnitude maps onto the
//! type's largest and nothing within the calibrated range is clipped.
//!
//! - **Weights** (initializers): `absmax` of their own values.
//! - **Activations** (every other value): `absmax` from the calibration
//!   statistics (`--stats`), given to materialization as
//!   [`ActivationRanges`] keyed by value name. An INT8 node reading an
//!   activation without a range is not quantized at all
//!   ([`uncalibrated_input`] says which value lacks one): a fixed-point
//!   format has no range of its own, and any guessed scale either clips the
//!   activation or wastes its bits. FP8 is a floating-point format: without
//!   a range its activations keep scale 1, i.e. the format's own range
//!   (±448), which represents them with FP8's relative precision and clips
//!   nothing below 448.

use std::collections::BTreeMap;

use qsync_ir::{DType, Graph, NodeId, ValueId};

use super::materialize::{any_dtype_input, pinned_input};

/// The largest magnitude of a quantized type.
pub fn qmax(q: DType) -> f64 {
    match q {
        DType::I8 => 127.0,
        _ => 448.0,
    }
}

/// `absmax / qmax`; `None` for a range that gives no usable scale (zero,
/// negative, not finite).
pub fn scale_for(absmax: f64, q: DType) -> Option<f64> {
    (absmax > 0.0 && absmax.is_finite()).then(|| absmax / qmax(q))
}

/// The largest magnitude of some values (0 for none).
pub fn absmax(values: &[f64]) -> f64 {
    values.iter().fold(0.0f64, |a, x| a.max(x.abs()))
}

/// Calibrated per-tensor ranges of activations: each value's largest
/// magnitude, by value name (names are stable through every pass).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ActivationRanges {
    absmax: BTreeMap<String, f64>,
}

impl ActivationRanges {
    /// Record `absmax` for the value named `name`. A range that gives no
    /// usable scale is ignored (returns false); a value given two ranges
    /// (two calibrated readers of one value) keeps the larger, so neither
    /// reader's values are clipped.
    pub fn insert(&mut self, name: impl Into<String>, absmax: f64) -> bool {
        if scale_for(absmax, DType::I8).is_none() {
            return false;
        }
        let e = self.absmax.entry(name.into()).or_insert(absmax);
        *e = e.max(absmax);
        true
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.absmax.get(name).copied()
    }

    pub fn len(&self) -> usize {
        self.absmax.len()
    }

    pub fn is_empty(&self) -> bool {
        self.absmax.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.absmax.iter().map(|(k, v)| (k.as_str(), *v))
    }
}

/// Whether a QDQ of `v` takes its scale from [`ActivationRanges`]: every
/// value but an initializer (whose scale comes from its own data).
pub fn needs_range(g: &Graph, v: ValueId) -> bool {
    g.value(v).init().is_none()
}

/// The first value node `n` would read through an INT8 QDQ pair (float,
/// not a pinned slot) that needs a calibrated range and has none in
/// `ranges`; `None` when every such value has one, so `n` may be INT8.
pub fn uncalibrated_input(g: &Graph, n: NodeId, ranges: &ActivationRanges) -> Option<ValueId> {
    let node = g.node(n);
    node.inputs().iter().enumerate().find_map(|(slot, v)| {
        let v = (*v)?;
        let float = g.ty(v).dtype.is_some_and(DType::is_float);
        let quantized = float && !pinned_input(&node.op, slot) && !(slot == 0 && any_dtype_input(&node.op));
        (quantized && needs_range(g, v) && ranges.get(g.value_name(v)).is_none()).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: an activation whose calibrated largest magnitude is 2.54
    /// gets 2.54 / 127 = 0.02 in INT8 (so 2.54 ↦ code 127, 0.03 ↦ round(1.5)
    /// = 2), and 2.54 / 448 = 0.00566964… in FP8 E4M3; a weight [0.5, -4,
    /// 1, 2] gets 4 / 127 = 0.0314960…
    #[test]
    fn scales_by_hand() {
        let s = scale_for(2.54, DType::I8).expect("scale");
        assert!((s - 0.02).abs() < 1e-15, "{s}");
        assert_eq!((2.54 / s).round(), 127.0);
        assert_eq!((0.03 / s).round_ties_even(), 2.0);
        let f8 = scale_for(2.54, DType::F8E4M3).expect("scale");
        assert!((f8 - 0.005_669_642_857_142_857).abs() < 1e-15, "{f8}");
        let w = absmax(&[0.5, -4.0, 1.0, 2.0]);
        assert_eq!(w, 4.0);
        assert!((scale_for(w, DType::I8).expect("scale") - 0.031_496_062_992_125_98).abs() < 1e-15);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(scale_for(bad, DType::I8), None, "{bad}");
        }
    }

    #[test]
    fn ranges_keep_the_larger_and_ignore_unusable() {
        let mut r = ActivationRanges::default();
        assert!(r.insert("x", 2.0));
        assert!(r.insert("x", 3.0));
        assert!(r.insert("x", 1.0));
        assert_eq!(r.get("x"), Some(3.0));
        assert!(!r.insert("y", 0.0));
        assert!(!r.insert("z", f64::NAN));
        assert_eq!(r.get("y"), None);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn uncalibrated_input_names_the_activation_not_the_weight() {
        let m = qsync_ir::text::parse_model(
            r#"opset "" 17
graph "g" {
  init %w: f32[2,2] = [0.5, -4.0, 1.0, 2.0]
  input %x: f32[2,2]
  input %y: f32[2,2]
  %a: f32[2,2] = MatMul "mm"(%x, %w)
  %b: f32[2,2] = MatMul "qk"(%a, %y)
  output %b
}"#,
        )
        .expect("parses");
        let g = &m.graph;
        let id = |name: &str| g.node_ids().into_iter().find(|&n| g.node(n).name == name).expect("node");
        let mut r = ActivationRanges::default();
        assert_eq!(uncalibrated_input(g, id("mm"), &r).map(|v| g.value_name(v).to_string()), Some("x".into()));
        r.insert("x", 1.0);
        assert_eq!(uncalibrated_input(g, id("mm"), &r), None, "the weight's scale comes from its data");
        r.insert("a", 1.0);
        assert_eq!(uncalibrated_input(g, id("qk"), &r).map(|v| g.value_name(v).to_string()), Some("y".into()));
    }
}
