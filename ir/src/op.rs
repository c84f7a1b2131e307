//! Operators. Known ONNX operators are variants of [`Op`] (their attributes
//! live on the node, see [`crate::Node::attrs`]); anything else is
//! [`Op::Opaque`], which keeps its domain and type so it survives export.

use std::fmt;

use crate::DType;

/// What an operator is for, used for statistics (FLOPs per class) and by
/// precision policies as a first coarse grouping.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum OpClass {
    Conv,
    MatMul,
    Norm,
    Softmax,
    Pool,
    Reduce,
    Binary,
    Unary,
    Activation,
    Movement,
    Shape,
    Cast,
    Random,
    Recurrent,
    Control,
    Loss,
    Other,
    Opaque,
}

impl OpClass {
    pub fn name(self) -> &'static str {
        match self {
            OpClass::Conv => "conv",
            OpClass::MatMul => "matmul",
            OpClass::Norm => "norm",
            OpClass::Softmax => "softmax",
            OpClass::Pool => "pool",
            OpClass::Reduce => "reduce",
            OpClass::Binary => "binary",
            OpClass::Unary => "unary",
            OpClass::Activation => "activation",
            OpClass::Movement => "movement",
            OpClass::Shape => "shape",
            OpClass::Cast => "cast",
            OpClass::Random => "random",
            OpClass::Recurrent => "recurrent",
            OpClass::Control => "control",
            OpClass::Loss => "loss",
            OpClass::Other => "other",
            OpClass::Opaque => "opaque",
        }
    }
}

macro_rules! define_ops {
    ($($name:ident => $class:ident,)*) => {
        /// An operator. Variant names are the ONNX op types of the default domain.
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
        pub enum Op {
            $($name,)*
            /// An operator the IR does not know: kept by domain and type.
            Opaque { domain: String, op_type: String },
        }

        impl Op {
            /// Every known operator (not `Opaque`).
            pub const KNOWN: &'static [Op] = &[$(Op::$name,)*];

            /// The ONNX op type.
            pub fn op_type(&self) -> &str {
                match self {
                    $(Op::$name => stringify!($name),)*
                    Op::Opaque { op_type, .. } => op_type,
                }
            }

            pub fn class(&self) -> OpClass {
                match self {
                    $(Op::$name => OpClass::$class,)*
                    Op::Opaque { .. } => OpClass::Opaque,
                }
            }

            fn known_from_type(s: &str) -> Option<Op> {
                match s {
                    $(stringify!($name) => Some(Op::$name),)*
                    _ => None,
                }
            }
        }
    };
}

define_ops! {
    Conv => Conv,
    ConvTranspose => Conv,
    ConvInteger => Conv,
    QLinearConv => Conv,
    DeformConv => Conv,
    Gemm => MatMul,
    MatMul => MatMul,
    MatMulInteger => MatMul,
    QLinearMatMul => MatMul,
    Einsum => MatMul,
    BatchNormalization => Norm,
    LayerNormalization => Norm,
    InstanceNormalization => Norm,
    GroupNormalization => Norm,
    RMSNormalization => Norm,
    RotaryEmbedding => Binary,
    LpNormalization => Norm,
    MeanVarianceNormalization => Norm,
    LRN => Norm,
    Softmax => Softmax,
    LogSoftmax => Softmax,
    Hardmax => Softmax,
    MaxPool => Pool,
    AveragePool => Pool,
    GlobalAveragePool => Pool,
    GlobalMaxPool => Pool,
    LpPool => Pool,
    GlobalLpPool => Pool,
    MaxRoiPool => Pool,
    RoiAlign => Pool,
    MaxUnpool => Pool,
    ReduceSum => Reduce,
    ReduceMean => Reduce,
    ReduceMax => Reduce,
    ReduceMin => Reduce,
    ReduceProd => Reduce,
    ReduceL1 => Reduce,
    ReduceL2 => Reduce,
    ReduceLogSum => Reduce,
    ReduceLogSumExp => Reduce,
    ReduceSumSquare => Reduce,
    ArgMax => Reduce,
    ArgMin => Reduce,
    TopK => Reduce,
    CumSum => Reduce,
    Add => Binary,
    Sub => Binary,
    Mul => Binary,
    Div => Binary,
    Pow => Binary,
    Mod => Binary,
    Max => Binary,
    Min => Binary,
    Mean => Binary,
    Sum => Binary,
    PRelu => Binary,
    BitShift => Binary,
    And => Binary,
    Or => Binary,
    Xor => Binary,
    Equal => Binary,
    Less => Binary,
    LessOrEqual => Binary,
    Greater => Binary,
    GreaterOrEqual => Binary,
    BitwiseAnd => Binary,
    BitwiseOr => Binary,
    BitwiseXor => Binary,
    Abs => Unary,
    Neg => Unary,
    Exp => Unary,
    Log => Unary,
    Sqrt => Unary,
    Reciprocal => Unary,
    Floor => Unary,
    Ceil => Unary,
    Round => Unary,
    Sign => Unary,
    Sin => Unary,
    Cos => Unary,
    Tan => Unary,
    Asin => Unary,
    Acos => Unary,
    Atan => Unary,
    Sinh => Unary,
    Cosh => Unary,
    Asinh => Unary,
    Acosh => Unary,
    Atanh => Unary,
    Erf => Unary,
    Not => Unary,
    IsNaN => Unary,
    IsInf => Unary,
    BitwiseNot => Unary,
    Relu => Activation,
    LeakyRelu => Activation,
    Elu => Activation,
    Selu => Activation,
    Celu => Activation,
    Sigmoid => Activation,
    HardSigmoid => Activation,
    HardSwish => Activation,
    Swish => Activation,
    Tanh => Activation,
    Softplus => Activation,
    Softsign => Activation,
    Gelu => Activation,
    Mish => Activation,
    ThresholdedRelu => Activation,
    Clip => Activation,
    Shrink => Activation,
    Reshape => Movement,
    Transpose => Movement,
    Concat => Movement,
    Split => Movement,
    Slice => Movement,
    Gather => Movement,
    GatherElements => Movement,
    GatherND => Movement,
    ScatterElements => Movement,
    ScatterND => Movement,
    TensorScatter => Movement,
    Scatter => Movement,
    Squeeze => Movement,
    Unsqueeze => Movement,
    Expand => Movement,
    Flatten => Movement,
    Pad => Movement,
    Tile => Movement,
    DepthToSpace => Movement,
    SpaceToDepth => Movement,
    Resize => Movement,
    Upsample => Movement,
    Identity => Movement,
    Trilu => Movement,
    ReverseSequence => Movement,
    Compress => Movement,
    NonZero => Movement,
    OneHot => Movement,
    Where => Movement,
    Shape => Shape,
    Size => Shape,
    Constant => Shape,
    ConstantOfShape => Shape,
    Range => Shape,
    EyeLike => Shape,
    Cast => Cast,
    CastLike => Cast,
    QuantizeLinear => Cast,
    DequantizeLinear => Cast,
    DynamicQuantizeLinear => Cast,
    Dropout => Random,
    RandomNormal => Random,
    RandomUniform => Random,
    RandomNormalLike => Random,
    RandomUniformLike => Random,
    Bernoulli => Random,
    Multinomial => Random,
    LSTM => Recurrent,
    GRU => Recurrent,
    RNN => Recurrent,
    Attention => Recurrent,
    If => Control,
    Loop => Control,
    Scan => Control,
    SoftmaxCrossEntropyLoss => Loss,
    NegativeLogLikelihoodLoss => Loss,
    NonMaxSuppression => Other,
    Unique => Other,
    DFT => Other,
    STFT => Other,
    GridSample => Other,
    Col2Im => Other,
    ImageDecoder => Other,
}

impl Op {
    /// One-input ops whose output has the input's type and shape
    /// (elementwise activations and math, and the normalizations along an
    /// axis): shape inference copies the input type, the verifier wants one
    /// input.
    pub fn is_unary_same_shape(&self) -> bool {
        use Op::*;
        matches!(
            self,
            Abs | Neg
                | Exp
                | Log
                | Sqrt
                | Reciprocal
                | Floor
                | Ceil
                | Round
                | Sign
                | Sin
                | Cos
                | Tan
                | Asin
                | Acos
                | Atan
                | Sinh
                | Cosh
                | Asinh
                | Acosh
                | Atanh
                | Erf
                | Not
                | BitwiseNot
                | Relu
                | LeakyRelu
                | Elu
                | Selu
                | Celu
                | Sigmoid
                | HardSigmoid
                | HardSwish
                | Swish
                | Tanh
                | Softplus
                | Softsign
                | Gelu
                | Mish
                | ThresholdedRelu
                | Shrink
                | Identity
                | Softmax
                | LogSoftmax
                | Hardmax
                | LpNormalization
                | MeanVarianceNormalization
                | LRN
        )
    }

    /// Float input slots that are parameters of the op rather than data it
    /// computes on (Dropout's ratio, Resize's roi and scales, Upsample's
    /// scales): a precision plan keeps their dtype, and they do not decide
    /// the precision an op computes in.
    pub fn pins_input_dtype(&self, slot: usize) -> bool {
        match self {
            Op::Resize => slot == 1 || slot == 2,
            Op::Upsample | Op::Dropout => slot == 1,
            _ => false,
        }
    }

    /// Whether the ONNX schema of this op at `opset` accepts `dtype` on its
    /// first input, for the four computing float types (f16, bf16, f32,
    /// f64): `Celu` takes only f32, most ops gain bf16 at opset 13, `CumSum`
    /// gains f16 at 14. `None` when the schema does not constrain it here
    /// (opaque ops, non-float dtypes, first inputs that are not float).
    pub fn float_input_allowed(&self, opset: i64, dtype: DType) -> Option<bool> {
        self.float_input_allowed_at(0, opset, dtype)
    }

    /// Whether the schema accepts float `dtype` on input `slot` (a variadic
    /// op's last formal input stands for every further one). `None` when
    /// the schema does not say (opaque ops, non-float dtypes, ops or opsets
    /// the table lacks, a slot beyond the formal inputs).
    pub fn float_input_allowed_at(&self, slot: usize, opset: i64, dtype: DType) -> Option<bool> {
        float_input_allowed_at(self.op_type(), self.is_opaque(), slot, opset, dtype)
    }

    /// The op for an ONNX `(domain, op_type)`; the default domain is `""`
    /// or `"ai.onnx"`. Unknown pairs become [`Op::Opaque`].
    pub fn from_onnx(domain: &str, op_type: &str) -> Op {
        if domain.is_empty() || domain == "ai.onnx" {
            if let Some(op) = Op::known_from_type(op_type) {
                return op;
            }
        }
        Op::Opaque { domain: domain.to_string(), op_type: op_type.to_string() }
    }

    /// The ONNX domain (`""` for the default domain).
    pub fn domain(&self) -> &str {
        match self {
            Op::Opaque { domain, .. } => domain,
            _ => "",
        }
    }

    pub fn is_opaque(&self) -> bool {
        matches!(self, Op::Opaque { .. })
    }
}

/// Table lookup behind [`Op::float_input_allowed_at`].
pub fn float_input_allowed_at(op_type: &str, opaque: bool, slot: usize, opset: i64, dtype: DType) -> Option<bool> {
    let bit = match dtype {
        DType::F16 => 1u8,
        DType::BF16 => 2,
        DType::F32 => 4,
        DType::F64 => 8,
        _ => return None,
    };
    if opaque {
        return None;
    }
    let table = crate::op_types::INPUT_FLOATS;
    let start = table.partition_point(|(name, _, _)| *name < op_type);
    let masks = table[start..]
        .iter()
        .take_while(|(name, _, _)| *name == op_type)
        .filter(|(_, since, _)| *since <= opset)
        .last()
        .map(|(_, _, masks)| *masks)?;
    let mask = masks.get(slot).or(masks.last())?;
    Some(mask & bit != 0)
}

/// Whether node `n` may compute at float `dtype` under its schema at
/// `opset`: every input a plan would cast to `dtype` (float inputs, except
/// the slots [`Op::pins_input_dtype`] keeps) must accept it. `Some(false)`
/// names a refusal; `None` when the schema says nothing about those inputs.
pub fn node_float_allowed(g: &crate::Graph, n: crate::NodeId, opset: i64, dtype: DType) -> Option<bool> {
    let node = g.node(n);
    let mut verdict = None;
    for (slot, v) in node.inputs().iter().enumerate() {
        let Some(v) = v else { continue };
        if !g.ty(*v).dtype.is_some_and(DType::is_float) || node.op.pins_input_dtype(slot) {
            continue;
        }
        // Shape, Size, Cast and CastLike read any dtype in slot 0.
        if slot == 0 && matches!(node.op, Op::Shape | Op::Size | Op::Cast | Op::CastLike) {
            continue;
        }
        match node.op.float_input_allowed_at(slot, opset, dtype) {
            Some(false) => return Some(false),
            Some(true) => verdict = Some(true),
            None => {}
        }
    }
    verdict.or_else(|| node.op.float_input_allowed(opset, dtype))
}

/// Text syntax: `Conv` for known ops, `!domain::Type` for opaque ones.
impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Opaque { domain, op_type } => write!(f, "!{domain}::{op_type}"),
            _ => f.write_str(self.op_type()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_ops_round_trip_by_name() {
        for op in Op::KNOWN {
            assert_eq!(&Op::from_onnx("", op.op_type()), op);
        }
        assert!(Op::from_onnx("com.microsoft", "FusedMatMul").is_opaque());
        assert!(Op::from_onnx("", "NoSuchOp").is_opaque());
    }

    #[test]
    fn schema_float_constraints_follow_the_opset() {
        // Facts from the ONNX operator documentation (Operators.md).
        assert_eq!(Op::Celu.float_input_allowed(12, DType::F16), Some(false));
        assert_eq!(Op::Celu.float_input_allowed(21, DType::F32), Some(true));
        assert_eq!(Op::Relu.float_input_allowed(12, DType::BF16), Some(false));
        assert_eq!(Op::Relu.float_input_allowed(14, DType::BF16), Some(true));
        assert_eq!(Op::Relu.float_input_allowed(14, DType::F16), Some(true));
        assert_eq!(Op::CumSum.float_input_allowed(13, DType::F16), Some(false));
        assert_eq!(Op::CumSum.float_input_allowed(14, DType::F16), Some(true));
        assert_eq!(Op::Relu.float_input_allowed(14, DType::I8), None);
        assert_eq!(Op::from_onnx("x", "Celu").float_input_allowed(14, DType::F16), None);
        // Later inputs: Pow's exponent (T1) gains bf16 at 15, its base (T) at 13;
        // Where's condition takes no float; Sum's variadic inputs all follow T.
        assert_eq!(Op::Pow.float_input_allowed_at(1, 13, DType::BF16), Some(false));
        assert_eq!(Op::Pow.float_input_allowed_at(0, 13, DType::BF16), Some(true));
        assert_eq!(Op::Pow.float_input_allowed_at(1, 15, DType::BF16), Some(true));
        assert_eq!(Op::Where.float_input_allowed_at(0, 16, DType::F32), Some(false));
        assert_eq!(Op::Sum.float_input_allowed_at(5, 13, DType::BF16), Some(true));
        assert_eq!(Op::Sum.float_input_allowed_at(5, 12, DType::BF16), Some(false));
        let table = crate::op_types::INPUT_FLOATS;
        assert!(table.windows(2).all(|w| (w[0].0, w[0].1) < (w[1].0, w[1].1)), "sorted for the binary search");
    }
}
