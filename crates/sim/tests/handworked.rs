//! The simulator on graphs small enough to work out by hand.

mod common;

use common::{solo, tiny};
use qsync_sim::{Cluster, SimConfig, SimError, Simulator};

fn sim(types: Vec<qsync_sim::DeviceType>, programs: Vec<qsync_sim::LocalProgram>, cap: u64) -> Simulator {
    let config = SimConfig { bucket_cap_bytes: cap, ..SimConfig::default() };
    Simulator::new(Cluster::new(types), programs, config).expect("valid input")
}

/// Two devices, one bucket, and the all-reduce overlapping the last kernel.
///
/// Forward: norm 0–4, fc1 4–14, relu 14–19, fc2 19–29.
/// Backward: fc2.dgrad 29–39, fc2.wgrad 39–59, relu.dgrad 59–64,
/// fc1.dgrad 64–74, fc1.wgrad 74–94, norm.dgrad 94–100.
/// One bucket of 100 kB is ready at 94; its all-reduce takes 100 µs: 94–194,
/// overlapping norm.dgrad (6 µs). Optimizer 194–204.
/// compute = 100 + 10 = 110, idle = 204 − 110 = 94, comm = 100.
#[test]
fn two_devices_one_bucket() {
    let mut s = sim(vec![solo("a", 8), solo("b", 8)], vec![tiny(1.0), tiny(1.0)], 1 << 20);
    let r = s.result();
    assert_eq!(r.collectives.len(), 1);
    let c = &r.collectives[0];
    assert_eq!((c.bytes, c.ready_us.clone(), c.start_us, c.end_us), (100_000, vec![94.0, 94.0], 94.0, 194.0));
    assert_eq!(r.iteration_us, 204.0);
    for d in &r.devices {
        assert_eq!((d.forward_end_us, d.backward_end_us, d.finish_us), (29.0, 100.0, 204.0));
        assert_eq!((d.compute_us, d.comm_us, d.idle_us), (110.0, 100.0, 94.0));
        // Activations 1000 + 4000 + 2000 + 4000, no static memory.
        assert_eq!(d.peak_memory_bytes, 11_000);
    }
    assert_eq!(r.global_batch, 16);
    assert_eq!(r.samples_per_s, 16.0 / 204e-6);
    assert_eq!(r.allreduce_bytes, 100_000);
}

/// `slow` takes twice as long for everything.
///
/// slow forward ends at 58; backward: fc2 58–78–118, relu 118–128,
/// fc1 128–148–188, norm.dgrad 188–200. The bucket is ready at 94 on `fast`
/// but 188 on `slow`, so the all-reduce runs 188–288. fast: optimizer 288–298;
/// slow: optimizer (20 µs) 288–308 = the iteration.
/// fast idles 308 − 110 = 198 µs (94 of them its own, the rest waiting on
/// the straggler); slow idles 308 − 220 = 88.
#[test]
fn straggler_makes_the_other_idle() {
    let mut s = sim(vec![solo("fast", 8), solo("slow", 8)], vec![tiny(1.0), tiny(2.0)], 1 << 20);
    let r = s.result();
    let c = &r.collectives[0];
    assert_eq!((c.ready_us.clone(), c.start_us, c.end_us), (vec![94.0, 188.0], 188.0, 288.0));
    assert_eq!(r.iteration_us, 308.0);
    let (fast, slow) = (&r.devices[0], &r.devices[1]);
    assert_eq!((fast.compute_us, fast.idle_us, fast.finish_us), (110.0, 198.0, 298.0));
    assert_eq!((slow.compute_us, slow.idle_us, slow.finish_us), (220.0, 88.0, 308.0));
}

/// Two buckets (capacity 40 kB): fc2's 40 kB gradient fills bucket 0 at 59,
/// fc1's 60 kB fills bucket 1 at 94. All-reduce 0: 59–99, overlapping
/// relu.dgrad, fc1's backward and norm.dgrad. All-reduce 1 waits for it:
/// 99–159. Optimizer 159–169. One bucket took 204 µs: overlap saves 35.
#[test]
fn two_buckets_overlap_backward() {
    let mut s = sim(vec![solo("a", 8), solo("b", 8)], vec![tiny(1.0), tiny(1.0)], 40_000);
    let r = s.result();
    let spans: Vec<_> = r.collectives.iter().map(|c| (c.bytes, c.start_us, c.end_us)).collect();
    assert_eq!(spans, vec![(40_000, 59.0, 99.0), (60_000, 99.0, 159.0)]);
    assert_eq!(r.iteration_us, 169.0);
    assert_eq!((r.devices[0].compute_us, r.devices[0].idle_us, r.devices[0].comm_us), (110.0, 59.0, 100.0));
}

/// A 2×(2 nodes × 2) hybrid cluster, hierarchical: the collective lasts as
/// long as the slower type. S = 100 kB, M = 4 nodes, g = 2.
/// a (intra 100 GB/s = 1e5 B/µs, a node NIC of 1e3 B/µs shared by its 2
/// devices: 500 B/µs each): inside 2·1/2·1e5/1e5 = 1, across
/// 2·3/4·5e4/500 = 150 → 151. b (node NIC 0.5 GB/s, 250 B/µs each):
/// 1 + 300 = 301.
#[test]
fn slowest_participant_sets_collective_time() {
    let a = qsync_sim::DeviceType::new("a", 4, 2, 8).with_bandwidth(100.0, 1.0).with_latency(0.0, 0.0);
    let b = qsync_sim::DeviceType::new("b", 4, 2, 8).with_bandwidth(100.0, 0.5).with_latency(0.0, 0.0);
    let mut s = sim(vec![a, b], vec![tiny(1.0), tiny(1.0)], 1 << 20);
    let r = s.result();
    assert_eq!((r.collectives[0].start_us, r.collectives[0].end_us), (94.0, 395.0));
    assert_eq!(r.iteration_us, 405.0);
    assert_eq!(r.global_batch, 64);
}

#[test]
fn memory_capacity() {
    let a = solo("a", 8).with_memory(1_000_000, Some(1_011_000));
    let b = solo("b", 8).with_memory(1_000_000, Some(1_010_999));
    let mut s = sim(vec![a, b], vec![tiny(1.0), tiny(1.0)], 1 << 20);
    let r = s.result();
    assert_eq!((r.devices[0].peak_memory_bytes, r.devices[0].fits), (1_011_000, true));
    assert!(!r.devices[1].fits);
}

#[test]
fn bad_input_is_an_error() {
    let cfg = SimConfig::default();
    assert_eq!(Simulator::new(Cluster::new(vec![]), vec![], cfg).err(), Some(SimError::EmptyCluster));
    let zero = qsync_sim::DeviceType::new("a", 0, 8, 8);
    assert!(matches!(Simulator::new(Cluster::new(vec![zero]), vec![tiny(1.0)], cfg), Err(SimError::ZeroCount { .. })));
    let two = || Cluster::new(vec![solo("a", 8), solo("b", 8)]);
    assert_eq!(
        Simulator::new(two(), vec![tiny(1.0)], cfg).err(),
        Some(SimError::ProgramCount { types: 2, programs: 1 })
    );
    let mut other = tiny(1.0);
    other.ops.pop();
    assert!(matches!(
        Simulator::new(two(), vec![tiny(1.0), other], cfg),
        Err(SimError::MismatchedGradients { found: 1, expected: 2, .. })
    ));
    let mut nan = tiny(1.0);
    nan.ops[2].cost.fwd_us = f64::NAN;
    assert!(matches!(Simulator::new(two(), vec![tiny(1.0), nan], cfg), Err(SimError::BadCost { index: 2, .. })));

    let mut s = Simulator::new(two(), vec![tiny(1.0), tiny(1.0)], cfg).expect("valid");
    let mut c = tiny(1.0).ops[1].cost;
    c.grad_bytes += 1;
    assert!(matches!(s.set_op_cost(0, 1, c), Err(SimError::GradBytesChanged { .. })));
    assert!(matches!(s.set_op_cost(0, 9, c), Err(SimError::NoOp { .. })));
    assert_eq!(s.set_op_cost(2, 0, c).err(), Some(SimError::NoDevice(2)));
}

/// Casts are just ops: a type may run more ops than another as long as it
/// all-reduces the same gradients.
#[test]
fn casts_change_one_type_only() {
    let mut cast = tiny(1.0);
    cast.ops.insert(1, qsync_sim::LocalOp::new("fc1.cast_f16", qsync_sim::OpCost::new(2.0, 2.0)));
    let mut s = sim(vec![solo("a", 8), solo("b", 8)], vec![tiny(1.0), cast.clone()], 1 << 20);
    // b: 4 µs more compute, all of it before its bucket is ready (at 96 < 98).
    let r = s.result().clone();
    assert_eq!(r.collectives[0].ready_us, vec![94.0, 96.0]);
    assert_eq!(r.iteration_us, 206.0);
    // The same through set_program on a simulator built without the cast.
    let mut t = sim(vec![solo("a", 8), solo("b", 8)], vec![tiny(1.0), tiny(1.0)], 1 << 20);
    t.set_program(1, cast).expect("same gradients");
    assert_eq!(t.result(), &r);
}
