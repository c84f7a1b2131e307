//! Sharded training (`qsync_sim::shard`), worked by hand on a small model:
//! two blocks of one 1024×1024 MatMul and a head of another, so
//! `P = 3·2^20` parameters in three units of `2^20`.

use qsync_cost::{Bindings, Device, DeviceDb, Optimizer, Plan};
use qsync_ir::Graph;
use qsync_sim::shard::{predict_sharded, CollectiveChoices, GatherPrecision, ReducePrecision, ShardSpec, Stage, Units};
use qsync_sim::topology::NodeNetwork;
use qsync_sim::{PredictOptions, Predictor, Target};

const MI: f64 = 1_048_576.0;

fn graph(batch: u32) -> Graph {
    let text = format!(
        r#"
graph "two_blocks" {{
  init %w0: f32[1024,1024] = absent
  init %w1: f32[1024,1024] = absent
  init %wh: f32[1024,1024] = absent
  input %x: f32[{batch},1024]
  %a0: f32[{batch},1024] = MatMul "/blocks.0/MatMul"(%x, %w0)
  %r0: f32[{batch},1024] = Relu "/blocks.0/Relu"(%a0)
  %a1: f32[{batch},1024] = MatMul "/blocks.1/MatMul"(%r0, %w1)
  %r1: f32[{batch},1024] = Relu "/blocks.1/Relu"(%a1)
  %y: f32[{batch},1024] = MatMul "/head/MatMul"(%r1, %wh)
  output %y
}}
"#
    );
    qsync_ir::text::parse_graph(&text).expect("parse")
}

/// A T4 whose sharded steps cost their bytes and ring latencies alone (no
/// hook time, no launch): the byte-level tests below.
fn t4() -> Device {
    let mut d = t4_fixed();
    d.fsdp_unit_host_us = Some(0.0);
    d.collective_launch_us = Some(0.0);
    d
}

/// The bundled T4, with the default fixed costs of a sharded step.
fn t4_fixed() -> Device {
    DeviceDb::bundled().expect("db").get("t4").expect("t4").clone()
}

/// `count` T4s, `per_node` to a node, one 80 Gbit/s NIC per node (10 GB/s,
/// 20 µs a step) and 100 GB/s inside the node (5 µs a step).
fn target(count: u32, per_node: u32, batch: u32) -> Target {
    target_nic(count, per_node, batch, 80.0)
}

/// As [`target`], the NIC at `gbit` Gbit/s.
fn target_nic(count: u32, per_node: u32, batch: u32, gbit: f64) -> Target {
    let mut t = Target::new(t4(), count, batch, Plan::new());
    t.per_node = per_node;
    t.network = Some(NodeNetwork {
        nics_per_node: 1,
        nic_gbit_s: gbit,
        nic_latency_us: 20.0,
        intra_node_gb_s: Some(100.0),
        intra_node_latency_us: 5.0,
        host_cores: None,
        nic_cpu_ns_per_byte: 0.0,
    });
    t
}

/// Adam; collectives across nodes as a flat ring.
fn opts() -> PredictOptions {
    let mut o = PredictOptions { bindings: Bindings::new(), optimizer: Optimizer::Adam, ..PredictOptions::default() };
    o.config.algo = qsync_sim::AllReduceAlgo::Ring;
    o
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "{what}: got {got}, want {want}");
}

#[test]
fn units_are_the_repeated_blocks_and_a_root_after_them() {
    let g = graph(8);
    let facts = qsync_cost::GraphFacts::new(&g, &Bindings::new()).expect("facts");
    let u = Units::of(&g, &facts);
    assert_eq!(u.rule, "blocks");
    let names: Vec<&str> = u.units.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["blocks.0", "blocks.1", "(root: after the blocks)"]);
    for unit in &u.units {
        assert_eq!(unit.params, MI, "{}", unit.name);
    }
    // A block's input: x (f32[8,1024]) for blocks.0, r0 for blocks.1:
    // 8·1024·4 = 32768 bytes each; outputs 2·8·1024 = 16384 elements.
    assert_eq!(u.units[0].input_bytes, 32768.0);
    assert_eq!(u.units[1].input_bytes, 32768.0);
    assert_eq!(u.units[0].out_elems, 16384.0);
    assert_eq!(u.units[2].out_elems, 8192.0);
    assert!(u.units[0].block && u.units[1].block && !u.units[2].block);
}

#[test]
fn a_graph_without_blocks_is_cut_into_units_of_equal_parameters() {
    // Eight MatMuls named without indices: eight units of 2^16 parameters.
    let mut text = String::from("graph \"chain\" {\n  input %x0: f32[4,256]\n");
    for i in 0..8 {
        text.push_str(&format!("  init %w{i}: f32[256,256] = absent\n"));
    }
    for i in 0..8 {
        text.push_str(&format!("  %x{}: f32[4,256] = MatMul \"mm_{i}\"(%x{i}, %w{i})\n", i + 1));
    }
    text.push_str("  output %x8\n}\n");
    let g = qsync_ir::text::parse_graph(&text).expect("parse");
    let facts = qsync_cost::GraphFacts::new(&g, &Bindings::new()).expect("facts");
    let u = Units::of(&g, &facts);
    assert_eq!(u.rule, "equal-parameters");
    assert_eq!(u.units.len(), 8);
    for unit in &u.units {
        assert_eq!(unit.params, 65536.0);
    }
}

#[test]
fn full_shard_memory_by_hand() {
    let g = graph(8);
    let mut pred = Predictor::new(&g, vec![target(4, 2, 8)], opts()).expect("predict");
    let facts = qsync_cost::GraphFacts::new(&g, &Bindings::new()).expect("facts");
    let units = Units::of(&g, &facts);
    let rep = *pred.memory(0).expect("memory");
    // Replicated FP32 + Adam: master 4P, gradients 4P, state 8P.
    let p = 3.0 * MI;
    close(rep.master_weights + rep.gradients + rep.optimizer_state, 16.0 * p, "replicated state");
    let (act, ws) = (rep.activations, rep.workspace);

    // FULL_SHARD, bf16 gathers, 4 devices: state 16P/4 = 12,582,912;
    // two units held at 2 bytes: 2·2^20·2 = 4,194,304; one unit's FP32
    // gradient 4·2^20 = 4,194,304.
    let spec = ShardSpec::new(Stage::FullShard, 1);
    let r = predict_sharded(&mut pred, &units, &spec).expect("sharded");
    let m = &r.devices[0].memory;
    close(r.devices[0].share, 0.25, "share");
    close(m.sharded_state, 12_582_912.0, "sharded state");
    close(m.gathered, 4_194_304.0, "gathered");
    close(m.unsharded_grad, 4_194_304.0, "unsharded gradient");
    close(m.secondary, 0.0, "secondary");
    close(m.total, 12_582_912.0 + 4_194_304.0 + 4_194_304.0 + act + ws, "total");

    // hpZ: a secondary shard of P at 2 bytes over the node's 2 GPUs:
    // 3·2^20·2/2 = 3,145,728.
    let hpz = ShardSpec { hpz: true, ..spec.clone() };
    let r = predict_sharded(&mut pred, &units, &hpz).expect("hpz");
    close(r.devices[0].memory.secondary, 3_145_728.0, "hpZ secondary");

    // SHARD_GRAD_OP keeps every unit gathered: P·2 = 6,291,456.
    let sgo = ShardSpec::new(Stage::ShardGradOp, 1);
    let r = predict_sharded(&mut pred, &units, &sgo).expect("sgo");
    close(r.devices[0].memory.gathered, 6_291_456.0, "shard-grad-op gathered");
    close(r.devices[0].memory.sharded_state, 12_582_912.0, "shard-grad-op state");

    // Checkpointing: blocks keep their inputs (32768 B each), the head its
    // activations (8192 of 40960 output elements: 0.2·A), and the largest
    // block is recomputed whole (16384 of 40960: 0.4·A).
    let ck = ShardSpec { checkpoint: vec![true], ..spec.clone() };
    let r = predict_sharded(&mut pred, &units, &ck).expect("checkpoint");
    close(r.devices[0].memory.activations, (2.0 * 32768.0 + 0.2 * act + 0.4 * act).min(act), "checkpointed");

    // Hybrid shard: shards over the node's 2 GPUs: 16P/2 = 25,165,824.
    let hy = ShardSpec::new(Stage::HybridShard, 1);
    let r = predict_sharded(&mut pred, &units, &hy).expect("hybrid");
    close(r.devices[0].memory.sharded_state, 25_165_824.0, "hybrid state");
}

#[test]
fn uneven_shares_fill_every_device_to_the_same_fraction() {
    // 2 T4 (full memory) and 2 T4 at half their memory: the fixed part
    // F (two units, one gradient, activations, workspace) is the same, the
    // free memory C−F and C/2−F; shares f = free / Σ 2·free.
    let g = graph(8);
    let mut half = target(2, 2, 8);
    half.device.name = "t4-half".into();
    half.memory_fraction = Some(0.5);
    let mut pred = Predictor::new(&g, vec![target(2, 2, 8), half], opts()).expect("predict");
    let facts = qsync_cost::GraphFacts::new(&g, &Bindings::new()).expect("facts");
    let units = Units::of(&g, &facts);
    let spec = ShardSpec { uneven: true, ..ShardSpec::new(Stage::FullShard, 2) };
    let r = predict_sharded(&mut pred, &units, &spec).expect("sharded");
    let (a, b) = (&r.devices[0], &r.devices[1]);
    let fixed = |m: &qsync_sim::shard::ShardMemory| m.total - m.sharded_state;
    let (fa, fb) = (a.memory.capacity - fixed(&a.memory), b.memory.capacity - fixed(&b.memory));
    close(a.share, fa / (2.0 * fa + 2.0 * fb), "share of the full T4");
    close(b.share, fb / (2.0 * fa + 2.0 * fb), "share of the halved T4");
    close(2.0 * a.share + 2.0 * b.share, 1.0, "shares cover the model");
    assert!(a.share > 0.25 && b.share < 0.25);
    // Every device left with the same fraction of its free memory.
    close((a.memory.capacity - a.memory.total) / fa, (b.memory.capacity - b.memory.total) / fb, "same fraction left");
}

/// Per unit forward and backward time from the predictor's program.
fn unit_times(pred: &Predictor<'_>, units: &Units) -> (Vec<f64>, Vec<f64>, f64) {
    let prog = pred.program(0).expect("program");
    let (mut f, mut b) = (vec![0.0; units.units.len()], vec![0.0; units.units.len()]);
    for (i, op) in prog.ops.iter().enumerate() {
        f[units.of_op[i]] += op.cost.fwd_us;
        b[units.of_op[i]] += op.cost.input_grad_us + op.cost.weight_grad_us;
    }
    (f, b, prog.optimizer_us)
}

#[test]
fn full_shard_time_when_the_network_dominates() {
    // 4 T4 in 2 nodes at batch 8: the collectives dwarf the compute.
    let g = graph(8);
    let mut pred = Predictor::new(&g, vec![target(4, 2, 8)], opts()).expect("predict");
    let facts = qsync_cost::GraphFacts::new(&g, &Bindings::new()).expect("facts");
    let units = Units::of(&g, &facts);
    let (f, b, opt) = unit_times(&pred, &units);
    // All-gather of a unit, bf16, flat ring over 4 devices across nodes at
    // the node's 10 GB/s (10,000 B/µs): shards of 2^20·2/4 = 524,288 B,
    // A = 3·524288/10000 + 3·20 = 217.2864 µs. Reduce-scatter, fp32:
    // shards of 2^20·4/4, R = 3·104.8576 + 60 = 374.5728 µs.
    let (a, r) = (217.2864, 374.5728);
    assert!(f.iter().chain(&b).all(|&t| t < a), "compute {f:?} {b:?} must be below {a} µs");
    // Forward: the three gathers back to back, then the head computes:
    // 3A + f2. Backward: gather 2 [3A+f2, 4A+f2]; gather 1 [4A+f2, 5A+f2];
    // RS 2 [5A+f2, 5A+f2+R]; gather 0 [5A+f2+R, 6A+f2+R]; RS 1 after it;
    // block 0's backward starts at 6A+f2+R and its RS waits for RS 1:
    // [6A+f2+2R, 6A+f2+3R]. Then the optimizer on a quarter of the state.
    let spec = ShardSpec::new(Stage::FullShard, 1);
    let res = predict_sharded(&mut pred, &units, &spec).expect("sharded");
    close(res.devices[0].forward_end_us, 3.0 * a + f[2], "forward end");
    close(res.iteration_us, 6.0 * a + 3.0 * r + f[2] + opt / 4.0, "iteration");
    assert_eq!(res.collectives.len(), 9);
    // qwZ halves the gathers (1 + 4/512 bytes per element: A' =
    // 3·2^20·1.0078125/4/10000 + 60) and qgZ-int4 the reduce-scatters
    // (0.5 + 4/512: R' = 3·2^20·0.5078125/4/10000 + 60), each plus its
    // kernels at the T4's rates (r·elements + c): qwZ quantizes its shard
    // of 2^20/4 and dequantizes the whole 2^20; qgZ-int4 quantizes the
    // whole unit's gradient and dequantizes 4 blocks of its 2^20/4 shard.
    let k = pred.cluster().types[0].sync_kernels;
    let (q4, d4) = (k.quantize4_r.unwrap_or(k.quantize_r), k.dequantize4_r.unwrap_or(k.dequantize_r));
    let kg = (k.quantize_r * MI / 4.0 + k.quantize_c + k.dequantize_r * MI + k.dequantize_c) * 1e6;
    let kr = (q4 * MI + k.quantize_c + d4 * 4.0 * (MI / 4.0) + k.dequantize_c) * 1e6;
    assert!(kg > 0.0 && kr > 0.0, "the kernels cost something: {kg} {kr}");
    let q = ShardSpec { gather: GatherPrecision::QwzInt8, reduce: ReducePrecision::QgzInt4, ..spec.clone() };
    let (aq, rq) = (3.0 * MI * 1.0078125 / 4.0 / 1e4 + 60.0 + kg, 3.0 * MI * 0.5078125 / 4.0 / 1e4 + 60.0 + kr);
    assert!(f.iter().chain(&b).all(|&t| t < rq.min(aq)));
    let res = predict_sharded(&mut pred, &units, &q).expect("quantized");
    close(res.iteration_us, 6.0 * aq + 3.0 * rq + f[2] + opt / 4.0, "qwZ + qgZ iteration");
    // hpZ: the backward gathers inside the node, a ring of 2 at 100 GB/s:
    // H = 2^20·2/2/100000 + 5 = 15.48576 µs. With F = 3A + f2 the forward
    // end, the stream runs gather 2 [F, F+H], gather 1 [F+H, F+2H] (issued
    // when block 2's backward starts), then RS 2 once block 2 is done, and
    // so on; each step below is `max(issued, stream free) + duration`.
    let h = 2.0 * MI / 2.0 / 1e5 + 5.0;
    close(h, 15.48576, "hpZ gather");
    let fe = 3.0 * a + f[2];
    let bstart2 = fe + h;
    let rs2_end = (bstart2 + b[2]).max(fe + 2.0 * h) + r;
    let bstart1 = (bstart2 + b[2]).max(fe + 2.0 * h);
    let g0_end = bstart1.max(rs2_end) + h;
    let rs1_end = (bstart1 + b[1]).max(g0_end) + r;
    let bstart0 = (bstart1 + b[1]).max(g0_end);
    let rs0_end = (bstart0 + b[0]).max(rs1_end) + r;
    let hp = ShardSpec { hpz: true, ..spec.clone() };
    let res = predict_sharded(&mut pred, &units, &hp).expect("hpz");
    close(res.iteration_us, rs0_end + opt / 4.0, "hpZ iteration");
    assert!(res.iteration_us < 6.0 * a + 3.0 * r + f[2] + opt / 4.0, "hpZ is faster here");
    // Hybrid: gathers and reduce-scatters inside the node (rings of 2 at
    // 100 GB/s: G = H, S = 2^20·4/2/1e5 + 5 = 25.97152), each unit's shard
    // all-reduced across the 2 nodes, the node's 10 GB/s shared by its 2
    // GPUs: X = 2·1/2·(2^20·4/2)/5000 + 2·20 = 459.4304. Backward: gather
    // 2, gather 1, RS 2, X 2, gather 0, RS 1, X 1, RS 0, X 0 in that order
    // on the stream (every b below G + S + X), then the step on half the
    // state.
    let (gg, ss, x) = (h, 4.0 * MI / 2.0 / 1e5 + 5.0, 2.0 * 1.0 / 2.0 * (MI * 4.0 / 2.0) / 5000.0 + 2.0 * 20.0);
    close(ss, 25.97152, "hybrid reduce-scatter");
    close(x, 459.4304, "hybrid all-reduce");
    // The forward: unit u+1's gather issued when unit u starts:
    // c0 = G, c1 = max(c0 + f0, 2G), c2 = c1 + max(f1, G), F = c2 + f2.
    assert!(b.iter().all(|&t| t < gg + ss + x));
    let c1 = (gg + f[0]).max(2.0 * gg);
    let c2 = c1 + f[1].max(gg);
    let fe = c2 + f[2];
    let hy = ShardSpec::new(Stage::HybridShard, 1);
    let res = predict_sharded(&mut pred, &units, &hy).expect("hybrid");
    let last = res.collectives.last().expect("collectives");
    assert_eq!((last.kind, last.unit, last.scope), ("all-reduce", 0, "cluster"));
    close(res.devices[0].forward_end_us, fe, "hybrid forward end");
    // RS 2 starts once block 2 is done and gather 1 is through:
    // max(F + G + b2, F + 2G); from there the stream is never idle.
    let rs2 = (fe + gg + b[2]).max(fe + 2.0 * gg);
    close(res.iteration_us, rs2 + gg + 3.0 * ss + 3.0 * x + opt / 2.0, "hybrid iteration");
}

#[test]
fn hierarchical_collectives_cross_nodes_like_the_all_reduce() {
    // The engine's default (hierarchical) algorithm: a ring in the node of
    // g = 2 at 100 GB/s, then each device's half across the m = 2 nodes at
    // 10 GB/s / 2 = 5000 B/µs. A unit's bf16 gather, 2^20·2 B:
    // inner (2−1)·2^20/1e5 + 5 = 15.48576, outer (2−1)·2^19/5000 + 20 =
    // 124.8576: A = 140.34336 µs. Its fp32 reduce-scatter: inner
    // 2^21/1e5 + 5 = 25.97152, outer 2^20/5000 + 20 = 229.7152:
    // R = 255.68672 µs. Then the network-bound schedule of
    // `full_shard_time_when_the_network_dominates`: 6A + 3R + f2 + step/4.
    let g = graph(8);
    let mut o = opts();
    o.config.algo = qsync_sim::AllReduceAlgo::Hierarchical;
    let mut pred = Predictor::new(&g, vec![target(4, 2, 8)], o).expect("predict");
    let facts = qsync_cost::GraphFacts::new(&g, &Bindings::new()).expect("facts");
    let units = Units::of(&g, &facts);
    let (f, b, opt) = unit_times(&pred, &units);
    let (a, r) = (140.34336, 255.68672);
    assert!(f.iter().chain(&b).all(|&t| t < a), "compute {f:?} {b:?} must be below {a} µs");
    let res = predict_sharded(&mut pred, &units, &ShardSpec::new(Stage::FullShard, 1)).expect("sharded");
    close(res.iteration_us, 6.0 * a + 3.0 * r + f[2] + opt / 4.0, "hierarchical iteration");
}

#[test]
fn full_shard_time_when_compute_dominates() {
    // 4 T4 in one node at batch 4096: each unit's compute (≈1 ms) hides
    // the gathers (A = 3·524288/100000 + 3·5 = 30.72864 µs) but the first
    // of each pass, and every reduce-scatter (R = 3·1048576/1e5 + 15 =
    // 46.4573 µs) but the last.
    let g = graph(4096);
    let mut pred = Predictor::new(&g, vec![target(4, 4, 4096)], opts()).expect("predict");
    let facts = qsync_cost::GraphFacts::new(&g, &Bindings::new()).expect("facts");
    let units = Units::of(&g, &facts);
    let (f, b, opt) = unit_times(&pred, &units);
    let (a, r) = (30.72864, 46.45728);
    assert!(f.iter().chain(&b).all(|&t| t > a + r), "compute {f:?} {b:?} must hide the collectives");
    let spec = ShardSpec::new(Stage::FullShard, 1);
    let res = predict_sharded(&mut pred, &units, &spec).expect("sharded");
    let (sf, sb): (f64, f64) = (f.iter().sum(), b.iter().sum());
    // A + Σf, then the backward's first gather A, Σb, the last RS, the step.
    close(res.devices[0].forward_end_us, a + sf, "forward end");
    close(res.iteration_us, a + sf + a + sb + r + opt / 4.0, "iteration");
    close(res.devices[0].compute_us, sf + sb + opt / 4.0, "compute");
    close(res.devices[0].exposed_comm_us, 2.0 * a + r, "exposed communication");
    // Checkpointing recomputes both blocks' forward in the backward.
    let ck = ShardSpec { checkpoint: vec![true], ..spec.clone() };
    let res = predict_sharded(&mut pred, &units, &ck).expect("checkpoint");
    close(res.iteration_us, a + sf + a + sb + f[0] + f[1] + r + opt / 4.0, "checkpointed iteration");
    // Replicate with checkpointing: DDP's iteration plus the recomputation.
    let ddp = pred.result().iteration_us;
    let rep = ShardSpec { checkpoint: vec![true], ..ShardSpec::new(Stage::Replicate, 1) };
    let res = predict_sharded(&mut pred, &units, &rep).expect("replicate");
    close(res.iteration_us, ddp + f[0] + f[1], "replicated, checkpointed");
}

#[test]
fn every_unit_and_collective_pays_its_fixed_cost() {
    // The compute-dominated case of `full_shard_time_when_compute_dominates`
    // (4 T4 in one node at batch 4096), with the default fixed costs: each
    // collective launches in L = 8.4 µs on top of its ring steps, and each
    // unit with parameters spends H = 100 µs of host time on FSDP's hook
    // per collective it takes part in, on its compute stream.
    let (l, h) = (qsync_sim::shard::COLLECTIVE_LAUNCH_US, qsync_sim::shard::FSDP_UNIT_HOST_US);
    assert_eq!((l, h), (8.4, 100.0));
    let g = graph(4096);
    let mut t = target(4, 4, 4096);
    t.device = t4_fixed();
    let mut pred = Predictor::new(&g, vec![t], opts()).expect("predict");
    let facts = qsync_cost::GraphFacts::new(&g, &Bindings::new()).expect("facts");
    let units = Units::of(&g, &facts);
    let (f, b, opt) = unit_times(&pred, &units);
    // A = 3·524288/1e5 + 3·5 + L, R = 3·1048576/1e5 + 15 + L.
    let (a, r) = (30.72864 + l, 46.45728 + l);
    assert!(f.iter().chain(&b).all(|&t| t > a + r), "compute {f:?} {b:?} must hide the collectives");
    let (sf, sb): (f64, f64) = (f.iter().sum(), b.iter().sum());
    // FULL_SHARD: three hooks a unit (forward gather, backward gather,
    // reduce-scatter), 9H in all on the compute stream. Forward A + 3H + Σf;
    // backward its first gather A, then 6H + Σb; the last reduce-scatter R;
    // the step over a quarter.
    let spec = ShardSpec::new(Stage::FullShard, 1);
    let res = predict_sharded(&mut pred, &units, &spec).expect("full shard");
    close(res.devices[0].forward_end_us, a + 3.0 * h + sf, "forward end");
    close(res.iteration_us, 2.0 * a + 9.0 * h + sf + sb + r + opt / 4.0, "full-shard iteration");
    close(res.devices[0].host_us, 9.0 * h, "host time");
    close(res.devices[0].compute_us, sf + sb + 9.0 * h + opt / 4.0, "compute with the hooks");
    close(res.devices[0].exposed_comm_us, 2.0 * a + r, "exposed communication");
    assert_eq!(res.collectives.len(), 9);
    // SHARD_GRAD_OP: no backward gather, two hooks a unit:
    // A + 6H + Σf + Σb + R + step/4.
    let res = predict_sharded(&mut pred, &units, &ShardSpec::new(Stage::ShardGradOp, 1)).expect("shard grad op");
    close(res.iteration_us, a + 6.0 * h + sf + sb + r + opt / 4.0, "shard-grad-op iteration");
    close(res.devices[0].host_us, 6.0 * h, "shard-grad-op host time");

    // A head without parameters (a Relu): its unit gathers nothing and
    // runs no hook. FULL_SHARD: forward A + 2H + Σf; the backward starts
    // with the head (no gather to wait for), whose b2 overlaps block 1's
    // gather: max(b2, A); then the blocks, 4H + b1 + b0, and block 0's R.
    let text = r#"
graph "free_head" {
  init %w0: f32[1024,1024] = absent
  init %w1: f32[1024,1024] = absent
  input %x: f32[4096,1024]
  %a0: f32[4096,1024] = MatMul "/blocks.0/MatMul"(%x, %w0)
  %r0: f32[4096,1024] = Relu "/blocks.0/Relu"(%a0)
  %a1: f32[4096,1024] = MatMul "/blocks.1/MatMul"(%r0, %w1)
  %r1: f32[4096,1024] = Relu "/blocks.1/Relu"(%a1)
  %y: f32[4096,1024] = Relu "/head/Relu"(%r1)
  output %y
}
"#;
    let g = qsync_ir::text::parse_graph(text).expect("parse");
    let mut t = target(4, 4, 4096);
    t.device = t4_fixed();
    let mut pred = Predictor::new(&g, vec![t], opts()).expect("predict");
    let facts = qsync_cost::GraphFacts::new(&g, &Bindings::new()).expect("facts");
    let units = Units::of(&g, &facts);
    assert_eq!(units.units.iter().map(|u| u.params).collect::<Vec<_>>(), [MI, MI, 0.0]);
    let (f, b, opt) = unit_times(&pred, &units);
    let res = predict_sharded(&mut pred, &units, &spec).expect("free head");
    assert_eq!(res.collectives.len(), 6, "{:?}", res.collectives);
    assert!(res.collectives.iter().all(|c| c.unit != 2));
    let (sf, fe) = (f.iter().sum::<f64>(), a + 2.0 * h + f.iter().sum::<f64>());
    close(res.devices[0].forward_end_us, fe, "free head forward end");
    close(
        res.iteration_us,
        a + 2.0 * h + sf + b[2].max(a) + 4.0 * h + b[1] + b[0] + r + opt / 4.0,
        "free head iteration",
    );
    close(res.devices[0].host_us, 6.0 * h, "free head host time");
}

/// Every `(gather, reduce)` pair `choices` allows within `budget`, priced;
/// the fastest (the first on ties, the 16-bit / FP32 pair leading).
fn fastest_pair(
    pred: &mut Predictor<'_>,
    units: &Units,
    choices: &CollectiveChoices,
    budget: f64,
) -> (GatherPrecision, ReducePrecision, f64) {
    let mut best: Option<(GatherPrecision, ReducePrecision, f64)> = None;
    for (gather, reduce) in choices.pairs(GatherPrecision::Bf16, 4, budget) {
        let spec = ShardSpec { gather, reduce, ..ShardSpec::new(Stage::FullShard, 1) };
        let it = predict_sharded(pred, units, &spec).expect("sharded").iteration_us;
        if best.is_none_or(|b| it < b.2) {
            best = Some((gather, reduce, it));
        }
    }
    best.expect("the fp pair is always priced")
}

#[test]
fn quantized_collectives_pay_on_a_slow_link_and_not_on_a_fast_one() {
    // Relative errors (qsync_runtime::shard's bounds, half a step per
    // round-to-nearest stage over the group's largest magnitude): qwZ and
    // qgZ-int8 1/(2·127) = 0.003937, qgZ-int4 1/(2·7) = 0.0714, a BF16 ring
    // over 4 devices 3·2^-8 = 0.01172. Under the default 0.01 `auto` offers
    // qwZ, qgZ-int8; under 0 nothing but bf16 / fp32.
    close(GatherPrecision::QwzInt8.relative_error(), 0.5 / 127.0, "qwZ error");
    close(ReducePrecision::QgzInt4.relative_error(4), 0.5 / 7.0, "qgZ-int4 error");
    close(ReducePrecision::Bf16.relative_error(4), 3.0 / 256.0, "bf16 ring error");
    let auto = CollectiveChoices::parse("auto").expect("auto");
    let pairs = auto.pairs(GatherPrecision::Bf16, 4, 0.01);
    assert_eq!(
        pairs,
        [
            (GatherPrecision::Bf16, ReducePrecision::Fp32),
            (GatherPrecision::Bf16, ReducePrecision::QgzInt8),
            (GatherPrecision::QwzInt8, ReducePrecision::Fp32),
            (GatherPrecision::QwzInt8, ReducePrecision::QgzInt8),
        ]
    );
    assert_eq!(auto.pairs(GatherPrecision::Bf16, 4, 0.0), [(GatherPrecision::Bf16, ReducePrecision::Fp32)]);
    assert_eq!(CollectiveChoices::parse("fp").expect("fp"), CollectiveChoices::default());
    assert!(CollectiveChoices::parse("qwz,int2").expect_err("int2 is no collective").contains("`int2`"));

    let g = graph(8);
    let facts = qsync_cost::GraphFacts::new(&g, &Bindings::new()).expect("facts");
    let units = Units::of(&g, &facts);
    // Kernels of one unit (2^20 elements) on a T4, µs: qwZ's quantize of a
    // quarter and dequantize of the whole, KG; qgZ-int8's quantize of the
    // whole and dequantize of four quarters, KR.
    let kernels = |pred: &Predictor<'_>| {
        let k = pred.cluster().types[0].sync_kernels;
        let kg = (k.quantize_r * MI / 4.0 + k.quantize_c + k.dequantize_r * MI + k.dequantize_c) * 1e6;
        let kr = (k.quantize_r * MI + k.quantize_c + k.dequantize_r * MI + k.dequantize_c) * 1e6;
        (kg, kr)
    };

    // Slow: 4 T4 in 2 nodes, 80 Gbit/s (10,000 B/µs, 20 µs a step), a flat
    // ring of 3 steps. bf16 gather A = 3·2^19/1e4 + 60 = 217.2864, qwZ
    // A' = 3·2^18·1.0078125/1e4 + 60 + KG; fp32 reduce-scatter
    // R = 3·2^20/1e4 + 60 = 374.5728, qgZ-int8 R' = 3·2^18·1.0078125/1e4 +
    // 60 + KR. The network-bound iteration is 6A + 3R + f2 + step/4, so
    // qwZ pays where A' < A and qgZ where R' < R.
    let mut pred = Predictor::new(&g, vec![target(4, 2, 8)], opts()).expect("predict");
    let (f, b, opt) = unit_times(&pred, &units);
    let (kg, kr) = kernels(&pred);
    let (a, r) = (217.2864, 374.5728);
    let (aq, rq) = (3.0 * MI / 4.0 * 1.0078125 / 1e4 + 60.0 + kg, 3.0 * MI / 4.0 * 1.0078125 / 1e4 + 60.0 + kr);
    assert!(aq < a && rq < r, "the slow link: qwZ {aq} < {a}, qgZ {rq} < {r}");
    assert!(f.iter().chain(&b).all(|&t| t < aq.min(rq)), "network-bound: {f:?} {b:?}");
    let (gather, reduce, it) = fastest_pair(&mut pred, &units, &auto, 0.01);
    assert_eq!((gather, reduce), (GatherPrecision::QwzInt8, ReducePrecision::QgzInt8));
    close(it, 6.0 * aq + 3.0 * rq + f[2] + opt / 4.0, "qwZ + qgZ-int8 iteration");
    // A zero budget keeps bf16 / fp32 however slow the link.
    let (gather, reduce, it) = fastest_pair(&mut pred, &units, &auto, 0.0);
    assert_eq!((gather, reduce), (GatherPrecision::Bf16, ReducePrecision::Fp32));
    close(it, 6.0 * a + 3.0 * r + f[2] + opt / 4.0, "bf16 + fp32 iteration");

    // Fast: the same nodes at 800 Gbit/s (100,000 B/µs). A = 3·2^19/1e5 +
    // 60 = 75.72864, A' = 3·2^18·1.0078125/1e5 + 60 + KG; R = 3·2^20/1e5 +
    // 60 = 91.45728, R' = 3·2^18·1.0078125/1e5 + 60 + KR: the bytes saved,
    // 3·2^19·(1 − 1.0078125/2)/1e5 = 7.8 µs a gather and 3·2^18·
    // (4 − 1.0078125)/1e5 = 23.5 µs a reduce-scatter, are less than the
    // kernels, so bf16 / fp32 stays.
    let mut pred = Predictor::new(&g, vec![target_nic(4, 2, 8, 800.0)], opts()).expect("predict");
    let (f, b, opt) = unit_times(&pred, &units);
    let (kg, kr) = kernels(&pred);
    let (a, r) = (75.72864, 91.45728);
    let (aq, rq) = (3.0 * MI / 4.0 * 1.0078125 / 1e5 + 60.0 + kg, 3.0 * MI / 4.0 * 1.0078125 / 1e5 + 60.0 + kr);
    assert!(aq > a && rq > r, "the fast link: qwZ {aq} > {a}, qgZ {rq} > {r}");
    assert!(f.iter().chain(&b).all(|&t| t < a.min(r)), "network-bound: {f:?} {b:?}");
    let (gather, reduce, it) = fastest_pair(&mut pred, &units, &auto, 0.01);
    assert_eq!((gather, reduce), (GatherPrecision::Bf16, ReducePrecision::Fp32));
    close(it, 6.0 * a + 3.0 * r + f[2] + opt / 4.0, "fast link iteration");
}
