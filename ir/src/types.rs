//! Value types: an element type and a shape of [`Dim`]s, either of which may
//! still be unknown before shape inference has run.

use std::fmt;

use crate::{DType, Dim};

/// A shape: one [`Dim`] per axis. A scalar has no axes.
pub type Shape = Vec<Dim>;

/// The type of a value. `dtype: None` or `shape: None` (unknown rank) means
/// not inferred yet; after `infer-shapes` both are known for every value the
/// inference could reach.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct TensorType {
    pub dtype: Option<DType>,
    pub shape: Option<Shape>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Shape) -> TensorType {
        TensorType { dtype: Some(dtype), shape: Some(shape) }
    }

    pub fn unknown() -> TensorType {
        TensorType::default()
    }

    pub fn is_complete(&self) -> bool {
        self.dtype.is_some() && self.shape.is_some()
    }

    pub fn rank(&self) -> Option<usize> {
        self.shape.as_ref().map(Vec::len)
    }

    /// The number of elements, as a dimension expression.
    pub fn numel(&self) -> Option<Dim> {
        self.shape.as_ref().map(|s| s.iter().fold(Dim::from(1), |a, d| a.mul(d)))
    }

    /// The shape as integers, when every dimension is known.
    pub fn concrete_shape(&self) -> Option<Vec<i64>> {
        self.shape.as_ref()?.iter().map(Dim::as_const).collect()
    }
}

/// Text syntax: `f32[batch,3,224,224]`, `i64[]` (scalar), `f32` (unknown
/// rank), `?[2,3]` (unknown element type), `?` (nothing known).
impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.dtype {
            Some(d) => write!(f, "{d}")?,
            None => f.write_str("?")?,
        }
        if let Some(shape) = &self.shape {
            f.write_str("[")?;
            for (i, d) in shape.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{d}")?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

impl fmt::Debug for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
