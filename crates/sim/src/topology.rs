//! Cluster files: the cluster as users describe it — groups of nodes, each
//! with its GPU type, GPUs and NICs per node, the NICs' bandwidth and
//! latency, the link inside the node — and the fabric between groups that
//! sit on different networks.
//!
//! ```toml
//! [[group]]
//! gpu = "a100"           # a device of the table (or a --device-file)
//! nodes = 2
//! gpus_per_node = 8
//! nics_per_node = 1      # shared by the node's GPUs
//! nic_gbit_s = 100       # each NIC, Gbit/s
//! nic_latency_us = 15    # one step across nodes
//! intra_node_gb_s = 300  # per GPU and direction (default: the device file's)
//! intra_node_latency_us = 3
//! host_cores_per_node = 64  # CPU cores the node's ranks share (host paths)
//! nic_cpu_ns_per_byte = 0   # host CPU per byte the NICs move (default 0)
//! [group.sources]        # where each figure comes from, or the assumption
//! nic_gbit_s = "..."
//!
//! [fabric]               # only when groups sit on different networks
//! gbit_s = 25
//! latency_us = 100
//! ```
//!
//! A group's figures default, where left out, to its device file (one NIC of
//! `network_gbit_s`, the `intra_node` link) and to the simulator's latencies
//! (20 µs across nodes, 5 µs inside). [`ClusterFile::with_network`] is the
//! `--network 25gbit` override of every group's NIC.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Default latency of one step across nodes, µs.
pub const NIC_LATENCY_US: f64 = 20.0;
/// Default latency of one step inside a node, µs.
pub const INTRA_NODE_LATENCY_US: f64 = 5.0;
/// Nodes in one group at most (a guard against hostile files).
pub const MAX_NODES: u32 = 1 << 16;
/// GPUs or NICs in one node at most.
pub const MAX_PER_NODE: u32 = 64;

/// Why a cluster file was refused; every message names the file and, where
/// there is one, the group and field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct ClusterFileError {
    pub file: String,
    pub reason: String,
}

/// The network of one node of a device type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeNetwork {
    pub nics_per_node: u32,
    /// Each NIC's bandwidth, Gbit/s.
    pub nic_gbit_s: f64,
    pub nic_latency_us: f64,
    /// Per GPU and direction, GB/s (`None`: the device file's).
    pub intra_node_gb_s: Option<f64>,
    pub intra_node_latency_us: f64,
    /// CPU cores the node's ranks share for host-side synchronization work
    /// (kernels, the TCP stack), and, on a device that is the host's own
    /// cores, for computing ([`crate::Target::compute_share`]); `None`: a
    /// core per rank at least.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cores: Option<u32>,
    /// CPU time, ns, the node's cores spend on each byte its NICs send or
    /// receive, beyond what the host transport's own measured cost
    /// (`--host-kernels`' `tcp_r`) already holds: 0 for a NIC that
    /// segments and paces in hardware; more where the network's work lands
    /// on the host's cores (a software-shaped link, an emulated node).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nic_cpu_ns_per_byte: f64,
}

/// `skip_serializing_if` for figures whose default is 0.
pub(crate) fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl NodeNetwork {
    /// One NIC of `nic_gbit_s`, default latencies, the device's own link
    /// inside the node: what a `--targets` entry means.
    pub fn single_nic(nic_gbit_s: f64) -> NodeNetwork {
        NodeNetwork {
            nics_per_node: 1,
            nic_gbit_s,
            nic_latency_us: NIC_LATENCY_US,
            intra_node_gb_s: None,
            intra_node_latency_us: INTRA_NODE_LATENCY_US,
            host_cores: None,
            nic_cpu_ns_per_byte: 0.0,
        }
    }

    /// The node's network to other nodes, GB/s (all NICs).
    pub fn node_gb_per_s(&self) -> f64 {
        f64::from(self.nics_per_node) * self.nic_gbit_s / 8.0
    }
}

/// One group of identical nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    pub gpu: String,
    pub nodes: u32,
    pub gpus_per_node: u32,
    #[serde(default)]
    pub nics_per_node: Option<u32>,
    #[serde(default)]
    pub nic_gbit_s: Option<f64>,
    #[serde(default)]
    pub nic_latency_us: Option<f64>,
    /// Informational: `nvlink`, `pcie`, `nvswitch`…
    #[serde(default)]
    pub intra_node: Option<String>,
    #[serde(default)]
    pub intra_node_gb_s: Option<f64>,
    #[serde(default)]
    pub intra_node_latency_us: Option<f64>,
    /// CPU cores of a node shared by its ranks' host-side work.
    #[serde(default)]
    pub host_cores_per_node: Option<u32>,
    /// Host CPU ns per byte the node's NICs move ([`NodeNetwork::nic_cpu_ns_per_byte`]).
    #[serde(default)]
    pub nic_cpu_ns_per_byte: Option<f64>,
    /// Field name → where the figure comes from.
    #[serde(default)]
    pub sources: BTreeMap<String, String>,
}

impl Group {
    /// The node network, figures left out taken from `device_nic_gbit_s`
    /// (the device file's network) and the default latencies.
    pub fn network(&self, device_nic_gbit_s: f64) -> NodeNetwork {
        NodeNetwork {
            nics_per_node: self.nics_per_node.unwrap_or(1),
            nic_gbit_s: self.nic_gbit_s.unwrap_or(device_nic_gbit_s),
            nic_latency_us: self.nic_latency_us.unwrap_or(NIC_LATENCY_US),
            intra_node_gb_s: self.intra_node_gb_s,
            intra_node_latency_us: self.intra_node_latency_us.unwrap_or(INTRA_NODE_LATENCY_US),
            host_cores: self.host_cores_per_node,
            nic_cpu_ns_per_byte: self.nic_cpu_ns_per_byte.unwrap_or(0.0),
        }
    }

    /// GPUs in the group.
    pub fn count(&self) -> u32 {
        self.nodes.saturating_mul(self.gpus_per_node)
    }

    /// The figures given, by field name (what needs a source).
    fn figures(&self) -> Vec<(&'static str, f64)> {
        let mut v = Vec::new();
        let mut put = |k, x: Option<f64>| {
            if let Some(x) = x {
                v.push((k, x));
            }
        };
        put("nic_gbit_s", self.nic_gbit_s);
        put("nic_latency_us", self.nic_latency_us);
        put("intra_node_gb_s", self.intra_node_gb_s);
        put("intra_node_latency_us", self.intra_node_latency_us);
        put("host_cores_per_node", self.host_cores_per_node.map(f64::from));
        put("nic_cpu_ns_per_byte", self.nic_cpu_ns_per_byte);
        v
    }
}

/// The link between groups on different networks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricSpec {
    pub gbit_s: f64,
    #[serde(default)]
    pub latency_us: Option<f64>,
    /// Where the figures come from.
    #[serde(default)]
    pub source: Option<String>,
}

impl FabricSpec {
    pub fn fabric(&self) -> crate::Fabric {
        crate::Fabric { gb_per_s: self.gbit_s / 8.0, latency_us: self.latency_us.unwrap_or(NIC_LATENCY_US) }
    }
}

/// A parsed, checked cluster file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(rename = "group")]
    pub groups: Vec<Group>,
    #[serde(default)]
    pub fabric: Option<FabricSpec>,
}

impl ClusterFile {
    /// Read and check `path`.
    pub fn load(path: &Path) -> Result<ClusterFile, ClusterFileError> {
        let file = path.display().to_string();
        let err = |reason: String| ClusterFileError { file: file.clone(), reason };
        let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
        if meta.len() > 1 << 20 {
            return Err(err(format!("{} bytes: a cluster file is at most 1 MiB", meta.len())));
        }
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        ClusterFile::parse(&text).map_err(err)
    }

    /// Parse and check TOML text; the error is the reason alone.
    pub fn parse(text: &str) -> Result<ClusterFile, String> {
        let c: ClusterFile = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), String> {
        if self.groups.is_empty() {
            return Err("no [[group]]: a cluster has at least one group of nodes".into());
        }
        for (i, g) in self.groups.iter().enumerate() {
            let at = format!("group {} (`{}`)", i + 1, g.gpu);
            if g.gpu.trim().is_empty() {
                return Err(format!("group {}: `gpu` is empty", i + 1));
            }
            if self.groups[..i].iter().any(|o| o.gpu.eq_ignore_ascii_case(&g.gpu)) {
                return Err(format!("{at}: a second group of the same GPU; merge them (one plan per GPU type)"));
            }
            if g.nodes == 0 || g.nodes > MAX_NODES {
                return Err(format!("{at}: nodes = {} (1 to {MAX_NODES})", g.nodes));
            }
            for (k, v) in [("gpus_per_node", Some(g.gpus_per_node)), ("nics_per_node", g.nics_per_node)] {
                if let Some(v) = v {
                    if v == 0 || v > MAX_PER_NODE {
                        return Err(format!("{at}: {k} = {v} (1 to {MAX_PER_NODE})"));
                    }
                }
            }
            for (k, v) in g.figures() {
                let positive = !(k.ends_with("latency_us") || k == "nic_cpu_ns_per_byte");
                if !v.is_finite() || v < 0.0 || (positive && v == 0.0) || v > 1e9 {
                    return Err(format!(
                        "{at}: {k} = {v} is not a {} number",
                        if positive { "positive" } else { "non-negative" }
                    ));
                }
            }
        }
        if let Some(f) = &self.fabric {
            if !(f.gbit_s.is_finite() && f.gbit_s > 0.0 && f.gbit_s <= 1e9) {
                return Err(format!("[fabric]: gbit_s = {} is not a positive number", f.gbit_s));
            }
            if let Some(l) = f.latency_us {
                if !(l.is_finite() && l >= 0.0) {
                    return Err(format!("[fabric]: latency_us = {l} is not a non-negative number"));
                }
            }
            if self.groups.len() < 2 {
                return Err("[fabric] joins groups, but the file has one group".into());
            }
        }
        Ok(())
    }

    /// Figures given without a `sources` entry (bundled files have none).
    pub fn unsourced(&self) -> Vec<String> {
        let mut v = Vec::new();
        for g in &self.groups {
            for (k, _) in g.figures() {
                if !g.sources.contains_key(k) {
                    v.push(format!("{}.{k}", g.gpu));
                }
            }
        }
        if let Some(f) = &self.fabric {
            if f.source.is_none() {
                v.push("fabric".into());
            }
        }
        v
    }

    /// Every group's NICs at `gbit_s` (`--network 25gbit`).
    pub fn with_network(mut self, gbit_s: f64) -> ClusterFile {
        for g in &mut self.groups {
            g.nic_gbit_s = Some(gbit_s);
            g.sources.insert("nic_gbit_s".into(), "--network".into());
        }
        self
    }
}

/// Parses a link rate as people write it: `25gbit`, `400Gbit/s`, `800mbit`,
/// `10g`; a bare number is Gbit/s.
pub fn parse_rate_gbit(s: &str) -> Result<f64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix("/s").or_else(|| t.strip_suffix("ps")).unwrap_or(&t);
    let (num, scale) = if let Some(n) =
        t.strip_suffix("gbit").or_else(|| t.strip_suffix("gb")).or_else(|| t.strip_suffix('g'))
    {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix("mbit").or_else(|| t.strip_suffix("mb")).or_else(|| t.strip_suffix('m')) {
        (n, 1e-3)
    } else {
        (t, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("`{s}` is not a link rate (25gbit, 800mbit)"))?;
    let v = v * scale;
    if !(v.is_finite() && v > 0.0 && v <= 1e6) {
        return Err(format!("`{s}`: a link rate must be positive (and at most 1 Pbit/s)"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_groups_defaults_and_a_fabric() {
        let c = ClusterFile::parse(
            r#"
            name = "mixed"
            [[group]]
            gpu = "a100"
            nodes = 2
            gpus_per_node = 8
            nic_gbit_s = 100
            [group.sources]
            nic_gbit_s = "assumption"
            [[group]]
            gpu = "t4"
            nodes = 4
            gpus_per_node = 4
            nics_per_node = 2
            host_cores_per_node = 16
            [group.sources]
            host_cores_per_node = "assumption"
            [fabric]
            gbit_s = 10
            "#,
        )
        .expect("parses");
        assert_eq!(c.groups.len(), 2);
        assert_eq!(c.groups[0].count(), 16);
        let n = c.groups[1].network(50.0);
        // Two NICs of the device file's 50 Gbit/s: 100 Gbit/s = 12.5 GB/s.
        assert_eq!(n.node_gb_per_s(), 12.5);
        assert_eq!(n.nic_latency_us, NIC_LATENCY_US);
        assert_eq!((c.groups[0].network(50.0).host_cores, n.host_cores), (None, Some(16)));
        assert!(ClusterFile::parse("[[group]]\ngpu = \"t4\"\nnodes = 1\ngpus_per_node = 4\nhost_cores_per_node = 0\n")
            .is_err_and(|e| e.contains("host_cores_per_node")));
        // The NIC's work on the host's cores: 0 unless given, 0 allowed,
        // negative refused.
        assert_eq!(n.nic_cpu_ns_per_byte, 0.0);
        let g = "[[group]]\ngpu = \"cpu\"\nnodes = 2\ngpus_per_node = 1\nnic_cpu_ns_per_byte = ";
        for (v, want) in [("0", Some(0.0)), ("1.75", Some(1.75)), ("-1", None)] {
            let got = ClusterFile::parse(&format!("{g}{v}\n")).map(|c| c.groups[0].network(1.0).nic_cpu_ns_per_byte);
            match want {
                Some(w) => assert_eq!(got, Ok(w)),
                None => assert!(got.is_err_and(|e| e.contains("nic_cpu_ns_per_byte"))),
            }
        }
        assert_eq!(c.fabric.as_ref().map(|f| f.fabric().gb_per_s), Some(1.25));
        assert_eq!(c.unsourced(), vec!["fabric".to_string()]);
        let o = c.with_network(25.0);
        assert!(o.groups.iter().all(|g| g.nic_gbit_s == Some(25.0)));
    }

    #[test]
    fn refuses_what_is_wrong_naming_the_group() {
        let bad = |t: &str, want: &str| {
            let e = ClusterFile::parse(t).expect_err(t);
            assert!(e.contains(want), "{e} lacks {want}");
        };
        bad("", "group");
        bad("[[group]]\ngpu = \"t4\"\nnodes = 0\ngpus_per_node = 4\n", "nodes = 0");
        bad("[[group]]\ngpu = \"t4\"\nnodes = 1\ngpus_per_node = 4\nnic_gbit_s = -1\n", "group 1 (`t4`): nic_gbit_s");
        bad("[[group]]\ngpu = \"t4\"\nnodes = 1\ngpus_per_node = 4\nnics = 2\n", "unknown field");
        bad("[[group]]\ngpu = \"t4\"\nnodes = 1\ngpus_per_node = 4\n[fabric]\ngbit_s = 1\n", "one group");
        bad("[[group]]\ngpu = \"t4\"\nnodes = 1\ngpus_per_node = 4\n[[group]]\ngpu = \"T4\"\nnodes = 1\ngpus_per_node = 1\n", "same GPU");
        bad("[[group]]\ngpu = \"t4\"\nnodes = 1\ngpus_per_node = 100000\n", "gpus_per_node");
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate_gbit("25gbit"), Ok(25.0));
        assert_eq!(parse_rate_gbit("400Gbit/s"), Ok(400.0));
        assert_eq!(parse_rate_gbit("800mbit"), Ok(0.8));
        assert_eq!(parse_rate_gbit("10"), Ok(10.0));
        assert!(parse_rate_gbit("fast").is_err());
        assert!(parse_rate_gbit("0gbit").is_err());
        assert!(parse_rate_gbit("nan").is_err());
    }
}
