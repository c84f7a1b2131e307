//! Replayer budgets: a full simulation of `bert_base_train.onnx`
//! (batch 32, seq 128) on 16 V100 + 16 T4 under 5 ms; one op change then a
//! fresh result under 0.5 ms.
//!
//! Costs come from a synthetic FLOP-proportional source defined here (the
//! real cost model lives in `qsync-cost`): MatMul/Gemm cost `2·out·K` FLOPs,
//! everything else one FLOP per output element, at a fixed fraction of each
//! device's FP32 peak plus a launch overhead; integer and tiny tensors (shape
//! arithmetic) cost nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_ir::{DType, Graph, NodeId, OpClass};
use qsync_sim::{Cluster, CostSource, DeviceType, LocalProgram, OpCost, SimConfig, Simulator};

/// FP32 peak in FLOP/µs per device name (V100 15.7 TFLOPS, T4 8.1).
struct FlopCost;

impl FlopCost {
    fn peak(device: &DeviceType) -> f64 {
        if device.name == "v100" {
            15.7e6
        } else {
            8.1e6
        }
    }
}

fn numel(g: &Graph, v: qsync_ir::ValueId) -> Option<u64> {
    let s = g.ty(v).concrete_shape()?;
    Some(s.iter().map(|&d| d.max(0) as u64).product())
}

impl CostSource for FlopCost {
    fn op_cost(&self, g: &Graph, n: NodeId, device: &DeviceType) -> OpCost {
        let node = g.node(n);
        let Some(&out) = node.outputs().first() else { return OpCost::default() };
        let float = g.ty(out).dtype.is_some_and(DType::is_float);
        let out_n = numel(g, out).unwrap_or(0);
        if !float || out_n < 1024 {
            return OpCost::default();
        }
        let flops = match node.op.class() {
            OpClass::MatMul => {
                let k =
                    node.input(0).and_then(|a| g.ty(a).concrete_shape()).and_then(|s| s.last().copied()).unwrap_or(1);
                2.0 * out_n as f64 * k as f64
            }
            _ => out_n as f64,
        };
        let rate = Self::peak(device) * 0.6;
        let fwd = 5.0 + flops / rate;
        let weights: u64 = node
            .inputs()
            .iter()
            .flatten()
            .filter(|&&v| g.value(v).init().is_some() && g.ty(v).dtype.is_some_and(DType::is_float))
            .filter_map(|&v| numel(g, v))
            .filter(|&e| e > 1)
            .sum();
        let cost = if weights > 0 { OpCost::weighted(fwd, fwd, fwd, weights * 4) } else { OpCost::new(fwd, fwd) };
        cost.saving(out_n * 4)
    }

    fn optimizer_us(&self, _g: &Graph, device: &DeviceType) -> f64 {
        // Adam over 110 M parameters, ~16 bytes per parameter through HBM.
        110e6 * 16.0 / if device.name == "v100" { 900e3 } else { 320e3 }
    }
}

fn setup() -> (Cluster, Vec<LocalProgram>) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/bert_base_train.onnx");
    let mut m = qsync_onnx::import_file(&path).expect("import bert_base_train.onnx");
    let opset = m.opset();
    let opts = InferOptions { batch: Some(32), dims: BTreeMap::from([("seq".to_string(), 128)]) };
    infer_shapes(&mut m.graph, opset, &opts);
    let cluster = Cluster::new(vec![
        DeviceType::new("v100", 16, 8, 32).with_bandwidth(130.0, 12.5),
        DeviceType::new("t4", 16, 8, 32).with_bandwidth(12.0, 12.5),
    ]);
    let programs: Vec<_> = cluster.types.iter().map(|t| LocalProgram::from_graph(&m.graph, t, &FlopCost)).collect();
    (cluster, programs)
}

fn bench_sim(c: &mut Criterion) {
    let (cluster, programs) = setup();
    let weighted = programs[0].ops.iter().filter(|o| o.cost.grad_bytes > 0).count();
    let mut sim = Simulator::new(cluster.clone(), programs.clone(), SimConfig::default()).expect("simulate");
    let r = sim.result();
    eprintln!(
        "bert_base_train: {} ops, {weighted} with weights, {} grad bytes, {} buckets; iteration {:.1} ms, {:.0} samples/s",
        programs[0].ops.len(),
        r.allreduce_bytes,
        r.collectives.len(),
        r.iteration_us / 1e3,
        r.samples_per_s
    );

    c.bench_function("sim/full/bert_base_train", |b| {
        b.iter_batched(
            || programs.clone(),
            |p| Simulator::new(cluster.clone(), p, SimConfig::default()).expect("simulate"),
            BatchSize::SmallInput,
        );
    });

    // Worst case for the incremental path: the first op's forward time, which
    // shifts every later step of the T4 timeline.
    let t4 = 1;
    let first = programs[t4].ops.iter().position(|o| o.cost.fwd_us > 0.0).expect("a costed op");
    let base = programs[t4].ops[first].cost;
    let mut flip = false;
    c.bench_function("sim/incremental/one_change", |b| {
        b.iter(|| {
            flip = !flip;
            let mut cost = base;
            cost.fwd_us = if flip { base.fwd_us * 0.5 } else { base.fwd_us };
            sim.set_op_cost(t4, first, cost).expect("change");
            sim.result().iteration_us
        });
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = bench_sim
}
criterion_main!(benches);
