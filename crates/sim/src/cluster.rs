//! The cluster: device types, how their devices sit in nodes, their links,
//! and the all-reduce cost model over that shape.
//!
//! Bandwidths are in GB/s (10⁹ bytes/s). Inside a node it is the bus
//! bandwidth one GPU gets (NVLink or PCIe). Across nodes it is the **node's**
//! network: the sum of its NICs, which the node's GPUs share. A phase in
//! which all `g` GPUs of a node send across nodes at once (the inter-node
//! rings of the hierarchical all-reduce, every compressed scheme's
//! exchanges) gives each GPU `1/g` of it ([`DeviceType::network_share`]); a
//! flat ring crosses each node boundary once (on as many channels as the
//! node has NICs) and gets the whole of it. When device types sit on
//! different fabrics, [`Fabric`] bounds what crosses between them.
//! Latencies are per ring step in µs.

use serde::{Deserialize, Serialize};

use crate::sync::SyncPath;
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
    /// The node's bandwidth to other nodes, GB/s: the sum of its NICs,
    /// shared by the node's devices.
    pub network_gb_per_s: f64,
    /// NICs per node (what `network_gb_per_s` sums; recorded, and a node
    /// with as many NICs as GPUs gives each GPU one).
    #[serde(default = "one")]
    pub nics_per_node: u32,
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
    /// The same kernels on the host CPU that serves one device (what the
    /// host paths run; [`crate::sync::SyncPath`]).
    #[serde(default = "crate::sync::SyncKernels::host")]
    pub host_kernels: crate::sync::SyncKernels,
    /// Pageable copies between one device and its host, GB/s each way.
    #[serde(default = "host_link")]
    pub host_link_gb_per_s: f64,
    /// CPU cores a node's ranks share for host-side synchronization work
    /// (`None`: at least a core per rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cores: Option<u32>,
    /// Host CPU seconds per byte the node's NICs send or receive, beyond
    /// the host transport's own cost (`host_kernels.tcp_r`); charged with
    /// it, on the cores the node's ranks share, to every byte that crosses
    /// nodes on a host transport ([`crate::topology::NodeNetwork::nic_cpu_ns_per_byte`]).
    #[serde(default, skip_serializing_if = "crate::topology::is_zero")]
    pub nic_cpu_s_per_byte: f64,
    /// Host time of one FSDP unit's hooks per collective it takes part in,
    /// µs ([`crate::shard::FSDP_UNIT_HOST_US`] unless the device file
    /// measured it).
    #[serde(default = "fsdp_unit_host")]
    pub fsdp_unit_host_us: f64,
    /// Fixed latency of one collective's launch beyond its ring steps, µs
    /// ([`crate::shard::COLLECTIVE_LAUNCH_US`] unless the device file
    /// measured it).
    #[serde(default = "collective_launch")]
    pub collective_launch_us: f64,
    /// The device is the host's own cores (a CPU described as a device):
    /// its fp32 all-reduce is a host engine's (gloo over TCP: one flat ring
    /// whose bytes and sums cost the cores, [`Cluster::allreduce_us`]), and
    /// every host-side synchronization takes its cycles from the same cores
    /// the forward and backward passes run on (the simulator delays the
    /// compute stream by that work).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compute_on_host: bool,
}

fn fsdp_unit_host() -> f64 {
    crate::shard::FSDP_UNIT_HOST_US
}

fn collective_launch() -> f64 {
    crate::shard::COLLECTIVE_LAUNCH_US
}

fn host_link() -> f64 {
    crate::sync::HOST_LINK_GB_PER_S
}

impl DeviceType {
    /// `count` devices, `per_node` to a node (the last node takes the rest),
    /// with NVLink-class defaults: 100 GB/s and 5 µs inside a node, one NIC
    /// of 10 GB/s per node and 20 µs across nodes. Zero `count` or `per_node` is left for
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
            nics_per_node: 1,
            intra_node_latency_us: 5.0,
            network_latency_us: 20.0,
            static_memory_bytes: 0,
            memory_capacity_bytes: None,
            sync_kernels: crate::sync::SyncKernels::default(),
            host_kernels: crate::sync::SyncKernels::host(),
            host_link_gb_per_s: crate::sync::HOST_LINK_GB_PER_S,
            host_cores: None,
            nic_cpu_s_per_byte: 0.0,
            fsdp_unit_host_us: crate::shard::FSDP_UNIT_HOST_US,
            collective_launch_us: crate::shard::COLLECTIVE_LAUNCH_US,
            compute_on_host: false,
        }
    }

    /// Mark the device as the host's own cores ([`DeviceType::compute_on_host`]).
    pub fn with_compute_on_host(mut self, on_host: bool) -> DeviceType {
        self.compute_on_host = on_host;
        self
    }

    /// Set sharded training's fixed costs (µs): the host time of a unit's
    /// hooks per collective, and a collective's launch.
    pub fn with_fsdp_fixed(mut self, unit_host_us: f64, collective_launch_us: f64) -> DeviceType {
        self.fsdp_unit_host_us = unit_host_us;
        self.collective_launch_us = collective_launch_us;
        self
    }

    /// Set the CPU cores a node's ranks share (`None`: a core per rank).
    pub fn with_host_cores(mut self, cores: Option<u32>) -> DeviceType {
        self.host_cores = cores;
        self
    }

    /// Set the host CPU seconds per byte the node's NICs move
    /// ([`DeviceType::nic_cpu_s_per_byte`]).
    pub fn with_nic_cpu(mut self, s_per_byte: f64) -> DeviceType {
        self.nic_cpu_s_per_byte = s_per_byte.max(0.0);
        self
    }

    /// CPU µs a rank's share of its node's cores spends on the NIC's work
    /// for `bytes` it sends to and `bytes` it receives from other nodes.
    pub fn nic_cpu_us(&self, bytes: f64) -> f64 {
        2.0 * bytes.max(0.0) * self.nic_cpu_s_per_byte * self.host_share() * 1e6
    }

    /// CPU µs a rank's share of its node's cores spends, each step of a
    /// flat ring over `nodes` nodes that moves `chunk` bytes a member, on
    /// the NIC's work: a node-major ring crosses each node's NIC once each
    /// way a step, one chunk out and one in for all the node's ranks
    /// (0 on one node).
    pub fn ring_nic_cpu_us(&self, chunk: f64, nodes: u64) -> f64 {
        if nodes > 1 {
            self.nic_cpu_us(chunk) / self.per_node() as f64
        } else {
            0.0
        }
    }

    /// How many of a node's ranks share one of its cores when all of them
    /// work on the host at once: `per_node / cores`, at least 1. Host-side
    /// work (kernels measured on one core, TCP) takes this much longer.
    pub fn host_share(&self) -> f64 {
        match self.host_cores {
            Some(c) if c > 0 => (self.per_node() as f64 / f64::from(c)).max(1.0),
            _ => 1.0,
        }
    }

    /// The host kernels as this type's synchronization runs them, `path`
    /// saying which: with their size ladder
    /// ([`crate::sync::SyncKernels::at_size`]) and pieces, except where
    /// the device computes on the host's own cores and the kernels run
    /// beside its backward pass (DDP's hooks on the host path, gloo's
    /// ring, DDP's bucket copies: `path` [`SyncPath::Host`]), which shares
    /// the caches, so a bucket does not stay cached as a lone gradient
    /// does: the memory-bound fits there (measured under DDP:
    /// docs/validation.md); the rates measured with every core at once
    /// ([`crate::sync::SyncKernels::corun_by_size`]) are then their
    /// largest size's at every size. On the MPI path (`sync-bench`, an MPI
    /// job's synchronization, Open MPI's own all-reduce) the kernels run
    /// between exchanges with nothing else on their cores, at the ladder's
    /// rates (the co-run ladder's where not pipelined).
    pub fn host_sync_kernels(&self, path: SyncPath) -> crate::sync::SyncKernels {
        if self.compute_on_host && path != SyncPath::Mpi {
            let k = self.host_kernels;
            let corun_by_size = k.corun_by_size.map(|l| [l[crate::sync::LADDER - 1]; crate::sync::LADDER]);
            crate::sync::SyncKernels { by_size: None, corun_by_size, pieces: None, ..k }
        } else {
            self.host_kernels
        }
    }

    /// Set the host's synchronization kernels and the host link (GB/s).
    pub fn with_host(mut self, k: crate::sync::SyncKernels, host_link_gb_per_s: f64) -> DeviceType {
        self.host_kernels = k;
        self.host_link_gb_per_s = host_link_gb_per_s;
        self
    }

    /// Set the synchronization kernels' costs.
    pub fn with_sync_kernels(mut self, k: crate::sync::SyncKernels) -> DeviceType {
        self.sync_kernels = k;
        self
    }

    /// Set both bandwidths (GB/s): per device inside a node, per node
    /// across nodes.
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

    /// Set the NICs per node (their sum stays `network_gb_per_s`).
    pub fn with_nics(mut self, nics_per_node: u32) -> DeviceType {
        self.nics_per_node = nics_per_node;
        self
    }

    /// Number of devices of this type.
    pub fn count(&self) -> u64 {
        self.nodes.iter().map(|&g| u64::from(g)).sum()
    }

    /// Devices in this type's largest node.
    pub fn per_node(&self) -> u64 {
        u64::from(self.nodes.iter().copied().max().unwrap_or(1).max(1))
    }

    /// Bytes per µs across nodes that one device gets while all `g` devices
    /// of its node send across nodes at once: the node's network over `g`.
    pub fn network_share(&self, g: u64) -> f64 {
        self.network_gb_per_s * 1e3 / g.max(1) as f64
    }
}

fn one() -> u32 {
    1
}

/// The link between device types that sit on different fabrics (two
/// clusters joined by a gateway, a data-center interconnect): everything
/// crossing from one type's nodes to another's shares it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Fabric {
    /// Bandwidth in each direction, GB/s.
    pub gb_per_s: f64,
    /// Latency added to a step that crosses it, µs.
    pub latency_us: f64,
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
    /// Reduce-scatter by recursive vector halving and distance doubling,
    /// then all-gather by the reverse (Rabenseifner; what Open MPI runs for
    /// large messages on a power-of-two world, measured on the emulated
    /// nodes' counters). Step `k` exchanges `S/2^(k+1)` with the rank at
    /// distance `2^k`: inside the node while `2^k < L`, else across — all
    /// `L` devices of a node at once. Other world sizes: the flat ring.
    /// A host engine's: each step also costs the host's TCP stack its bytes
    /// and each reduce-scatter step its f32 sum, on the node's shared cores.
    HalvingDoubling,
}

/// Device types and their shape. Devices of one type share a plan and hence
/// a simulated timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    pub types: Vec<DeviceType>,
    /// The link between device types, when they sit on different fabrics
    /// (`None`: one fabric, nodes limited only by their own NICs).
    #[serde(default)]
    pub fabric: Option<Fabric>,
}

impl Cluster {
    pub fn new(types: Vec<DeviceType>) -> Cluster {
        Cluster { types, fabric: None }
    }

    /// Join the device types through `fabric`.
    pub fn with_fabric(mut self, fabric: Option<Fabric>) -> Cluster {
        self.fabric = fabric;
        self
    }

    /// Bytes per µs and latency of the fabric between types, when the
    /// cluster has one and more than one type uses it.
    pub(crate) fn fabric_link(&self) -> Option<(f64, f64)> {
        self.fabric.filter(|_| self.types.len() > 1).map(|f| (f.gb_per_s * 1e3, f.latency_us))
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
            if t.nics_per_node == 0 {
                return zero("NICs per node");
            }
            let checks = [
                ("intra-node bandwidth", t.intra_node_gb_per_s, true),
                ("network bandwidth", t.network_gb_per_s, true),
                ("intra-node latency", t.intra_node_latency_us, false),
                ("network latency", t.network_latency_us, false),
                ("host link bandwidth", t.host_link_gb_per_s, true),
                ("FSDP unit host time", t.fsdp_unit_host_us, false),
                ("collective launch", t.collective_launch_us, false),
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
        if let Some(f) = self.fabric {
            for (what, value, strict) in
                [("fabric bandwidth", f.gb_per_s, true), ("fabric latency", f.latency_us, false)]
            {
                if !value.is_finite() || value < 0.0 || (strict && value == 0.0) {
                    return Err(SimError::BadNumber { device: "fabric".into(), what, value });
                }
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
    /// `2(p−1)` step latencies. A flat ring spanning nodes crosses each node
    /// boundary once and runs at the node's whole network. Hierarchically, a
    /// node of `g` devices pays a ring inside the node (reduce-scatter then
    /// all-gather), and each of its `g` devices all-reduces its `S/g` shard in
    /// a ring over the `M` nodes — all `g` at once, so each at `1/g` of the
    /// node's network. A fabric between types bounds any ring crossing it: the
    /// concurrent rings together move `2(k−1)/k · S` over it.
    pub fn allreduce_us(&self, t: usize, bytes: u64, algo: AllReduceAlgo) -> f64 {
        let ty = &self.types[t];
        let s = bytes as f64;
        let p = self.device_count();
        let m = self.node_count();
        let intra_bw = ty.intra_node_gb_per_s * 1e3; // bytes per µs
        let fabric = self.fabric_link();
        // A ring of `k` members moving `each` bytes per member over `bw`, or
        // over the fabric if that is slower.
        let across = |k: u64, each: f64, bw: f64, lat: f64| match fabric {
            Some((fbw, flat)) => ring(k, each, bw, lat.max(flat)).max(ring(k, s, fbw, lat.max(flat))),
            None => ring(k, each, bw, lat),
        };
        // A host engine (gloo) runs one flat ring whatever the algorithm
        // asked for, and its cores pay for every byte and every sum.
        let algo = if ty.compute_on_host && algo == AllReduceAlgo::Hierarchical { AllReduceAlgo::Ring } else { algo };
        match algo {
            AllReduceAlgo::Ring if ty.compute_on_host => {
                if p <= 1 {
                    return 0.0;
                }
                let (k, share) = (&ty.host_sync_kernels(SyncPath::Host), ty.host_share());
                let (bw, lat) = if m > 1 {
                    (ty.network_share(1), ty.network_latency_us)
                } else {
                    (intra_bw, ty.intra_node_latency_us)
                };
                let nic = ty.ring_nic_cpu_us(s / p as f64, m);
                match fabric {
                    Some((fbw, flat)) if m > 1 => {
                        host_ring(p, s, bw, lat.max(flat), k, share, nic).max(ring(p, s, fbw, lat.max(flat)))
                    }
                    _ => host_ring(p, s, bw, lat, k, share, nic),
                }
            }
            AllReduceAlgo::Ring => {
                if p <= 1 {
                    return 0.0;
                }
                if m > 1 {
                    across(p, s, ty.network_share(1), ty.network_latency_us)
                } else {
                    ring(p, s, intra_bw, ty.intra_node_latency_us)
                }
            }
            AllReduceAlgo::HalvingDoubling => {
                if p <= 1 {
                    return 0.0;
                }
                if !p.is_power_of_two() {
                    return self.allreduce_us(t, bytes, AllReduceAlgo::Ring);
                }
                let l = ty.per_node();
                // The engine runs on the host: every step's bytes cost the
                // TCP stack CPU, and each reduce-scatter step sums what it
                // received, on cores the node's ranks share.
                let (k, share) = (&ty.host_sync_kernels(SyncPath::Mpi).at_size(s / 4.0), ty.host_share());
                let mut total = 0.0;
                let (mut d, mut part) = (1u64, s / 2.0);
                while d < p {
                    let cpu = k.ring_step(part) * share * 1e6;
                    let step = if d < l {
                        (part / intra_bw).max(cpu) + ty.intra_node_latency_us
                    } else {
                        let lat = match fabric {
                            Some((_, flat)) => ty.network_latency_us.max(flat),
                            None => ty.network_latency_us,
                        };
                        let mut t = part / ty.network_share(l);
                        if let Some((fbw, _)) = fabric {
                            t = t.max(part * ty.count() as f64 / fbw);
                        }
                        // Open MPI's TCP transport moves the two large
                        // messages a pair exchanges one direction at a
                        // time (measured on the emulated nodes with one
                        // rank a node: twice the link's time for the bytes
                        // crossing each way, at 1 and at 10 Gbit/s;
                        // docs/validation.md). With one rank a node that
                        // pair is alone on the NIC; with more, the other
                        // pairs fill the idle direction.
                        let directions = if l == 1 { 2.0 } else { 1.0 };
                        directions * t.max(cpu + ty.nic_cpu_us(part)) + lat
                    };
                    // The reduce-scatter's step and the all-gather's mirror.
                    total += 2.0 * step + k.sum(part / 4.0) * share * 1e6;
                    d *= 2;
                    part /= 2.0;
                }
                total
            }
            AllReduceAlgo::Hierarchical => {
                let mut worst = 0.0f64;
                for &g in &ty.nodes {
                    let g = u64::from(g);
                    let inner = ring(g, s, intra_bw, ty.intra_node_latency_us);
                    let outer =
                        if m > 1 { across(m, s / g as f64, ty.network_share(g), ty.network_latency_us) } else { 0.0 };
                    worst = worst.max(inner + outer);
                }
                worst
            }
        }
    }
}

/// Ring all-reduce of `s` bytes among `p` members on a host transport: each
/// of the `2(p−1)` steps moves `s/p` bytes, lasting the longer of the link's
/// time and the CPU's (`k`'s TCP work on the bytes and one message, on cores
/// shared `share` ways, and `nic` µs of the NIC's work on them), plus a
/// latency; each of the `p−1` reduce-scatter steps then sums `s/4p`
/// elements. Without host costs in `k`, [`ring`].
fn host_ring(p: u64, s: f64, bw: f64, lat: f64, k: &crate::sync::SyncKernels, share: f64, nic: f64) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let (cpu, sum) = host_ring_step_cpu(p, s, k, share);
    let steps = (p - 1) as f64;
    2.0 * steps * ((s / p as f64 / bw).max(cpu + nic) + lat) + steps * sum
}

/// CPU µs of one step of a host ring of `p` members over `s` bytes (`k`'s
/// cost of an engine step on its `s/p` bytes, [`SyncKernels::ring_step`]),
/// and of the sum that follows a reduce-scatter step, on cores shared
/// `share` ways.
///
/// [`SyncKernels::ring_step`]: crate::sync::SyncKernels::ring_step
fn host_ring_step_cpu(p: u64, s: f64, k: &crate::sync::SyncKernels, share: f64) -> (f64, f64) {
    let part = s / p.max(1) as f64;
    let k = &k.at_size(s / 4.0);
    (k.ring_step(part) * share * 1e6, k.sum(part / 4.0) * share * 1e6)
}

/// All the CPU µs a host ring takes: its `2(p−1)` steps (each with `nic`
/// µs of the NIC's work) and `p−1` sums ([`host_ring`] without the link).
pub(crate) fn host_ring_cpu_us(p: u64, s: f64, k: &crate::sync::SyncKernels, share: f64, nic: f64) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let (cpu, sum) = host_ring_step_cpu(p, s, k, share);
    let steps = (p - 1) as f64;
    2.0 * steps * (cpu + nic) + steps * sum
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
        // 2 nodes × 4 GPUs, 100 GB/s = 1e5 B/µs inside, one NIC of 10 GB/s =
        // 1e4 B/µs per node, shared by its 4 GPUs. S = 8e6 B.
        // Inside: 2·3/4·8e6/1e5 = 120 µs + 6·5 = 150.
        // Across: 4 rings at once, each a 2e6 B shard at 1e4/4 = 2.5e3 B/µs,
        // M = 2: 2·1/2·2e6/2.5e3 = 800 µs + 2·20 = 840. Total 990.
        let c = Cluster::new(vec![DeviceType::new("a", 8, 4, 1)]);
        assert_eq!(c.allreduce_us(0, 8_000_000, AllReduceAlgo::Hierarchical), 990.0);
        // Flat ring of 8, crossing each node's NIC once at its full rate:
        // 2·7/8·8e6/1e4 = 1400 + 14·20 = 1680.
        assert_eq!(c.allreduce_us(0, 8_000_000, AllReduceAlgo::Ring), 1680.0);
    }

    #[test]
    fn a_host_engine_runs_one_ring_that_costs_its_cores() {
        // 2 nodes × 2 CPU ranks, one core a node (2 ranks share it), NIC
        // 1 GB/s = 1e3 B/µs, TCP 1 ns a byte, sum 1 ns an element; S = 4e6 B.
        // Flat ring of 4, 1e6 B a step: link 1000 µs, CPU 1e6·1e-9·2 s =
        // 2000 µs; 6 steps of 2000 + 20 = 12 120 µs, and 3 sums of 2.5e5
        // elements, 3·500 = 1500: 13 620 µs, whichever algorithm was asked.
        let k = crate::sync::SyncKernels { tcp_r: Some(1e-9), sum_r: Some(1e-9), ..Default::default() };
        let ty = DeviceType::new("cpu", 4, 2, 1).with_bandwidth(10.0, 1.0).with_host(k, 10.0).with_host_cores(Some(1));
        let host = Cluster::new(vec![ty.clone().with_compute_on_host(true)]);
        for algo in [AllReduceAlgo::Ring, AllReduceAlgo::Hierarchical] {
            let t = host.allreduce_us(0, 4_000_000, algo);
            assert!((t - 13_620.0).abs() < 1e-6, "{algo:?}: {t}");
        }
        // Its CPU work: TCP on 2·3/4·4e6 = 6e6 B and sums of 7.5e5
        // elements, twice: (6000 + 750)·2 = 13 500 µs.
        let fp32 = crate::sync::SyncSpec::default();
        assert!((host.sync_cpu_us(0, 4_000_000, &fp32) - 13_500.0).abs() < 1e-6);
        // A GPU's engine: the link alone, 2·3/4·4e6/1e3 = 6000 + 6·20, and
        // no CPU of the compute cores.
        let gpu = Cluster::new(vec![ty]);
        assert_eq!(gpu.allreduce_us(0, 4_000_000, AllReduceAlgo::Ring), 6120.0);
        assert_eq!(gpu.sync_cpu_us(0, 4_000_000, &fp32), 0.0);
    }

    #[test]
    fn the_engines_own_ring_is_priced_apart_from_the_hooks_transport() {
        // As above, but the engine's own all-reduce costs 0.25 ns a byte and
        // 100 µs a step, where the hooks' transport costs 1 ns a byte.
        // A step: CPU (1e6·0.25e-9 + 1e-4)·2 = 700 µs against the link's
        // 1000: 6·(1000 + 20) + 3 sums of 500 = 7620 µs; its CPU
        // 6·700 + 3·500 = 5700 µs.
        let k = crate::sync::SyncKernels {
            tcp_r: Some(1e-9),
            sum_r: Some(1e-9),
            ring_tcp_r: Some(0.25e-9),
            ring_step_s: Some(1e-4),
            ..Default::default()
        };
        let ty = DeviceType::new("cpu", 4, 2, 1).with_bandwidth(10.0, 1.0).with_host(k, 10.0).with_host_cores(Some(1));
        let host = Cluster::new(vec![ty.with_compute_on_host(true)]);
        let t = host.allreduce_us(0, 4_000_000, AllReduceAlgo::Ring);
        assert!((t - 7620.0).abs() < 1e-6, "{t}");
        let fp32 = crate::sync::SyncSpec::default();
        let cpu = host.sync_cpu_us(0, 4_000_000, &fp32);
        assert!((cpu - 5700.0).abs() < 1e-6, "{cpu}");
        // A compressed scheme's exchanges still pay the transport's 1 ns a
        // byte: fp16 moves 2·3/4·2e6 = 3e6 B a rank, 3e6·1e-9·2 = 6000 µs
        // of CPU besides its casts (free here: the default's are GPU rates,
        // replaced below by zero).
        let k16 = crate::sync::SyncKernels { cast16_r: 0.0, cast16_c: 0.0, ..k };
        let ty16 =
            DeviceType::new("cpu", 4, 2, 1).with_bandwidth(10.0, 1.0).with_host(k16, 10.0).with_host_cores(Some(1));
        let host16 = Cluster::new(vec![ty16.with_compute_on_host(true)]);
        let fp16 =
            crate::sync::SyncSpec::new(crate::sync::SyncScheme::Fp16, 512).with_path(crate::sync::SyncPath::Host);
        let b = host16.sync_breakdown(0, 4_000_000, &fp16);
        assert!((b.transport_cpu_us - 6000.0).abs() < 1e-6, "{}", b.transport_cpu_us);
    }

    #[test]
    fn the_node_nic_is_shared_by_its_gpus() {
        // 2 nodes × 8 GPUs, one 100 Gbit/s NIC (12.5 GB/s) per node, S = 64e6 B.
        // Inter-node part: 8 shards of 8e6 B at 12.5e3/8 = 1562.5 B/µs each:
        // 2·1/2·8e6/1562.5 = 5120 µs + 2·20 — the same 5120 µs as one device
        // sending all 64e6 B through the whole NIC (2·1/2·64e6/12.5e3).
        let one_nic = Cluster::new(vec![DeviceType::new("a", 16, 8, 1).with_bandwidth(600.0, 12.5)]);
        let inner = 2.0 * 7.0 / 8.0 * 64e6 / 600e3 + 14.0 * 5.0;
        let t = one_nic.allreduce_us(0, 64_000_000, AllReduceAlgo::Hierarchical);
        assert!((t - (inner + 5120.0 + 40.0)).abs() < 1e-6, "{t}");
        // DGX-style: 8 NICs of 400 Gbit/s = 400 GB/s per node, 50 GB/s a GPU:
        // 2·1/2·8e6/50e3 = 160 µs + 40.
        let dgx = Cluster::new(vec![DeviceType::new("a", 16, 8, 1).with_bandwidth(600.0, 400.0).with_nics(8)]);
        let t = dgx.allreduce_us(0, 64_000_000, AllReduceAlgo::Hierarchical);
        assert!((t - (inner + 160.0 + 40.0)).abs() < 1e-6, "{t}");
    }

    #[test]
    fn a_fabric_between_types_bounds_the_rings_that_cross_it() {
        // Two types of 1 node × 4 GPUs each, 10 GB/s NICs, joined by a
        // 1 GB/s = 1e3 B/µs fabric with 100 µs latency. S = 4e6 B.
        // Hierarchical, M = 2: NIC-bound 2·1/2·1e6/2.5e3 = 400 µs; the 4
        // concurrent rings move 2·1/2·4e6 B over the fabric: 4000 µs. Steps
        // take the larger latency: 2·100 = 200.
        let types = vec![DeviceType::new("a", 4, 4, 1), DeviceType::new("b", 4, 4, 1)];
        let c = Cluster::new(types.clone()).with_fabric(Some(Fabric { gb_per_s: 1.0, latency_us: 100.0 }));
        let inner = 2.0 * 3.0 / 4.0 * 4e6 / 1e5 + 6.0 * 5.0;
        assert_eq!(c.allreduce_us(0, 4_000_000, AllReduceAlgo::Hierarchical), inner + 4000.0 + 200.0);
        // Without the fabric only the NICs count.
        let c = Cluster::new(types);
        assert_eq!(c.allreduce_us(0, 4_000_000, AllReduceAlgo::Hierarchical), inner + 400.0 + 40.0);
    }

    #[test]
    fn halving_doubling_by_hand() {
        // 2 nodes × 2, 1e5 B/µs inside, a 1e3 B/µs NIC per node (500 each
        // when both devices cross), latencies 5 / 20 µs. S = 4e6 B.
        // Distance 1 (inside): 2e6 B / 1e5 = 20 + 5; distance 2 (across):
        // 1e6 B / 500 = 2000 + 20. Each twice (reduce-scatter, all-gather):
        // 2·(25 + 2020) = 4090 µs — half the ring's bytes across nodes
        // (with a host whose TCP stack and sums cost nothing: the bytes
        // alone; `host_work_shares_the_node_cores` prices the CPU side).
        let free = crate::sync::SyncKernels {
            sum_r: None,
            tcp_r: None,
            by_size: None,
            corun_by_size: None,
            pieces: None,
            ..crate::sync::SyncKernels::host()
        };
        let c = Cluster::new(vec![DeviceType::new("a", 4, 2, 1).with_bandwidth(100.0, 1.0).with_host(free, 10.0)]);
        assert_eq!(c.allreduce_us(0, 4_000_000, AllReduceAlgo::HalvingDoubling), 4090.0);
        // One device a node: its pair alone on the NIC, one direction at a
        // time. 2 nodes × 1: one step across, 2e6 B / 1e3 = 2000 µs, twice,
        // + 20; reduce-scatter and all-gather: 2·4020 = 8040 µs.
        let one = Cluster::new(vec![DeviceType::new("a", 2, 1, 1).with_bandwidth(100.0, 1.0).with_host(free, 10.0)]);
        assert_eq!(one.allreduce_us(0, 4_000_000, AllReduceAlgo::HalvingDoubling), 8040.0);
        // Three devices: the ring.
        let c3 = Cluster::new(vec![DeviceType::new("a", 3, 2, 1)]);
        assert_eq!(
            c3.allreduce_us(0, 4_000_000, AllReduceAlgo::HalvingDoubling),
            c3.allreduce_us(0, 4_000_000, AllReduceAlgo::Ring)
        );
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
        let n = Cluster::new(vec![DeviceType::new("a", 1, 8, 1).with_nics(0)]);
        assert!(matches!(n.validate(), Err(SimError::ZeroCount { .. })));
        let f = Cluster::new(vec![DeviceType::new("a", 1, 8, 1)])
            .with_fabric(Some(Fabric { gb_per_s: f64::NAN, latency_us: 1.0 }));
        assert!(matches!(f.validate(), Err(SimError::BadNumber { .. })));
    }
}
