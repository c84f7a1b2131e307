//! Unit tests for per-node inference, shape arithmetic, binding and eval.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::{Attr, DType, Dim, Graph, NodeSpec, Op, Tensor, TensorType, ValueId};

fn d(s: &str) -> Dim {
    Dim::parse(s).unwrap()
}

/// `f32[batch,3]`-style type.
fn ty(s: &str) -> TensorType {
    let (dt, rest) = s.split_once('[').unwrap();
    let dims = rest.trim_end_matches(']');
    let shape = if dims.is_empty() { vec![] } else { dims.split(',').map(d).collect() };
    TensorType::new(DType::from_name(dt).unwrap(), shape)
}

fn i64s(g: &mut Graph, name: &str, v: &[i64]) -> ValueId {
    g.add_init(name, Tensor::from_i64(vec![v.len() as i64], v))
}

fn scalar(g: &mut Graph, name: &str, v: i64) -> ValueId {
    g.add_init(name, Tensor::from_i64(vec![], &[v]))
}

/// Add a node with one output (type unknown) and return the output.
fn node(g: &mut Graph, op: Op, inputs: &[ValueId], attrs: &[(&str, Attr)]) -> ValueId {
    let name = format!("n{}", g.node_count());
    let mut spec = NodeSpec::new(name.clone(), op);
    for &i in inputs {
        spec = spec.input(i);
    }
    for (k, a) in attrs {
        spec = spec.attr(k, a.clone());
    }
    spec = spec.output(format!("{name}_out"), TensorType::unknown());
    let n = g.add_node(spec);
    g.node(n).outputs()[0]
}

fn node_n(g: &mut Graph, op: Op, inputs: &[ValueId], attrs: &[(&str, Attr)], outs: usize) -> Vec<ValueId> {
    let name = format!("n{}", g.node_count());
    let mut spec = NodeSpec::new(name.clone(), op);
    for &i in inputs {
        spec = spec.input(i);
    }
    for (k, a) in attrs {
        spec = spec.attr(k, a.clone());
    }
    for o in 0..outs {
        spec = spec.output(format!("{name}_out{o}"), TensorType::unknown());
    }
    let n = g.add_node(spec);
    g.node(n).outputs().to_vec()
}

fn run(g: &mut Graph, opset: i64) -> InferReport {
    infer_shapes(g, opset, &InferOptions::default())
}

#[test]
fn broadcast_symbolic() {
    let mut g = Graph::new("t");
    let a = g.add_input("a", ty("f32[batch,1,768]"));
    let b = g.add_input("b", ty("f32[seq,1]"));
    let c = g.add_input("c", ty("f32[batch,seq,768]"));
    let s = node(&mut g, Op::Add, &[a, b], &[]);
    let t = node(&mut g, Op::Mul, &[s, c], &[]);
    let e = node(&mut g, Op::Equal, &[t, c], &[]);
    let r = run(&mut g, 17);
    assert!(r.errors.is_empty() && r.unknown.is_empty(), "{r:?}");
    assert_eq!(g.ty(s), &ty("f32[batch,seq,768]"));
    assert_eq!(g.ty(t), &ty("f32[batch,seq,768]"));
    assert_eq!(g.ty(e), &ty("bool[batch,seq,768]"));

    let mut g = Graph::new("bad");
    let a = g.add_input("a", ty("f32[3]"));
    let b = g.add_input("b", ty("f32[4]"));
    node(&mut g, Op::Add, &[a, b], &[]);
    let r = run(&mut g, 17);
    assert_eq!(r.errors.len(), 1);
    assert!(r.errors[0].message.contains("cannot broadcast"), "{:?}", r.errors);
}

#[test]
fn reshape_minus_one_through_shape_arithmetic() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", ty("f32[batch,seq,768]"));
    let sh = node(&mut g, Op::Shape, &[x], &[]);
    let i0 = scalar(&mut g, "i0", 0);
    let i1 = scalar(&mut g, "i1", 1);
    let ax = i64s(&mut g, "ax", &[0]);
    let b = node(&mut g, Op::Gather, &[sh, i0], &[]);
    let s = node(&mut g, Op::Gather, &[sh, i1], &[]);
    let bu = node(&mut g, Op::Unsqueeze, &[b, ax], &[]);
    let su = node(&mut g, Op::Unsqueeze, &[s, ax], &[]);
    let rest = i64s(&mut g, "rest", &[12, -1]);
    let target = node(&mut g, Op::Concat, &[bu, su, rest], &[("axis", Attr::Int(0))]);
    let y = node(&mut g, Op::Reshape, &[x, target], &[]);
    // Flatten everything: -1 = batch*seq*768.
    let flat = i64s(&mut g, "flat", &[-1]);
    let z = node(&mut g, Op::Reshape, &[x, flat], &[]);
    // 0 copies, -1 with symbolic remainder.
    let t2 = i64s(&mut g, "t2", &[0, -1, 64]);
    let w = node(&mut g, Op::Reshape, &[x, t2], &[]);
    let r = run(&mut g, 17);
    assert!(r.errors.is_empty() && r.unknown.is_empty(), "{r:?}");
    assert_eq!(g.ty(y), &ty("f32[batch,seq,12,64]"));
    assert_eq!(g.ty(z), &ty("f32[768*batch*seq]"));
    assert_eq!(g.ty(w), &ty("f32[batch,12*seq,64]"));
}

#[test]
fn conv_symbolic_spatial() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", ty("f32[N,3,H,W]"));
    let w = g.add_init("w", Tensor { dtype: DType::F32, dims: vec![64, 3, 7, 7], data: crate::TensorData::Absent });
    let y =
        node(&mut g, Op::Conv, &[x, w], &[("strides", Attr::Ints(vec![2, 2])), ("pads", Attr::Ints(vec![3, 3, 3, 3]))]);
    let same = node(
        &mut g,
        Op::Conv,
        &[x, w],
        &[("strides", Attr::Ints(vec![2, 2])), ("auto_pad", Attr::String(b"SAME_UPPER".to_vec()))],
    );
    let p = node(
        &mut g,
        Op::MaxPool,
        &[y],
        &[
            ("kernel_shape", Attr::Ints(vec![3, 3])),
            ("strides", Attr::Ints(vec![2, 2])),
            ("pads", Attr::Ints(vec![1, 1, 1, 1])),
        ],
    );
    let gp = node(&mut g, Op::GlobalAveragePool, &[p], &[]);
    let r = run(&mut g, 17);
    assert!(r.errors.is_empty() && r.unknown.is_empty(), "{r:?}");
    let h = d("H-1").floor_div_const(2).unwrap().add(&d("1"));
    assert_eq!(g.ty(y).shape.as_ref().unwrap()[2], h);
    assert_eq!(g.ty(y).shape.as_ref().unwrap()[1], d("64"));
    assert_eq!(g.ty(same).shape.as_ref().unwrap()[3], d("(W+1)/2"));
    assert_eq!(g.ty(gp).shape.as_ref().unwrap()[2..], [d("1"), d("1")]);

    // Concrete: resnet stem 224 → 112 → 56.
    let mut g = Graph::new("c");
    let x = g.add_input("x", ty("f32[1,3,224,224]"));
    let w = g.add_init("w", Tensor { dtype: DType::F32, dims: vec![64, 3, 7, 7], data: crate::TensorData::Absent });
    let y =
        node(&mut g, Op::Conv, &[x, w], &[("strides", Attr::Ints(vec![2, 2])), ("pads", Attr::Ints(vec![3, 3, 3, 3]))]);
    let p = node(
        &mut g,
        Op::MaxPool,
        &[y],
        &[
            ("kernel_shape", Attr::Ints(vec![3, 3])),
            ("strides", Attr::Ints(vec![2, 2])),
            ("pads", Attr::Ints(vec![1, 1, 1, 1])),
        ],
    );
    let c = node(
        &mut g,
        Op::MaxPool,
        &[p],
        &[("kernel_shape", Attr::Ints(vec![3, 3])), ("strides", Attr::Ints(vec![2, 2])), ("ceil_mode", Attr::Int(1))],
    );
    let ct = node(
        &mut g,
        Op::ConvTranspose,
        &[p, w],
        &[
            ("strides", Attr::Ints(vec![2, 2])),
            ("pads", Attr::Ints(vec![3, 3, 3, 3])),
            ("output_padding", Attr::Ints(vec![1, 1])),
        ],
    );
    let r = run(&mut g, 17);
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(g.ty(y), &ty("f32[1,64,112,112]"));
    assert_eq!(g.ty(p), &ty("f32[1,64,56,56]"));
    assert_eq!(g.ty(c), &ty("f32[1,64,28,28]"));
    // (56-1)*2 + 1 + 7 - 6 = 112; channels = W[1]*group = 3.
    assert_eq!(g.ty(ct), &ty("f32[1,3,112,112]"));
}

#[test]
fn split_variants() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", ty("f32[batch,10,2*seq]"));
    let sp = i64s(&mut g, "sp", &[3, 7]);
    let a = node_n(&mut g, Op::Split, &[x, sp], &[("axis", Attr::Int(1))], 2);
    let b = node_n(&mut g, Op::Split, &[x], &[("axis", Attr::Int(1)), ("num_outputs", Attr::Int(3))], 3);
    let c = node_n(&mut g, Op::Split, &[x], &[("axis", Attr::Int(-1))], 2);
    let r = run(&mut g, 18);
    assert!(r.errors.is_empty() && r.unknown.is_empty(), "{r:?}");
    assert_eq!(g.ty(a[0]), &ty("f32[batch,3,2*seq]"));
    assert_eq!(g.ty(a[1]), &ty("f32[batch,7,2*seq]"));
    assert_eq!(g.ty(b[0]), &ty("f32[batch,4,2*seq]"));
    assert_eq!(g.ty(b[2]), &ty("f32[batch,2,2*seq]"));
    assert_eq!(g.ty(c[1]), &ty("f32[batch,10,seq]"));

    // Opset 11: split attribute; a wrong sum is an error.
    let mut g = Graph::new("t11");
    let x = g.add_input("x", ty("f32[6]"));
    let o = node_n(&mut g, Op::Split, &[x], &[("split", Attr::Ints(vec![1, 5]))], 2);
    let _ = node_n(&mut g, Op::Split, &[x], &[("split", Attr::Ints(vec![1, 2]))], 2);
    let r = run(&mut g, 11);
    assert_eq!(g.ty(o[1]), &ty("f32[5]"));
    assert_eq!(r.errors.len(), 1, "{r:?}");
}

#[test]
fn slice_on_shapes_and_symbolic_dims() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", ty("f32[batch,seq,768]"));
    let sh = node(&mut g, Op::Shape, &[x], &[]);
    let st = i64s(&mut g, "st", &[1]);
    let en = i64s(&mut g, "en", &[i64::MAX]);
    let tail = node(&mut g, Op::Slice, &[sh, st, en], &[]);
    // x[:, 1:] along axis 1 → seq-1; x[:, -2:] → 2.
    let ax = i64s(&mut g, "ax", &[1]);
    let y = node(&mut g, Op::Slice, &[x, st, en, ax], &[]);
    let m2 = i64s(&mut g, "m2", &[-2]);
    let z = node(&mut g, Op::Slice, &[x, m2, en, ax], &[]);
    // A constant buffer sliced to `seq` (from the shape): [512] → [seq].
    let buf = g.add_init("buf", Tensor { dtype: DType::I64, dims: vec![1, 512], data: crate::TensorData::Absent });
    let zero = i64s(&mut g, "zero", &[0]);
    let seqv = node(&mut g, Op::Slice, &[sh, st, en, zero], &[]);
    let seq1 = node(&mut g, Op::Slice, &[seqv, zero, st], &[]);
    let pos = node(&mut g, Op::Slice, &[buf, zero, seq1, ax], &[]);
    // Reshape to the sliced shape contents: [seq, 768].
    let re = node(&mut g, Op::Reshape, &[x, tail], &[]);
    let r = run(&mut g, 17);
    assert!(r.unknown.is_empty(), "{r:?}");
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(g.ty(tail), &ty("i64[2]"));
    assert_eq!(g.ty(y), &ty("f32[batch,seq-1,768]"));
    assert_eq!(g.ty(z), &ty("f32[batch,2,768]"));
    assert_eq!(g.ty(pos), &ty("i64[1,seq]"));
    let _ = re;
}

#[test]
fn squeeze_unsqueeze_and_bad_axes() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", ty("f32[batch,1,5]"));
    let ax = i64s(&mut g, "ax", &[-2]);
    let s = node(&mut g, Op::Squeeze, &[x, ax], &[]);
    let ax2 = i64s(&mut g, "ax2", &[0, -1]);
    let u = node(&mut g, Op::Unsqueeze, &[s, ax2], &[]);
    let bad = i64s(&mut g, "bad", &[7]);
    let b = node(&mut g, Op::Squeeze, &[x, bad], &[]);
    let t = node(&mut g, Op::Transpose, &[x], &[("perm", Attr::Ints(vec![0, 0, 1]))]);
    let r = run(&mut g, 13);
    assert_eq!(g.ty(s), &ty("f32[batch,5]"));
    assert_eq!(g.ty(u), &ty("f32[1,batch,5,1]"));
    assert_eq!(r.errors.len(), 2, "{r:?}");
    assert!(r.unknown.contains(&b) && r.unknown.contains(&t));
}

#[test]
fn matmul_gemm_and_norms() {
    let mut g = Graph::new("t");
    let a = g.add_input("a", ty("f32[batch,1,seq,64]"));
    let b = g.add_input("b", ty("f32[12,64,seq]"));
    let v = g.add_input("v", ty("f32[64]"));
    let m = node(&mut g, Op::MatMul, &[a, b], &[]);
    let mv = node(&mut g, Op::MatMul, &[a, v], &[]);
    let vm = node(&mut g, Op::MatMul, &[v, b], &[]);
    let ga = g.add_input("ga", ty("f16[10,k]"));
    let gb = g.add_input("gb", ty("f16[20,10]"));
    let gm = node(&mut g, Op::Gemm, &[ga, gb], &[("transA", Attr::Int(1)), ("transB", Attr::Int(1))]);
    let ln = node_n(&mut g, Op::LayerNormalization, &[a, v], &[("axis", Attr::Int(-1))], 3);
    let r = run(&mut g, 17);
    assert!(r.errors.is_empty() && r.unknown.is_empty(), "{r:?}");
    assert_eq!(g.ty(m), &ty("f32[batch,12,seq,seq]"));
    assert_eq!(g.ty(mv), &ty("f32[batch,1,seq]"));
    assert_eq!(g.ty(vm), &ty("f32[12,seq]"));
    assert_eq!(g.ty(gm), &ty("f16[k,20]"));
    assert_eq!(g.ty(ln[1]), &ty("f32[batch,1,seq,1]"));
}

#[test]
fn reductions_and_constants() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", ty("f32[batch,seq,768]"));
    let ax = i64s(&mut g, "ax", &[-1]);
    let r18 = node(&mut g, Op::ReduceMean, &[x, ax], &[]);
    let rs = node(&mut g, Op::ReduceSum, &[x, ax], &[("keepdims", Attr::Int(0))]);
    let am = node(&mut g, Op::ArgMax, &[x], &[("axis", Attr::Int(1))]);
    let c = node(&mut g, Op::Constant, &[], &[("value_ints", Attr::Ints(vec![2, 3]))]);
    let cos = node(&mut g, Op::ConstantOfShape, &[c], &[("value", Attr::Tensor(Tensor::from_i64(vec![1], &[1])))]);
    let k = scalar(&mut g, "k", 5);
    let kk = node(&mut g, Op::Unsqueeze, &[k, ax], &[]);
    let tk = node_n(&mut g, Op::TopK, &[x, kk], &[], 2);
    let zero = scalar(&mut g, "z", 0);
    let sh = node(&mut g, Op::Shape, &[x], &[]);
    let one = scalar(&mut g, "one", 1);
    let sq = node(&mut g, Op::Gather, &[sh, one], &[]);
    let rg = node(&mut g, Op::Range, &[zero, sq, one], &[]);
    let r = run(&mut g, 18);
    assert!(r.errors.is_empty() && r.unknown.is_empty(), "{r:?}");
    assert_eq!(g.ty(r18), &ty("f32[batch,seq,1]"));
    assert_eq!(g.ty(rs), &ty("f32[batch,seq]"));
    assert_eq!(g.ty(am), &ty("i64[batch,1,768]"));
    assert_eq!(g.ty(cos), &ty("i64[2,3]"));
    assert_eq!(g.ty(tk[0]), &ty("f32[batch,seq,5]"));
    assert_eq!(g.ty(tk[1]), &ty("i64[batch,seq,5]"));
    assert_eq!(g.ty(rg), &ty("i64[seq]"));

    // Opset 13: ReduceMean axes are an attribute.
    let mut g = Graph::new("t13");
    let x = g.add_input("x", ty("f32[batch,seq,768]"));
    let m = node(&mut g, Op::ReduceMean, &[x], &[("axes", Attr::Ints(vec![1, 2])), ("keepdims", Attr::Int(0))]);
    run(&mut g, 13);
    assert_eq!(g.ty(m), &ty("f32[batch]"));
}

#[test]
fn expand_where_and_cast() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", ty("i64[batch,seq]"));
    let sh = node(&mut g, Op::Shape, &[x], &[]);
    let m1 = i64s(&mut g, "m1", &[-1]);
    let eq = node(&mut g, Op::Equal, &[sh, m1], &[]);
    let ones = i64s(&mut g, "ones", &[1, 1]);
    let wh = node(&mut g, Op::Where, &[eq, ones, sh], &[]);
    let one = g.add_init("one", Tensor::from_f32(vec![1, 1], &[1.0]));
    let ex = node(&mut g, Op::Expand, &[one, wh], &[]);
    let cs = node(&mut g, Op::Cast, &[ex], &[("to", Attr::Int(10))]);
    let dr = node_n(&mut g, Op::Dropout, &[cs], &[], 2);
    let r = run(&mut g, 17);
    assert!(r.errors.is_empty() && r.unknown.is_empty(), "{r:?}");
    assert_eq!(g.ty(ex), &ty("f32[batch,seq]"));
    assert_eq!(g.ty(cs), &ty("f16[batch,seq]"));
    assert_eq!(g.ty(dr[1]), &ty("bool[batch,seq]"));
}

#[test]
fn binding_batch_and_dims() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", ty("f32[batch,seq,768]"));
    let y = node(&mut g, Op::Relu, &[x], &[]);
    g.set_ty(y, ty("f32[batch,seq,768]"));
    let opts = InferOptions { batch: Some(4), dims: [("seq".to_string(), 16)].into_iter().collect() };
    let r = infer_shapes(&mut g, 17, &opts);
    assert_eq!(r.fixed_batch, None);
    assert_eq!(g.ty(x), &ty("f32[4,16,768]"));
    assert_eq!(g.ty(y), &ty("f32[4,16,768]"));

    let mut g = Graph::new("fixed");
    let x = g.add_input("x", ty("f32[1,3]"));
    let y = node(&mut g, Op::Relu, &[x], &[]);
    g.set_ty(y, ty("f32[2,3]"));
    let r = infer_shapes(&mut g, 17, &InferOptions { batch: Some(8), ..InferOptions::default() });
    assert_eq!(r.fixed_batch, Some(1));
    assert_eq!(g.ty(x), &ty("f32[1,3]"));
    assert_eq!(g.ty(y), &ty("f32[1,3]"));
    assert_eq!(r.warnings.len(), 1, "stale concrete declaration is warned about: {r:?}");
}

#[test]
fn opaque_keeps_declared_with_warning() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", ty("f32[2]"));
    let mut spec = NodeSpec::new("o", Op::from_onnx("com.microsoft", "FusedMatMul")).input(x);
    spec = spec.output("y", ty("f16[3]"));
    let n = g.add_node(spec);
    let r = run(&mut g, 17);
    assert_eq!(g.ty(g.node(n).outputs()[0]), &ty("f16[3]"));
    assert_eq!(r.warnings.len(), 1);
    assert!(r.errors.is_empty());
}

#[test]
fn eval_node_semantics() {
    let mut g = Graph::new("t");
    let a = g.add_init("a", Tensor::from_i64(vec![4], &[-7, 7, -7, 7]));
    let b = g.add_init("b", Tensor::from_i64(vec![4], &[2, -2, -2, 2]));
    let q = node(&mut g, Op::Div, &[a, b], &[]);
    let n = g.producer(q).unwrap().0;
    let ta = g.value(a).init().cloned().unwrap();
    let tb = g.value(b).init().cloned().unwrap();
    let out = eval_node(&g, n, &[Some(&ta), Some(&tb)], 17).unwrap();
    assert_eq!(out[0].as_i64s().unwrap(), vec![-3, -3, 3, 3]);

    // Float add rounds in f32.
    let fa = Tensor::from_f32(vec![2], &[0.1, 1e8]);
    let fb = Tensor::from_f32(vec![1], &[0.2]);
    let s = node(&mut g, Op::Add, &[a, b], &[]);
    let n = g.producer(s).unwrap().0;
    let out = eval_node(&g, n, &[Some(&fa), Some(&fb)], 17).unwrap();
    let bytes = out[0].inline_bytes().unwrap().to_vec();
    let got: Vec<f32> = bytes.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_eq!(got, vec![0.1f32 + 0.2f32, 1e8f32 + 0.2f32]);

    // Transpose [2,3] → [3,2].
    let m = Tensor::from_i64(vec![2, 3], &[1, 2, 3, 4, 5, 6]);
    let t = node(&mut g, Op::Transpose, &[a], &[]);
    let out = eval_node(&g, g.producer(t).unwrap().0, &[Some(&m)], 17).unwrap();
    assert_eq!(out[0].dims, vec![3, 2]);
    assert_eq!(out[0].as_i64s().unwrap(), vec![1, 4, 2, 5, 3, 6]);

    // Gather axis 1 with negative index.
    let idx = Tensor::from_i64(vec![2], &[-1, 0]);
    let ga = node(&mut g, Op::Gather, &[a, b], &[("axis", Attr::Int(1))]);
    let out = eval_node(&g, g.producer(ga).unwrap().0, &[Some(&m), Some(&idx)], 17).unwrap();
    assert_eq!(out[0].as_i64s().unwrap(), vec![3, 1, 6, 4]);

    // Slice columns 1.. with step 1; Concat; Reshape; Cast to i32.
    let st = Tensor::from_i64(vec![1], &[1]);
    let en = Tensor::from_i64(vec![1], &[i64::MAX]);
    let ax = Tensor::from_i64(vec![1], &[1]);
    let sl = node(&mut g, Op::Slice, &[a, b, a, b], &[]);
    let out = eval_node(&g, g.producer(sl).unwrap().0, &[Some(&m), Some(&st), Some(&en), Some(&ax)], 17).unwrap();
    assert_eq!(out[0].dims, vec![2, 2]);
    assert_eq!(out[0].as_i64s().unwrap(), vec![2, 3, 5, 6]);
    let cc = node(&mut g, Op::Concat, &[a, b], &[("axis", Attr::Int(0))]);
    let out = eval_node(&g, g.producer(cc).unwrap().0, &[Some(&st), Some(&idx)], 17).unwrap();
    assert_eq!(out[0].as_i64s().unwrap(), vec![1, -1, 0]);
    let shape = Tensor::from_i64(vec![2], &[3, -1]);
    let rs = node(&mut g, Op::Reshape, &[a, b], &[]);
    let out = eval_node(&g, g.producer(rs).unwrap().0, &[Some(&m), Some(&shape)], 17).unwrap();
    assert_eq!(out[0].dims, vec![3, 2]);
    let ca = node(&mut g, Op::Cast, &[a], &[("to", Attr::Int(6))]);
    let out = eval_node(&g, g.producer(ca).unwrap().0, &[Some(&fa)], 17).unwrap();
    assert_eq!(out[0].dtype, DType::I32);
    assert_eq!(out[0].as_i64s().unwrap(), vec![0, 100_000_000]);
    // Range and Where.
    let r0 = Tensor::from_i64(vec![], &[5]);
    let r1 = Tensor::from_i64(vec![], &[0]);
    let r2 = Tensor::from_i64(vec![], &[-2]);
    let rg = node(&mut g, Op::Range, &[a, a, a], &[]);
    let out = eval_node(&g, g.producer(rg).unwrap().0, &[Some(&r0), Some(&r1), Some(&r2)], 17).unwrap();
    assert_eq!(out[0].as_i64s().unwrap(), vec![5, 3, 1]);
    let cond = Tensor::from_i64s(DType::Bool, vec![2], &[1, 0]).unwrap();
    let wh = node(&mut g, Op::Where, &[a, a, a], &[]);
    let out = eval_node(&g, g.producer(wh).unwrap().0, &[Some(&cond), Some(&st), Some(&idx)], 17).unwrap();
    assert_eq!(out[0].as_i64s().unwrap(), vec![1, 0]);
}

#[test]
fn misc_ops() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", ty("f32[N,16,H,W]"));
    let q = g.add_input("q", ty("f32[batch,12,seq,64]"));
    let k = g.add_input("k", ty("f32[batch,12,seq,64]"));
    let e = node(&mut g, Op::Einsum, &[q, k], &[("equation", Attr::String(b"bhqd,bhkd->bhqk".to_vec()))]);
    let e2 = node(&mut g, Op::Einsum, &[q], &[("equation", Attr::String(b"...ij->...ji".to_vec()))]);
    let pads = i64s(&mut g, "pads", &[0, 0, 1, 2, 0, 0, 3, 4]);
    let p = node(&mut g, Op::Pad, &[x, pads], &[]);
    let d2s = node(&mut g, Op::DepthToSpace, &[x], &[("blocksize", Attr::Int(2))]);
    let s2d = node(&mut g, Op::SpaceToDepth, &[d2s], &[("blocksize", Attr::Int(2))]);
    let reps = i64s(&mut g, "reps", &[1, 2, 1, 1]);
    let tl = node(&mut g, Op::Tile, &[x, reps], &[]);
    let scales = g.add_init("scales", Tensor::from_f32(vec![4], &[1.0, 1.0, 2.0, 2.0]));
    let rz = g.add_node(NodeSpec {
        inputs: vec![Some(x), None, Some(scales)],
        ..NodeSpec::new("rz", Op::Resize).output("rz_out", TensorType::unknown())
    });
    let rz = g.node(rz).outputs()[0];
    let ids = g.add_input("ids", ty("i64[batch,seq]"));
    let depth = scalar(&mut g, "depth", 10);
    let vals = g.add_init("vals", Tensor::from_f32(vec![2], &[0.0, 1.0]));
    let oh = node(&mut g, Op::OneHot, &[ids, depth, vals], &[]);
    let nz = node(&mut g, Op::NonZero, &[ids], &[]);
    let fl = node(&mut g, Op::Flatten, &[x], &[("axis", Attr::Int(2))]);
    let r = run(&mut g, 18);
    assert!(r.errors.is_empty() && r.unknown.is_empty(), "{r:?}");
    assert_eq!(g.ty(e), &ty("f32[batch,12,seq,seq]"));
    assert_eq!(g.ty(e2), &ty("f32[batch,12,64,seq]"));
    assert_eq!(g.ty(p), &ty("f32[N,16,H+4,W+6]"));
    assert_eq!(g.ty(d2s), &ty("f32[N,4,2*H,2*W]"));
    assert_eq!(g.ty(s2d), &ty("f32[N,16,H,W]"));
    assert_eq!(g.ty(tl), &ty("f32[N,32,H,W]"));
    assert_eq!(g.ty(rz), &ty("f32[N,16,2*H,2*W]"));
    assert_eq!(g.ty(oh), &ty("f32[batch,seq,10]"));
    assert_eq!(g.ty(nz).shape.as_ref().unwrap()[0], d("2"));
    assert_eq!(g.ty(fl), &ty("f32[16*N,H*W]"));
}

/// Known integer contents flow through `Mod` (both sign conventions),
/// `Max`/`Min`, and N-D `Slice`/`Transpose` (legacy pad-list arithmetic).
#[test]
fn known_contents_mod_max_and_2d_movement() {
    let mut g = Graph::new("t");
    let a = scalar(&mut g, "a", -7);
    let b = scalar(&mut g, "b", 3);
    let m0 = node(&mut g, Op::Mod, &[a, b], &[]);
    let m1 = node(&mut g, Op::Mod, &[a, b], &[("fmod", Attr::Int(1))]);
    let mx = node(&mut g, Op::Max, &[m0, b], &[]);
    let mn = node(&mut g, Op::Min, &[m1, b], &[]);
    let v = i64s(&mut g, "v", &[1, 2, 3, 4, 5, 6]);
    let rows = i64s(&mut g, "rows", &[-1, 2]);
    let m = node(&mut g, Op::Reshape, &[v, rows], &[]);
    let st = i64s(&mut g, "st", &[-1]);
    let en = i64s(&mut g, "en", &[i64::MIN + 1]);
    let ax = i64s(&mut g, "ax", &[0]);
    let rev = node(&mut g, Op::Slice, &[m, st, en, ax, st], &[]);
    let t = node(&mut g, Op::Transpose, &[rev], &[("perm", Attr::Ints(vec![1, 0]))]);
    let r = run(&mut g, 17);
    assert!(r.errors.is_empty() && r.unknown.is_empty(), "{r:?}");
    let k = known_table(&g, 17);
    let vals = |v: ValueId| k[v.index()].as_ref().and_then(Known::consts);
    assert_eq!(vals(m0), Some(vec![2]));
    assert_eq!(vals(m1), Some(vec![-1]));
    assert_eq!(vals(mx), Some(vec![3]));
    assert_eq!(vals(mn), Some(vec![-1]));
    // [[1,2],[3,4],[5,6]] → rows reversed → transposed.
    assert_eq!(vals(rev), Some(vec![5, 6, 3, 4, 1, 2]));
    assert_eq!(g.ty(t), &ty("i64[2,3]"));
    assert_eq!(vals(t), Some(vec![5, 3, 1, 6, 4, 2]));
}

#[test]
fn opset_22_to_25_ops() {
    let mut g = Graph::new("g");
    // 4-D attention with a past: outputs Y, present key/value, QK scores.
    let q = g.add_input("q", ty("f16[b,8,s,64]"));
    let k = g.add_input("k", ty("f16[b,2,s,64]"));
    let v = g.add_input("v", ty("f32[b,2,s,32]"));
    let pk = g.add_input("pk", ty("f16[b,2,p,64]"));
    let pv = g.add_input("pv", ty("f32[b,2,p,32]"));
    let mut spec = NodeSpec::new("att4", Op::Attention);
    spec.inputs = vec![Some(q), Some(k), Some(v), None, Some(pk), Some(pv)];
    for o in ["y4", "pk4", "pv4", "qk4"] {
        spec = spec.output(o, TensorType::unknown());
    }
    let a4 = g.add_node(spec);
    let a4: Vec<ValueId> = g.node(a4).outputs().to_vec();
    // 3-D grouped-query attention: hidden sizes split by the head counts.
    let q3 = g.add_input("q3", ty("f32[2,4,48]"));
    let k3 = g.add_input("k3", ty("f32[2,6,24]"));
    let v3 = g.add_input("v3", ty("f32[2,6,39]"));
    let heads = [("q_num_heads", Attr::Int(6)), ("kv_num_heads", Attr::Int(3))];
    let a3 = node_n(&mut g, Op::Attention, &[q3, k3, v3], &heads, 2);
    let x = g.add_input("x", ty("f32[2,4,3,8]"));
    let cos = g.add_input("cos", ty("f32[2,3,4]"));
    let rot = node(&mut g, Op::RotaryEmbedding, &[x, cos, cos], &[]);
    let sw = node(&mut g, Op::Swish, &[x], &[("alpha", Attr::Float(1.0))]);
    let idx = g.add_input("idx", ty("i64[2]"));
    let ts = node(&mut g, Op::TensorScatter, &[x, x, idx], &[]);
    let bad = node(&mut g, Op::Attention, &[q3, k3, v3], &[]);
    let r = run(&mut g, 24);
    assert_eq!(g.ty(a4[0]), &ty("f16[b,8,s,32]"));
    assert_eq!(g.ty(a4[1]), &ty("f16[b,2,p+s,64]"));
    assert_eq!(g.ty(a4[2]), &ty("f32[b,2,p+s,32]"));
    assert_eq!(g.ty(a4[3]), &ty("f16[b,8,s,p+s]"));
    assert_eq!(g.ty(a3[0]), &ty("f32[2,4,78]"));
    assert_eq!(g.ty(a3[1]), &ty("f32[2,3,6,8]"));
    for o in [rot, sw, ts] {
        assert_eq!(g.ty(o), &ty("f32[2,4,3,8]"));
    }
    // 3-D inputs without head counts: an error at the node.
    assert_eq!(g.ty(bad).shape, None);
    assert!(r.errors.iter().any(|e| e.message.contains("q_num_heads")), "{:?}", r.errors);
}
