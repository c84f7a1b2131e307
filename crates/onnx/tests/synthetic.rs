//! Hand-built models covering the mapping rules one by one.

mod common;

use prost::Message;
use qsync_ir::{Attr, DType, Dim, Op, RawAttrKind, TensorData, TensorType};
use qsync_onnx::compare::model_diff;
use qsync_onnx::proto::{self, attr_type, DimValue, TypeValue};
use qsync_onnx::{export_bytes, export_file, import_bytes, import_bytes_with_report, import_file, OnnxError};

fn vi(name: &str, elem: i32, dims: &[DimValue]) -> proto::ValueInfoProto {
    let shape = proto::TensorShapeProto {
        dim: dims.iter().map(|d| proto::Dimension { value: Some(d.clone()), denotation: String::new() }).collect(),
    };
    proto::ValueInfoProto {
        name: name.into(),
        r#type: Some(proto::TypeProto {
            value: Some(TypeValue::TensorType(proto::TypeTensor { elem_type: elem, shape: Some(shape) })),
            denotation: String::new(),
        }),
        ..Default::default()
    }
}

fn node(op: &str, name: &str, ins: &[&str], outs: &[&str], attrs: Vec<proto::AttributeProto>) -> proto::NodeProto {
    proto::NodeProto {
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        attribute: attrs,
        ..Default::default()
    }
}

fn attr(name: &str, ty: i32) -> proto::AttributeProto {
    proto::AttributeProto { name: name.into(), r#type: ty, ..Default::default() }
}

fn model(g: proto::GraphProto, opset: i64) -> Vec<u8> {
    proto::ModelProto {
        ir_version: 8,
        producer_name: "test".into(),
        graph: Some(g),
        opset_import: vec![proto::OperatorSetIdProto { domain: String::new(), version: opset }],
        metadata_props: vec![proto::StringStringEntryProto { key: "k".into(), value: "v".into() }],
        ..Default::default()
    }
    .encode_to_vec()
}

fn p(s: &str) -> DimValue {
    DimValue::DimParam(s.into())
}

fn round_trip(bytes: &[u8]) -> qsync_ir::Model {
    let a = import_bytes(bytes, None, "t.onnx").unwrap_or_else(|e| panic!("{e}"));
    let out = export_bytes(&a).unwrap_or_else(|e| panic!("{e}"));
    let b = import_bytes(&out, None, "t2.onnx").unwrap_or_else(|e| panic!("{e}"));
    let d = model_diff(&a, &b);
    assert!(d.is_empty(), "{}", d.join("\n"));
    assert_eq!(out, export_bytes(&b).unwrap_or_else(|e| panic!("{e}")));
    a
}

/// A graph exercising constants, forward references, optional inputs,
/// unnamed nodes, symbolic dims and every attribute kind.
fn rich_graph() -> proto::GraphProto {
    let mut a_graph = attr("then_branch", attr_type::GRAPH);
    a_graph.g = Some(Box::new(proto::GraphProto { name: "body".into(), ..Default::default() }));
    let mut a_tp = attr("tp", attr_type::TYPE_PROTO);
    a_tp.tp = vi("x", 1, &[]).r#type;
    let mut a_floats = attr("fs", attr_type::FLOATS);
    a_floats.floats = vec![1.5, -2.0];
    let mut a_strings = attr("ss", attr_type::STRINGS);
    a_strings.strings = vec![b"a".to_vec(), b"bc".to_vec()];
    let mut a_s = attr("s", attr_type::STRING);
    a_s.s = Some(b"hello".to_vec());
    let mut untyped = attr("axis", attr_type::UNDEFINED);
    untyped.i = Some(1);
    let mut c_f = attr("value_float", attr_type::FLOAT);
    c_f.f = Some(0.5);
    let mut c_is = attr("value_ints", attr_type::INTS);
    c_is.ints = vec![1, 2, 3];
    let mut c_t = attr("value", attr_type::TENSOR);
    c_t.t = Some(proto::TensorProto {
        dims: vec![2],
        data_type: 10,
        int32_data: vec![0x3c00, 0xc000],
        ..Default::default()
    });
    proto::GraphProto {
        name: "g".into(),
        node: vec![
            // Uses `late`, defined by the last node (forward reference).
            node("Add", "", &["x", "late"], &["y"], vec![]),
            node("Constant", "c_f", &[], &["cf"], vec![c_f]),
            node("Constant", "", &[], &["ci"], vec![c_is]),
            node("Constant", "c_t", &[], &["ct"], vec![c_t]),
            node("Clip", "clip", &["y", "", "w"], &["z"], vec![]),
            node("Custom", "custom", &["z"], &["u", ""], vec![a_graph, a_tp, a_floats, a_strings, a_s, untyped])
                .tap(|n| n.domain = "com.example".into()),
            node("Relu", "late_def", &["x"], &["late"], vec![]),
        ],
        initializer: vec![proto::TensorProto {
            name: "w".into(),
            data_type: 1,
            float_data: vec![3.0],
            ..Default::default()
        }],
        input: vec![vi("x", 1, &[p("batch"), p("batch*seq"), DimValue::DimValue(4)]), vi("w", 1, &[])],
        output: vec![vi("u", 1, &[]), vi("cf", 1, &[])],
        value_info: vec![proto::ValueInfoProto {
            name: "y".into(),
            r#type: vi("y", 1, &[]).r#type.map(|mut t| {
                if let Some(TypeValue::TensorType(tt)) = &mut t.value {
                    tt.shape = Some(proto::TensorShapeProto {
                        dim: vec![proto::Dimension::default(), proto::Dimension::default()],
                    });
                }
                t
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

trait Tap: Sized {
    fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
        f(&mut self);
        self
    }
}
impl Tap for proto::NodeProto {}

#[test]
fn rich_graph_maps_every_rule() {
    let bytes = model(rich_graph(), 17);
    let (m, report) = import_bytes_with_report(&bytes, None, "rich.onnx").unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    assert_eq!(g.node_count(), 7);
    assert_eq!(m.metadata, vec![("k".to_string(), "v".to_string())]);
    // Symbolic dims, including an expression.
    let x = g.value_by_name("x").expect("x");
    let want = vec![Dim::sym("batch"), Dim::sym("batch").mul(&Dim::sym("seq")), Dim::from(4)];
    assert_eq!(g.ty(x), &TensorType::new(DType::F32, want));
    // Initializer that is also an input.
    let w = g.value_by_name("w").expect("w");
    assert!(g.inputs().contains(&w) && g.inits().contains(&w));
    // The declared value_info of `y` (unnamed dims, wrong rank) gives way to
    // the inferred broadcast type; unnamed nodes get OpType_index.
    let y = g.value_by_name("y").expect("y");
    assert_eq!(g.ty(y), g.ty(x));
    let names: Vec<String> = g.node_ids().iter().map(|&n| g.node(n).name.clone()).collect();
    assert!(names.contains(&"Add_0".to_string()) && names.contains(&"Constant_2".to_string()), "{names:?}");
    // Forward reference resolved: Add runs after late_def.
    let order: Vec<String> = g.schedule().iter().map(|&n| g.node(n).name.clone()).collect();
    let pos = |s: &str| order.iter().position(|n| n == s).expect("node");
    assert!(pos("late_def") < pos("Add_0"), "{order:?}");
    // Optional input.
    let clip = g.node_ids().into_iter().find(|&n| g.node(n).name == "clip").expect("clip");
    assert_eq!(g.node(clip).inputs()[1], None);
    // Constants keep their attributes and type their outputs.
    let cf = g.value_by_name("cf").expect("cf");
    assert_eq!(g.ty(cf), &TensorType::new(DType::F32, vec![]));
    let ct = g.value_by_name("ct").expect("ct");
    let (cn, _) = g.producer(ct).expect("producer");
    assert_eq!(g.node(cn).op, Op::Constant);
    let t = g.node(cn).attr("value").and_then(Attr::as_tensor).expect("tensor");
    assert_eq!(t.dtype, DType::F16);
    assert_eq!(t.as_f64s(), Some(vec![1.0, -2.0]));
    // Attributes of every kind; the untyped one is inferred.
    let custom = g.node_ids().into_iter().find(|&n| g.node(n).name == "custom").expect("custom");
    let cn = g.node(custom);
    assert_eq!(cn.op, Op::Opaque { domain: "com.example".into(), op_type: "Custom".into() });
    assert!(matches!(cn.attr("then_branch"), Some(Attr::Raw { kind: RawAttrKind::Graph, .. })));
    assert!(matches!(cn.attr("tp"), Some(Attr::Raw { kind: RawAttrKind::TypeProto, .. })));
    assert_eq!(cn.attr("fs"), Some(&Attr::Floats(vec![1.5, -2.0])));
    assert_eq!(cn.attr_int("axis"), Some(1));
    assert_eq!(cn.attr_str("s"), Some("hello"));
    assert_eq!(cn.outputs().len(), 2);
    assert!(report.warnings.iter().any(|w| w.contains("then_branch")), "{:?}", report.warnings);
    round_trip(&bytes);
}

fn init_model(t: proto::TensorProto) -> Vec<u8> {
    let name = t.name.clone();
    model(
        proto::GraphProto {
            node: vec![node("Identity", "id", &[&name], &["out"], vec![])],
            initializer: vec![t],
            output: vec![vi("out", 0, &[])],
            ..Default::default()
        },
        13,
    )
}

fn init_of(bytes: &[u8]) -> qsync_ir::Tensor {
    let m = round_trip(bytes);
    let v = m.graph.inits()[0];
    m.graph.value(v).init().expect("init").clone()
}

fn tp(dt: i32, dims: Vec<i64>) -> proto::TensorProto {
    proto::TensorProto { name: "t".into(), data_type: dt, dims, ..Default::default() }
}

#[test]
fn typed_tensor_fields_unpack() {
    let t = init_of(&init_model(proto::TensorProto { int32_data: vec![1, 0, 1], ..tp(9, vec![3]) }));
    assert_eq!((t.dtype, t.inline_bytes().map(<[u8]>::to_vec)), (DType::Bool, Some(vec![1, 0, 1])));
    let t = init_of(&init_model(proto::TensorProto { int32_data: vec![-1, 127], ..tp(3, vec![2]) }));
    assert_eq!(t.as_i64s(), Some(vec![-1, 127]));
    let t = init_of(&init_model(proto::TensorProto { int32_data: vec![0x3f80, 0x4000], ..tp(16, vec![2]) }));
    assert_eq!(t.as_f64s(), Some(vec![1.0, 2.0]));
    let t = init_of(&init_model(proto::TensorProto { int64_data: vec![-5, 7], ..tp(7, vec![2]) }));
    assert_eq!(t.as_i64s(), Some(vec![-5, 7]));
    let t = init_of(&init_model(proto::TensorProto { double_data: vec![0.25], ..tp(11, vec![]) }));
    assert_eq!(t.as_f64s(), Some(vec![0.25]));
    let t = init_of(&init_model(proto::TensorProto { uint64_data: vec![u64::MAX], ..tp(13, vec![1]) }));
    assert_eq!(t.inline_bytes().map(<[u8]>::to_vec), Some(vec![0xff; 8]));
    let t = init_of(&init_model(proto::TensorProto { raw_data: vec![0, 0, 128, 63], ..tp(1, vec![1]) }));
    assert_eq!(t.as_f64s(), Some(vec![1.0]));
    let t = init_of(&init_model(proto::TensorProto { string_data: vec![b"ab".to_vec(), vec![]], ..tp(8, vec![2]) }));
    assert_eq!(t.inline_bytes().map(<[u8]>::to_vec), Some(vec![2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]));
    let t = init_of(&init_model(tp(1, vec![0, 3])));
    assert_eq!(t.inline_bytes().map(<[u8]>::len), Some(0));
}

#[test]
fn bad_tensor_data_is_an_error() {
    let e = import_bytes(&init_model(proto::TensorProto { float_data: vec![1.0], ..tp(1, vec![2]) }), None, "bad.onnx")
        .expect_err("count");
    assert!(e.to_string().contains("bad.onnx") && e.to_string().contains("initializer `t`"), "{e}");
    let e =
        import_bytes(&init_model(proto::TensorProto { raw_data: vec![1, 2, 3], ..tp(1, vec![1]) }), None, "bad.onnx")
            .expect_err("raw");
    assert!(matches!(e, OnnxError::Invalid { .. }), "{e}");
    let e = import_bytes(&init_model(tp(1, vec![-1])), None, "bad.onnx").expect_err("negative dim");
    assert!(matches!(e, OnnxError::Invalid { .. }), "{e}");
    let e = import_bytes(&init_model(tp(1, vec![1 << 40, 1 << 40])), None, "bad.onnx").expect_err("huge");
    assert!(matches!(e, OnnxError::Invalid { .. }), "{e}");
    let e = import_bytes(&init_model(tp(99, vec![1])), None, "bad.onnx").expect_err("elem type");
    assert!(matches!(e, OnnxError::UnknownElemType { code: 99, .. }) && e.to_string().contains("bad.onnx"), "{e}");
}

#[test]
fn structural_errors_name_file_and_node() {
    let g = proto::GraphProto {
        node: vec![node("Relu", "r", &["nowhere"], &["y"], vec![])],
        output: vec![vi("y", 1, &[])],
        ..Default::default()
    };
    let e = import_bytes(&model(g.clone(), 17), None, "undef.onnx").expect_err("undefined");
    assert!(matches!(e, OnnxError::UndefinedValue { .. }), "{e}");
    let s = e.to_string();
    assert!(s.contains("undef.onnx") && s.contains("`r`") && s.contains("nowhere"), "{s}");
    // Opsets 7..=25 import; outside that range is refused.
    for v in [6, 26, 1] {
        let e = import_bytes(&model(g.clone(), v), None, "opset.onnx").expect_err("opset");
        assert!(matches!(e, OnnxError::UnsupportedOpset { version, .. } if version == v), "{e}");
        assert!(e.to_string().contains("opset.onnx"));
    }
    let no_graph = proto::ModelProto {
        ir_version: 8,
        opset_import: vec![proto::OperatorSetIdProto { domain: String::new(), version: 17 }],
        ..Default::default()
    };
    let e = import_bytes(&no_graph.encode_to_vec(), None, "nograph.onnx").expect_err("no graph");
    assert!(matches!(e, OnnxError::MissingGraph { .. }) && e.to_string().contains("nograph.onnx"), "{e}");
    let mut bad_in = g.clone();
    bad_in.input = vec![vi("nowhere", 42, &[])];
    let e = import_bytes(&model(bad_in, 17), None, "elem.onnx").expect_err("elem");
    assert!(matches!(e, OnnxError::UnknownElemType { code: 42, .. }), "{e}");
    let dup = proto::GraphProto {
        node: vec![node("Relu", "a", &["x"], &["y"], vec![]), node("Relu", "b", &["x"], &["y"], vec![])],
        input: vec![vi("x", 1, &[])],
        ..Default::default()
    };
    let e = import_bytes(&model(dup, 17), None, "dup.onnx").expect_err("dup");
    assert!(matches!(e, OnnxError::DuplicateDefinition { .. }) && e.to_string().contains("`b`"), "{e}");
}

#[test]
fn external_data_is_referenced_copied_and_loaded() {
    let src_dir = common::temp_dir("ext-src");
    let out_dir = common::temp_dir("ext-out");
    let data: Vec<u8> = (0..16u8).collect();
    std::fs::write(src_dir.join("w.bin"), &data).expect("write data");
    let ext = |loc: &str, off: &str| proto::TensorProto {
        data_location: proto::DATA_LOCATION_EXTERNAL,
        external_data: vec![
            proto::StringStringEntryProto { key: "location".into(), value: loc.into() },
            proto::StringStringEntryProto { key: "offset".into(), value: off.into() },
            proto::StringStringEntryProto { key: "length".into(), value: "8".into() },
        ],
        ..tp(1, vec![2])
    };
    let g = proto::GraphProto {
        node: vec![node("Add", "add", &["a", "b"], &["y"], vec![])],
        initializer: vec![
            proto::TensorProto { name: "a".into(), ..ext("w.bin", "8") },
            proto::TensorProto { name: "b".into(), ..ext("gone.bin", "0") },
        ],
        output: vec![vi("y", 1, &[DimValue::DimValue(2)])],
        ..Default::default()
    };
    let src = src_dir.join("m.onnx");
    std::fs::write(&src, model(g, 17)).expect("write model");
    let m = import_file(&src).unwrap_or_else(|e| panic!("{e}"));
    let a = m.graph.value(m.graph.value_by_name("a").expect("a")).init().expect("init").clone();
    assert_eq!(a.data, TensorData::External { location: "w.bin".into(), offset: 8, length: Some(8) });
    assert_eq!(a.load(m.base_dir.as_deref()).expect("io").as_deref(), Some(&data[8..]));
    let b = m.graph.value(m.graph.value_by_name("b").expect("b")).init().expect("init").clone();
    assert_eq!(b.load(m.base_dir.as_deref()).expect("io"), None, "missing file: values absent");
    assert_eq!(b.dims, vec![2]);
    let out = out_dir.join("m.onnx");
    export_file(&m, &out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(std::fs::read(out_dir.join("w.bin")).expect("copied"), data);
    assert!(!out_dir.join("gone.bin").exists());
    let m2 = import_file(&out).unwrap_or_else(|e| panic!("{e}"));
    assert!(model_diff(&m, &m2).is_empty());
    let a2 = m2.graph.value(m2.graph.value_by_name("a").expect("a")).init().expect("init").clone();
    assert_eq!(a2.load(m2.base_dir.as_deref()).expect("io").as_deref(), Some(&data[8..]));
}

#[test]
fn dim_expressions_and_fresh_symbols_round_trip() {
    use qsync_ir::{Graph, Model, NodeSpec};
    let mut g = Graph::new("dims");
    let b = Dim::sym("batch");
    let s = Dim::sym("seq");
    let odd = Dim::sym("odd name");
    let shape = vec![
        b.mul(&s),
        s.add(&Dim::from(1)).floor_div_const(2).expect("div"),
        odd.mul(&Dim::from(2)),
        odd.clone(),
        Dim::from(3),
    ];
    let x = g.add_input("x", TensorType::new(DType::F32, shape.clone()));
    let n = g.add_node(NodeSpec::new("r", Op::Relu).input(x).output("y", TensorType::new(DType::F32, shape.clone())));
    let y = g.node(n).outputs()[0];
    g.set_outputs(vec![y]);
    let m = Model::new(g);
    let bytes = export_bytes(&m).unwrap_or_else(|e| panic!("{e}"));
    let back = import_bytes(&bytes, None, "dims.onnx").unwrap_or_else(|e| panic!("{e}"));
    assert!(model_diff(&m, &back).is_empty(), "{:?}", model_diff(&m, &back));
    assert_eq!(back.graph.ty(back.graph.inputs()[0]).shape.as_deref(), Some(shape.as_slice()));

    // A fresh symbol never collides with a dim_param the file uses.
    let gp = proto::GraphProto {
        node: vec![node("Relu", "r", &["x"], &["y"], vec![])],
        input: vec![proto::ValueInfoProto {
            name: "x".into(),
            r#type: vi("x", 1, &[p("unk__0")]).r#type.map(|mut t| {
                if let Some(TypeValue::TensorType(tt)) = &mut t.value {
                    if let Some(sh) = &mut tt.shape {
                        sh.dim.push(proto::Dimension::default());
                    }
                }
                t
            }),
            ..Default::default()
        }],
        output: vec![vi("y", 1, &[])],
        ..Default::default()
    };
    let m = round_trip(&model(gp, 17));
    let shape = m.graph.ty(m.graph.inputs()[0]).shape.clone();
    assert_eq!(shape, Some(vec![Dim::sym("unk__0"), Dim::sym("unk__1")]));
}

/// Export annotates (`value_info`) exactly the intermediate values the source
/// file annotated: onnxruntime picks shape-dependent fusions (e.g. folding a
/// scalar `Mul` into `FusedMatMul`) from `value_info`, so annotating a legacy
/// export that had none changed its outputs in the last bits.
#[test]
fn export_annotates_only_what_the_source_annotated() {
    let g = proto::GraphProto {
        name: "g".into(),
        node: vec![
            node("Relu", "r", &["x"], &["a"], vec![]),
            node("Neg", "n", &["a"], &["c"], vec![]),
            node("Abs", "b", &["c"], &["y"], vec![]),
        ],
        input: vec![vi("x", 1, &[p("batch"), DimValue::DimValue(4)])],
        output: vec![vi("y", 1, &[p("batch"), DimValue::DimValue(4)])],
        value_info: vec![vi("a", 1, &[p("batch"), DimValue::DimValue(4)])],
        ..Default::default()
    };
    let bytes = model(g, 17);
    let mut m = round_trip(&bytes);
    let names = |m: &qsync_ir::Model| -> Vec<String> {
        let out = export_bytes(m).unwrap_or_else(|e| panic!("{e}"));
        let mp = proto::ModelProto::decode(out.as_slice()).unwrap_or_else(|e| panic!("{e}"));
        mp.graph.expect("graph").value_info.into_iter().map(|v| v.name).collect()
    };
    assert_eq!(names(&m), vec!["a".to_string()]);
    // `c` is still typed by inference after import.
    let c = m.graph.value_by_name("c").expect("c");
    assert!(m.graph.ty(c).is_complete());
    // A model not read from ONNX (annotated = None) annotates every typed value.
    m.annotated = None;
    assert_eq!(names(&m), vec!["a".to_string(), "c".to_string()]);
}

/// The dynamo exporter at opset 17 writes Split-18's `num_outputs`, which
/// Split-13 lacks (onnx.checker rejects it): import drops it when it equals
/// the output count, so a round trip gives a valid file; at 18 it stays.
#[test]
fn split_num_outputs_below_opset_18_is_dropped() {
    let mut k = attr("num_outputs", attr_type::INT);
    k.i = Some(3);
    let mut ax = attr("axis", attr_type::INT);
    ax.i = Some(1);
    let g = |opset_note: &str| proto::GraphProto {
        name: opset_note.into(),
        node: vec![node("Split", "s", &["x"], &["a", "b", "c"], vec![ax.clone(), k.clone()])],
        input: vec![vi("x", 1, &[p("batch"), DimValue::DimValue(6)])],
        output: vec![vi("a", 1, &[]), vi("b", 1, &[]), vi("c", 1, &[])],
        ..Default::default()
    };
    for (opset, kept) in [(17, false), (18, true)] {
        let (m, report) =
            import_bytes_with_report(&model(g("g"), opset), None, "s.onnx").unwrap_or_else(|e| panic!("{e}"));
        let gr = &m.graph;
        let n = gr.node_ids()[0];
        assert_eq!(gr.node(n).attr("num_outputs").is_some(), kept, "opset {opset}");
        assert_eq!(report.warnings.iter().any(|w| w.contains("num_outputs")), !kept, "{:?}", report.warnings);
        let a = gr.value_by_name("a").expect("a");
        assert_eq!(gr.ty(a), &TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::from(2)]));
    }
}

#[test]
fn refreshed_copies_travel_as_metadata() {
    let mut w = tp(1, vec![2]);
    w.name = "w".into();
    w.float_data = vec![1.0, 2.0];
    let mut c = tp(10, vec![2]);
    c.name = "w.f16".into();
    c.int32_data = vec![0x3c00, 0x4000];
    let graph = proto::GraphProto {
        node: vec![node("Identity", "id", &["w.f16"], &["out"], vec![])],
        initializer: vec![w, c],
        output: vec![vi("out", 0, &[])],
        ..Default::default()
    };
    let mut mp = proto::ModelProto::decode(model(graph, 17).as_slice()).expect("decode");
    let entry = |k: &str, v: &str| proto::StringStringEntryProto { key: k.into(), value: v.into() };
    mp.metadata_props = vec![entry("author", "x"), entry("qsync.refresh:w.f16", "w")];
    let bytes = mp.encode_to_vec();
    let m = round_trip(&bytes);
    let g = &m.graph;
    let (copy, master) = (g.value_by_name("w.f16").expect("copy"), g.value_by_name("w").expect("master"));
    assert_eq!(g.master_of(copy), Some(master));
    // The pairing is the graph's, not free-form metadata; export writes it back once.
    assert_eq!(m.metadata, vec![("author".to_string(), "x".to_string())]);
    let out = proto::ModelProto::decode(export_bytes(&m).expect("export").as_slice()).expect("decode");
    let keys: Vec<&str> = out.metadata_props.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["author", "qsync.refresh:w.f16"]);
    // A pairing naming a value that is not an initializer is an error naming
    // the file and the entry.
    mp.metadata_props = vec![entry("qsync.refresh:w.f16", "nope")];
    let e = import_bytes(&mp.encode_to_vec(), None, "bad.onnx").expect_err("dangling master");
    let text = e.to_string();
    assert!(text.contains("bad.onnx") && text.contains("qsync.refresh:w.f16") && text.contains("`nope`"), "{text}");
}

#[test]
fn opsets_7_to_25_and_other_domains_only_import() {
    for v in [7, 9, 10, 21, 22, 23, 24, 25] {
        let g = proto::GraphProto {
            node: vec![node("Relu", "r", &["x"], &["y"], vec![])],
            input: vec![vi("x", 1, &[p("n"), DimValue::DimValue(3)])],
            output: vec![vi("y", 1, &[])],
            ..Default::default()
        };
        let m = round_trip(&model(g, v));
        assert_eq!(m.opset(), v);
        let y = m.graph.outputs()[0];
        assert_eq!(m.graph.ty(y).to_string(), "f32[n,3]", "opset {v}");
    }
    // A model importing only `ai.onnx.ml`: its nodes are opaque ops.
    let only_ml = |op_domain: &str| {
        let mut n = node("Binarizer", "b", &["x"], &["y"], vec![]);
        n.domain = op_domain.into();
        proto::ModelProto {
            ir_version: 8,
            graph: Some(proto::GraphProto {
                node: vec![n],
                input: vec![vi("x", 1, &[DimValue::DimValue(4)])],
                output: vec![vi("y", 1, &[DimValue::DimValue(4)])],
                ..Default::default()
            }),
            opset_import: vec![proto::OperatorSetIdProto { domain: "ai.onnx.ml".into(), version: 3 }],
            ..Default::default()
        }
        .encode_to_vec()
    };
    let m = round_trip(&only_ml("ai.onnx.ml"));
    assert_eq!(m.opset(), 0);
    assert!(matches!(&m.graph.node(m.graph.node_ids()[0]).op, Op::Opaque { domain, .. } if domain == "ai.onnx.ml"));
    // A default-domain node in such a model names the node and the reason.
    let e = import_bytes(&only_ml(""), None, "ml.onnx").expect_err("default-domain node without the import");
    let s = e.to_string();
    assert!(s.contains("ml.onnx") && s.contains("`b`") && s.contains("does not import"), "{s}");
}

#[test]
fn newer_element_types_import_and_round_trip() {
    // FLOAT8E4M3FNUZ 18, FLOAT8E5M2FNUZ 20, FLOAT4E2M1 23, FLOAT8E8M0 24, UINT2 25, INT2 26.
    for (code, dt, n, bytes) in [
        (18, DType::F8E4M3Fnuz, 3, 3),
        (20, DType::F8E5M2Fnuz, 3, 3),
        (23, DType::F4E2M1, 3, 2),
        (24, DType::F8E8M0, 3, 3),
        (25, DType::U2, 5, 2),
        (26, DType::I2, 5, 2),
    ] {
        let raw: Vec<u8> = (1..=bytes as u8).collect();
        let t = init_of(&init_model(proto::TensorProto { raw_data: raw.clone(), ..tp(code, vec![n]) }));
        assert_eq!(t.dtype, dt);
        assert_eq!(t.inline_bytes().map(<[u8]>::to_vec), Some(raw), "{dt}");
        assert_eq!(DType::from_onnx_code(code), Some(dt));
        // Packed types in int32_data: one packed byte per element.
        let packed: Vec<i32> = (1..=bytes).collect();
        let t = init_of(&init_model(proto::TensorProto { int32_data: packed, ..tp(code, vec![n]) }));
        assert_eq!(t.inline_bytes().map(<[u8]>::len), Some(bytes as usize), "{dt}");
    }
}

#[test]
fn declared_sizes_do_not_drive_allocation() {
    // 2^48 doubles declared, one present: an error, not a 2 PB reservation.
    let t = proto::TensorProto { double_data: vec![1.0], ..tp(11, vec![1 << 48]) };
    let e = import_bytes(&init_model(t), None, "huge.onnx").expect_err("count mismatch");
    let s = e.to_string();
    assert!(s.contains("huge.onnx") && s.contains("double_data holds 1 values"), "{s}");
    // Dims whose product overflows u64 are refused before anything is read.
    let t = proto::TensorProto { float_data: vec![1.0], ..tp(1, vec![1 << 40, 1 << 40]) };
    assert!(import_bytes(&init_model(t), None, "overflow.onnx")
        .expect_err("too large")
        .to_string()
        .contains("too large"));
}

#[test]
fn sparse_boundaries_are_refused_and_container_mismatches_fail_verification() {
    let elem = vi("x", 1, &[DimValue::DimValue(2)]).r#type.map(Box::new);
    let sparse = TypeValue::SparseTensorType(proto::TypeSparseTensor { elem_type: 1, shape: None });
    let seq = TypeValue::SequenceType(Box::new(proto::TypeSequence { elem_type: elem }));
    for (value, refused) in [(sparse, true), (seq, false)] {
        let mut out = vi("y", 1, &[]);
        out.r#type = Some(proto::TypeProto { value: Some(value), denotation: String::new() });
        let g = proto::GraphProto {
            node: vec![node("Identity", "id", &["x"], &["y"], vec![])],
            input: vec![vi("x", 1, &[DimValue::DimValue(2)])],
            output: vec![out],
            ..Default::default()
        };
        match import_bytes(&model(g, 18), None, "t.onnx") {
            Err(e) => {
                let s = e.to_string();
                assert!(
                    refused && s.contains("t.onnx") && s.contains("graph output `y`") && s.contains("sparse"),
                    "{s}"
                );
            }
            Ok(m) => {
                // A tensor declared a sequence by Identity: the verifier says so.
                assert!(!refused);
                let errs = qsync_ir::verify::verify(&m.graph, 18).expect_err("tensor vs sequence");
                let s: Vec<String> = errs.iter().map(ToString::to_string).collect();
                assert!(s.iter().any(|e| e.contains("id") && e.contains("seq<f32[2]>")), "{s:?}");
            }
        }
    }
}

/// An If whose branches read `r` and `x` from the main graph without
/// inputs; in the file it comes before `r`'s producer.
fn capturing_model(then_reads: &str) -> Vec<u8> {
    let branch = |name: &str, reads: &str| proto::GraphProto {
        name: name.into(),
        node: vec![node("Identity", &format!("{name}_id"), &[reads], &[&format!("{name}_out")], vec![])],
        output: vec![vi(&format!("{name}_out"), 1, &[DimValue::DimValue(2)])],
        ..Default::default()
    };
    let mut then_a = attr("then_branch", attr_type::GRAPH);
    then_a.g = Some(Box::new(branch("then", then_reads)));
    let mut else_a = attr("else_branch", attr_type::GRAPH);
    else_a.g = Some(Box::new(branch("else", "x")));
    let g = proto::GraphProto {
        name: "g".into(),
        node: vec![
            node("If", "if", &["c"], &["y"], vec![then_a, else_a]),
            node("Relu", "relu", &["x"], &["r"], vec![]),
        ],
        input: vec![vi("x", 1, &[DimValue::DimValue(2)]), vi("c", 9, &[])],
        output: vec![vi("y", 1, &[DimValue::DimValue(2)])],
        ..Default::default()
    };
    model(g, 17)
}

fn exported_nodes(m: &qsync_ir::Model) -> Vec<proto::NodeProto> {
    let bytes = export_bytes(m).unwrap_or_else(|e| panic!("{e}"));
    proto::ModelProto::decode(bytes.as_slice()).expect("decode").graph.expect("graph").node
}

#[test]
fn subgraph_reads_are_captures_that_order_and_follow_rewrites() {
    let mut m = import_bytes(&capturing_model("r"), None, "t.onnx").unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    let iff = g.node_ids().into_iter().find(|&n| g.node(n).op == Op::If).expect("if");
    let names: Vec<&str> = g.node(iff).captures().iter().map(|c| g.value_name(c.value)).collect();
    assert_eq!(names, ["r", "x"]);
    let r = g.value_by_name("r").expect("r");
    assert!(g.users(r).iter().any(|&(n, s)| n == iff && s == qsync_ir::CAPTURE_SLOT));
    // The producer of a captured value is scheduled first.
    let order: Vec<String> = exported_nodes(&m).iter().map(|n| n.name.clone()).collect();
    assert_eq!(order, ["relu", "if"]);
    // A rewrite replacing `r` re-points the capture; export renames the read.
    let x = m.graph.value_by_name("x").expect("x");
    let neg = m.graph.add_node(
        qsync_ir::NodeSpec::new("neg", Op::Neg).input(x).output("r_neg", TensorType::new(DType::F32, vec![2.into()])),
    );
    let r_neg = m.graph.node(neg).outputs()[0];
    m.graph.replace_all_uses(r, r_neg);
    assert!(!m.graph.has_users(r));
    let nodes = exported_nodes(&m);
    let pos = |name: &str| nodes.iter().position(|n| n.name == name).expect("node");
    assert!(pos("neg") < pos("if"));
    let then_g = nodes[pos("if")].attribute.iter().find(|a| a.name == "then_branch").and_then(|a| a.g.clone());
    assert_eq!(then_g.expect("then").node[0].input, ["r_neg"]);
    // A new name the body already defines would change what it reads: refused.
    let mut clash = m.clone();
    let v = clash.graph.value_by_name("r_neg").expect("r_neg");
    clash.graph.rename_value(v, "then_out");
    let e = export_bytes(&clash).expect_err("name clash");
    assert!(e.to_string().contains("`if`") && e.to_string().contains("then_out"), "{e}");
    let b = import_bytes(&export_bytes(&m).expect("export"), None, "t2.onnx").expect("reimport");
    let iff = b.graph.node_ids().into_iter().find(|&n| b.graph.node(n).op == Op::If).expect("if");
    let mut names: Vec<&str> = b.graph.node(iff).captures().iter().map(|c| b.graph.value_name(c.value)).collect();
    names.sort_unstable();
    assert_eq!(names, ["r_neg", "x"]);
}

#[test]
fn subgraph_read_of_an_undefined_value_is_an_error_naming_the_node() {
    let e = import_bytes(&capturing_model("nowhere"), None, "t.onnx").expect_err("undefined capture");
    let msg = e.to_string();
    assert!(msg.contains("t.onnx") && msg.contains("if") && msg.contains("`nowhere`"), "{msg}");
}

#[test]
fn sequence_optional_and_map_types_round_trip_unchanged() {
    let tensor = |elem: i32, dims: &[DimValue]| vi("", elem, dims).r#type.expect("type");
    let wrap = |v: TypeValue| proto::TypeProto { value: Some(v), denotation: String::new() };
    let seq = wrap(TypeValue::SequenceType(Box::new(proto::TypeSequence {
        elem_type: Some(Box::new(tensor(1, &[DimValue::DimValue(2), p("N")]))),
    })));
    let opt = wrap(TypeValue::OptionalType(Box::new(proto::TypeOptional { elem_type: Some(Box::new(seq.clone())) })));
    let map =
        wrap(TypeValue::MapType(Box::new(proto::TypeMap { key_type: 7, value_type: Some(Box::new(tensor(1, &[]))) })));
    let typed = |name: &str, t: &proto::TypeProto| proto::ValueInfoProto {
        name: name.into(),
        r#type: Some(t.clone()),
        ..Default::default()
    };
    let g = proto::GraphProto {
        name: "g".into(),
        node: vec![node("Identity", "id", &["o"], &["o2"], vec![])],
        input: vec![typed("s", &seq), typed("o", &opt), typed("m", &map)],
        output: vec![typed("o2", &opt), typed("s", &seq), typed("m", &map)],
        ..Default::default()
    };
    let m = round_trip(&model(g.clone(), 18));
    let out = proto::ModelProto::decode(export_bytes(&m).expect("export").as_slice()).expect("decode");
    let out = out.graph.expect("graph");
    assert_eq!(out.input, g.input);
    assert_eq!(out.output, g.output);
    // Precision passes see no float dtype on them.
    assert!(m.graph.inputs().iter().all(|&v| m.graph.ty(v).dtype.is_none() && !m.graph.ty(v).is_tensor()));
}
