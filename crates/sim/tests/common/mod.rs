//! Shared fixtures: a four-op model whose timeline is worked out by hand in
//! `handworked.rs`.
#![allow(dead_code)]

use qsync_sim::{DeviceType, LocalOp, LocalProgram, OpCost};

/// `norm → fc1 → relu → fc2`, times in µs, gradients 60 kB (fc1) and 40 kB (fc2).
pub fn tiny(scale: f64) -> LocalProgram {
    let s = scale;
    LocalProgram {
        ops: vec![
            LocalOp::new("norm", OpCost::new(4.0 * s, 6.0 * s).saving(1000)),
            LocalOp::new("fc1", OpCost::weighted(10.0 * s, 10.0 * s, 20.0 * s, 60_000).saving(4000)),
            LocalOp::new("relu", OpCost::new(5.0 * s, 5.0 * s).saving(2000)),
            LocalOp::new("fc2", OpCost::weighted(10.0 * s, 10.0 * s, 20.0 * s, 40_000).saving(4000)),
        ],
        optimizer_us: 10.0 * s,
        optimizer_host_us: 0.0,
    }
}

/// One device in its own node, 1 GB/s (= 1000 B/µs) network, no latency:
/// with every device alone in its node, an all-reduce of S bytes over M = 2
/// nodes costs 2·(2−1)/2 · S/1000 = S/1000 µs.
pub fn solo(name: &str, local_batch: u32) -> DeviceType {
    DeviceType::new(name, 1, 1, local_batch).with_bandwidth(100.0, 1.0).with_latency(0.0, 0.0)
}

/// A small deterministic LCG (Knuth's MMIX constants).
#[derive(Debug)]
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 11
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in [lo, hi), on a 1/1024 grid so values print nicely.
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.below(1024) as f64 / 1024.0)
    }
}

/// A random program of `n ≥ grads.len()` ops; about one in four has weights,
/// taking every gradient size of `grads` in order, so that every program
/// built from the same `grads` all-reduces the same tensors.
pub fn random_program(rng: &mut Lcg, n: usize, grads: &[u64]) -> LocalProgram {
    let mut g = grads.iter();
    let ops = (0..n)
        .map(|i| {
            let fwd = rng.range(0.0, 50.0);
            let dg = rng.range(0.0, 80.0);
            let must = g.len() >= n - i;
            let cost = match (i % 4 == 1 || must).then(|| g.next()).flatten() {
                Some(&bytes) => OpCost::weighted(fwd, dg, rng.range(0.0, 80.0), bytes),
                None => OpCost::new(fwd, dg),
            };
            LocalOp::new(format!("op{i}"), cost.saving(rng.below(1 << 20)))
        })
        .collect();
    LocalProgram { ops, optimizer_us: rng.range(0.0, 100.0), optimizer_host_us: 0.0 }
}

/// Gradient sizes for `random_program` with `n` ops.
pub fn random_grads(rng: &mut Lcg, n: usize) -> Vec<u64> {
    (0..n.div_ceil(4)).map(|_| 1 + rng.below(8 << 20)).collect()
}
