//! One small text-IR graph per structured MLIR lowering: it maps with no
//! generic `qsync.*` op, names the expected linalg/tensor ops, and the module
//! verifies with `mlir-opt-22` and no flag (skipped, with the reason printed,
//! when the tool is not installed).

use std::process::Command;

use qsync_codegen::{emit_mlir, emit_mlir_model, MlirOutput};
use qsync_ir::infer::{infer_shapes, InferOptions};

fn emit(name: &str, body: &str) -> MlirOutput {
    emit_at(18, name, body)
}

/// [`emit`] for a model of the given default-domain opset (the emitter is
/// told it).
fn emit_at(opset: i64, name: &str, body: &str) -> MlirOutput {
    let text = format!("opset \"\" {opset}\ngraph \"{name}\" {{\n{body}\n}}\n");
    let mut m = qsync_ir::text::parse_model(&text).expect("text IR");
    let opset = m.opset();
    infer_shapes(&mut m.graph, opset, &InferOptions::default());
    let out = emit_mlir_model(&m, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(out.all_ops_mapped(), "{name}: generic {:?}\n{}", out.generic_ops, out.text);
    let again = emit_mlir_model(&m, name).expect("second emission");
    assert_eq!(out.text, again.text, "{name}: emission is deterministic");
    mlir_opt_plain(&out.text, name);
    out
}

/// `mlir-opt-22` with no flag accepts the module.
fn mlir_opt_plain(text: &str, tag: &str) {
    let tool = std::env::var("QSYNC_MLIR_OPT").unwrap_or_else(|_| "mlir-opt-22".into());
    let path = std::env::temp_dir().join(format!("qsync-lowering-{}-{tag}.mlir", std::process::id()));
    std::fs::write(&path, text).expect("write mlir");
    let out = match Command::new(&tool).arg(&path).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipping the mlir-opt check of {tag}: `{tool}` cannot run ({e})");
            return;
        }
    };
    let _ = std::fs::remove_file(&path);
    assert!(out.status.success(), "{tag}: {tool} rejected:\n{}\n{text}", String::from_utf8_lossy(&out.stderr));
}

/// The arguments of the module's function, as MLIR printed them.
fn params(out: &MlirOutput) -> Vec<String> {
    let line = out.text.lines().find(|l| l.contains("func.func @")).expect("a func.func");
    let inner = &line[line.find('(').expect("(") + 1..line.find(") ->").expect(") ->")];
    let mut args = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '<' | '{' | '(' | '[' => depth += 1,
            '>' | '}' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                args.push(inner[start..i].trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    if !inner.trim().is_empty() {
        args.push(inner[start..].trim().to_string());
    }
    args
}

/// The signature carries no `rng_offset` argument: `n` arguments, for the
/// inputs and initializers.
fn no_offset(out: &MlirOutput, n: usize) {
    let args = params(out);
    assert!(!out.rng_offset && !out.text.contains("rng_offset"), "no random op, no offset:\n{}", out.text);
    assert_eq!(args.len(), n, "inputs and initializers only: {args:?}");
}

fn has(out: &MlirOutput, ops: &[&str]) {
    for op in ops {
        assert!(out.text.contains(op), "missing {op}:\n{}", out.text);
    }
}

#[test]
fn conv_with_bias_pads_and_strides() {
    let out = emit(
        "conv",
        r#"  input %x: f16[batch,3,9,9]
  input %w: f16[8,3,3,3]
  input %b: f16[8]
  %y = Conv "conv"(%x, %w, %b) {pads=[1, 1, 1, 1], strides=[2, 2], kernel_shape=[3, 3]} @f16
  output %y"#,
    );
    has(
        &out,
        &["tensor.pad", "linalg.broadcast", "linalg.conv_2d_nchw_fchw", "tensor.dim", "qsync.precision = \"f16\""],
    );
    assert!(out.text.contains("tensor<?x8x5x5xf16>"), "{}", out.text);
}

#[test]
fn conv_same_upper_without_bias() {
    let out = emit(
        "conv_same",
        r#"  input %x: f32[1,2,7,7]
  input %w: f32[4,2,3,3]
  %y = Conv "conv"(%x, %w) {auto_pad="SAME_UPPER", dilations=[2, 2]}
  output %y"#,
    );
    has(&out, &["linalg.fill", "linalg.conv_2d_nchw_fchw", "tensor<1x2x11x11xf32>"]);
}

#[test]
fn grouped_conv_uses_the_grouped_named_op() {
    let out = emit(
        "depthwise",
        r#"  input %x: f32[batch,4,6,6]
  input %w: f32[4,1,3,3]
  %y = Conv "dw"(%x, %w) {group=4, pads=[1, 1, 1, 1]}
  output %y"#,
    );
    has(&out, &["tensor.expand_shape", "linalg.conv_2d_ngchw_gfchw", "tensor.collapse_shape"]);
}

#[test]
fn max_pool_in_ceil_mode_pads_with_minus_infinity() {
    let out = emit(
        "maxpool",
        r#"  input %x: f16[batch,2,8,8]
  %y = MaxPool "pool"(%x) {kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1}
  output %y"#,
    );
    has(&out, &["linalg.pooling_nchw_max", "tensor.pad", "0xFC00"]);
}

#[test]
fn average_pool_divides_by_window_or_valid_counts() {
    let out = emit(
        "avgpool",
        r#"  input %x: f32[1,2,6,6]
  %y = AveragePool "uniform"(%x) {kernel_shape=[2, 2], strides=[2, 2]}
  %z = AveragePool "excl"(%x) {kernel_shape=[3, 3], pads=[1, 1, 1, 1]}
  output %y, %z"#,
    );
    has(&out, &["linalg.pooling_nchw_sum", "arith.divf", "dense<1.000000e+00>"]);
}

#[test]
fn global_average_pool_flatten_and_gemm() {
    let out = emit(
        "head",
        r#"  input %x: f16[batch,8,4,4]
  input %w: f16[10,8]
  input %b: f16[10]
  %p = GlobalAveragePool "gap"(%x)
  %f = Flatten "flat"(%p) {axis=1}
  %y = Gemm "fc"(%f, %w, %b) {transB=1, alpha=0.5}
  output %y"#,
    );
    has(&out, &["linalg.generic", "\"reduction\"", "arith.extf", "tensor.collapse_shape", "linalg.matmul"]);
}

#[test]
fn reshape_concat_and_reduce_mean() {
    let out = emit(
        "shapes",
        r#"  input %x: f32[2,3,4]
  input %y: f32[2,5,4]
  init %s: i64[2] = [2, -1]
  init %ax: i64[1] = [2]
  %c = Concat "cat"(%x, %y) {axis=1}
  %r = Reshape "re"(%c, %s)
  %m = ReduceMean "mean"(%c, %ax) {keepdims=0}
  output %r, %m"#,
    );
    has(&out, &["tensor.concat dim(1)", "tensor.collapse_shape", "arith.divf"]);
}

#[test]
fn batch_norm_inference_and_training() {
    let out = emit(
        "bn",
        r#"  input %x: f16[batch,4,3,3]
  input %s: f16[4]
  input %b: f16[4]
  input %m: f16[4]
  input %v: f16[4]
  %y = BatchNormalization "bn"(%x, %s, %b, %m, %v) {epsilon=0.001}
  %t, %rm, %rv = BatchNormalization "bn_train"(%x, %s, %b, %m, %v) {training_mode=1}
  output %y, %t, %rm, %rv"#,
    );
    has(&out, &["math.sqrt", "arith.sitofp", "\"reduction\""]);
}

/// Opset-15 BatchNormalization with FP32 parameters over f16 data (what
/// `egraph-casts` makes of an FP16 BatchNorm): computed in f32 and rounded
/// once; the running statistics keep the parameters' type.
#[test]
fn batch_norm_with_fp32_parameters() {
    let out = emit(
        "bn_mixed",
        r#"  input %x: f16[batch,4,3,3]
  input %s: f32[4]
  input %b: f32[4]
  input %m: f32[4]
  input %v: f32[4]
  %y = BatchNormalization "bn"(%x, %s, %b, %m, %v) @f16
  %t, %rm, %rv = BatchNormalization "bn_train"(%x, %s, %b, %m, %v) {training_mode=1} @f16
  output %y, %t, %rm, %rv"#,
    );
    has(&out, &["math.sqrt", "arith.extf", "arith.truncf", "tensor<4xf32>", "tensor<?x4x3x3xf16>"]);
}

#[test]
fn matmuls_fold_batches_or_broadcast() {
    let out = emit(
        "matmuls",
        r#"  input %x: f16[batch,8,16]
  input %w: f16[16,4]
  input %q: f16[batch,2,8,4]
  input %k: f16[batch,2,4,8]
  input %p: f16[2,4,8]
  %y = MatMul "proj"(%x, %w) @f16
  %s = MatMul "scores"(%q, %k) @f16
  %t = MatMul "bcast"(%q, %p)
  output %y, %s, %t"#,
    );
    has(&out, &["linalg.matmul", "linalg.batch_matmul", "tensor.expand_shape", "\"reduction\"", "arith.mulf"]);
    assert!(out.text.contains("tensor<?x8x4xf16>"), "{}", out.text);
}

#[test]
fn softmax_layer_norm_and_gather() {
    let out = emit(
        "encoder",
        r#"  input %ids: i64[1,seq]
  init %emb: f32[10,4] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]
  input %g: f16[4]
  input %b: f16[4]
  %e = Gather "embed"(%emb, %ids) {axis=0}
  %h = Cast "half"(%e) {to=10}
  %n = LayerNormalization "ln"(%h, %g, %b) {axis=-1, epsilon=1e-12}
  %s = Softmax "sm"(%n) {axis=-1}
  output %s"#,
    );
    has(&out, &["tensor.extract", "linalg.index", "math.sqrt", "linalg.softmax dimension(2)", "arith.extf"]);
}

#[test]
fn broadcasting_elementwise_ops_and_where() {
    let out = emit(
        "ewise",
        r#"  input %x: f16[2,3,4]
  input %b: f16[4]
  input %c: f16[]
  input %m: bool[2,1,4]
  %a = Add "add"(%x, %b)
  %p = Pow "pow"(%a, %c)
  %r = Sqrt "sqrt"(%p)
  %e = Erf "erf"(%r)
  %n = IsNaN "nan"(%e)
  %k = And "and"(%n, %m)
  %w = Where "where"(%k, %c, %e)
  %l = Less "lt"(%w, %x)
  %g = Gelu "gelu"(%x)
  %t = Gelu "gelu_tanh"(%x) {approximate="tanh"}
  output %w, %l, %g, %t"#,
    );
    has(
        &out,
        &[
            "math.powf",
            "math.sqrt",
            "arith.cmpf uno",
            "arith.andi",
            "arith.select",
            "arith.cmpf olt",
            "math.erf",
            "math.tanh",
        ],
    );
}

#[test]
fn constants_and_shape_computations() {
    let out = emit(
        "shapes_of",
        r#"  input %x: f32[batch,seq,4]
  input %lo: i64[]
  input %hi: i64[]
  input %step: i64[]
  %c = Constant "c"() {value=tensor<i64[2,2]> [1, 2, 3, 4]}
  %z = Constant "z"() {value=tensor<i64[0]> []}
  %s = Shape "shape"(%x)
  %k = ConstantOfShape "ones"(%c) {value=tensor<f32[1]> [1.0]}
  %r = Range "range"(%lo, %hi, %step)
  %e = Expand "expand"(%x, %s)
  output %c, %z, %s, %k, %r, %e"#,
    );
    has(&out, &["dense<[[1, 2], [3, 4]]>", "dense<>", "tensor.from_elements", "arith.index_cast", "linalg.index"]);
}

#[test]
fn slices_splits_and_element_gathers() {
    let out = emit(
        "indexing",
        r#"  input %x: f32[2,seq,6]
  input %start: i64[1]
  input %ids: i64[2,3]
  input %nd: i64[2,2]
  init %ax: i64[1] = [2]
  init %st: i64[1] = [1]
  init %end: i64[1] = [5]
  init %one: i64[1] = [1]
  %s: f32[2,seq,3] = Slice "slice"(%x, %start, %end, %ax, %st)
  %c = Slice "const_slice"(%x, %one, %end, %ax, %st)
  %a, %b = Split "split"(%x) {axis=2, num_outputs=2}
  %g = GatherElements "ge"(%ids, %ids) {axis=1}
  %n = GatherND "gnd"(%x, %nd)
  output %s, %c, %a, %b, %g, %n"#,
    );
    has(&out, &["tensor.extract_slice", "arith.minsi", "tensor.extract"]);
}

#[test]
fn unsupported_forms_stay_generic_without_panicking() {
    let text = r#"opset "" 18
graph "odd" {
  input %x: f32[1,2,5]
  input %y: f32[1,2,5,5]
  input %w: f32[3,2,3,3,3]
  input %t: bool[]
  input %r: f32[]
  init %one: f32[] = [1.0]
  %c = Conv "rank_mismatch"(%x, %w)
  %p, %i = MaxPool "column_major_1d"(%x) {kernel_shape=[2], storage_order=1}
  %s = Softmax "inner_axis"(%y) {axis=1}
  %l = LogSoftmax "inner_axis_log"(%y)
  %d = Dropout "ratio_one"(%y, %one, %t)
  %z = Conv "zero_stride"(%y, %y) {strides=[0, 0]}
  %q = AveragePool "huge"(%y) {kernel_shape=[9, 9], pads=[9223372036854775807, 0, 0, 0]}
  %u = Split "scalar"(%r)
  output %c, %p, %i, %s, %d, %z, %q, %u, %l
}
"#;
    let mut m = qsync_ir::text::parse_model(text).expect("text IR");
    let opset = m.opset();
    infer_shapes(&mut m.graph, opset, &InferOptions::default());
    let out = emit_mlir(&m.graph, "odd").expect("generic forms verify");
    // Without the model the opset is unknown: Softmax and LogSoftmax on an
    // inner axis (whose meaning changed in opset 13) stay generic.
    for op in ["Conv", "MaxPool", "Softmax", "LogSoftmax", "Dropout", "AveragePool"] {
        assert!(out.generic_ops.contains_key(op), "{op} stays generic: {:?}", out.generic_ops);
    }
    assert!(out.warning().is_some());
    // The generic Dropout draws nothing in the module: no offset argument.
    no_offset(&out, 6);
}

#[test]
fn inference_dropout_forwards_its_input() {
    let out = emit(
        "dropout",
        r#"  input %x: f32[2,3]
  init %ratio: f32[] = [0.1]
  %f = Constant "off"() {value=tensor<bool[]> [false]}
  %y = Dropout "plain"(%x, %ratio)
  %z = Dropout "off"(%y, %ratio, %f)
  %r = Relu "relu"(%z)
  output %r"#,
    );
    has(&out, &["tosa.clamp %arg0"]);
    // Forwarding draws nothing: the signature is the input and the ratio.
    no_offset(&out, 2);
}

/// Shapes the IR knows only partly: an empty Slice starting at the end of
/// its axis (an exporter's shape arithmetic) is an empty tensor, and a
/// Reshape whose target a tracer baked in as constants, from an input with
/// a symbolic dim (and back), casts between static and dynamic types where
/// MLIR's collapse/expand typing needs it.
#[test]
fn empty_slices_and_reshapes_between_symbolic_and_static_dims() {
    let out = emit(
        "partial_shapes",
        r#"  input %s: i64[2]
  input %x: f32[5,n,192]
  input %y: f32[5,1,3,64]
  init %st: i64[1] = [2]
  init %en: i64[1] = [9]
  init %to: i64[4] = [5, 1, 3, 64]
  init %back: i64[3] = [5, -1, 192]
  %e: i64[0] = Slice "tail"(%s, %st, %en)
  %r: f32[5,1,3,64] = Reshape "baked"(%x, %to)
  %b: f32[5,n,192] = Reshape "back"(%y, %back)
  output %e, %r, %b"#,
    );
    has(&out, &["tensor.empty", "tensor.cast", "tensor.expand_shape", "tensor.collapse_shape"]);
}

/// Opset-18 reductions take their axes as an input, which exporters write as
/// a `Constant` node as often as an initializer.
#[test]
fn reduce_mean_axes_from_a_constant_node() {
    let out = emit(
        "reduce_axes",
        r#"  input %x: f32[2,8,16]
  %ax: i64[1] = Constant "axes"() {value=tensor<i64[1]> [-1]}
  %m: f32[2,8,1] = ReduceMean "mean"(%x, %ax)
  output %m"#,
    );
    has(&out, &["\"reduction\"", "arith.divf"]);
}

/// `Pad` in constant mode: pads and axes from initializers or `Constant`
/// nodes, the fill value from an input.
#[test]
fn constant_pad() {
    let out = emit(
        "pad",
        r#"  input %x: f32[batch,3,8,8]
  init %p: i64[4] = [1, 0, 2, 3]
  init %ax: i64[2] = [1, 3]
  %v: f32[] = Constant "fill"() {value=tensor<f32[]> [-1.0]}
  %y: f32[batch,6,8,11] = Pad "pad"(%x, %p, %v, %ax)
  output %y"#,
    );
    has(&out, &["tensor.pad", "low[0, 1, 0, 0] high[0, 2, 0, 3]"]);
}

/// `ScatterND` as an `scf.for` carrying the data: whole-index tuples write
/// elements (`tensor.insert`), shorter ones slices (`tensor.insert_slice`),
/// reductions combine with what is there; symbolic dims read with
/// `tensor.dim`.
#[test]
fn scatter_nd_writes_elements_and_slices() {
    let out = emit(
        "scatter_nd",
        r#"  input %x: f32[batch,6,4]
  input %rows: i64[3,1]
  input %upd: f32[3,6,4]
  input %pts: i64[2,5,3]
  input %vals: f32[2,5]
  input %counts: i32[8]
  input %at: i64[1,2,1]
  input %ones: i32[1,2]
  %s = ScatterND "rows"(%x, %rows, %upd)
  %a = ScatterND "points_add"(%s, %pts, %vals) {reduction="add"}
  %m = ScatterND "max"(%x, %rows, %upd) {reduction="max"}
  %c = ScatterND "int_mul"(%counts, %at, %ones) {reduction="mul"}
  output %a, %m, %c"#,
    );
    has(
        &out,
        &[
            "scf.for",
            "scf.yield",
            "tensor.insert_slice",
            "tensor.extract_slice",
            "tensor.insert ",
            "arith.addf",
            "arith.maximumf",
            "arith.muli",
            "tensor.dim",
        ],
    );
}

/// Training-mode `Dropout` (a constant or runtime `training_mode`; constant,
/// default or runtime ratio; with and without the mask) and the uniform
/// random ops draw per element from a counter-based hash of `linalg.index`.
#[test]
fn training_dropout_and_uniform_random_ops() {
    let out = emit(
        "random",
        r#"  input %x: f16[batch,seq,8]
  input %flag: bool[]
  input %r: f32[]
  init %ratio: f32[] = [0.1]
  %t: bool[] = Constant "on"() {value=tensor<bool[]> [true]}
  %y, %m = Dropout "train"(%x, %ratio, %t) {seed=7}
  %z = Dropout "default_ratio"(%y, _, %t)
  %w = Dropout "runtime"(%z, %r, %flag)
  %u = RandomUniformLike "u"(%x) {low=-1.0, high=3.0, dtype=1, seed=2.0}
  %v = RandomUniform "v"() {shape=[3, 4], dtype=11}
  output %w, %m, %u, %v"#,
    );
    has(
        &out,
        &[
            "linalg.index",
            "arith.shrui",
            "arith.xori",
            "arith.uitofp",
            "arith.cmpf oge",
            "arith.select",
            "tensor<?x?x8xi1>",
            "tensor<?x?x8xf32>",
            "tensor<3x4xf64>",
        ],
    );
    // Three inputs, one initializer, then the offset, read once and mixed
    // into each of the five drawing nodes' keys.
    let args = params(&out);
    assert!(out.rng_offset, "the module draws");
    assert_eq!(args.len(), 5, "{args:?}");
    assert!(args[..4].iter().all(|a| !a.contains("rng_offset")), "{args:?}");
    assert!(
        args[4].ends_with(": tensor<i64> {qsync.name = \"rng_offset\", qsync.rng_offset}"),
        "trailing offset: {}",
        args[4]
    );
    assert_eq!(out.text.matches("tensor.extract %arg4[] : tensor<i64>").count(), 1, "{}", out.text);
}

/// A module with no random op takes exactly its inputs and initializers.
#[test]
fn modules_without_random_ops_take_no_offset() {
    let out = emit(
        "plain",
        r#"  input %x: f32[batch,4]
  init %b: f32[4] = [1.0, 2.0, 3.0, 4.0]
  %y = Add "add"(%x, %b)
  %z = Relu "relu"(%y)
  output %z"#,
    );
    no_offset(&out, 2);
}

/// 1-D and 3-D `Conv` through their named ops, grouped ones (no named op)
/// through a `linalg.generic`; `ConvTranspose` spreads its input with a
/// strided `tensor.insert_slice` and correlates with the flipped kernel.
#[test]
fn conv_1d_3d_grouped_and_transposed() {
    let out = emit(
        "convs",
        r#"  input %x1: f32[batch,4,9]
  input %w1: f32[6,4,3]
  input %b1: f32[6]
  input %g1: f32[4,2,3]
  input %x3: f16[batch,2,5,6,7]
  input %w3: f16[4,2,3,3,3]
  input %g3: f16[2,1,1,2,3]
  input %xt: f32[batch,4,5,6]
  input %wt: f32[4,3,3,2]
  input %bt: f32[6]
  %c1 = Conv "c1"(%x1, %w1, %b1) {pads=[1, 2], strides=[2]}
  %d1 = Conv "grouped1"(%x1, %g1) {group=2, dilations=[2]}
  %c3 = Conv "c3"(%x3, %w3) {auto_pad="SAME_UPPER", strides=[1, 2, 2]} @f16
  %d3 = Conv "grouped3"(%x3, %g3) {group=2, pads=[0, 1, 0, 0, 1, 1]} @f16
  %t = ConvTranspose "up"(%xt, %wt, %bt) {group=2, strides=[2, 3], pads=[1, 0, 0, 1], output_padding=[1, 2], dilations=[1, 2]}
  output %c1, %d1, %c3, %d3, %t"#,
    );
    has(
        &out,
        &[
            "linalg.conv_1d_ncw_fcw",
            "linalg.conv_3d_ncdhw_fcdhw",
            "\"reduction\"",
            "tensor.insert_slice",
            "linalg.broadcast",
            "tensor<?x6x5xf32>",
            "tensor<?x6x11x19xf32>",
        ],
    );
}

/// `CumSum` along a constant (here negative) axis, inclusive and
/// exclusive/reversed, over float and integer data with a symbolic dim.
#[test]
fn cumulative_sums() {
    let out = emit(
        "cumsum",
        r#"  input %x: f16[batch,5]
  input %i: i64[3,seq,1]
  init %last: i64[] = [-1]
  %ax: i32[] = Constant "axis"() {value=tensor<i32[]> [1]}
  %y = CumSum "inclusive"(%x, %last)
  %z = CumSum "exclusive_reverse"(%i, %ax) {exclusive=1, reverse=1}
  output %y, %z"#,
    );
    has(&out, &["scf.for", "tensor.extract_slice", "tensor.insert_slice", "arith.addf", "arith.addi", "scf.yield"]);
}

/// `Mod` under broadcasting: Python-style on integers, C `fmod` on
/// integers and floats.
#[test]
fn integer_and_float_mod() {
    let out = emit(
        "mod",
        r#"  input %a: i64[batch,4]
  input %b: i64[4]
  input %f: f16[2,3]
  input %g: f16[]
  input %u: i32[]
  %m = Mod "python"(%a, %b)
  %c = Mod "c_int"(%a, %b) {fmod=1}
  %r = Mod "c_float"(%f, %g) {fmod=1}
  %s = Mod "scalars"(%u, %u)
  output %m, %c, %r, %s"#,
    );
    has(&out, &["arith.remsi", "arith.remf", "arith.xori", "arith.select"]);
}

/// `Pad` with amounts computed at run time (read from the pads tensor,
/// negative ones cropping), a computed fill value, and the index-reading
/// modes.
#[test]
fn computed_pads_and_edge_reflect_wrap() {
    let out = emit(
        "pad_dynamic",
        r#"  input %x: f16[batch,4,6]
  input %p: i64[4]
  input %v: f16[]
  input %i: i32[2,3]
  init %q: i64[4] = [1, -1, 2, 1]
  init %ax: i64[2] = [2, 1]
  %y: f16[batch,h,w] = Pad "computed"(%x, %p, %v, %ax)
  %e: i32[5,3] = Pad "edge"(%i, %q) {mode="edge"}
  %r: i32[5,3] = Pad "reflect"(%i, %q) {mode="reflect"}
  %w: i32[5,3] = Pad "wrap"(%i, %q) {mode="wrap"}
  %c: i32[5,3] = Pad "crop"(%i, %q)
  output %y, %e, %r, %w, %c"#,
    );
    has(&out, &["tensor.pad", "arith.maxsi", "tensor.extract_slice", "arith.remsi", "linalg.index"]);
}

/// `Slice` with a negative step (exporters reverse an axis that way), from
/// a constant start and a computed one.
#[test]
fn slices_with_negative_steps() {
    let out = emit(
        "reverse",
        r#"  input %x: i64[4,2]
  input %y: f32[5,3]
  input %s: i64[1]
  init %st: i64[1] = [-1]
  init %en: i64[1] = [-9223372036854775807]
  init %ax: i64[1] = [0]
  init %two: i64[1] = [-2]
  %r = Slice "flip"(%x, %st, %en, %ax, %st)
  %t: f32[2,3] = Slice "computed"(%y, %s, %en, %ax, %two)
  output %r, %t"#,
    );
    has(&out, &["linalg.index", "arith.muli", "tensor.extract"]);
}

/// Before opset 11 `Pad` takes its pads and fill value as attributes.
#[test]
fn opset_10_pad_fills_with_its_value_attribute() {
    let text = r#"opset "" 10
graph "old_pad" {
  input %x: f32[2,3]
  %y = Pad "old"(%x) {pads=[0, 1, 0, 2], value=7.5}
  output %y
}
"#;
    let mut m = qsync_ir::text::parse_model(text).expect("text IR");
    let opset = m.opset();
    infer_shapes(&mut m.graph, opset, &InferOptions::default());
    let out = emit_mlir(&m.graph, "old_pad").expect("emits");
    assert!(out.all_ops_mapped(), "{:?}\n{}", out.generic_ops, out.text);
    mlir_opt_plain(&out.text, "old_pad");
    has(&out, &["tensor.pad", "7.500000e+00", "tensor<2x6xf32>"]);
}

/// Emits `body` and checks that its one contraction (`op` names the line:
/// a named op, or `"reduction"` for a contracting `linalg.generic`) reads
/// f16 operands into an f32 accumulator, that no arithmetic runs in f16,
/// and that the result is rounded to f16 exactly once.
fn accumulates_in_f32(name: &str, body: &str, op: &str) -> MlirOutput {
    let out = emit(name, body);
    let into_f32 = out.text.lines().any(|l| {
        l.contains(op)
            && l.split_once("outs(").is_some_and(|(ins, outs)| ins.contains("xf16>") && outs.contains("xf32>"))
    });
    assert!(into_f32, "{name}: no {op} from f16 into an f32 accumulator:\n{}", out.text);
    assert!(out.text.contains("linalg.fill ins(%cst : f32)") || out.text.contains("arith.extf"), "{}", out.text);
    let f16_math = out
        .text
        .lines()
        .filter(|l| ["arith.addf", "arith.mulf"].iter().any(|a| l.contains(a)) && l.trim_end().ends_with(": f16"));
    assert_eq!(f16_math.count(), 0, "{name}: f16 arithmetic:\n{}", out.text);
    assert_eq!(out.text.matches("arith.truncf").count(), 1, "{name}: one rounding:\n{}", out.text);
    out
}

/// Contractions over f16 accumulate in f32 and round once, as cuBLAS and
/// cuDNN do with an f32 compute type: convolutions (named, grouped through a
/// `linalg.generic`, transposed), Gemm (with α and β·C, and without), and
/// MatMul against a 2-D weight, batched and with a broadcast batch.
#[test]
fn f16_contractions_accumulate_in_f32_and_round_once() {
    let conv = accumulates_in_f32(
        "conv_f16",
        r#"  input %x: f16[batch,3,9,9]
  input %w: f16[8,3,3,3]
  input %b: f16[8]
  %y = Conv "conv"(%x, %w, %b) {pads=[1, 1, 1, 1], strides=[2, 2]} @f16
  output %y"#,
        "linalg.conv_2d_nchw_fchw",
    );
    has(&conv, &["linalg.broadcast", "tensor<8xf32>", "tensor<?x8x5x5xf32>", "tensor<?x8x5x5xf16>"]);
    let grouped = accumulates_in_f32(
        "grouped_conv1d_f16",
        r#"  input %x: f16[batch,4,9]
  input %w: f16[4,2,3]
  %y = Conv "grouped1"(%x, %w) {group=2, dilations=[2]} @f16
  output %y"#,
        "\"reduction\"",
    );
    has(&grouped, &["linalg.fill", "arith.extf", "tensor<?x2x2x5xf32>"]);
    accumulates_in_f32(
        "depthwise_f16",
        r#"  input %x: f16[batch,4,6,6]
  input %w: f16[4,1,3,3]
  %y = Conv "dw"(%x, %w) {group=4, pads=[1, 1, 1, 1]} @f16
  output %y"#,
        "linalg.conv_2d_ngchw_gfchw",
    );
    let up = accumulates_in_f32(
        "conv_transpose_f16",
        r#"  input %x: f16[batch,4,5,6]
  input %w: f16[4,3,3,2]
  input %b: f16[6]
  %t = ConvTranspose "up"(%x, %w, %b) {group=2, strides=[2, 3], pads=[1, 0, 0, 1]} @f16
  output %t"#,
        "\"reduction\"",
    );
    has(&up, &["tensor.insert_slice", "arith.extf"]);
    let gemm = accumulates_in_f32(
        "gemm_f16",
        r#"  input %a: f16[batch,64]
  input %b: f16[10,64]
  input %c: f16[10]
  %y = Gemm "fc"(%a, %b, %c) {transB=1, alpha=0.5, beta=2.0} @f16
  output %y"#,
        "linalg.matmul",
    );
    has(&gemm, &["arith.extf", "tensor<?x10xf32>", "tensor<?x10xf16>"]);
    accumulates_in_f32(
        "gemm_plain_f16",
        r#"  input %a: f16[8,64]
  input %b: f16[64,10]
  %y = Gemm "fc"(%a, %b) @f16
  output %y"#,
        "linalg.matmul",
    );
    let proj = accumulates_in_f32(
        "matmul_2d_weight_f16",
        r#"  input %x: f16[batch,8,16]
  input %w: f16[16,4]
  %y = MatMul "proj"(%x, %w) @f16
  output %y"#,
        "linalg.matmul",
    );
    has(&proj, &["tensor.expand_shape", "tensor<?x8x4xf16>"]);
    accumulates_in_f32(
        "batch_matmul_f16",
        r#"  input %q: f16[batch,2,8,4]
  input %k: f16[batch,2,4,8]
  %s = MatMul "scores"(%q, %k) @f16
  output %s"#,
        "linalg.batch_matmul",
    );
    let bcast = accumulates_in_f32(
        "broadcast_matmul_f16",
        r#"  input %q: f16[batch,2,8,4]
  input %p: f16[2,4,8]
  %t = MatMul "bcast"(%q, %p) @f16
  output %t"#,
        "\"reduction\"",
    );
    has(&bcast, &["arith.extf", "tensor<?x2x8x8xf32>"]);
}

/// f32 operands accumulate in f32 with nothing extended or rounded.
#[test]
fn f32_contractions_are_not_converted() {
    let out = emit(
        "f32_contractions",
        r#"  input %x: f32[1,3,9,9]
  input %w: f32[8,3,3,3]
  input %a: f32[4,16]
  input %b: f32[16,4]
  input %c: f32[4]
  %y = Conv "conv"(%x, %w) @f32
  %g = Gemm "fc"(%a, %b, %c) {alpha=0.5} @f32
  %m = MatMul "mm"(%a, %b) @f32
  output %y, %g, %m"#,
    );
    assert!(!out.text.contains("arith.extf") && !out.text.contains("arith.truncf"), "{}", out.text);
}

/// From opset 13 `Softmax`/`LogSoftmax` normalize along one axis, any of
/// them: `linalg.softmax dimension(axis)` on the input itself, and
/// reductions over that axis.
#[test]
fn softmax_over_an_inner_axis_from_opset_13() {
    let out = emit_at(
        13,
        "softmax13",
        r#"  input %x: f32[batch,3,4]
  input %h: f16[2,3,4]
  %a = Softmax "first"(%x) {axis=0}
  %b = Softmax "middle"(%x) {axis=-2}
  %c = Softmax "default"(%x)
  %l = LogSoftmax "log_middle"(%x) {axis=1}
  %m = LogSoftmax "log_half"(%h) {axis=0} @f16
  output %a, %b, %c, %l, %m"#,
    );
    has(
        &out,
        &[
            "linalg.softmax dimension(0) ins(%arg0 : tensor<?x3x4xf32>)",
            "linalg.softmax dimension(1) ins(%arg0 : tensor<?x3x4xf32>)",
            "linalg.softmax dimension(2) ins(%arg0 : tensor<?x3x4xf32>)",
            "arith.maximumf",
            "math.exp",
            "math.log",
            "arith.truncf",
        ],
    );
    assert!(!out.text.contains("tensor.collapse_shape"), "one axis needs no reshape:\n{}", out.text);
}

/// Before opset 13 the input is coerced to 2-D at `axis` (default 1):
/// `Softmax` collapses the trailing block into one axis around
/// `linalg.softmax`, `LogSoftmax` reduces over the whole block.
#[test]
fn softmax_before_opset_13_normalizes_the_trailing_block() {
    let out = emit_at(
        11,
        "softmax11",
        r#"  input %x: f32[batch,3,4]
  %a = Softmax "default_axis"(%x)
  %b = Softmax "all"(%x) {axis=0}
  %c = Softmax "last"(%x) {axis=-1}
  %l = LogSoftmax "log_block"(%x) {axis=1}
  output %a, %b, %c, %l"#,
    );
    has(
        &out,
        &[
            "tensor.collapse_shape %arg0 [[0], [1, 2]] : tensor<?x3x4xf32> into tensor<?x12xf32>",
            "linalg.softmax dimension(1) ins(%collapsed : tensor<?x12xf32>)",
            "linalg.softmax dimension(0)",
            "tensor.expand_shape",
            "linalg.softmax dimension(2) ins(%arg0 : tensor<?x3x4xf32>)",
            "iterator_types = [\"parallel\", \"reduction\", \"reduction\"]",
        ],
    );
}

/// `MaxPool` with `Indices`: one reducing `linalg.generic` carrying the
/// value and its int64 index (with `storage_order = 1` turned column-major
/// by an elementwise one); padding and ceil mode as without indices.
#[test]
fn max_pool_with_indices() {
    let out = emit(
        "pool_indices",
        r#"  input %x: f32[batch,2,5,6]
  input %h: f16[1,2,4,4]
  %y, %i = MaxPool "rows"(%x) {kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]}
  %z, %j = MaxPool "cols"(%x) {kernel_shape=[2, 3], dilations=[2, 1], ceil_mode=1, strides=[2, 2], storage_order=1}
  %v, %k = MaxPool "half"(%h) {kernel_shape=[2, 2]} @f16
  output %y, %i, %z, %j, %v, %k"#,
    );
    has(
        &out,
        &[
            "tensor<?x2x3x3xi64>",
            "tensor<1x2x3x3xi64>",
            "arith.cmpf ogt",
            "arith.select",
            "arith.remsi",
            "\"reduction\", \"reduction\"]",
            "qsync.name = \"rows\"",
        ],
    );
}

/// `ConvTranspose` with `output_shape` or `SAME_*`: the pads come from the
/// total padding and the lowering is the one of explicit pads.
#[test]
fn conv_transpose_with_output_shape_and_same_padding() {
    let out = emit(
        "convt_auto",
        r#"  input %x: f32[batch,2,4,3]
  input %w: f32[2,3,3,3]
  %a = ConvTranspose "shape"(%x, %w) {strides=[3, 2], output_shape=[9, 6]}
  %b = ConvTranspose "upper"(%x, %w) {strides=[2, 2], auto_pad="SAME_UPPER"}
  %c = ConvTranspose "lower"(%x, %w) {strides=[2, 2], dilations=[2, 1], auto_pad="SAME_LOWER"}
  %d = ConvTranspose "full_shape"(%x, %w) {strides=[2, 2], output_shape=[1, 3, 8, 7], output_padding=[1, 1], auto_pad="SAME_UPPER"}
  output %a, %b, %c, %d"#,
    );
    has(&out, &["tensor.insert_slice", "tensor<?x3x9x6xf32>", "tensor<?x3x8x6xf32>", "tensor<?x3x8x7xf32>"]);
}

/// f16 `Softmax` normalizes in f32 and rounds once: the input is extended,
/// `linalg.softmax` runs on f32, and one `arith.truncf` gives f16 back.
#[test]
fn f16_softmax_normalizes_in_f32() {
    let out = emit(
        "softmax_f16",
        r#"  input %x: f16[2,3,8]
  %y = Softmax "sm"(%x) {axis=-1} @f16
  output %y"#,
    );
    has(&out, &["arith.extf", "linalg.softmax dimension(2) ins(", "tensor<2x3x8xf32>) outs("]);
    assert_eq!(out.text.matches("arith.truncf").count(), 1, "{}", out.text);
    assert!(!out.text.contains("linalg.softmax dimension(2) ins(%arg0 : tensor<2x3x8xf16>"), "{}", out.text);
}
