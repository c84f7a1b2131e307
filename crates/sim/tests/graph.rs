//! Building programs from IR graphs through a `CostSource`.

use qsync_ir::{Graph, NodeId, Op};
use qsync_sim::{Cluster, CostSource, DeviceType, LocalProgram, OpCost, SimConfig, Simulator};

/// MatMul: 8 µs forward, 8 dgrad, 8 wgrad, 256 gradient bytes (an 8×8 f32
/// weight); anything else 1 µs each way; everything twice as slow on `slow`.
struct Toy;

impl CostSource for Toy {
    fn op_cost(&self, g: &Graph, n: NodeId, device: &DeviceType) -> OpCost {
        let k = if device.name == "slow" { 2.0 } else { 1.0 };
        match g.node(n).op {
            Op::MatMul => OpCost::weighted(8.0 * k, 8.0 * k, 8.0 * k, 256),
            _ => OpCost::new(k, k),
        }
    }

    fn optimizer_us(&self, _g: &Graph, device: &DeviceType) -> f64 {
        if device.name == "slow" {
            4.0
        } else {
            2.0
        }
    }
}

const SRC: &str = r#"
opset "" 17
graph "g" {
  input %x: f32[4,8]
  input %w: f32[8,8]
  %y = MatMul "mm"(%x, %w)
  %r = Relu "relu"(%y)
  output %r
}
"#;

/// fast: mm 0–8, relu 8–9, relu.dgrad 9–10, mm.dgrad 10–18, mm.wgrad 18–26.
/// slow: everything doubled, bucket ready at 52. 256 B over 2 nodes of one
/// device at 1 GB/s (1000 B/µs), no latency: 2·1/2·256/1000 = 0.256 µs,
/// 52–52.256. Optimizers: fast 52.256–54.256, slow 52.256–56.256.
#[test]
fn programs_from_a_graph() {
    let g = qsync_ir::text::parse_graph(SRC).expect("parse");
    let types = vec![
        DeviceType::new("fast", 1, 1, 4).with_bandwidth(10.0, 1.0).with_latency(0.0, 0.0),
        DeviceType::new("slow", 1, 1, 4).with_bandwidth(10.0, 1.0).with_latency(0.0, 0.0),
    ];
    let programs: Vec<_> = types.iter().map(|t| LocalProgram::from_graph(&g, t, &Toy)).collect();
    let names: Vec<_> = programs[0].ops.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["mm", "relu"]);
    assert!(programs[0].ops.iter().all(|o| o.node.is_some()));
    let mut sim = Simulator::new(Cluster::new(types), programs, SimConfig::default()).expect("valid");
    let r = sim.result();
    assert_eq!(r.collectives[0].ready_us, vec![26.0, 52.0]);
    assert_eq!((r.collectives[0].start_us, r.collectives[0].end_us), (52.0, 52.256));
    assert_eq!(r.iteration_us, 56.256);
    assert_eq!(r.devices[0].finish_us, 54.256);
}
