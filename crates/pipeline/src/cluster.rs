//! The cluster a plan (or a simulation) runs on: the device database, the
//! device types with their counts, nodes and networks, the memory limits
//! and the timing profiles, resolved and checked against one another.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::{bail, Context};
use qsync_cost::{DeviceDb, Profile};

use crate::error::{Error, Result};
use crate::input::{ClusterInput, MemoryLimit};

/// The cluster: the device database (bundled plus `--device-file`s), the
/// device types as `(name, count, per node)`, and the memory fractions by
/// device name.
#[derive(Debug)]
pub struct ClusterSpec {
    pub db: DeviceDb,
    pub specs: Vec<(String, u32, u32)>,
    pub fractions: BTreeMap<String, f64>,
    /// Which device each alias (`a100`) was taken as, for stderr.
    pub notes: Vec<String>,
    /// Per device type, its nodes' network (from the cluster file or
    /// `--network`; absent: the device file's one NIC).
    pub networks: BTreeMap<String, qsync_sim::topology::NodeNetwork>,
    /// The link between groups (`[fabric]` of a cluster file).
    pub fabric: Option<qsync_sim::Fabric>,
}

impl ClusterSpec {
    /// Each device type's node network, resolved against its device file.
    pub fn network_of(&self, name: &str) -> Option<qsync_sim::topology::NodeNetwork> {
        self.networks.get(name).cloned()
    }

    /// The cluster as planned, for manifests and `--json`: per type its
    /// nodes, GPUs and NICs per node, NIC rate and latency, the link
    /// inside the node, the host's cores and the NIC's work on them where
    /// given; and the fabric.
    pub fn describe(&self) -> serde_json::Value {
        let groups: Vec<serde_json::Value> = self
            .specs
            .iter()
            .map(|(name, count, per_node)| {
                let d = self.db.get(name).ok();
                let net = self.network_of(name).unwrap_or_else(|| {
                    qsync_sim::topology::NodeNetwork::single_nic(d.map_or(0.0, |d| d.network_gbit_s))
                });
                let intra = net.intra_node_gb_s.or(d.map(|d| d.intra_node_bytes_per_s() / 1e9));
                let mut g = serde_json::json!({
                    "device": name,
                    "count": count,
                    "gpus_per_node": per_node,
                    "nodes": count.div_ceil((*per_node).max(1)),
                    "nics_per_node": net.nics_per_node,
                    "nic_gbit_s": net.nic_gbit_s,
                    "nic_latency_us": net.nic_latency_us,
                    "intra_node_gb_s": intra,
                    "intra_node_latency_us": net.intra_node_latency_us,
                });
                // The host's figures, where the cluster file gave them.
                if let Some(c) = net.host_cores {
                    g["host_cores_per_node"] = c.into();
                }
                if net.nic_cpu_ns_per_byte > 0.0 {
                    g["nic_cpu_ns_per_byte"] = net.nic_cpu_ns_per_byte.into();
                }
                g
            })
            .collect();
        serde_json::json!({
            "groups": groups,
            "fabric": self.fabric.map(|f| serde_json::json!({ "gb_s": f.gb_per_s, "latency_us": f.latency_us })),
        })
    }

    /// The table name of a device named in a `--memory` / `--precision`
    /// key, aliases resolved; it must be among the targets.
    pub fn target_key(&self, flag: &str, key: &str) -> anyhow::Result<String> {
        let (name, _) = crate::devices::resolve(key, |n| self.db.get(n).is_ok());
        if !self.specs.iter().any(|(n, _, _)| *n == name) {
            bail!("--{flag} names `{key}`, which is not among --targets");
        }
        Ok(name)
    }
}

/// Resolve the cluster: every target a known device (aliases resolved)
/// named once, the network override applied, every memory limit naming a
/// target. Errors are [`Error::Cluster`].
pub fn resolve(
    device_files: &[PathBuf],
    input: &ClusterInput,
    network: Option<f64>,
    memory: &[MemoryLimit],
) -> Result<ClusterSpec> {
    resolve_inner(device_files, input, network, memory).map_err(Error::cluster)
}

fn resolve_inner(
    device_files: &[PathBuf],
    input: &ClusterInput,
    network: Option<f64>,
    memory: &[MemoryLimit],
) -> anyhow::Result<ClusterSpec> {
    let mut db = DeviceDb::bundled()?;
    for f in device_files {
        db.load_file(f)?;
    }
    let mut networks = BTreeMap::new();
    let mut fabric = None;
    let from_file = matches!(input, ClusterInput::File { .. });
    let mut specs: Vec<(String, u32, u32)> = match input {
        ClusterInput::File { path, file } => {
            let mut file = file.clone();
            if let Some(gbit) = network {
                file = file.with_network(gbit);
            }
            fabric = file.fabric.as_ref().map(|f| f.fabric());
            let mut specs = Vec::new();
            for (i, g) in file.groups.iter().enumerate() {
                let (name, note) = crate::devices::resolve(&g.gpu, |n| db.get(n).is_ok());
                let device = db
                    .get(&name)
                    .with_context(|| format!("--cluster {}: group {} names GPU `{}`", path.display(), i + 1, g.gpu))?;
                let count = g.nodes.checked_mul(g.gpus_per_node).with_context(|| {
                    format!("--cluster {}: group {} has more GPUs than can be counted", path.display(), i + 1)
                })?;
                networks.insert(name.clone(), g.network(device.network_gbit_s));
                if let Some(n) = note {
                    eprintln!("note: {n}");
                }
                specs.push((name, count, g.gpus_per_node));
            }
            specs
        }
        ClusterInput::Targets(t) => t.0.iter().map(|t| (t.device.clone(), t.count, t.per_node)).collect(),
    };
    let mut seen = BTreeSet::new();
    let mut notes = Vec::new();
    for (name, _, _) in &mut specs {
        let (resolved, note) = crate::devices::resolve(name, |n| db.get(n).is_ok());
        db.get(&resolved).with_context(|| "--targets".to_string())?;
        notes.extend(note);
        *name = resolved;
        if !seen.insert(name.clone()) {
            bail!("the cluster names `{name}` twice");
        }
        if let (Some(gbit), false) = (network, from_file) {
            networks.insert(name.clone(), qsync_sim::topology::NodeNetwork::single_nic(gbit));
        }
    }
    let mut cluster = ClusterSpec { db, specs, fractions: BTreeMap::new(), notes, networks, fabric };
    for m in memory {
        let k = cluster.target_key("memory", &m.device)?;
        cluster.fractions.insert(k, m.fraction);
    }
    Ok(cluster)
}

/// `--profile` files: timing profiles (`qsyncc profile build`), at most one
/// per device type, each naming a device among the targets. Errors are
/// [`Error::Request`].
pub fn load_profiles(files: &[PathBuf], cluster: &ClusterSpec) -> Result<BTreeMap<String, Profile>> {
    load_profiles_inner(files, cluster).map_err(|e| Error::Request(format!("{e:#}")))
}

fn load_profiles_inner(files: &[PathBuf], cluster: &ClusterSpec) -> anyhow::Result<BTreeMap<String, Profile>> {
    let mut out: BTreeMap<String, Profile> = BTreeMap::new();
    for f in files {
        let profile = Profile::load_file(f).map_err(|e| {
            anyhow::anyhow!("--profile {}: {e} (a timing profile, as `qsyncc profile build` writes)", f.display())
        })?;
        let Some(device) = profile.device.clone() else {
            bail!("profile `{}` does not name its device (add \"device\": \"NAME\")", f.display());
        };
        let name = cluster
            .target_key("profile", &device)
            .with_context(|| format!("profile `{}` is for device `{device}`", f.display()))?;
        if out.insert(name.clone(), profile).is_some() {
            bail!("two profiles for device `{name}`");
        }
    }
    Ok(out)
}
