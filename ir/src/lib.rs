//! # qsync-ir — the typed graph IR
//!
//! The representation every qsync layer works on: a dataflow [`Graph`] of
//! [`Node`]s over typed values ([`TensorType`]: a [`DType`] and a shape of
//! symbolic [`Dim`]s), with constant [`Tensor`]s as initializers and a
//! per-node compute precision that planning passes assign.
//!
//! Around it:
//! - [`text`]: the text format (printer and parser that round-trip exactly);
//! - [`verify`]: the verifier, which reports every problem at once;
//! - [`infer`]: dtype and shape inference for every known op, including the
//!   partial evaluation of shape arithmetic over symbolic dims.
//!
//! This crate knows nothing of ONNX protobufs, passes, devices or codegen.

pub mod attr;
pub mod dim;
pub mod dtype;
pub mod graph;
pub mod infer;
pub mod op;
mod op_types;
pub mod tensor;
pub mod text;
pub mod types;
pub mod upgrade;
pub mod verify;

pub use attr::{Attr, RawAttrKind};
pub use dim::Dim;
pub use dtype::DType;
pub use graph::{Capture, Graph, Model, Node, NodeId, NodeSpec, Scope, ValueData, ValueDef, ValueId, CAPTURE_SLOT};
pub use op::{Op, OpClass};
pub use tensor::{Tensor, TensorData};
pub use types::{Container, Shape, TensorType};
