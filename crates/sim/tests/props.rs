//! Properties over random programs drawn from a seeded LCG.

mod common;

use common::{random_grads, random_program, Lcg};
use qsync_sim::{AllReduceAlgo, Cluster, DeviceType, LocalProgram, OpCost, SimConfig, Simulator};

fn cluster() -> Cluster {
    Cluster::new(vec![
        DeviceType::new("v100", 16, 8, 32).with_bandwidth(130.0, 12.5),
        DeviceType::new("t4", 16, 8, 16).with_bandwidth(12.0, 6.0),
    ])
}

fn programs(rng: &mut Lcg, n: usize) -> Vec<LocalProgram> {
    let grads = random_grads(rng, n);
    let first = random_program(rng, n, &grads);
    let extra = rng.below(5) as usize;
    vec![first, random_program(rng, n + extra, &grads)]
}

fn config(cap: u64) -> SimConfig {
    SimConfig { bucket_cap_bytes: cap, algo: AllReduceAlgo::Hierarchical, ..SimConfig::default() }
}

/// After any sequence of single-op changes, the incremental result (and
/// trace) equals a fresh simulation of the changed programs, bit for bit.
#[test]
fn incremental_equals_full() {
    let mut rng = Lcg(0x5157_4e43);
    for round in 0..40 {
        let n = 1 + rng.below(60) as usize;
        let mut progs = programs(&mut rng, n);
        let cfg = config(1 + rng.below(32 << 20));
        let mut inc = Simulator::new(cluster(), progs.clone(), cfg).expect("valid");
        for step in 0..25 {
            let t = rng.below(2) as usize;
            let i = rng.below(progs[t].ops.len() as u64) as usize;
            let old = progs[t].ops[i].cost;
            // Sometimes touch only one of the three times, sometimes none.
            let mut c = old;
            match rng.below(5) {
                0 => c.fwd_us = rng.range(0.0, 50.0),
                1 => c.input_grad_us = rng.range(0.0, 80.0),
                2 if old.grad_bytes > 0 => c.weight_grad_us = rng.range(0.0, 80.0),
                3 => {}
                _ => {
                    c = OpCost { fwd_us: rng.range(0.0, 9.0), input_grad_us: rng.range(0.0, 9.0), ..old };
                    c.saved_bytes = rng.below(1 << 20);
                }
            }
            progs[t].ops[i].cost = c;
            inc.set_op_cost(t, i, c).expect("valid change");
            if rng.below(3) == 0 || step == 24 {
                let mut full = Simulator::new(cluster(), progs.clone(), cfg).expect("valid");
                assert_eq!(inc.result(), full.result(), "round {round} step {step}");
                assert_eq!(inc.chrome_trace_json(), full.chrome_trace_json(), "round {round} step {step}");
            }
        }
    }
}

/// Slowing any one op of one device type never shortens the iteration.
#[test]
fn slower_device_never_faster() {
    let mut rng = Lcg(7);
    for _ in 0..200 {
        let n = 1 + rng.below(40) as usize;
        let progs = programs(&mut rng, n);
        let cfg = config(1 + rng.below(16 << 20));
        let mut sim = Simulator::new(cluster(), progs.clone(), cfg).expect("valid");
        let before = sim.result().iteration_us;
        let t = rng.below(2) as usize;
        // Either slow one op or scale the whole type.
        if rng.below(2) == 0 {
            let i = rng.below(progs[t].ops.len() as u64) as usize;
            let mut c = progs[t].ops[i].cost;
            c.fwd_us += rng.range(0.0, 100.0);
            c.weight_grad_us += if c.grad_bytes > 0 { rng.range(0.0, 100.0) } else { 0.0 };
            sim.set_op_cost(t, i, c).expect("valid");
        } else {
            let k = rng.range(1.0, 4.0);
            let mut p = progs[t].clone();
            for op in &mut p.ops {
                op.cost.fwd_us *= k;
                op.cost.input_grad_us *= k;
                op.cost.weight_grad_us *= k;
            }
            p.optimizer_us *= k;
            sim.set_program(t, p).expect("valid");
        }
        assert!(sim.result().iteration_us >= before);
    }
}

/// The bucket capacity changes how many collectives run (a smaller capacity
/// never fewer), never how many bytes they move.
#[test]
fn bucket_count_never_changes_volume() {
    let mut rng = Lcg(99);
    for _ in 0..100 {
        let n = 4 + rng.below(80) as usize;
        let progs = programs(&mut rng, n);
        let total: u64 = progs[0].grad_bytes();
        let mut counts = Vec::new();
        for cap in [1, 1 << 20, 25 << 20, u64::MAX] {
            let mut sim = Simulator::new(cluster(), progs.clone(), config(cap)).expect("valid");
            let r = sim.result();
            assert_eq!(r.allreduce_bytes, total);
            assert_eq!(r.collectives.iter().map(|c| c.bytes).sum::<u64>(), total);
            counts.push(sim.bucket_count());
        }
        assert!(counts.windows(2).all(|w| w[0] >= w[1]), "{counts:?}");
        assert_eq!(counts[3], 1);
    }
}

/// Same input, same bytes.
#[test]
fn deterministic() {
    let make = || {
        let mut rng = Lcg(3);
        let progs = programs(&mut rng, 30);
        let mut s = Simulator::new(cluster(), progs, SimConfig::default()).expect("valid");
        (s.result().clone(), s.chrome_trace_json())
    };
    assert_eq!(make(), make());
}
