//! Value types: an element type and a shape of [`Dim`]s, either of which may
//! still be unknown before shape inference has run.

use std::fmt;

use crate::{DType, Dim};

/// A shape: one [`Dim`] per axis. A scalar has no axes.
pub type Shape = Vec<Dim>;

/// The type of a value. `dtype: None` or `shape: None` (unknown rank) means
/// not inferred yet; after `infer-shapes` both are known for every value the
/// inference could reach.
///
/// A value that is not a tensor (an ONNX sequence, optional or map) has a
/// `container` and neither dtype nor shape of its own: it is carried through
/// import, passes and export unchanged, and precision passes, which look
/// at float dtypes, leave it alone.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct TensorType {
    pub container: Option<Box<Container>>,
    pub dtype: Option<DType>,
    pub shape: Option<Shape>,
}

/// The non-tensor value types of ONNX, each over an element type (itself a
/// tensor or another container).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Container {
    /// `seq<T>`: a sequence of values of type T.
    Sequence(TensorType),
    /// `opt<T>`: a value of type T, or none.
    Optional(TensorType),
    /// `map<K, V>`: keys of the integer or string dtype K, values of type V.
    Map(DType, TensorType),
}

impl TensorType {
    pub fn new(dtype: DType, shape: Shape) -> TensorType {
        TensorType { container: None, dtype: Some(dtype), shape: Some(shape) }
    }

    pub fn unknown() -> TensorType {
        TensorType::default()
    }

    /// A sequence, optional or map type.
    pub fn of(c: Container) -> TensorType {
        TensorType { container: Some(Box::new(c)), dtype: None, shape: None }
    }

    /// Whether the value is a tensor (or of unknown type), not a container.
    pub fn is_tensor(&self) -> bool {
        self.container.is_none()
    }

    /// Both dtype and shape known, or a container type (complete as given).
    pub fn is_complete(&self) -> bool {
        self.container.is_some() || (self.dtype.is_some() && self.shape.is_some())
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
/// rank), `?[2,3]` (unknown element type), `?` (nothing known);
/// `seq<f32[2]>`, `opt<seq<f32>>`, `map<i64, f32[]>` for containers.
impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.container.as_deref() {
            Some(Container::Sequence(t)) => return write!(f, "seq<{t}>"),
            Some(Container::Optional(t)) => return write!(f, "opt<{t}>"),
            Some(Container::Map(k, t)) => return write!(f, "map<{k}, {t}>"),
            None => {}
        }
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
