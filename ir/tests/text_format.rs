//! The text format round-trips exactly and reports errors with positions.

use qsync_ir::text::{parse_model, print_model};
use qsync_ir::{Attr, DType, ValueDef};

const SAMPLE: &str = r#"ir_version 8
opset "" 17
opset "com.microsoft" 1
producer "pytorch" "2.15.0"
metadata "k" "v"
graph "main" {
  init %w: f32[4,3,1,1] = external("m.onnx.weights", 0, 48)
  init %b: f32[4] = [0.0, -1.5, 1e-5, inf]
  init %shape: i64[2] = [0, -1]
  init %h: f16[2] = hex"003c0040"
  init %flag: bool[2] = [true, false]
  init %names: str[2] = ["a", "b\n"]
  init %gone: f32[3] = absent
  input %x: f32[batch,3,seq,seq/2]
  input %w
  %y: f32[batch,4,seq,seq/2] = Conv "/conv1/Conv"(%x, %w, %b) {dilations=[1, 1], group=1, kernel_shape=[1, 1], pads=[0, 0, 0, 0], strides=[1, 1]} @f16
  %"odd/name": f32[batch,4*seq*(seq/2)] = Reshape "r"(%y, %shape) {allowzero=0}
  %m, %inv = !com.microsoft::Foo "op"(%"odd/name", _, %b) {alpha=0.5, fs=[1.0, nan], g=graph<"AAEC">, ls=ints[], mode="fast", ss=["x", "y"], t=tensor<i64[2]> [1, 2], ts=tensors[tensor<f32[]> [2.0]]}
  %z: f32 = Relu "relu"(%m)
  output %z, %inv
}
"#;

#[test]
fn sample_round_trips_exactly() {
    let m = parse_model(SAMPLE).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print_model(&m), SAMPLE);
    let g = &m.graph;
    assert_eq!(g.node_count(), 4);
    assert_eq!(g.inputs().len(), 2);
    assert_eq!(g.inits().len(), 7);
    let y = g.value_by_name("y").expect("y");
    let (conv, _) = g.producer(y).expect("producer");
    assert_eq!(g.node(conv).precision, Some(DType::F16));
    assert_eq!(g.node(conv).attr_ints("strides"), Some(&[1i64, 1][..]));
    let foo = g.producer(g.value_by_name("m").expect("m")).expect("foo").0;
    assert_eq!(g.node(foo).inputs()[1], None);
    assert!(matches!(g.node(foo).attr("alpha"), Some(Attr::Float(f)) if *f == 0.5));
    let w = g.value_by_name("w").expect("w");
    assert!(matches!(g.value(w).def, ValueDef::Init(_)));
}

#[test]
fn forward_references_resolve_and_print_in_topological_order() {
    let src = r#"graph "g" {
  input %x: f32[2]
  %b: f32[2] = Neg "second"(%a)
  %a: f32[2] = Relu "first"(%x)
  output %b
}
"#;
    let m = parse_model(src).unwrap_or_else(|e| panic!("{e}"));
    let printed = print_model(&m);
    let relu = printed.find("Relu").expect("relu");
    let neg = printed.find("Neg").expect("neg");
    assert!(relu < neg, "{printed}");
    assert_eq!(print_model(&parse_model(&printed).expect("reparse")), printed);
}

#[test]
fn errors_carry_positions() {
    let cases = [
        ("graph \"g\" {\n  %y = Frobnicate \"n\"(%x)\n}\n", 2, "unknown op `Frobnicate`"),
        ("graph \"g\" {\n  input %x: q32[2]\n}\n", 2, "unknown dtype `q32`"),
        ("graph \"g\" {\n  init %c: i64[3] = [1, 2]\n}\n", 2, "2 values given for a tensor of 3 elements"),
        ("graph \"g\" {\n  input %x f32[2]\n", 2, "has no type"),
        ("nonsense", 1, "unknown header"),
        ("graph \"g\" {\n  %y = Relu \"n\"(%x) {a=1, a=2}\n}\n", 2, "given twice"),
    ];
    for (src, line, needle) in cases {
        let e = parse_model(src).expect_err(src);
        assert_eq!(e.line, line, "{src}: {e}");
        assert!(e.message.contains(needle), "{src}: {e}");
    }
}

#[test]
fn float_attributes_round_trip_bit_exactly() {
    for f in [0.1f32, 1.0 / 3.0, 1e-38, f32::MAX, -0.0, 3.4028235e38, f32::MIN_POSITIVE, 7e-45] {
        let src = format!(
            "graph \"g\" {{\n  input %x: f32[1]\n  %y: f32[1] = LeakyRelu \"n\"(%x) {{alpha={}}}\n  output %y\n}}\n",
            qsync_ir::text::printer::float32(f)
        );
        let m = parse_model(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
        let n = m.graph.producer(m.graph.value_by_name("y").expect("y")).expect("p").0;
        let Some(Attr::Float(g)) = m.graph.node(n).attr("alpha") else { panic!("no alpha") };
        assert_eq!(g.to_bits(), f.to_bits());
        assert_eq!(print_model(&m), src);
    }
}

#[test]
fn refreshed_copies_round_trip_and_are_verified() {
    let src = r#"opset "" 17
graph "g" {
  init %w: f32[2] = [1.0, 65520.0]
  init %w.f16: f16[2] = hex"003c007c"
  refresh %w.f16 from %w
  input %x: f16[2]
  %y: f16[2] = Mul "m"(%x, %w.f16)
  output %y
}
"#;
    let m = parse_model(src).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print_model(&m), src);
    let g = &m.graph;
    let (c, w) = (g.value_by_name("w.f16").expect("copy"), g.value_by_name("w").expect("master"));
    assert_eq!(g.master_of(c), Some(w));
    assert!(g.is_master(w));
    assert_eq!(qsync_ir::verify::verify(g, 17), Ok(()));
    // A pairing the verifier rejects: the master is not an initializer.
    let bad = src.replace("refresh %w.f16 from %w", "refresh %w.f16 from %x");
    let errs = qsync_ir::verify::verify(&parse_model(&bad).expect("parses").graph, 17).expect_err("bad pairing");
    assert!(errs.iter().any(|e| e.to_string().contains("master `x` is not an initializer")), "{errs:?}");
    // `from` is required.
    let e = parse_model(&src.replace(" from %w", " %w")).expect_err("no from").to_string();
    assert!(e.contains("`from`"), "{e}");
}

#[test]
fn container_types_round_trip_and_nest_boundedly() {
    let src = r#"opset "" 17
graph "g" {
  input %s: seq<f32[2,N]>
  input %o: opt<seq<f32>>
  input %m: map<i64, f32[]>
  %t: seq<f32[2,N]> = Identity "id"(%s)
  output %t, %o, %m
}
"#;
    let m = parse_model(src).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print_model(&m), src);
    let s = m.graph.value_by_name("s").expect("s");
    assert!(!m.graph.ty(s).is_tensor());
    assert_eq!(m.graph.ty(s).dtype, None);
    let deep = format!("graph \"g\" {{\n  input %x: {}f32{}\n}}\n", "seq<".repeat(17), ">".repeat(17));
    let e = parse_model(&deep).expect_err("too deep");
    assert!(e.message.contains("16 containers deep"), "{e}");
}
