//! The cluster: device types, how their devices sit in nodes, their links,
//! and the all-reduce cost model over that shape.
//!
//! Bandwidths are per device in GB/s (10⁹ bytes/s) — the bus bandwidth one
//! GPU gets inside its node (NVLink or PCIe) and across nodes (its share of
//! the NIC). Latencies are per ring step in µs.

use serde::{Deserialize, Serialize};

use crate::SimError;

/// One kind of GPU in the cluster, all running the same plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceType {
    /// Name shown in results and traces, e.g. `v100`. Unique in a cluster.
    pub name: String,
    /// Devices per node, one entry per node: `[8, 8]` is 16 GPUs in 2 nodes.
    pub nodes: Vec<u32>,
    /// Samples per device per iteration.
    pub local_batch: u32,
    /// Per-device bus bandwidth inside a node, GB/s.
    pub intra_node_gb_per_s: f64,
    /// Per-device bandwidth across nodes, GB/s.
    pub network_gb_per_s: f64,
    /// Latency of one intra-node ring step, µs.
    pub intra_node_latency_us: f64,
    /// Latency of one inter-node ring step, µs.
    pub network_latency_us: f64,
    /// Bytes resident whatever the schedule: weights (all copies), gradients,
    /// optimizer state, workspace. Activation memory comes from
    /// [`crate::OpCost::saved_bytes`].
    pub static_memory_bytes: u64,
    /// Memory available to training on one device, if known.
    pub memory_capacity_bytes: Option<u64>,
    /// Costs of the gradient-synchronization kernels (quantize,
    /// dequantize-accumulate, 16-bit casts) on one device.
    #[serde(default)]
    pub sync_kernels: crate::sync::SyncKernels,
}

impl DeviceType {
    /// `count` devices, `per_node` to a node (the last node takes the rest),
    /// with NVLink-class defaults: 100 GB/s and 5 µs inside a node, 10 GB/s
    /// and 20 µs across nodes. Zero `count` or `per_node` is left for
    /// [`Cluster::validate`] to reject.
    pub fn new(name: impl Into<String>, count: u32, per_node: u32, local_batch: u32) -> DeviceType {
        let mut nodes = Vec::new();
        if per_node > 0 {
            let mut left = count;
            while left > 0 {
                nodes.push(left.min(per_node));
                left -= left.min(per_node);
            }
        }
        DeviceType {
            name: name.into(),
            nodes,
            local_batch,
            intra_node_gb_per_s: 100.0,
            network_gb_per_s: 10.0,
            intra_node_latency_us: 5.0,
            network_latency_us: 20.0,
            static_memory_bytes: 0,
            memory_capacity_bytes: None,
            sync_kernels: crate::sync::SyncKernels::default(),
        }
    }

    /// Set the synchronization kernels' costs.
    pub fn with_sync_kernels(mut self, k: crate::sync::SyncKernels) -> DeviceType {
        self.sync_kernels = k;
        self
    }

    /// Set both bandwidths (GB/s).
    pub fn with_bandwidth(mut self, intra_node_gb_per_s: f64, network_gb_per_s: f64) -> DeviceType {
        self.intra_node_gb_per_s = intra_node_gb_per_s;
        self.network_gb_per_s = network_gb_per_s;
        self
    }

    /// Set both per-step latencies (µs).
    pub fn with_latency(mut self, intra_node_us: f64, network_us: f64) -> DeviceType {
        self.intra_node_latency_us = intra_node_us;
        self.network_latency_us = network_us;
        self
    }

    /// Set the static memory and the capacity (bytes).
    pub fn with_memory(mut self, static_bytes: u64, capacity_bytes: Option<u64>) -> DeviceType {
        self.static_memory_bytes = static_bytes;
        self.memory_capacity_bytes = capacity_bytes;
        self
    }

    /// Number of devices of this type.
    pub fn count(&self) -> u64 {
        self.nodes.iter().map(|&g| u64::from(g)).sum()
    }
}

/// How gradients are all-reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum AllReduceAlgo {
    /// One flat ring over every device; its bandwidth is the network's as soon
    /// as the ring spans nodes.
    Ring,
    /// Ring reduce-scatter inside each node, ring all-reduce of each device's
    /// shard across nodes, ring all-gather inside each node.
    #[default]
    Hierarchical,
}

/// Device types and their shape. Devices of one type share a plan and hence
/// a simulated timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    pub types: Vec<DeviceType>,
}

impl Cluster {
    pub fn new(types: Vec<DeviceType>) -> Cluster {
        Cluster { types }
    }

    /// Reject an empty cluster, zero counts, zero batches, duplicate names and
    /// non-positive bandwidths.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.types.is_empty() {
            return Err(SimError::EmptyCluster);
        }
        for (i, t) in self.types.iter().enumerate() {
            let zero = |what| Err(SimError::ZeroCount { device: t.name.clone(), what });
            if t.nodes.is_empty() {
                return zero("node count");
            }
            if t.nodes.contains(&0) {
                return zero("devices per node");
            }
            if t.local_batch == 0 {
                return zero("local batch");
            }
            let checks = [
                ("intra-node bandwidth", t.intra_node_gb_per_s, true),
                ("network bandwidth", t.network_gb_per_s, true),
                ("intra-node latency", t.intra_node_latency_us, false),
                ("network latency", t.network_latency_us, false),
            ];
            for (what, value, strict) in checks {
                let bad = !value.is_finite() || value < 0.0 || (strict && value == 0.0);
                if bad {
                    return Err(SimError::BadNumber { device: t.name.clone(), what, value });
                }
            }
            if self.types[..i].iter().any(|o| o.name == t.name) {
                return Err(SimError::DuplicateDevice(t.name.clone()));
            }
        }
        Ok(())
    }

    /// All devices in the cluster.
    pub fn device_count(&self) -> u64 {
        self.types.iter().map(DeviceType::count).sum()
    }

    /// All nodes in the cluster (a node holds devices of one type).
    pub fn node_count(&self) -> u64 {
        self.types.iter().map(|t| t.nodes.len() as u64).sum()
    }

    /// Samples per iteration over the whole cluster.
    pub fn global_batch(&self) -> u64 {
        self.types.iter().map(|t| t.count() * u64::from(t.local_batch)).sum()
    }

    /// Time in µs that devices of type `t` need for their part of an
    /// all-reduce of `bytes`: the slowest of that type's nodes. The collective
    /// as a whole lasts as long as the slowest type (QSync eq. 6).
    ///
    /// A ring of `p` members over bandwidth `B` costs `2(p−1)/p · S/B` plus
    /// `2(p−1)` step latencies. Hierarchically, a node of `g` devices pays that
    /// twice over half the steps inside the node (reduce-scatter, all-gather)
    /// and each device all-reduces its `S/g` shard in a ring over the `M` nodes.
    pub fn allreduce_us(&self, t: usize, bytes: u64, algo: AllReduceAlgo) -> f64 {
        let ty = &self.types[t];
        let s = bytes as f64;
        let p = self.device_count();
        let m = self.node_count();
        let intra_bw = ty.intra_node_gb_per_s * 1e3; // bytes per µs
        let net_bw = ty.network_gb_per_s * 1e3;
        match algo {
            AllReduceAlgo::Ring => {
                if p <= 1 {
                    return 0.0;
                }
                let (bw, lat) =
                    if m > 1 { (net_bw, ty.network_latency_us) } else { (intra_bw, ty.intra_node_latency_us) };
                ring(p, s, bw, lat)
            }
            AllReduceAlgo::Hierarchical => {
                let mut worst = 0.0f64;
                for &g in &ty.nodes {
                    let g = u64::from(g);
                    let inner = ring(g, s, intra_bw, ty.intra_node_latency_us);
                    let outer = ring(m, s / g as f64, net_bw, ty.network_latency_us);
                    worst = worst.max(inner + outer);
                }
                worst
            }
        }
    }
}

/// Ring all-reduce of `s` bytes among `p` members: `2(p−1)/p · s/bw + 2(p−1)·lat`.
fn ring(p: u64, s: f64, bw: f64, lat: f64) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let steps = 2.0 * (p - 1) as f64;
    steps / p as f64 * s / bw + steps * lat
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hierarchical_by_hand() {
        // 2 nodes × 4 GPUs, 100 GB/s = 1e5 B/µs inside, 10 GB/s = 1e4 B/µs across.
        // S = 8e6 B. Inside: 2·3/4·8e6/1e5 = 120 µs + 6·5 = 150.
        // Across: shard 2e6 B, M = 2: 2·1/2·2e6/1e4 = 200 µs + 2·20 = 240. Total 390.
        let c = Cluster::new(vec![DeviceType::new("a", 8, 4, 1)]);
        assert_eq!(c.allreduce_us(0, 8_000_000, AllReduceAlgo::Hierarchical), 390.0);
        // Flat ring of 8 over the network: 2·7/8·8e6/1e4 = 1400 + 14·20 = 1680.
        assert_eq!(c.allreduce_us(0, 8_000_000, AllReduceAlgo::Ring), 1680.0);
    }

    #[test]
    fn single_device_is_free() {
        let c = Cluster::new(vec![DeviceType::new("a", 1, 8, 1)]);
        assert_eq!(c.allreduce_us(0, 1 << 20, AllReduceAlgo::Hierarchical), 0.0);
        assert_eq!(c.allreduce_us(0, 1 << 20, AllReduceAlgo::Ring), 0.0);
    }

    #[test]
    fn validation() {
        assert_eq!(Cluster::new(vec![]).validate(), Err(SimError::EmptyCluster));
        let z = Cluster::new(vec![DeviceType::new("a", 0, 8, 1)]);
        assert!(matches!(z.validate(), Err(SimError::ZeroCount { .. })));
        let d = Cluster::new(vec![DeviceType::new("a", 1, 8, 1), DeviceType::new("a", 1, 8, 1)]);
        assert_eq!(d.validate(), Err(SimError::DuplicateDevice("a".into())));
        let b = Cluster::new(vec![DeviceType::new("a", 1, 8, 1).with_bandwidth(0.0, 1.0)]);
        assert!(matches!(b.validate(), Err(SimError::BadNumber { .. })));
    }
}
