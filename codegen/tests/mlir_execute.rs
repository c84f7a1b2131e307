//! Runs emitted MLIR on the CPU and checks the numbers: the module is
//! bufferized and lowered to LLVM by `mlir-opt-22`, translated by
//! `mlir-translate-22` and run by `lli-22` with MLIR's runner utilities
//! printing each result (`common`). Skipped, with the reason printed, when a
//! tool or the runner library is missing.

mod common;

use qsync_ir::infer::{infer_shapes, InferOptions};

/// Emits the graph (all f32 results), calls it from a `main` with the given
/// `(type, dense literal)` arguments and returns each result's values.
fn execute(tag: &str, body: &str, args: &[(&str, &str)]) -> Option<Vec<Vec<f64>>> {
    execute_calls(tag, body, &[args.to_vec()]).map(|mut calls| calls.remove(0))
}

/// As [`execute`], calling the function once per argument list in order
/// (all in one process); returns each call's results.
fn execute_calls(tag: &str, body: &str, calls: &[Vec<(&str, &str)>]) -> Option<Vec<Vec<Vec<f64>>>> {
    execute_at(18, tag, body, calls)
}

/// As [`execute_calls`] for a model of the default-domain `opset` (the
/// emitter is told it).
fn execute_at(opset: i64, tag: &str, body: &str, calls: &[Vec<(&str, &str)>]) -> Option<Vec<Vec<Vec<f64>>>> {
    if !common::tools_present() {
        return None;
    }
    let text = format!("opset \"\" {opset}\ngraph \"g\" {{\n{body}\n}}\n");
    let mut m = qsync_ir::text::parse_model(&text).expect("text IR");
    let opset = m.opset();
    infer_shapes(&mut m.graph, opset, &InferOptions::default());
    let (module, generic) = qsync_codegen::mlir::mlir_text_model(&m, "g");
    assert!(generic.is_empty(), "{tag}: {generic:?}");
    let rtys: Vec<String> = m.graph.outputs().iter().map(|&v| common::f32_result_type(&m.graph, v)).collect();
    Some(common::run_module(tag, &module, "g", &rtys, calls))
}

fn close(tag: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{tag}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{tag}: {got:?} vs {want:?}");
    }
}

#[test]
fn convolution_and_pooling_compute_onnx_values() {
    let ones = "dense<1.0>";
    let Some(r) = execute(
        "conv_pool",
        r#"  input %x: f32[1,1,3,3]
  input %w: f32[1,1,3,3]
  input %b: f32[1]
  input %y: f32[1,1,4,4]
  %c = Conv "conv"(%x, %w, %b) {pads=[1, 1, 1, 1]}
  %a = AveragePool "incl"(%y) {kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1}
  %e = AveragePool "excl"(%y) {kernel_shape=[3, 3], pads=[1, 1, 1, 1]}
  %m = MaxPool "ceil"(%y) {kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1}
  output %c, %a, %e, %m"#,
        &[
            ("tensor<1x1x3x3xf32>", ones),
            ("tensor<1x1x3x3xf32>", ones),
            ("tensor<1xf32>", ones),
            ("tensor<1x1x4x4xf32>", "dense<[[[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0], [13.0, 14.0, 15.0, 16.0]]]]>"),
        ],
    ) else {
        return;
    };
    // In-bounds taps of a 3×3 window on a 3×3 input with padding 1, plus the bias.
    close("conv", &r[0], &[5.0, 7.0, 5.0, 7.0, 10.0, 7.0, 5.0, 7.0, 5.0]);
    // Corner window of the 4×4 ramp: 1+2+5+6 over 9 (pads count) or 4.
    assert!((r[1][0] - 14.0 / 9.0).abs() < 1e-5 && (r[2][0] - 3.5).abs() < 1e-5, "{:?} {:?}", r[1], r[2]);
    close("excl centre", &r[2][5..6], &[6.0]);
    // Ceil mode: 2×2 windows, the last ones clipped to the input.
    close("max", &r[3], &[11.0, 12.0, 15.0, 16.0]);
}

#[test]
fn gemm_norms_and_indexing_compute_onnx_values() {
    let Some(r) = execute(
        "gemm_bn_index",
        r#"  input %a: f32[2,2]
  input %b: f32[2,2]
  input %c: f32[2]
  input %x: f32[2,2,1,1]
  input %s: f32[2]
  input %z: f32[2]
  input %idx: i64[2]
  input %st: i64[1]
  init %ax: i64[1] = [0]
  init %end: i64[1] = [9]
  %g = Gemm "gemm"(%a, %b, %c) {transB=1, alpha=0.5, beta=2.0}
  %t, %rm, %rv = BatchNormalization "bn"(%x, %s, %z, %z, %s) {training_mode=1, epsilon=0.0, momentum=0.5}
  %h = Gather "gather"(%c, %idx) {axis=0}
  %l: f32[1] = Slice "slice"(%c, %st, %end, %ax)
  output %g, %t, %rm, %rv, %h, %l"#,
        &[
            ("tensor<2x2xf32>", "dense<[[1.0, 2.0], [3.0, 4.0]]>"),
            ("tensor<2x2xf32>", "dense<[[1.0, 0.0], [1.0, 1.0]]>"),
            ("tensor<2xf32>", "dense<[10.0, 20.0]>"),
            ("tensor<2x2x1x1xf32>", "dense<[[[[1.0]], [[2.0]]], [[[3.0]], [[6.0]]]]>"),
            ("tensor<2xf32>", "dense<1.0>"),
            ("tensor<2xf32>", "dense<0.0>"),
            ("tensor<2xi64>", "dense<[-1, 0]>"),
            ("tensor<1xi64>", "dense<-1>"),
            // The initializers follow the inputs.
            ("tensor<1xi64>", "dense<0>"),
            ("tensor<1xi64>", "dense<9>"),
        ],
    ) else {
        return;
    };
    // 0.5·A·Bᵀ + 2·c.
    close("gemm", &r[0], &[20.5, 41.5, 21.5, 43.5]);
    // Channel 0 holds {1, 3}: mean 2, variance 1; channel 1 {2, 6}: mean 4, variance 4.
    close("bn", &r[1], &[-1.0, -1.0, 1.0, 1.0]);
    close("running mean", &r[2], &[1.0, 2.0]);
    close("running var", &r[3], &[1.0, 2.5]);
    close("gather wraps negative indices", &r[4], &[20.0, 10.0]);
    close("slice from -1", &r[5], &[20.0]);
}

/// Opset-15 BatchNormalization with FP32 parameters over f16 data (the form
/// `egraph-casts` produces): the numbers match ONNX semantics in inference and
/// training mode, and the running statistics come out in f32.
#[test]
fn batch_norm_with_fp32_parameters_computes_onnx_values() {
    let Some(r) = execute(
        "bn_mixed",
        r#"  input %x: f16[1,2,1,1]
  input %s: f32[2]
  input %b: f32[2]
  input %m: f32[2]
  input %v: f32[2]
  input %xt: f16[2,2,1,1]
  input %one: f32[2]
  input %zero: f32[2]
  %y = BatchNormalization "bn"(%x, %s, %b, %m, %v) {epsilon=0.0} @f16
  %y32 = Cast "y32"(%y) {to=1}
  %t, %rm, %rv = BatchNormalization "bn_train"(%xt, %one, %zero, %zero, %one) {training_mode=1, epsilon=0.0, momentum=0.5} @f16
  %t32 = Cast "t32"(%t) {to=1}
  output %y32, %t32, %rm, %rv"#,
        &[
            ("tensor<1x2x1x1xf16>", "dense<[[[[3.0]], [[6.0]]]]>"),
            ("tensor<2xf32>", "dense<[2.0, 0.5]>"),
            ("tensor<2xf32>", "dense<[1.0, -1.0]>"),
            ("tensor<2xf32>", "dense<[1.0, 2.0]>"),
            ("tensor<2xf32>", "dense<[4.0, 16.0]>"),
            ("tensor<2x2x1x1xf16>", "dense<[[[[1.0]], [[2.0]]], [[[3.0]], [[6.0]]]]>"),
            ("tensor<2xf32>", "dense<1.0>"),
            ("tensor<2xf32>", "dense<0.0>"),
        ],
    ) else {
        return;
    };
    // (3 - 1) / 2 · 2 + 1 and (6 - 2) / 4 · 0.5 - 1.
    close("inference", &r[0], &[3.0, -0.5]);
    close("training", &r[1], &[-1.0, -1.0, 1.0, 1.0]);
    close("running mean (f32)", &r[2], &[1.0, 2.0]);
    close("running var (f32)", &r[3], &[1.0, 2.5]);
}

/// HardSigmoid / HardSwish (MobileNetV3's activations) and integer
/// Max / Min / Abs compute ONNX values.
#[test]
fn hard_activations_and_integer_max_min_abs_compute_onnx_values() {
    let Some(r) = execute(
        "hard_int",
        r#"  input %x: f32[5]
  input %i: i64[2]
  input %j: i64[2]
  %hs = HardSigmoid "hs"(%x) {alpha=0.5, beta=0.5}
  %hw = HardSwish "hw"(%x)
  %mx = Max "mx"(%i, %j)
  %mn = Min "mn"(%i, %j)
  %ab = Abs "ab"(%i)
  %mxf = Cast "mxf"(%mx) {to=1}
  %mnf = Cast "mnf"(%mn) {to=1}
  %abf = Cast "abf"(%ab) {to=1}
  output %hs, %hw, %mxf, %mnf, %abf"#,
        &[
            ("tensor<5xf32>", "dense<[-3.0, -0.5, 0.0, 0.5, 3.0]>"),
            ("tensor<2xi64>", "dense<[3, -4]>"),
            ("tensor<2xi64>", "dense<[1, 2]>"),
        ],
    ) else {
        return;
    };
    close("hard sigmoid", &r[0], &[0.0, 0.25, 0.5, 0.75, 1.0]);
    close("hard swish", &r[1], &[0.0, -0.5 * (0.5 - 0.5 / 6.0), 0.0, 0.5 * (0.5 + 0.5 / 6.0), 3.0]);
    close("max", &r[2], &[3.0, 2.0]);
    close("min", &r[3], &[1.0, -4.0]);
    close("abs", &r[4], &[3.0, 4.0]);
}

/// Constant-mode `Pad` fills with its value on both sides of each axis.
#[test]
fn constant_pad_computes_onnx_values() {
    let Some(r) = execute(
        "pad",
        r#"  input %x: f32[1,2]
  init %p: i64[4] = [0, 1, 0, 2]
  init %v: f32[] = [7.0]
  %y: f32[1,5] = Pad "pad"(%x, %p, %v)
  output %y"#,
        &[
            ("tensor<1x2xf32>", "dense<[[1.0, 2.0]]>"),
            // The initializers follow the inputs.
            ("tensor<4xi64>", "dense<[0, 1, 0, 2]>"),
            ("tensor<f32>", "dense<7.0>"),
        ],
    ) else {
        return;
    };
    close("pad", &r[0], &[7.0, 1.0, 2.0, 7.0, 7.0]);
}

/// A `dense<…>` literal of row-major `vals` with `dims` (integers printed
/// without a fraction).
fn dense(vals: &[f64], dims: &[usize], int: bool) -> String {
    fn nest(vals: &[f64], dims: &[usize], int: bool) -> String {
        match dims {
            [] => {
                if int {
                    format!("{}", vals[0] as i64)
                } else {
                    format!("{:?}", vals[0])
                }
            }
            [_, rest @ ..] => {
                let inner: usize = rest.iter().product();
                let parts: Vec<String> = vals.chunks(inner.max(1)).map(|c| nest(c, rest, int)).collect();
                format!("[{}]", parts.join(", "))
            }
        }
    }
    format!("dense<{}>", nest(vals, dims, int))
}

/// erf by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7).
fn erf_ref(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly =
        t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    (1.0 - poly * (-x * x).exp()).copysign(x)
}

/// The ops emitted as tosa (`tosa.clamp`, `tanh`, `sigmoid`, `exp`, `erf`,
/// `transpose`, a broadcasting `add`) and `linalg.softmax`, which run
/// through the tosa-to-linalg passes and softmax's decomposition.
#[test]
fn tosa_ops_and_softmax_compute_onnx_values() {
    let x: Vec<f64> = vec![-2.0, -0.5, 0.0, 0.25, 1.0, 3.0];
    let b: Vec<f64> = vec![10.0, 20.0, 30.0];
    let Some(r) = execute(
        "tosa_softmax",
        r#"  input %x: f32[2,3]
  input %b: f32[1,3]
  %r = Relu "relu"(%x)
  %t = Tanh "tanh"(%x)
  %s = Sigmoid "sigmoid"(%x)
  %e = Exp "exp"(%x)
  %f = Erf "erf"(%x)
  %p = Transpose "tr"(%x) {perm=[1, 0]}
  %a = Add "badd"(%x, %b)
  %m = Softmax "softmax"(%x) {axis=-1}
  output %r, %t, %s, %e, %f, %p, %a, %m"#,
        &[("tensor<2x3xf32>", &dense(&x, &[2, 3], false)), ("tensor<1x3xf32>", &dense(&b, &[1, 3], false))],
    ) else {
        return;
    };
    let map = |f: fn(f64) -> f64| x.iter().map(|&v| f(v)).collect::<Vec<f64>>();
    close("relu", &r[0], &map(|v| v.max(0.0)));
    close("tanh", &r[1], &map(f64::tanh));
    close("sigmoid", &r[2], &map(|v| 1.0 / (1.0 + (-v).exp())));
    close("exp", &r[3], &map(f64::exp));
    close("erf", &r[4], &map(erf_ref));
    close("transpose", &r[5], &[x[0], x[3], x[1], x[4], x[2], x[5]]);
    close("broadcast add", &r[6], &x.iter().enumerate().map(|(i, v)| v + b[i % 3]).collect::<Vec<f64>>());
    let softmax: Vec<f64> = x
        .chunks(3)
        .flat_map(|row| {
            let top = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v));
            let sum: f64 = row.iter().map(|v| (v - top).exp()).sum();
            row.iter().map(move |v| (v - top).exp() / sum).collect::<Vec<f64>>()
        })
        .collect();
    close("softmax", &r[7], &softmax);
}

/// ONNX `CumSum` of `x` (row-major, `shape`) along `axis`.
fn cumsum_ref(x: &[f64], shape: &[usize], axis: usize, exclusive: bool, reverse: bool) -> Vec<f64> {
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut y = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * n + k) * inner + i;
            let order: Vec<usize> = if reverse { (0..n).rev().collect() } else { (0..n).collect() };
            let mut sum = 0.0;
            for k in order {
                if exclusive {
                    y[at(k)] = sum;
                    sum += x[at(k)];
                } else {
                    sum += x[at(k)];
                    y[at(k)] = sum;
                }
            }
        }
    }
    y
}

/// `CumSum` in all four `exclusive`/`reverse` combinations, along a
/// negative axis, an inner axis and a unit one, on floats and integers.
#[test]
fn cumulative_sums_compute_onnx_values() {
    let x: Vec<f64> = (0..24).map(|i| f64::from((i * 7 % 11) - 5) * 0.5).collect();
    let k: Vec<f64> = [3.0, -1.0, 4.0, -1.0, 5.0, -9.0].to_vec();
    let Some(r) = execute(
        "cumsum",
        r#"  input %x: f32[2,3,4]
  input %k: i32[1,6]
  %last: i64[] = Constant "last"() {value=tensor<i64[]> [-1]}
  %mid: i32[1] = Constant "mid"() {value=tensor<i32[1]> [1]}
  %first: i64[] = Constant "first"() {value=tensor<i64[]> [0]}
  %a = CumSum "plain"(%x, %last)
  %b = CumSum "excl"(%x, %last) {exclusive=1}
  %c = CumSum "rev"(%x, %mid) {reverse=1}
  %d = CumSum "excl_rev"(%x, %mid) {exclusive=1, reverse=1}
  %e = CumSum "int_excl_rev"(%k, %last) {exclusive=1, reverse=1}
  %f = CumSum "unit_axis"(%k, %first) {exclusive=1}
  %ef = Cast "ef"(%e) {to=1}
  %ff = Cast "ff"(%f) {to=1}
  output %a, %b, %c, %d, %ef, %ff"#,
        &[("tensor<2x3x4xf32>", &dense(&x, &[2, 3, 4], false)), ("tensor<1x6xi32>", &dense(&k, &[1, 6], true))],
    ) else {
        return;
    };
    let s = [2, 3, 4];
    close("inclusive", &r[0], &cumsum_ref(&x, &s, 2, false, false));
    close("exclusive", &r[1], &cumsum_ref(&x, &s, 2, true, false));
    close("reverse", &r[2], &cumsum_ref(&x, &s, 1, false, true));
    close("exclusive reverse", &r[3], &cumsum_ref(&x, &s, 1, true, true));
    close("integer exclusive reverse", &r[4], &cumsum_ref(&k, &[1, 6], 1, true, true));
    close("unit axis", &r[5], &cumsum_ref(&k, &[1, 6], 0, true, false));
}

/// ONNX `Mod`: `fmod = 0` takes the divisor's sign (`a − b·⌊a/b⌋`),
/// `fmod = 1` the dividend's (C `fmod`).
fn mod_ref(a: f64, b: f64, fmod: bool) -> f64 {
    if fmod {
        a % b
    } else {
        a - b * (a / b).floor()
    }
}

/// Integer `Mod` in both modes and float `fmod`, with every sign of
/// dividend and divisor, under broadcasting and on scalars.
#[test]
fn mod_computes_onnx_values() {
    let a = [7.0, -7.0, 7.0, -7.0, 6.0, -6.0, 0.0, 13.0];
    let b = [3.0, 3.0, -3.0, -3.0];
    let f = [5.5, -5.5, 2.25, -0.75, 9.0, -9.0];
    let g = [2.0, 2.0, -1.5];
    let Some(r) = execute(
        "mod",
        r#"  input %a: i64[2,4]
  input %b: i64[4]
  input %f: f32[2,3]
  input %g: f32[3]
  input %s: i32[]
  input %t: i32[]
  %m = Mod "python"(%a, %b)
  %c = Mod "c_int"(%a, %b) {fmod=1}
  %r = Mod "c_float"(%f, %g) {fmod=1}
  %q = Mod "scalars"(%s, %t)
  %mf = Cast "mf"(%m) {to=1}
  %cf = Cast "cf"(%c) {to=1}
  %qf = Cast "qf"(%q) {to=1}
  output %mf, %cf, %r, %qf"#,
        &[
            ("tensor<2x4xi64>", &dense(&a, &[2, 4], true)),
            ("tensor<4xi64>", &dense(&b, &[4], true)),
            ("tensor<2x3xf32>", &dense(&f, &[2, 3], false)),
            ("tensor<3xf32>", &dense(&g, &[3], false)),
            ("tensor<i32>", "dense<-16>"),
            ("tensor<i32>", "dense<7>"),
        ],
    ) else {
        return;
    };
    let bcast = |x: &[f64], y: &[f64], fmod: bool| -> Vec<f64> {
        x.iter().enumerate().map(|(i, &v)| mod_ref(v, y[i % y.len()], fmod)).collect()
    };
    close("python mod", &r[0], &bcast(&a, &b, false));
    close("c mod", &r[1], &bcast(&a, &b, true));
    close("float fmod", &r[2], &bcast(&f, &g, true));
    close("scalars", &r[3], &[mod_ref(-16.0, 7.0, false)]);
}

/// ONNX `Pad` of a 2-D `x` by `low`/`high` per axis (negative amounts
/// crop) in `mode`, filling with `value` in constant mode.
fn pad_ref(x: &[f64], shape: [usize; 2], low: [i64; 2], high: [i64; 2], mode: &str, value: f64) -> Vec<f64> {
    let out: Vec<i64> = (0..2).map(|a| shape[a] as i64 + low[a] + high[a]).collect();
    let mut y = Vec::new();
    for i in 0..out[0] {
        for j in 0..out[1] {
            let mut at = [i - low[0], j - low[1]];
            let mut inside = true;
            for (a, p) in at.iter_mut().enumerate() {
                let n = shape[a] as i64;
                if (0..n).contains(p) {
                    continue;
                }
                match mode {
                    "constant" => inside = false,
                    "edge" => *p = (*p).clamp(0, n - 1),
                    "reflect" => *p = if *p < 0 { -*p } else { 2 * (n - 1) - *p },
                    _ => *p = p.rem_euclid(n),
                }
            }
            y.push(if inside { x[at[0] as usize * shape[1] + at[1] as usize] } else { value });
        }
    }
    y
}

/// `Pad` with amounts and fill value computed at run time (negative ones
/// crop), constant pads that crop, and `edge`/`reflect`/`wrap`.
#[test]
fn computed_pads_compute_onnx_values() {
    let x: Vec<f64> = (1..=12).map(f64::from).collect();
    // pads = [x1_begin, x2_begin, x1_end, x2_end]
    let p = [2.0, -1.0, 1.0, 3.0];
    let Some(r) = execute(
        "pad_dynamic",
        r#"  input %x: f32[3,4]
  input %p: i64[4]
  input %v: f32[]
  %q: i64[4] = Constant "q"() {value=tensor<i64[4]> [-1, 1, 0, -2]}
  %c: f32[6,6] = Pad "computed"(%x, %p, %v)
  %e: f32[6,6] = Pad "edge"(%x, %p) {mode="edge"}
  %r: f32[6,6] = Pad "reflect"(%x, %p) {mode="reflect"}
  %w: f32[6,6] = Pad "wrap"(%x, %p) {mode="wrap"}
  %k = Pad "crop"(%x, %q, %v)
  output %c, %e, %r, %w, %k"#,
        &[
            ("tensor<3x4xf32>", &dense(&x, &[3, 4], false)),
            ("tensor<4xi64>", &dense(&p, &[4], true)),
            ("tensor<f32>", "dense<-0.5>"),
        ],
    ) else {
        return;
    };
    let (low, high) = ([2, -1], [1, 3]);
    close("constant", &r[0], &pad_ref(&x, [3, 4], low, high, "constant", -0.5));
    close("edge", &r[1], &pad_ref(&x, [3, 4], low, high, "edge", 0.0));
    close("reflect", &r[2], &pad_ref(&x, [3, 4], low, high, "reflect", 0.0));
    close("wrap", &r[3], &pad_ref(&x, [3, 4], low, high, "wrap", 0.0));
    close("constant pads that crop", &r[4], &pad_ref(&x, [3, 4], [-1, 1], [0, -2], "constant", -0.5));
}

/// ONNX `Slice` of a 2-D `x` along `axes` with `starts`/`ends`/`steps`
/// (wrapped and clamped as the operator defines).
fn slice_ref(x: &[f64], shape: [usize; 2], axes: &[usize], starts: &[i64], ends: &[i64], steps: &[i64]) -> Vec<f64> {
    let mut picks: Vec<Vec<usize>> = shape.iter().map(|&n| (0..n).collect()).collect();
    for (k, &a) in axes.iter().enumerate() {
        let n = shape[a] as i64;
        let wrap = |v: i64| if v < 0 { v.saturating_add(n) } else { v };
        let (t, mut s, mut e) = (steps[k], wrap(starts[k]), wrap(ends[k]));
        if t > 0 {
            (s, e) = (s.clamp(0, n), e.clamp(0, n));
        } else {
            (s, e) = (s.clamp(0, n - 1), e.clamp(-1, n - 1));
        }
        picks[a].clear();
        while (t > 0 && s < e) || (t < 0 && s > e) {
            picks[a].push(s as usize);
            s += t;
        }
    }
    let mut y = Vec::new();
    for &i in &picks[0] {
        for &j in &picks[1] {
            y.push(x[i * shape[1] + j]);
        }
    }
    y
}

/// `Slice` with negative steps: a flip from constants, a computed start
/// stepping by −2, and two axes at once with starts past the end.
#[test]
fn negative_step_slices_compute_onnx_values() {
    let x: Vec<f64> = (0..15).map(|i| f64::from(i) * 1.5 - 4.0).collect();
    let Some(r) = execute(
        "reverse",
        r#"  input %x: f32[5,3]
  input %s: i64[1]
  %m1: i64[1] = Constant "m1"() {value=tensor<i64[1]> [-1]}
  %inf: i64[1] = Constant "inf"() {value=tensor<i64[1]> [-9223372036854775807]}
  %a0: i64[1] = Constant "a0"() {value=tensor<i64[1]> [0]}
  %m2: i64[1] = Constant "m2"() {value=tensor<i64[1]> [-2]}
  %st: i64[2] = Constant "st"() {value=tensor<i64[2]> [100, 4]}
  %en: i64[2] = Constant "en"() {value=tensor<i64[2]> [-100, 0]}
  %ax: i64[2] = Constant "ax"() {value=tensor<i64[2]> [1, 0]}
  %sp: i64[2] = Constant "sp"() {value=tensor<i64[2]> [-1, -3]}
  %f = Slice "flip"(%x, %m1, %inf, %a0, %m1)
  %c: f32[2,3] = Slice "computed"(%x, %s, %inf, %a0, %m2)
  %b = Slice "both"(%x, %st, %en, %ax, %sp)
  output %f, %c, %b"#,
        &[("tensor<5x3xf32>", &dense(&x, &[5, 3], false)), ("tensor<1xi64>", "dense<-3>")],
    ) else {
        return;
    };
    let inf = -9_223_372_036_854_775_807;
    close("flip", &r[0], &slice_ref(&x, [5, 3], &[0], &[-1], &[inf], &[-1]));
    close("computed start", &r[1], &slice_ref(&x, [5, 3], &[0], &[-3], &[inf], &[-2]));
    close("two axes", &r[2], &slice_ref(&x, [5, 3], &[1, 0], &[100, 4], &[-100, 0], &[-1, -3]));
}

/// Arbitrary, non-trivial test values: `n` numbers in roughly [−3, 3).
fn ramp(n: usize, salt: usize) -> Vec<f64> {
    (0..n).map(|i| (((i * 7 + salt * 5 + 3) % 13) as f64 - 6.0) * 0.5).collect()
}

/// ONNX `ScatterND`, plainly: each index tuple (the last axis of
/// `indices`, negative values counted from the end) selects a slice of the
/// data that its update replaces or is combined into, in order.
fn scatter_nd(data: &[f64], dshape: &[usize], idx: &[i64], ishape: &[usize], upd: &[f64], reduction: &str) -> Vec<f64> {
    let k = *ishape.last().expect("indices rank ≥ 1");
    let slice: usize = dshape[k..].iter().product();
    let mut out = data.to_vec();
    for (row, tuple) in idx.chunks(k).enumerate() {
        let mut at = 0usize;
        for (j, &i) in tuple.iter().enumerate() {
            let n = dshape[j] as i64;
            at = at * dshape[j] + (if i < 0 { i + n } else { i }) as usize;
        }
        for e in 0..slice {
            let (o, u) = (&mut out[at * slice + e], upd[row * slice + e]);
            *o = match reduction {
                "add" => *o + u,
                "mul" => *o * u,
                "max" => o.max(u),
                "min" => o.min(u),
                _ => u,
            };
        }
    }
    out
}

/// `ScatterND` with each reduction, element and slice updates, negative
/// indices, duplicates for the combining reductions and integer data,
/// against a plain implementation of the ONNX definition.
#[test]
fn scatter_nd_computes_onnx_values() {
    let d = ramp(24, 1);
    let rows: Vec<i64> = vec![-1, 1, -4];
    let rows_upd = ramp(18, 2);
    // Whole-index tuples into 4×3×2 with repeats (and negative forms of them).
    let pts: Vec<i64> = vec![0, 1, 1, -4, -2, -1, 3, 0, 0, 0, 1, 1, 3, -3, 0, 2, 2, 0];
    let pts_upd = ramp(6, 3);
    // Row pairs selecting slices of 2 along the last axis; (1, 2) twice.
    let pairs: Vec<i64> = vec![1, 2, 0, 0, -3, -1, 2, 1];
    let pairs_upd = ramp(8, 4);
    let ints: Vec<f64> = vec![3.0, -2.0, 5.0, 7.0, 1.0];
    let int_idx: Vec<i64> = vec![4, -1, 0, 2];
    let int_upd: Vec<f64> = vec![2.0, -3.0, 4.0, 6.0];
    let fmt_i = |v: &[i64], s: &[usize]| dense(&v.iter().map(|&i| i as f64).collect::<Vec<_>>(), s, true);
    let Some(r) = execute(
        "scatter_nd",
        r#"  input %x: f32[4,3,2]
  input %rows: i64[3,1]
  input %rows_upd: f32[3,3,2]
  input %pts: i64[2,3,3]
  input %pts_upd: f32[2,3]
  input %pairs: i64[2,2,2]
  input %pairs_upd: f32[2,2,2]
  input %ints: i64[5]
  input %int_idx: i64[4,1]
  input %int_upd: i64[4]
  %none = ScatterND "none"(%x, %rows, %rows_upd)
  %add = ScatterND "add"(%x, %pts, %pts_upd) {reduction="add"}
  %mul = ScatterND "mul"(%x, %pts, %pts_upd) {reduction="mul"}
  %max = ScatterND "max"(%x, %pairs, %pairs_upd) {reduction="max"}
  %min = ScatterND "min"(%x, %pairs, %pairs_upd) {reduction="min"}
  %iadd = ScatterND "int_add"(%ints, %int_idx, %int_upd) {reduction="add"}
  %iaddf = Cast "to_float"(%iadd) {to=1}
  output %none, %add, %mul, %max, %min, %iaddf"#,
        &[
            ("tensor<4x3x2xf32>", &dense(&d, &[4, 3, 2], false)),
            ("tensor<3x1xi64>", &fmt_i(&rows, &[3, 1])),
            ("tensor<3x3x2xf32>", &dense(&rows_upd, &[3, 3, 2], false)),
            ("tensor<2x3x3xi64>", &fmt_i(&pts, &[2, 3, 3])),
            ("tensor<2x3xf32>", &dense(&pts_upd, &[2, 3], false)),
            ("tensor<2x2x2xi64>", &fmt_i(&pairs, &[2, 2, 2])),
            ("tensor<2x2x2xf32>", &dense(&pairs_upd, &[2, 2, 2], false)),
            ("tensor<5xi64>", &dense(&ints, &[5], true)),
            ("tensor<4x1xi64>", &fmt_i(&int_idx, &[4, 1])),
            ("tensor<4xi64>", &dense(&int_upd, &[4], true)),
        ],
    ) else {
        return;
    };
    let ds = [4, 3, 2];
    close("none", &r[0], &scatter_nd(&d, &ds, &rows, &[3, 1], &rows_upd, "none"));
    close("add", &r[1], &scatter_nd(&d, &ds, &pts, &[2, 3, 3], &pts_upd, "add"));
    close("mul", &r[2], &scatter_nd(&d, &ds, &pts, &[2, 3, 3], &pts_upd, "mul"));
    close("max", &r[3], &scatter_nd(&d, &ds, &pairs, &[2, 2, 2], &pairs_upd, "max"));
    close("min", &r[4], &scatter_nd(&d, &ds, &pairs, &[2, 2, 2], &pairs_upd, "min"));
    close("int add", &r[5], &scatter_nd(&ints, &[5], &int_idx, &[4, 1], &int_upd, "add"));
}

/// SplitMix64's finalizer.
fn fin(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The documented random stream: a node with key `key`, called with
/// `rng_offset` = `offset`, draws under `K = key ^ fin(offset)`; element `n`
/// takes the `n`-th output of SplitMix64 started at `K`, and its top `bits`
/// bits scaled to [0, 1).
fn stream(key: u64, offset: i64, n: usize, bits: u32) -> f64 {
    let k = key ^ fin(offset as u64);
    let z = fin(k.wrapping_add((n as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    (z >> (64 - bits)) as f64 / 2f64.powi(bits as i32)
}

/// The key of an unseeded node: the default xor the FNV-1a hash of its name.
fn unseeded_key(name: &str) -> u64 {
    let fnv =
        name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, c| (h ^ u64::from(c)).wrapping_mul(0x0000_0100_0000_01B3));
    0x5153_594E_435F_524E ^ fnv
}

/// Share of true (non-zero) entries.
fn share(v: &[f64]) -> f64 {
    v.iter().filter(|&&x| x != 0.0).count() as f64 / v.len() as f64
}

/// Training-mode `Dropout` on 64k elements: the mask keeps about 1 − ratio
/// of them, follows the documented stream exactly, kept values are exactly
/// `x / (1 − ratio)` and dropped ones 0; one seed gives one mask, another
/// seed another; ratio 0 and a runtime-false mode forward the input, and a
/// runtime ratio is honoured.
#[test]
fn training_dropout_keeps_the_right_share_exactly_scaled() {
    let n = 256 * 256;
    // Non-zero, varied inputs: dropped and kept elements tell apart.
    let x: Vec<f64> = (0..n).map(|i| (1.0 + (i % 97) as f64 * 0.25) * if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
    let Some(r) = execute(
        "dropout_train",
        r#"  input %x: f32[256,256]
  input %on: bool[]
  input %off: bool[]
  input %rr: f32[]
  %t: bool[] = Constant "t"() {value=tensor<bool[]> [true]}
  %ratio: f32[] = Constant "ratio"() {value=tensor<f32[]> [0.3]}
  %zero: f32[] = Constant "zero"() {value=tensor<f32[]> [0.0]}
  %keep: f32[] = Constant "keep"() {value=tensor<f32[]> [0.7]}
  %y, %m = Dropout "drop"(%x, %ratio, %t) {seed=42}
  %y2 = Dropout "same_seed"(%x, %ratio, %t) {seed=42}
  %y3 = Dropout "other_seed"(%x, %ratio, %t) {seed=43}
  %z, %zm = Dropout "ratio_zero"(%x, %zero, %t)
  %yr, %mr = Dropout "runtime_on"(%x, %rr, %on) {seed=9}
  %yo, %mo = Dropout "runtime_off"(%x, %rr, %off) {seed=9}
  %q = Div "scaled"(%x, %keep)
  %eq = Equal "exact"(%y, %q)
  %one: f32[] = Constant "one"() {value=tensor<f32[]> [1.0]}
  %mf = Where "mf"(%m, %one, %zero)
  %eqf = Where "eqf"(%eq, %one, %zero)
  %zmf = Where "zmf"(%zm, %one, %zero)
  %mrf = Where "mrf"(%mr, %one, %zero)
  %mof = Where "mof"(%mo, %one, %zero)
  output %y, %mf, %eqf, %y2, %y3, %z, %zmf, %yr, %mrf, %yo, %mof"#,
        &[
            ("tensor<256x256xf32>", &dense(&x, &[256, 256], false)),
            ("tensor<i1>", "dense<true>"),
            ("tensor<i1>", "dense<false>"),
            ("tensor<f32>", "dense<0.75>"),
            ("tensor<i64>", "dense<0>"),
        ],
    ) else {
        return;
    };
    let (y, mask, exact) = (&r[0], &r[1], &r[2]);
    let kept = share(mask);
    assert!((kept - 0.7).abs() < 0.01, "keeps {kept} of the elements, not 0.7");
    // Neighbours are independent: both kept or both dropped 0.7² + 0.3² of the time.
    let agree = mask.windows(2).filter(|w| w[0] == w[1]).count() as f64 / (n - 1) as f64;
    assert!((agree - 0.58).abs() < 0.01, "neighbouring masks agree {agree} of the time");
    let den = (1.0 - f64::from(0.3f32)) as f32;
    for i in 0..n {
        let want = stream(42, 0, i, 24) as f32 >= 0.3f32;
        assert_eq!(mask[i] == 1.0, want, "mask {i} follows the stream");
        if want {
            assert!(exact[i] == 1.0, "kept element {i}: {} is not exactly x / (1 − ratio)", y[i]);
            let w = f64::from(x[i] as f32 / den);
            assert!((y[i] - w).abs() <= 1e-5 * w.abs(), "element {i}: {} vs {w}", y[i]);
        } else {
            assert_eq!(y[i], 0.0, "dropped element {i}");
        }
    }
    assert_eq!(&r[3], y, "one seed, one output");
    let differ = y.iter().zip(&r[4]).filter(|(a, b)| (**a == 0.0) != (**b == 0.0)).count() as f64 / n as f64;
    assert!((differ - 0.42).abs() < 0.01, "another seed drops other elements: {differ}");
    close("ratio 0 forwards", &r[5], &x);
    assert!(r[6].iter().all(|&v| v == 1.0), "ratio 0 keeps every element");
    let kept = share(&r[8]);
    assert!((kept - 0.25).abs() < 0.01, "runtime ratio 0.75 keeps {kept}");
    for i in 0..n {
        match r[8][i] == 1.0 {
            true => assert!((r[7][i] - x[i] / 0.25).abs() <= 1e-5 * x[i].abs() * 4.0, "runtime scale at {i}"),
            false => assert_eq!(r[7][i], 0.0),
        }
    }
    close("runtime-false mode forwards", &r[9], &x);
    assert!(r[10].iter().all(|&v| v == 1.0), "runtime-false mode keeps every element");
}

/// `RandomUniformLike` over 64k elements follows the documented stream, stays
/// in [low, high) with the mean and variance of the uniform distribution;
/// an f16 output draws 11 bits, exact in f16.
#[test]
fn random_uniform_like_is_uniform_and_seeded() {
    let Some(r) = execute(
        "uniform",
        r#"  input %x: f32[256,256]
  %u = RandomUniformLike "u"(%x) {low=-2.0, high=3.0, seed=5.0}
  %h = RandomUniformLike "h"(%x) {dtype=10, seed=5.0}
  %hf = Cast "hf"(%h) {to=1}
  output %u, %hf"#,
        &[("tensor<256x256xf32>", "dense<1.0>"), ("tensor<i64>", "dense<0>")],
    ) else {
        return;
    };
    let (u, h) = (&r[0], &r[1]);
    let n = u.len() as f64;
    assert!(u.iter().all(|&v| (-2.0..3.0).contains(&v)), "outside [−2, 3)");
    let mean = u.iter().sum::<f64>() / n;
    let var = u.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    assert!((mean - 0.5).abs() < 0.03, "mean {mean}");
    assert!((var - 25.0 / 12.0).abs() < 0.05, "variance {var}");
    let want: Vec<f64> = (0..u.len()).map(|i| f64::from((stream(5, 0, i, 24) * 5.0 - 2.0) as f32)).collect();
    close("documented stream", u, &want);
    for (i, &v) in h.iter().enumerate() {
        // A multiple of 2⁻¹¹ (up to the six digits printed).
        assert!((0.0..1.0).contains(&v) && ((v * 2048.0) - (v * 2048.0).round()).abs() < 5e-3, "f16 draw {i}: {v}");
        assert!((v - stream(5, 0, i, 11)).abs() < 1e-6, "f16 draw {i} follows the stream");
    }
}

/// The documented Box–Muller pair of element `n`: `u₁ ∈ (0, 1]`, `u₂ ∈ [0, 1)`
/// from one draw, 24 bits each (f32 compute).
fn normal_pair(key: u64, offset: i64, n: usize) -> (f64, f64) {
    let k = key ^ fin(offset as u64);
    let z = fin(k.wrapping_add((n as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let u1 = ((z >> 40) + 1) as f64 / 2f64.powi(24);
    let u2 = ((z >> 8) & 0xFF_FFFF) as f64 / 2f64.powi(24);
    (u1, u2)
}

#[test]
fn random_normal_like_is_normal_and_seeded() {
    let Some(r) = execute(
        "normal",
        r#"  input %x: f32[256,256]
  %g = RandomNormalLike "g"(%x) {mean=1.5, scale=2.0, seed=7.0}
  %s = RandomNormal "s"() {shape=[4096], seed=7.0}
  output %g, %s"#,
        &[("tensor<256x256xf32>", "dense<1.0>"), ("tensor<i64>", "dense<0>")],
    ) else {
        return;
    };
    let (g, s) = (&r[0], &r[1]);
    let n = g.len() as f64;
    let mean = g.iter().sum::<f64>() / n;
    let var = g.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    // 65536 samples: standard errors 0.008 (mean) and 0.022 (variance 4).
    assert!((mean - 1.5).abs() < 0.04, "mean {mean}");
    assert!((var - 4.0).abs() < 0.1, "variance {var}");
    // The tails of a normal: |x − μ| > 2σ about 4.55% of the time, > 3σ 0.27%.
    let beyond = |k: f64| g.iter().filter(|&&v| (v - 1.5).abs() > k * 2.0).count() as f64 / n;
    assert!((beyond(2.0) - 0.0455).abs() < 0.004, "beyond 2σ: {}", beyond(2.0));
    assert!((beyond(3.0) - 0.0027).abs() < 0.001, "beyond 3σ: {}", beyond(3.0));
    let want: Vec<f64> = (0..g.len())
        .map(|i| {
            let (u1, u2) = normal_pair(7, 0, i);
            1.5 + 2.0 * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
        })
        .collect();
    close("documented stream", g, &want);
    // Same seed, same stream: the static-shape op equals the first 4096 of
    // the like op's standard draws.
    let std: Vec<f64> = g[..4096].iter().map(|v| (v - 1.5) / 2.0).collect();
    close("seeded", s, &std);
}

#[test]
fn bernoulli_follows_its_probabilities() {
    let Some(r) = execute(
        "bernoulli",
        r#"  input %p: f32[256,256]
  input %q: f64[4,4]
  %b = Bernoulli "b"(%p) {seed=3.0}
  %bb = Bernoulli "bb"(%q) {dtype=9}
  %bf = Cast "bf"(%bb) {to=1}
  output %b, %bf"#,
        &[
            ("tensor<256x256xf32>", "dense<0.25>"),
            (
                "tensor<4x4xf64>",
                "dense<[[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0]]>",
            ),
            ("tensor<i64>", "dense<0>"),
        ],
    ) else {
        return;
    };
    let (b, bb) = (&r[0], &r[1]);
    assert!(b.iter().all(|&v| v == 0.0 || v == 1.0), "0 or 1");
    // 65536 trials at p = 0.25: standard error 0.0017.
    assert!((share(b) - 0.25).abs() < 0.01, "share {}", share(b));
    let want: Vec<f64> = (0..b.len()).map(|i| f64::from(stream(3, 0, i, 24) < 0.25)).collect();
    close("documented stream", b, &want);
    // p = 0 never fires and p = 1 always does; bool output.
    let want: Vec<f64> = (0..16).map(|i| (i % 2) as f64).collect();
    close("p in {0, 1}", bb, &want);
}

/// `Multinomial` inverts each row's CDF with the documented draws: 4096
/// samples per row follow the row's softmax (probabilities 0.1 / 0.2 / 0.7,
/// the same shifted by +5 — the max is subtracted —, uniform, and one class
/// holding all the mass), every sample is the class an independent f64
/// inversion picks for the same draw (except within 1e-5 of a class
/// boundary, where f32 rounding may decide), and `dtype` picks int64.
#[test]
fn multinomial_samples_by_inverting_the_cdf() {
    let (rows, samples) = (4usize, 4096usize);
    let p = [0.1f64, 0.2, 0.7];
    let logits: Vec<f64> = p
        .iter()
        .map(|v| v.ln())
        .chain(p.iter().map(|v| v.ln() + 5.0))
        .chain([0.0, 0.0, 0.0])
        .chain([-1000.0, 0.0, -1000.0])
        .collect();
    let lit = dense(&logits.iter().map(|&v| f64::from(v as f32)).collect::<Vec<_>>(), &[rows, 3], false);
    let Some(r) = execute(
        "multinomial",
        &format!(
            r#"  input %x: f32[4,3]
  %s: i64[4,{samples}] = Multinomial "m"(%x) {{dtype=7, sample_size={samples}, seed=7.0}}
  %f = Cast "f"(%s) {{to=1}}
  output %f"#
        ),
        &[("tensor<4x3xf32>", lit.as_str()), ("tensor<i64>", "dense<0>")],
    ) else {
        return;
    };
    let got = &r[0];
    assert_eq!(got.len(), rows * samples);
    let (mut exact, mut boundary) = (0, 0);
    for b in 0..rows {
        let row: Vec<f64> = logits[3 * b..3 * b + 3].iter().map(|&v| f64::from(v as f32)).collect();
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
        let total: f64 = w.iter().sum();
        let cdf: Vec<f64> = w
            .iter()
            .scan(0.0, |acc, v| {
                *acc += v;
                Some(*acc)
            })
            .collect();
        let mut counts = [0usize; 3];
        for s in 0..samples {
            let n = b * samples + s;
            let t = stream(7, 0, n, 24) * total;
            let want = cdf.iter().filter(|&&c| c <= t).count().min(2);
            let g = got[n];
            assert!(g == 0.0 || g == 1.0 || g == 2.0, "class index {g}");
            counts[g as usize] += 1;
            if g as usize == want {
                exact += 1;
            } else {
                assert!(cdf.iter().any(|c| (c - t).abs() < 1e-5 * total), "row {b} sample {s}: {g} vs {want}");
                boundary += 1;
            }
        }
        let freq: Vec<f64> = counts.iter().map(|&c| c as f64 / samples as f64).collect();
        let want: Vec<f64> = w.iter().map(|v| v / total).collect();
        for (f, q) in freq.iter().zip(&want) {
            // 4096 draws: standard error at most 0.008.
            assert!((f - q).abs() < 0.03, "row {b}: frequencies {freq:?}, probabilities {want:?}");
        }
    }
    assert!(boundary <= 2, "{boundary} samples differ off the documented inversion ({exact} agree)");
}

/// The trailing `rng_offset` argument selects the stream of a call: one
/// compiled function called with offsets 0, 1, 0 and −7 (in one process)
/// keeps 0.7 of the elements each time, draws another mask at each new
/// offset, the same mask again at the same offset, and follows the
/// documented derivation for seeded and unseeded nodes alike (uniform draws
/// included).
#[test]
fn rng_offset_selects_a_stream_per_call() {
    let n = 256 * 256;
    let offsets = [0i64, 1, 0, -7];
    let calls: Vec<Vec<(&str, String)>> = offsets
        .iter()
        .map(|o| vec![("tensor<256x256xf32>", "dense<1.0>".to_string()), ("tensor<i64>", format!("dense<{o}>"))])
        .collect();
    let calls: Vec<Vec<(&str, &str)>> =
        calls.iter().map(|c| c.iter().map(|(t, l)| (*t, l.as_str())).collect()).collect();
    let Some(r) = execute_calls(
        "rng_offset",
        r#"  input %x: f32[256,256]
  %t: bool[] = Constant "t"() {value=tensor<bool[]> [true]}
  %ratio: f32[] = Constant "ratio"() {value=tensor<f32[]> [0.3]}
  %zero: f32[] = Constant "zero"() {value=tensor<f32[]> [0.0]}
  %one: f32[] = Constant "one"() {value=tensor<f32[]> [1.0]}
  %y, %m = Dropout "seeded"(%x, %ratio, %t) {seed=42}
  %y2, %m2 = Dropout "unseeded"(%x, %ratio, %t)
  %u = RandomUniformLike "u"(%x) {seed=5.0}
  %mf = Where "mf"(%m, %one, %zero)
  %m2f = Where "m2f"(%m2, %one, %zero)
  output %mf, %m2f, %u"#,
        &calls,
    ) else {
        return;
    };
    let differ = |a: &[f64], b: &[f64]| a.iter().zip(b).filter(|(x, y)| x != y).count() as f64 / n as f64;
    for (call, &o) in r.iter().zip(&offsets) {
        for (k, (mask, key)) in [(&call[0], 42), (&call[1], unseeded_key("unseeded"))].into_iter().enumerate() {
            let kept = share(mask);
            assert!((kept - 0.7).abs() < 0.01, "offset {o}, mask {k}: keeps {kept}, not 0.7");
            for (i, &v) in mask.iter().enumerate() {
                let want = stream(key, o, i, 24) as f32 >= 0.3f32;
                assert_eq!(v == 1.0, want, "offset {o}, mask {k}, element {i} follows the stream");
            }
        }
        let want: Vec<f64> = (0..n).map(|i| f64::from(stream(5, o, i, 24) as f32)).collect();
        close(&format!("uniform at offset {o}"), &call[2], &want);
    }
    // Independent masks keep-or-drop alike 0.7² + 0.3² of the time;
    // independent uniform draws almost never agree.
    for (k, want) in [0.42, 0.42, 1.0].into_iter().enumerate() {
        assert_eq!(r[0][k], r[2][k], "output {k}: offset 0 again draws the same numbers");
        for (a, b) in [(0, 1), (0, 3), (1, 3)] {
            let d = differ(&r[a][k], &r[b][k]);
            assert!((d - want).abs() < 0.01, "output {k}: offsets {} and {} differ at {d}", offsets[a], offsets[b]);
        }
    }
    // The two nodes of one call draw unrelated masks too.
    assert!((differ(&r[1][0], &r[1][1]) - 0.42).abs() < 0.01, "seeded and unseeded nodes agree too often");
}

/// Every index of `shape`, row-major.
fn points(shape: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &n in shape {
        out = out.into_iter().flat_map(|p| (0..n).map(move |i| [p.clone(), vec![i]].concat())).collect();
    }
    out
}

/// The row-major offset of `idx` in `shape`.
fn offset(shape: &[usize], idx: &[usize]) -> usize {
    shape.iter().zip(idx).fold(0, |acc, (n, i)| acc * n + i)
}

/// Shapes and window attributes of a convolution.
struct Window<'a> {
    x: &'a [usize],
    w: &'a [usize],
    strides: &'a [usize],
    dilations: &'a [usize],
    /// Begin pads then end pads.
    pads: &'a [usize],
    group: usize,
}

/// ONNX `Conv`, plainly: each output is the bias plus the in-bounds taps
/// `x[n, g·C/G + c, o·s − pad + k·d] · w[f, c, k]` of its group.
fn conv_ref(x: &[f64], w: &[f64], b: Option<&[f64]>, win: &Window) -> (Vec<f64>, Vec<usize>) {
    let sp = win.x.len() - 2;
    let (f, cg) = (win.w[0], win.w[1]);
    let fg = f / win.group;
    let mut oshape = vec![win.x[0], f];
    for i in 0..sp {
        let span = (win.w[2 + i] - 1) * win.dilations[i] + 1;
        oshape.push((win.x[2 + i] + win.pads[i] + win.pads[sp + i] - span) / win.strides[i] + 1);
    }
    let mut y = vec![0.0; oshape.iter().product()];
    for o in points(&oshape) {
        let (n, fo) = (o[0], o[1]);
        let mut acc = b.map_or(0.0, |b| b[fo]);
        for c in 0..cg {
            for k in points(&win.w[2..]) {
                let pos: Vec<i64> = (0..sp)
                    .map(|i| (o[2 + i] * win.strides[i] + k[i] * win.dilations[i]) as i64 - win.pads[i] as i64)
                    .collect();
                if pos.iter().zip(&win.x[2..]).any(|(&p, &m)| p < 0 || p >= m as i64) {
                    continue;
                }
                let mut xi = vec![n, (fo / fg) * cg + c];
                xi.extend(pos.iter().map(|&p| p as usize));
                let wi = [vec![fo, c], k.clone()].concat();
                acc += x[offset(win.x, &xi)] * w[offset(win.w, &wi)];
            }
        }
        y[offset(&oshape, &o)] = acc;
    }
    (y, oshape)
}

/// ONNX `ConvTranspose`, plainly: every input element adds `x · w[c, f, k]`
/// at output position `i·s + k·d − pad_begin` (when inside the output), on
/// top of the bias; the output size is `s·(I − 1) + output_padding +
/// (K − 1)·d + 1 − pads`.
fn conv_transpose_ref(x: &[f64], w: &[f64], b: Option<&[f64]>, win: &Window, extra: &[usize]) -> Vec<f64> {
    let sp = win.x.len() - 2;
    let (c, fg) = (win.w[0], win.w[1]);
    let cg = c / win.group;
    let mut oshape = vec![win.x[0], fg * win.group];
    for (i, e) in extra.iter().enumerate() {
        let full = win.strides[i] * (win.x[2 + i] - 1) + e + (win.w[2 + i] - 1) * win.dilations[i] + 1;
        oshape.push(full - win.pads[i] - win.pads[sp + i]);
    }
    let mut y = vec![0.0; oshape.iter().product()];
    for o in points(&oshape) {
        y[offset(&oshape, &o)] = b.map_or(0.0, |b| b[o[1]]);
    }
    for xi in points(win.x) {
        let (n, ci) = (xi[0], xi[1]);
        for f in 0..fg {
            for k in points(&win.w[2..]) {
                let pos: Vec<i64> = (0..sp)
                    .map(|i| (xi[2 + i] * win.strides[i] + k[i] * win.dilations[i]) as i64 - win.pads[i] as i64)
                    .collect();
                if pos.iter().zip(&oshape[2..]).any(|(&p, &m)| p < 0 || p >= m as i64) {
                    continue;
                }
                let mut oi = vec![n, (ci / cg) * fg + f];
                oi.extend(pos.iter().map(|&p| p as usize));
                y[offset(&oshape, &oi)] += x[offset(win.x, &xi)] * w[offset(win.w, &[vec![ci, f], k.clone()].concat())];
            }
        }
    }
    y
}

/// 1-D and 3-D convolutions (strided, padded, dilated, grouped, with and
/// without bias) and transposed 2-D convolutions (strides, pads,
/// `output_padding`, dilations, groups) against plain implementations of the
/// ONNX definitions.
#[test]
fn conv_1d_3d_and_transposed_compute_onnx_values() {
    let vals = |n: usize, salt: usize| -> Vec<f64> {
        (0..n).map(|i| (((i * 37 + salt * 11) % 29) as f64 - 14.0) * 0.125).collect()
    };
    let (x1, w1, b1, g1) = (vals(72, 1), vals(72, 2), vals(6, 3), vals(24, 4));
    let (x3, w3, b3, g3) = (vals(420, 5), vals(108, 6), vals(3, 7), vals(12, 8));
    let (xt, wt, bt) = (vals(48, 9), vals(72, 10), vals(6, 11));
    let (xu, wu) = (vals(18, 12), vals(54, 13));
    let Some(r) = execute(
        "convs",
        r#"  input %x1: f32[2,4,9]
  input %w1: f32[6,4,3]
  input %b1: f32[6]
  input %g1: f32[4,2,3]
  input %x3: f32[1,2,5,6,7]
  input %w3: f32[3,2,3,2,3]
  input %b3: f32[3]
  input %g3: f32[2,1,1,2,3]
  input %xt: f32[1,4,3,4]
  input %wt: f32[4,3,3,2]
  input %bt: f32[6]
  input %xu: f32[1,2,3,3]
  input %wu: f32[2,3,3,3]
  %c1 = Conv "c1"(%x1, %w1, %b1) {pads=[1, 2], strides=[2]}
  %d1 = Conv "grouped1"(%x1, %g1) {group=2, dilations=[2]}
  %c3 = Conv "c3"(%x3, %w3, %b3) {strides=[1, 2, 2], pads=[1, 0, 1, 1, 1, 0]}
  %d3 = Conv "grouped3"(%x3, %g3) {group=2, pads=[0, 1, 0, 0, 1, 1], dilations=[1, 1, 2]}
  %t = ConvTranspose "t"(%xt, %wt, %bt) {group=2, strides=[2, 3], pads=[1, 0, 0, 1], output_padding=[1, 2], dilations=[1, 2]}
  %u = ConvTranspose "u"(%xu, %wu) {strides=[2, 2]}
  output %c1, %d1, %c3, %d3, %t, %u"#,
        &[
            ("tensor<2x4x9xf32>", &dense(&x1, &[2, 4, 9], false)),
            ("tensor<6x4x3xf32>", &dense(&w1, &[6, 4, 3], false)),
            ("tensor<6xf32>", &dense(&b1, &[6], false)),
            ("tensor<4x2x3xf32>", &dense(&g1, &[4, 2, 3], false)),
            ("tensor<1x2x5x6x7xf32>", &dense(&x3, &[1, 2, 5, 6, 7], false)),
            ("tensor<3x2x3x2x3xf32>", &dense(&w3, &[3, 2, 3, 2, 3], false)),
            ("tensor<3xf32>", &dense(&b3, &[3], false)),
            ("tensor<2x1x1x2x3xf32>", &dense(&g3, &[2, 1, 1, 2, 3], false)),
            ("tensor<1x4x3x4xf32>", &dense(&xt, &[1, 4, 3, 4], false)),
            ("tensor<4x3x3x2xf32>", &dense(&wt, &[4, 3, 3, 2], false)),
            ("tensor<6xf32>", &dense(&bt, &[6], false)),
            ("tensor<1x2x3x3xf32>", &dense(&xu, &[1, 2, 3, 3], false)),
            ("tensor<2x3x3x3xf32>", &dense(&wu, &[2, 3, 3, 3], false)),
        ],
    ) else {
        return;
    };
    let win = |x, w, strides, dilations, pads, group| Window { x, w, strides, dilations, pads, group };
    let (c1, _) = conv_ref(&x1, &w1, Some(&b1), &win(&[2, 4, 9], &[6, 4, 3], &[2], &[1], &[1, 2], 1));
    close("conv 1-D", &r[0], &c1);
    let (d1, _) = conv_ref(&x1, &g1, None, &win(&[2, 4, 9], &[4, 2, 3], &[1], &[2], &[0, 0], 2));
    close("grouped conv 1-D", &r[1], &d1);
    let w3win = win(&[1, 2, 5, 6, 7], &[3, 2, 3, 2, 3], &[1, 2, 2], &[1, 1, 1], &[1, 0, 1, 1, 1, 0], 1);
    close("conv 3-D", &r[2], &conv_ref(&x3, &w3, Some(&b3), &w3win).0);
    let g3win = win(&[1, 2, 5, 6, 7], &[2, 1, 1, 2, 3], &[1, 1, 1], &[1, 1, 2], &[0, 1, 0, 0, 1, 1], 2);
    close("grouped conv 3-D", &r[3], &conv_ref(&x3, &g3, None, &g3win).0);
    let twin = win(&[1, 4, 3, 4], &[4, 3, 3, 2], &[2, 3], &[1, 2], &[1, 0, 0, 1], 2);
    close("conv transpose", &r[4], &conv_transpose_ref(&xt, &wt, Some(&bt), &twin, &[1, 2]));
    let uwin = win(&[1, 2, 3, 3], &[2, 3, 3, 3], &[2, 2], &[1, 1], &[0, 0, 0, 0], 1);
    close("conv transpose, stride 2", &r[5], &conv_transpose_ref(&xu, &wu, None, &uwin, &[0, 0]));
}

/// `v` rounded to the nearest f16 (ties to even), by the kernels' reference
/// cast (the project's specification of it).
fn round_f16(v: f32) -> f32 {
    use qsync_kernels::reference::{f16_to_f32, f32_to_f16};
    f16_to_f32(f32_to_f16(v))
}

/// `init + Σ a·b` over `terms`, accumulated in f32, or, with `f16_acc`,
/// rounded to f16 after every addition (what accumulating in f16 gives).
fn dot(init: f32, terms: impl Iterator<Item = (f32, f32)>, f16_acc: bool) -> f32 {
    terms.fold(init, |acc, (a, b)| if f16_acc { round_f16(acc + round_f16(a * b)) } else { acc + a * b })
}

/// Contractions over f16 operands accumulate in f32 and round once: with
/// K = 4096 terms of {0.5, 1, 1.5, 2}² the sums reach several thousand,
/// where f16's step is 2 to 8, so an f16 accumulator loses most of each
/// addition. Every partial sum is a multiple of ¼ below 2¹⁵, exact in f32
/// (and in f64, so the plain convolution references sum exactly too): the
/// expected values are those sums rounded once to f16. Covered: MatMul
/// against a 2-D weight, batched, and with a broadcast batch; Gemm with α,
/// β and C; Conv with bias (named op), grouped 1-D (a `linalg.generic`) and
/// ConvTranspose.
#[test]
fn f16_contractions_accumulate_in_f32_and_round_once() {
    const K: usize = 4096;
    let vals = |n: usize, salt: usize| -> Vec<f32> {
        (0..n).map(|i| 0.5 * (1 + (i * 37 + salt * 11 + i / 5) % 4) as f32).collect()
    };
    let (a, w, q, kb, kp) = (vals(2 * K, 1), vals(K * 3, 2), vals(2 * K, 3), vals(2 * K * 2, 4), vals(K * 2, 5));
    let (ga, gb, gc) = (vals(2 * K, 6), vals(3 * K, 7), vals(3, 8));
    let (x, cw, cb) = (vals(1024 * 9, 9), vals(2 * 1024 * 4, 10), vals(2, 11));
    let (x1, w1) = (vals(K * 3, 12), vals(2 * (K / 2) * 2, 13));
    let (xt, wt) = (vals(2048 * 4, 14), vals(2048 * 4, 15));
    let lit = |v: &[f32], dims: &[usize]| dense(&v.iter().map(|&e| f64::from(e)).collect::<Vec<_>>(), dims, false);
    let Some(r) = execute(
        "f16_accumulation",
        r#"  input %a: f16[1,2,4096]
  input %w: f16[4096,3]
  input %q: f16[2,1,4096]
  input %kb: f16[2,4096,2]
  input %kp: f16[1,4096,2]
  input %ga: f16[2,4096]
  input %gb: f16[3,4096]
  input %gc: f16[3]
  input %x: f16[1,1024,3,3]
  input %cw: f16[2,1024,2,2]
  input %cb: f16[2]
  input %x1: f16[1,4096,3]
  input %w1: f16[2,2048,2]
  input %xt: f16[1,2048,2,2]
  input %wt: f16[2048,1,2,2]
  %m = MatMul "proj"(%a, %w) @f16
  %b = MatMul "batched"(%q, %kb) @f16
  %p = MatMul "bcast"(%q, %kp) @f16
  %g = Gemm "fc"(%ga, %gb, %gc) {transB=1, alpha=0.5, beta=2.0} @f16
  %c = Conv "conv"(%x, %cw, %cb) @f16
  %d = Conv "grouped"(%x1, %w1) {group=2} @f16
  %t = ConvTranspose "up"(%xt, %wt) @f16
  %m32 = Cast "m32"(%m) {to=1}
  %b32 = Cast "b32"(%b) {to=1}
  %p32 = Cast "p32"(%p) {to=1}
  %g32 = Cast "g32"(%g) {to=1}
  %c32 = Cast "c32"(%c) {to=1}
  %d32 = Cast "d32"(%d) {to=1}
  %t32 = Cast "t32"(%t) {to=1}
  output %m32, %b32, %p32, %g32, %c32, %d32, %t32"#,
        &[
            ("tensor<1x2x4096xf16>", &lit(&a, &[1, 2, K])),
            ("tensor<4096x3xf16>", &lit(&w, &[K, 3])),
            ("tensor<2x1x4096xf16>", &lit(&q, &[2, 1, K])),
            ("tensor<2x4096x2xf16>", &lit(&kb, &[2, K, 2])),
            ("tensor<1x4096x2xf16>", &lit(&kp, &[1, K, 2])),
            ("tensor<2x4096xf16>", &lit(&ga, &[2, K])),
            ("tensor<3x4096xf16>", &lit(&gb, &[3, K])),
            ("tensor<3xf16>", &lit(&gc, &[3])),
            ("tensor<1x1024x3x3xf16>", &lit(&x, &[1, 1024, 3, 3])),
            ("tensor<2x1024x2x2xf16>", &lit(&cw, &[2, 1024, 2, 2])),
            ("tensor<2xf16>", &lit(&cb, &[2])),
            ("tensor<1x4096x3xf16>", &lit(&x1, &[1, K, 3])),
            ("tensor<2x2048x2xf16>", &lit(&w1, &[2, K / 2, 2])),
            ("tensor<1x2048x2x2xf16>", &lit(&xt, &[1, 2048, 2, 2])),
            ("tensor<2048x1x2x2xf16>", &lit(&wt, &[2048, 1, 2, 2])),
        ],
    ) else {
        return;
    };
    // Row-major [batch][rows][cols] products of a (batch × rows × K) and
    // b (batch × K × cols), a batch of 1 broadcast; f32 or f16 sums.
    let matmul = |a: &[f32], b: &[f32], [ba, bb, rows, cols]: [usize; 4], f16_acc: bool| -> Vec<f32> {
        let mut y = Vec::new();
        for n in 0..ba.max(bb) {
            let (na, nb) = (if ba == 1 { 0 } else { n }, if bb == 1 { 0 } else { n });
            for i in 0..rows {
                for j in 0..cols {
                    let terms = (0..K).map(|k| (a[(na * rows + i) * K + k], b[(nb * K + k) * cols + j]));
                    y.push(dot(0.0, terms, f16_acc));
                }
            }
        }
        y
    };
    let rounded = |v: &[f32]| -> Vec<f64> { v.iter().map(|&e| f64::from(round_f16(e))).collect() };
    // The f32 sums and, to show the test tells the two apart, f16 ones.
    let shapes = [(&a, &w, [1, 1, 2, 3]), (&q, &kb, [2, 2, 1, 2]), (&q, &kp, [2, 1, 1, 2])];
    for (i, (lhs, rhs, dims)) in shapes.into_iter().enumerate() {
        let want = matmul(lhs, rhs, dims, false);
        let f16_sums = matmul(lhs, rhs, dims, true);
        assert!(want.iter().zip(&f16_sums).all(|(s, h)| round_f16(*s) != *h), "f16 sums {f16_sums:?} vs {want:?}");
        assert_eq!(r[i], rounded(&want), "matmul {i}");
    }
    // Gemm: 0.5·A·Bᵀ + 2·C, in f32 then rounded.
    let gbt: Vec<f32> = (0..K * 3).map(|i| gb[(i % 3) * K + i / 3]).collect();
    let ab = matmul(&ga, &gbt, [1, 1, 2, 3], false);
    let want: Vec<f32> = ab.iter().enumerate().map(|(i, &s)| 0.5 * s + 2.0 * gc[i % 3]).collect();
    assert_eq!(r[3], rounded(&want), "gemm");
    // The convolutions, summed exactly by the plain references.
    let f64s = |v: &[f32]| -> Vec<f64> { v.iter().map(|&e| f64::from(e)).collect() };
    let win = |x: &'static [usize], w: &'static [usize], group: usize| Window {
        x,
        w,
        strides: &[1, 1],
        dilations: &[1, 1],
        pads: &[0, 0, 0, 0],
        group,
    };
    let (conv, _) = conv_ref(&f64s(&x), &f64s(&cw), Some(&f64s(&cb)), &win(&[1, 1024, 3, 3], &[2, 1024, 2, 2], 1));
    let grouped = Window { strides: &[1], dilations: &[1], pads: &[0, 0], ..win(&[1, K, 3], &[2, K / 2, 2], 2) };
    let (grouped, _) = conv_ref(&f64s(&x1), &f64s(&w1), None, &grouped);
    let up = conv_transpose_ref(&f64s(&xt), &f64s(&wt), None, &win(&[1, 2048, 2, 2], &[2048, 1, 2, 2], 1), &[0, 0]);
    for (tag, got, sums) in [("conv", &r[4], conv), ("grouped conv", &r[5], grouped), ("conv transpose", &r[6], up)] {
        assert!(sums.iter().all(|&s| s > 2048.0 && s == f64::from(s as f32)), "{tag}: {sums:?}");
        let want: Vec<f64> = sums.iter().map(|&s| f64::from(round_f16(s as f32))).collect();
        assert_eq!(*got, want, "{tag}");
    }
}

/// f16 `AveragePool` sums its windows in f32 and rounds once after the
/// division: with 2048 first in each window, an f16 running sum would stay
/// at 2048 (2049 rounds to even) and lose every following 1. Covers the
/// uniform divisor and the per-window counts (excluded padding).
#[test]
fn f16_average_pool_sums_in_f32_and_rounds_once() {
    // x[0, 0] = 2048, the rest 1: window sums are exact in f32.
    let x: Vec<f32> = (0..9).map(|i| if i == 0 { 2048.0 } else { 1.0 }).collect();
    let lit = dense(&x.iter().map(|&e| f64::from(e)).collect::<Vec<_>>(), &[1, 1, 3, 3], false);
    let Some(r) = execute(
        "f16_average_pool",
        r#"  input %x: f16[1,1,3,3]
  %u = AveragePool "whole"(%x) {kernel_shape=[3, 3]} @f16
  %p = AveragePool "padded"(%x) {kernel_shape=[2, 2], pads=[1, 1, 0, 0]} @f16
  %u32 = Cast "u32"(%u) {to=1}
  %p32 = Cast "p32"(%p) {to=1}
  output %u32, %p32"#,
        &[("tensor<1x1x3x3xf16>", &lit)],
    ) else {
        return;
    };
    // Plain reference: the mean of each window's in-bounds elements (pads
    // do not count), in f32, rounded once; and the f16 running sum that the
    // test must tell apart from it.
    let pool = |k: usize, pad: usize, f16_acc: bool| -> Vec<f64> {
        let o = 3 + pad - k + 1;
        let mut y = Vec::new();
        for i in 0..o {
            for j in 0..o {
                let (mut s, mut n) = (0.0f32, 0.0f32);
                for (di, dj) in (0..k).flat_map(|a| (0..k).map(move |b| (a, b))) {
                    let (r, c) = ((i + di).checked_sub(pad), (j + dj).checked_sub(pad));
                    if let (Some(r), Some(c)) = (r, c) {
                        s += x[r * 3 + c];
                        if f16_acc {
                            s = round_f16(s);
                        }
                        n += 1.0;
                    }
                }
                y.push(f64::from(round_f16(s / n)));
            }
        }
        y
    };
    for (tag, got, k, pad) in [("uniform", &r[0], 3, 0), ("counts", &r[1], 2, 1)] {
        let want = pool(k, pad, false);
        assert_ne!(want, pool(k, pad, true), "{tag}: the input does not tell the accumulators apart");
        assert_eq!(*got, want, "{tag}");
    }
}

/// ONNX `Softmax` (or `LogSoftmax`) of `x` viewed as outer × n × inner,
/// normalizing along the middle: from opset 13 `n` is the size of `axis`,
/// before it the product of the axes from `axis` on (inner 1).
fn softmax_ref(x: &[f64], outer: usize, n: usize, inner: usize, log: bool) -> Vec<f64> {
    assert_eq!(x.len(), outer * n * inner);
    let mut y = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            let top = (0..n).fold(f64::NEG_INFINITY, |a, j| a.max(x[at(j)]));
            let sum: f64 = (0..n).map(|j| (x[at(j)] - top).exp()).sum();
            for j in 0..n {
                let t = x[at(j)] - top;
                y[at(j)] = if log { t - sum.ln() } else { t.exp() / sum };
            }
        }
    }
    y
}

/// `Softmax`/`LogSoftmax` over every axis of a 2×3×4 tensor, from opset 13
/// (one axis) and at opset 11 (the block from `axis` on, default 1).
#[test]
fn softmax_over_any_axis_in_both_opset_regimes() {
    let x: Vec<f64> = (0..24).map(|i| (((i * 7) % 11) as f64 - 5.0) * 0.375).collect();
    let lit = dense(&x, &[2, 3, 4], false);
    let args = vec![("tensor<2x3x4xf32>", lit.as_str())];
    let Some(r13) = execute_at(
        13,
        "softmax13",
        r#"  input %x: f32[2,3,4]
  %a = Softmax "first"(%x) {axis=0}
  %b = Softmax "middle"(%x) {axis=1}
  %c = Softmax "default"(%x)
  %l = LogSoftmax "log_middle"(%x) {axis=-2}
  %m = LogSoftmax "log_first"(%x) {axis=-3}
  output %a, %b, %c, %l, %m"#,
        std::slice::from_ref(&args),
    ) else {
        return;
    };
    let r = &r13[0];
    close("opset 13, axis 0", &r[0], &softmax_ref(&x, 1, 2, 12, false));
    close("opset 13, axis 1", &r[1], &softmax_ref(&x, 2, 3, 4, false));
    close("opset 13, default axis", &r[2], &softmax_ref(&x, 6, 4, 1, false));
    close("opset 13, log, axis -2", &r[3], &softmax_ref(&x, 2, 3, 4, true));
    close("opset 13, log, axis -3", &r[4], &softmax_ref(&x, 1, 2, 12, true));
    let Some(r11) = execute_at(
        11,
        "softmax11",
        r#"  input %x: f32[2,3,4]
  %a = Softmax "default"(%x)
  %b = Softmax "all"(%x) {axis=0}
  %c = Softmax "last"(%x) {axis=2}
  %l = LogSoftmax "log_default"(%x)
  %m = LogSoftmax "log_all"(%x) {axis=-3}
  output %a, %b, %c, %l, %m"#,
        &[args],
    ) else {
        return;
    };
    let r = &r11[0];
    close("opset 11, default axis 1", &r[0], &softmax_ref(&x, 2, 12, 1, false));
    close("opset 11, axis 0", &r[1], &softmax_ref(&x, 1, 24, 1, false));
    close("opset 11, axis 2", &r[2], &softmax_ref(&x, 6, 4, 1, false));
    close("opset 11, log, default axis 1", &r[3], &softmax_ref(&x, 2, 12, 1, true));
    close("opset 11, log, axis -3", &r[4], &softmax_ref(&x, 1, 24, 1, true));
}

/// Window attributes of a 2-D max pool.
struct Pool {
    k: [usize; 2],
    s: [usize; 2],
    d: [usize; 2],
    /// Begin pads then end pads.
    pads: [usize; 4],
    ceil: bool,
    storage_order: i64,
}

/// ONNX `MaxPool` with `Indices` on N×C×H×W, as onnxruntime computes it:
/// each window scans its in-bounds positions row by row and keeps the
/// first one greater than everything before; the index is
/// `(n·C + c)·H·W + h·W + w` (`storage_order = 0`) or `… + w·H + h` (1).
fn max_pool_ref(x: &[f64], shape: [usize; 4], p: &Pool) -> (Vec<f64>, Vec<f64>) {
    let [n, c, h, w] = shape;
    let out = |i: usize, size: usize| {
        let span = (p.k[i] - 1) * p.d[i] + 1;
        let room = size + p.pads[i] + p.pads[2 + i] - span;
        let o = if p.ceil { room.div_ceil(p.s[i]) } else { room / p.s[i] } + 1;
        // Ceil mode drops a last window that would start in the end padding.
        if p.ceil && (o - 1) * p.s[i] >= size + p.pads[i] {
            o - 1
        } else {
            o
        }
    };
    let (oh, ow) = (out(0, h), out(1, w));
    let (mut ys, mut is) = (Vec::new(), Vec::new());
    for plane in 0..n * c {
        for a in 0..oh {
            for b in 0..ow {
                let mut best: Option<(f64, usize, usize)> = None;
                for i in 0..p.k[0] {
                    for j in 0..p.k[1] {
                        let r = (a * p.s[0] + i * p.d[0]) as i64 - p.pads[0] as i64;
                        let q = (b * p.s[1] + j * p.d[1]) as i64 - p.pads[1] as i64;
                        if r < 0 || q < 0 || r >= h as i64 || q >= w as i64 {
                            continue;
                        }
                        let v = x[plane * h * w + r as usize * w + q as usize];
                        if best.is_none_or(|(bv, _, _)| v > bv) {
                            best = Some((v, r as usize, q as usize));
                        }
                    }
                }
                let (v, r, q) = best.expect("a window inside the input");
                ys.push(v);
                let local = if p.storage_order == 0 { r * w + q } else { q * h + r };
                is.push((plane * h * w + local) as f64);
            }
        }
    }
    (ys, is)
}

/// `MaxPool`'s values and `Indices` (cast to f32 to be printed) on data full
/// of ties, with padding, strides, dilations, ceil mode and both storage
/// orders, against onnxruntime's definition.
#[test]
fn max_pool_indices_compute_onnx_values() {
    let shape = [2, 2, 5, 6];
    // Few distinct values: many windows hold their maximum twice.
    let x: Vec<f64> = (0..120).map(|i| ((i * 7 + i / 6) % 5) as f64 - 2.0).collect();
    let Some(r) = execute(
        "max_pool_indices",
        r#"  input %x: f32[2,2,5,6]
  %y1, %i1 = MaxPool "plain"(%x) {kernel_shape=[2, 2]}
  %y2, %i2 = MaxPool "padded"(%x) {kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]}
  %y3, %i3 = MaxPool "cols"(%x) {kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 0, 1], storage_order=1}
  %y4, %i4 = MaxPool "ceil"(%x) {kernel_shape=[2, 2], strides=[2, 2], dilations=[2, 1], ceil_mode=1}
  %y5, %i5 = MaxPool "ceil_cols"(%x) {kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1, storage_order=1}
  %f1 = Cast "f1"(%i1) {to=1}
  %f2 = Cast "f2"(%i2) {to=1}
  %f3 = Cast "f3"(%i3) {to=1}
  %f4 = Cast "f4"(%i4) {to=1}
  %f5 = Cast "f5"(%i5) {to=1}
  output %y1, %f1, %y2, %f2, %y3, %f3, %y4, %f4, %y5, %f5"#,
        &[("tensor<2x2x5x6xf32>", &dense(&x, &shape, false))],
    ) else {
        return;
    };
    let pools = [
        Pool { k: [2, 2], s: [1, 1], d: [1, 1], pads: [0; 4], ceil: false, storage_order: 0 },
        Pool { k: [3, 3], s: [2, 2], d: [1, 1], pads: [1, 1, 1, 1], ceil: false, storage_order: 0 },
        Pool { k: [3, 2], s: [2, 2], d: [1, 1], pads: [1, 0, 0, 1], ceil: false, storage_order: 1 },
        Pool { k: [2, 2], s: [2, 2], d: [2, 1], pads: [0; 4], ceil: true, storage_order: 0 },
        Pool { k: [2, 3], s: [2, 2], d: [1, 1], pads: [0; 4], ceil: true, storage_order: 1 },
    ];
    for (i, p) in pools.iter().enumerate() {
        let (y, idx) = max_pool_ref(&x, shape, p);
        close(&format!("max pool {i} values"), &r[2 * i], &y);
        assert_eq!(r[2 * i + 1], idx, "max pool {i} indices");
    }
}

/// `ConvTranspose` whose pads come from `output_shape` (spatial or full,
/// an odd total going to the beginning) or from `SAME_UPPER`/`SAME_LOWER`
/// (output `in·s`; the odd one at the end, resp. the beginning).
#[test]
fn conv_transpose_output_shape_and_same_compute_onnx_values() {
    let vals = |n: usize, salt: usize| -> Vec<f64> {
        (0..n).map(|i| (((i * 31 + salt * 7) % 23) as f64 - 11.0) * 0.25).collect()
    };
    let (x, w, b) = (vals(24, 1), vals(54, 2), vals(3, 3));
    let Some(r) = execute(
        "convt_auto",
        r#"  input %x: f32[1,2,4,3]
  input %w: f32[2,3,3,3]
  input %b: f32[3]
  %a = ConvTranspose "shape"(%x, %w, %b) {strides=[3, 2], output_shape=[9, 6]}
  %u = ConvTranspose "upper"(%x, %w) {strides=[2, 2], auto_pad="SAME_UPPER"}
  %l = ConvTranspose "lower"(%x, %w, %b) {strides=[2, 2], dilations=[2, 1], auto_pad="SAME_LOWER"}
  %f = ConvTranspose "full_shape"(%x, %w) {strides=[2, 2], output_shape=[1, 3, 8, 7], output_padding=[1, 1], auto_pad="SAME_UPPER"}
  output %a, %u, %l, %f"#,
        &[
            ("tensor<1x2x4x3xf32>", &dense(&x, &[1, 2, 4, 3], false)),
            ("tensor<2x3x3x3xf32>", &dense(&w, &[2, 3, 3, 3], false)),
            ("tensor<3xf32>", &dense(&b, &[3], false)),
        ],
    ) else {
        return;
    };
    let (xs, ws) = ([1, 2, 4, 3], [2, 3, 3, 3]);
    let win = |strides, dilations, pads| Window { x: &xs, w: &ws, strides, dilations, pads, group: 1 };
    // Totals s·(in − 1) + output_padding + (k − 1)·d + 1 − out, split by mode.
    let split =
        |total: usize, upper: bool| if upper { (total / 2, total - total / 2) } else { (total - total / 2, total / 2) };
    let pads = |h: (usize, usize), w: (usize, usize)| [h.0, w.0, h.1, w.1];
    // output_shape [9, 6], NOTSET: totals 3·3 + 3 − 9 = 3 and 2·2 + 3 − 6 = 1.
    let p = pads(split(3, false), split(1, false));
    close("output_shape", &r[0], &conv_transpose_ref(&x, &w, Some(&b), &win(&[3, 2], &[1, 1], &p), &[0, 0]));
    // SAME_UPPER, out 8×6: totals 2·3 + 3 − 8 = 1 and 2·2 + 3 − 6 = 1.
    let p = pads(split(1, true), split(1, true));
    close("same upper", &r[1], &conv_transpose_ref(&x, &w, None, &win(&[2, 2], &[1, 1], &p), &[0, 0]));
    // SAME_LOWER, dilations [2, 1], out 8×6: totals 2·3 + 5 − 8 = 3 and 1.
    let p = pads(split(3, false), split(1, false));
    close("same lower", &r[2], &conv_transpose_ref(&x, &w, Some(&b), &win(&[2, 2], &[2, 1], &p), &[0, 0]));
    // output_shape 8×7 with output_padding 1: totals 2·3 + 1 + 3 − 8 = 2 and 2·2 + 1 + 3 − 7 = 1.
    let p = pads(split(2, true), split(1, true));
    close("full output_shape", &r[3], &conv_transpose_ref(&x, &w, None, &win(&[2, 2], &[1, 1], &p), &[1, 1]));
}

/// A pooling window over any number of spatial axes, as ONNX defines it.
struct PoolNd {
    k: Vec<usize>,
    s: Vec<usize>,
    d: Vec<usize>,
    lo: Vec<usize>,
    hi: Vec<usize>,
    ceil: bool,
}

/// Reference MaxPool (values and row-major indices, ties to the first
/// maximum in window order) or AveragePool (`include_pad`: explicit pads
/// count, ceil mode's extra positions never do) over `x` of `shape`
/// (N, C, spatial…).
fn pool_nd_ref(x: &[f64], shape: &[usize], p: &PoolNd, max: bool, include_pad: bool) -> (Vec<f64>, Vec<f64>) {
    let sp = &shape[2..];
    let n = sp.len();
    let out: Vec<usize> = (0..n)
        .map(|i| {
            let span = sp[i] + p.lo[i] + p.hi[i] - ((p.k[i] - 1) * p.d[i] + 1);
            let mut o = if p.ceil { span.div_ceil(p.s[i]) } else { span / p.s[i] } + 1;
            if p.ceil && (o - 1) * p.s[i] >= sp[i] + p.lo[i] {
                o -= 1;
            }
            o
        })
        .collect();
    let (mut vals, mut idxs) = (Vec::new(), Vec::new());
    let planes = shape[0] * shape[1];
    let count = |dims: &[usize]| dims.iter().product::<usize>();
    let unravel = |mut f: usize, dims: &[usize]| -> Vec<usize> {
        let mut v = vec![0; dims.len()];
        for i in (0..dims.len()).rev() {
            v[i] = f % dims[i];
            f /= dims[i];
        }
        v
    };
    for plane in 0..planes {
        for of in 0..count(&out) {
            let o = unravel(of, &out);
            let (mut best, mut best_at, mut sum, mut cnt) = (f64::NEG_INFINITY, -1i64, 0.0, 0.0);
            for wf in 0..count(&p.k) {
                let w = unravel(wf, &p.k);
                let pos: Vec<i64> = (0..n).map(|i| (o[i] * p.s[i] + w[i] * p.d[i]) as i64 - p.lo[i] as i64).collect();
                let inside = (0..n).all(|i| pos[i] >= 0 && pos[i] < sp[i] as i64);
                let counted = match include_pad {
                    true => (0..n).all(|i| pos[i] >= -(p.lo[i] as i64) && pos[i] < (sp[i] + p.hi[i]) as i64),
                    false => inside,
                };
                if counted {
                    cnt += 1.0;
                }
                if !inside {
                    continue;
                }
                let mut flat = plane as i64;
                for i in 0..n {
                    flat = flat * sp[i] as i64 + pos[i];
                }
                let v = x[flat as usize];
                sum += v;
                if best_at < 0 || v > best {
                    (best, best_at) = (v, flat);
                }
            }
            if max {
                vals.push(best);
                idxs.push(best_at as f64);
            } else {
                vals.push(sum / cnt);
            }
        }
    }
    (vals, idxs)
}

/// MaxPool (with and without Indices) and AveragePool over 1 and 3
/// spatial axes: padding, strides, dilations, ceil mode, count_include_pad.
#[test]
fn pooling_over_one_and_three_axes_computes_onnx_values() {
    let x1: Vec<f64> = (0..2 * 3 * 9).map(|i| ((i * 7 + i / 5) % 6) as f64 - 2.5).collect();
    let x3: Vec<f64> = (0..2 * 4 * 5 * 4).map(|i| ((i * 11 + i / 7) % 9) as f64 * 0.5 - 2.0).collect();
    let Some(r) = execute(
        "pool_nd",
        r#"  input %a: f32[2,3,9]
  input %v: f32[1,2,4,5,4]
  %m1, %i1 = MaxPool "m1"(%a) {kernel_shape=[3], strides=[2], pads=[1, 1]}
  %m1b = MaxPool "m1b"(%a) {kernel_shape=[2], dilations=[3], ceil_mode=1, strides=[2]}
  %p1 = AveragePool "p1"(%a) {kernel_shape=[4], strides=[3], pads=[2, 1], ceil_mode=1}
  %q1 = AveragePool "q1"(%a) {kernel_shape=[4], strides=[3], pads=[2, 1], ceil_mode=1, count_include_pad=1}
  %m3, %i3 = MaxPool "m3"(%v) {kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[0, 1, 1, 1, 1, 0]}
  %p3 = AveragePool "p3"(%v) {kernel_shape=[2, 2, 2], strides=[1, 2, 2], pads=[1, 0, 1, 0, 1, 1], count_include_pad=1}
  %r3 = AveragePool "r3"(%v) {kernel_shape=[3, 2, 3], ceil_mode=1, strides=[2, 2, 2]}
  %f1 = Cast "f1"(%i1) {to=1}
  %f3 = Cast "f3"(%i3) {to=1}
  output %m1, %f1, %m1b, %p1, %q1, %m3, %f3, %p3, %r3"#,
        &[
            ("tensor<2x3x9xf32>", &dense(&x1, &[2, 3, 9], false)),
            ("tensor<1x2x4x5x4xf32>", &dense(&x3, &[1, 2, 4, 5, 4], false)),
        ],
    ) else {
        return;
    };
    let p = |k: &[usize], s: &[usize], d: &[usize], lo: &[usize], hi: &[usize], ceil: bool| PoolNd {
        k: k.to_vec(),
        s: s.to_vec(),
        d: d.to_vec(),
        lo: lo.to_vec(),
        hi: hi.to_vec(),
        ceil,
    };
    let (s1, s3) = ([2, 3, 9], [1, 2, 4, 5, 4]);
    let (m1, i1) = pool_nd_ref(&x1, &s1, &p(&[3], &[2], &[1], &[1], &[1], false), true, false);
    close("1-D max", &r[0], &m1);
    assert_eq!(r[1], i1, "1-D max indices");
    let (m1b, _) = pool_nd_ref(&x1, &s1, &p(&[2], &[2], &[3], &[0], &[0], true), true, false);
    close("1-D dilated ceil max", &r[2], &m1b);
    let q = p(&[4], &[3], &[1], &[2], &[1], true);
    close("1-D average", &r[3], &pool_nd_ref(&x1, &s1, &q, false, false).0);
    close("1-D average with pads", &r[4], &pool_nd_ref(&x1, &s1, &q, false, true).0);
    let (m3, i3) =
        pool_nd_ref(&x3, &s3, &p(&[2, 3, 2], &[2, 1, 2], &[1, 1, 1], &[0, 1, 1], &[1, 1, 0], false), true, false);
    close("3-D max", &r[5], &m3);
    assert_eq!(r[6], i3, "3-D max indices");
    let q3 = p(&[2, 2, 2], &[1, 2, 2], &[1, 1, 1], &[1, 0, 1], &[0, 1, 1], false);
    close("3-D average with pads", &r[7], &pool_nd_ref(&x3, &s3, &q3, false, true).0);
    let r3 = p(&[3, 2, 3], &[2, 2, 2], &[1, 1, 1], &[0, 0, 0], &[0, 0, 0], true);
    close("3-D ceil average", &r[8], &pool_nd_ref(&x3, &s3, &r3, false, false).0);
}

/// `LpPool`: the p-norm of each window (padding adds nothing), p = 2 over
/// 2-D windows and p = 3 over 1-D, p = 1 over 3-D.
#[test]
fn lp_pool_computes_onnx_values() {
    let x2: Vec<f64> = (0..2 * 5 * 6).map(|i| ((i * 5 + i / 4) % 7) as f64 - 3.0).collect();
    let x1: Vec<f64> = (0..3 * 8).map(|i| ((i * 3) % 5) as f64 * 0.5 - 1.0).collect();
    let x3: Vec<f64> = (0..2 * 3 * 3 * 3).map(|i| ((i * 7) % 6) as f64 - 2.5).collect();
    let Some(r) = execute(
        "lp_pool",
        r#"  input %a: f32[1,2,5,6]
  input %b: f32[1,3,8]
  input %c: f32[1,2,3,3,3]
  %l2 = LpPool "l2"(%a) {kernel_shape=[2, 3], strides=[1, 2], pads=[1, 0, 0, 1]}
  %l3 = LpPool "l3"(%b) {kernel_shape=[3], p=3, strides=[2]}
  %l1 = LpPool "l1"(%c) {kernel_shape=[2, 2, 2], p=1}
  output %l2, %l3, %l1"#,
        &[
            ("tensor<1x2x5x6xf32>", &dense(&x2, &[1, 2, 5, 6], false)),
            ("tensor<1x3x8xf32>", &dense(&x1, &[1, 3, 8], false)),
            ("tensor<1x2x3x3x3xf32>", &dense(&x3, &[1, 2, 3, 3, 3], false)),
        ],
    ) else {
        return;
    };
    // The p-norm is the average pool of |x|^p times the counted positions,
    // so the reference reuses the average pool with pads counted (they
    // hold 0 here): norm = (mean · window)^(1/p).
    let lp = |x: &[f64], shape: &[usize], p: &PoolNd, pw: i32| -> Vec<f64> {
        let powed: Vec<f64> = x.iter().map(|v| v.abs().powi(pw)).collect();
        let window: usize = p.k.iter().product();
        let (mean, _) = pool_nd_ref(&powed, shape, p, false, true);
        mean.iter().map(|m| (m * window as f64).powf(1.0 / f64::from(pw))).collect()
    };
    let p2 = PoolNd { k: vec![2, 3], s: vec![1, 2], d: vec![1, 1], lo: vec![1, 0], hi: vec![0, 1], ceil: false };
    close("2-D p=2", &r[0], &lp(&x2, &[1, 2, 5, 6], &p2, 2));
    let p3 = PoolNd { k: vec![3], s: vec![2], d: vec![1], lo: vec![0], hi: vec![0], ceil: false };
    close("1-D p=3", &r[1], &lp(&x1, &[1, 3, 8], &p3, 3));
    let p1 =
        PoolNd { k: vec![2, 2, 2], s: vec![1, 1, 1], d: vec![1, 1, 1], lo: vec![0; 3], hi: vec![0; 3], ceil: false };
    close("3-D p=1", &r[2], &lp(&x3, &[1, 2, 3, 3, 3], &p1, 1));
}
