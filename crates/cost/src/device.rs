//! The device database: one JSON file per GPU in `crates/cost/devices/`,
//! compiled in with `include_str!`, plus files loaded at run time
//! (`--device-file PATH`). Every file is validated on load and every figure
//! must cite its source in the file's `sources` table.
//!
//! Units: TFLOPS (10¹² operations/s, dense, no sparsity), GB/s (10⁹ bytes/s),
//! Gbit/s for the network, µs for the launch overhead, bytes for memory.
//! Interconnect figures are stored as the datasheets quote them
//! (bidirectional aggregate); [`Device::intra_node_bytes_per_s`] gives the
//! per-direction rate a ring all-reduce sees.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{CostError, Precision, Result};

/// Kind of intra-node link.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    Nvlink,
    Pcie,
}

/// The link between GPUs of one node.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntraNode {
    pub kind: LinkKind,
    /// Aggregate bidirectional bandwidth as the datasheet quotes it.
    pub bandwidth_gb_s: f64,
}

/// Fractions of peak that real kernels reach (calibrated, not datasheet).
///
/// Calibrated against published NVIDIA ResNet-50 training throughput at batch
/// 32 (tests/real_models.rs prints them). V100: cuDNN FP32 convolutions reach
/// ~90% of peak (Winograd cuts work on 3×3 layers), HBM2 streams ~85%, FP16
/// Tensor Core convs ~60%. T4: the 70 W cap holds clocks well under boost
/// under sustained load, so Tensor Cores reach ~30%, GDDR6 ~60%. Other
/// devices keep the defaults (0.6 / 0.75 / 0.8) until profiled.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Conv/GEMM on Tensor Cores.
    pub tensor_core: f64,
    /// Conv/GEMM and arithmetic on CUDA cores.
    pub cuda_core: f64,
    /// DRAM bandwidth reached by memory-bound kernels.
    pub memory: f64,
}

/// How GEMM-like kernels fill the device: the wave model of small work
/// (`model::wave_factor`). A GEMM's output is cut into tiles of
/// `tile_outputs` elements; when its reduction dimension K is long, split-K
/// cuts each tile's K into slices of at least `split_k_min`; the device runs
/// `sm_count · tiles_per_sm` such blocks at once (one wave). A kernel takes
/// whole waves: with fewer blocks than one wave its time is that of a full
/// wave (flat below one wave), and it steps up by one wave at a time.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Occupancy {
    /// Streaming multiprocessors (cores, for a CPU).
    pub sm_count: u32,
    /// GEMM tiles resident on one SM at once.
    pub tiles_per_sm: u32,
    /// Output elements of one GEMM tile (128 × 128 = 16384).
    pub tile_outputs: u32,
    /// The shortest slice of K one split-K block reduces.
    pub split_k_min: u32,
}

/// One GPU model.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Short name used on the command line (`v100`, `t4`).
    pub name: String,
    pub full_name: String,
    /// Compute capability as `sm_XX` (`cpu` for a host processor described
    /// as a device).
    pub arch: String,
    pub memory_bytes: u64,
    pub memory_bandwidth_gb_s: f64,
    pub cuda_core_tflops: BTreeMap<Precision, f64>,
    #[serde(default)]
    pub tensor_core_tflops: BTreeMap<Precision, f64>,
    /// GEMM dimensions must be multiples of this for Tensor Cores.
    #[serde(default)]
    pub tensor_core_alignment: BTreeMap<Precision, u32>,
    pub supported_precisions: Vec<Precision>,
    pub intra_node: IntraNode,
    pub network_gbit_s: f64,
    pub launch_overhead_us: f64,
    /// The framework's host time per view operator that computes nothing
    /// (Reshape, Flatten, Squeeze, Unsqueeze, Expand of a tensor; not shape
    /// arithmetic), per pass: charged once to its forward and once to its
    /// backward. 0 when absent: on a GPU this host time overlaps the
    /// kernels of the ops before it (a device file that measured it on a
    /// starved GPU may carry it); on a CPU it is the dispatch itself.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub view_op_us: f64,
    /// Sharded training's fixed costs on this device (FSDP2 over NCCL),
    /// when measured: the host time of one unit's hooks per collective it
    /// takes part in, and one collective's launch, µs. Absent: the
    /// simulator's documented defaults (`qsync_sim::shard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsdp_unit_host_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective_launch_us: Option<f64>,
    /// Memory the framework reserves outside the model (context, workspaces).
    pub workspace_bytes: u64,
    pub efficiency: Efficiency,
    /// Fraction of memory available to training by default (1.0 if absent).
    #[serde(default)]
    pub available_memory_fraction: Option<f64>,
    /// The wave model of small work (absent: GEMM-like kernels keep their
    /// rate at any size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupancy: Option<Occupancy>,
    /// Citation per figure: `memory_bytes`, `cuda_core_tflops.fp16`, …
    pub sources: BTreeMap<String, String>,
    #[serde(skip)]
    tables: Tables,
}

/// Dense per-precision tables filled by validation, for fast lookups.
#[derive(Clone, PartialEq, Debug, Default)]
struct Tables {
    cuda: [f64; 7],
    tc: [f64; 7],
    align: [u32; 7],
    supported: [bool; 7],
}

const BUNDLED: [(&str, &str); 10] = [
    ("v100.json", include_str!("../devices/v100.json")),
    ("t4.json", include_str!("../devices/t4.json")),
    ("a10.json", include_str!("../devices/a10.json")),
    ("a100-40gb.json", include_str!("../devices/a100-40gb.json")),
    ("a100-80gb.json", include_str!("../devices/a100-80gb.json")),
    ("h100-sxm.json", include_str!("../devices/h100-sxm.json")),
    ("h200.json", include_str!("../devices/h200.json")),
    ("l4.json", include_str!("../devices/l4.json")),
    ("rtx2080ti.json", include_str!("../devices/rtx2080ti.json")),
    ("rtx4090.json", include_str!("../devices/rtx4090.json")),
];

impl Device {
    /// Parse and validate one device file; `file` names it in errors.
    pub fn from_json(text: &str, file: &str) -> Result<Device> {
        let mut d: Device = serde_json::from_str(text)
            .map_err(|e| CostError::DeviceParse { file: file.to_string(), message: e.to_string() })?;
        d.validate(file)?;
        Ok(d)
    }

    /// Check every field and fill the lookup tables.
    pub fn validate(&mut self, file: &str) -> Result<()> {
        let bad = |field: &str, message: String| CostError::DeviceField {
            file: file.to_string(),
            field: field.to_string(),
            message,
        };
        if self.name.is_empty()
            || !self.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        {
            return Err(bad(
                "name",
                format!("`{}` must be non-empty lowercase ASCII letters, digits, `-` or `_`", self.name),
            ));
        }
        // `cpu`: a host processor described as a device, to check the cost
        // model against measurements without a GPU (simulated only: no code
        // is generated for it).
        let arch_ok = self.arch == "cpu"
            || self.arch.strip_prefix("sm_").is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if !arch_ok {
            return Err(bad("arch", format!("`{}` is not of the form sm_XX (or `cpu`)", self.arch)));
        }
        let positive = |field: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(bad(field, format!("must be a positive finite number, got {v}")))
            }
        };
        if self.memory_bytes == 0 {
            return Err(bad("memory_bytes", "must be positive".into()));
        }
        positive("memory_bandwidth_gb_s", self.memory_bandwidth_gb_s)?;
        positive("intra_node.bandwidth_gb_s", self.intra_node.bandwidth_gb_s)?;
        positive("network_gbit_s", self.network_gbit_s)?;
        positive("launch_overhead_us", self.launch_overhead_us)?;
        if !(self.view_op_us.is_finite() && self.view_op_us >= 0.0) {
            return Err(bad("view_op_us", format!("must be a non-negative finite number, got {}", self.view_op_us)));
        }
        for (f, v) in
            [("fsdp_unit_host_us", self.fsdp_unit_host_us), ("collective_launch_us", self.collective_launch_us)]
        {
            if let Some(v) = v {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(bad(f, format!("must be a non-negative finite number, got {v}")));
                }
            }
        }
        let e = &self.efficiency;
        for (f, v) in [
            ("efficiency.tensor_core", e.tensor_core),
            ("efficiency.cuda_core", e.cuda_core),
            ("efficiency.memory", e.memory),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 1.0) {
                return Err(bad(f, format!("must be in (0, 1], got {v}")));
            }
        }
        if let Some(f) = self.available_memory_fraction {
            if !(f.is_finite() && f > 0.0 && f <= 1.0) {
                return Err(bad("available_memory_fraction", format!("must be in (0, 1], got {f}")));
            }
        }
        if let Some(o) = &self.occupancy {
            for (f, v) in [
                ("occupancy.sm_count", o.sm_count),
                ("occupancy.tiles_per_sm", o.tiles_per_sm),
                ("occupancy.tile_outputs", o.tile_outputs),
                ("occupancy.split_k_min", o.split_k_min),
            ] {
                if v == 0 {
                    return Err(bad(f, "must be positive".into()));
                }
            }
        }
        let mut t = Tables::default();
        for &p in &self.supported_precisions {
            t.supported[p.index()] = true;
        }
        if !t.supported[Precision::Fp32.index()] {
            return Err(bad("supported_precisions", "must include fp32".into()));
        }
        if !self.cuda_core_tflops.contains_key(&Precision::Fp32) {
            return Err(bad("cuda_core_tflops", "must give an fp32 rate".into()));
        }
        for (&p, &v) in &self.cuda_core_tflops {
            positive(&format!("cuda_core_tflops.{p}"), v)?;
            t.cuda[p.index()] = v * 1e12;
        }
        for (&p, &v) in &self.tensor_core_tflops {
            let field = format!("tensor_core_tflops.{p}");
            positive(&field, v)?;
            if !t.supported[p.index()] {
                return Err(bad(&field, format!("{p} has a Tensor Core rate but is not in supported_precisions")));
            }
            let a = self.tensor_core_alignment.get(&p).copied().unwrap_or(0);
            if a == 0 {
                return Err(bad(
                    &format!("tensor_core_alignment.{p}"),
                    "missing or zero for a precision with Tensor Cores".into(),
                ));
            }
            t.tc[p.index()] = v * 1e12;
            t.align[p.index()] = a;
        }
        for &p in &self.supported_precisions {
            if t.cuda[p.index()] == 0.0 && t.tc[p.index()] == 0.0 {
                return Err(bad(
                    "supported_precisions",
                    format!("{p} is supported but has no CUDA-core or Tensor Core rate"),
                ));
            }
        }
        let mut needed: Vec<String> = [
            "arch",
            "memory_bytes",
            "memory_bandwidth_gb_s",
            "intra_node",
            "network_gbit_s",
            "launch_overhead_us",
            "efficiency",
            "workspace_bytes",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        needed.extend(self.cuda_core_tflops.keys().map(|p| format!("cuda_core_tflops.{p}")));
        needed.extend(self.tensor_core_tflops.keys().map(|p| format!("tensor_core_tflops.{p}")));
        if !self.tensor_core_tflops.is_empty() {
            needed.push("tensor_core_alignment".into());
        }
        if self.view_op_us > 0.0 {
            needed.push("view_op_us".into());
        }
        for (f, v) in
            [("fsdp_unit_host_us", self.fsdp_unit_host_us), ("collective_launch_us", self.collective_launch_us)]
        {
            if v.is_some_and(|v| v > 0.0) {
                needed.push(f.into());
            }
        }
        if self.occupancy.is_some() {
            needed.push("occupancy.sm_count".into());
            needed.push("occupancy.tiles".into());
        }
        for k in needed {
            if self.sources.get(&k).is_none_or(|s| s.trim().is_empty()) {
                return Err(bad(&format!("sources.{k}"), "every figure must cite its source".into()));
            }
        }
        self.tables = t;
        Ok(())
    }

    /// Whether the device can compute in `p` at all.
    pub fn supports(&self, p: Precision) -> bool {
        self.tables.supported[p.index()]
    }

    /// Error unless the device supports `p`.
    pub fn require(&self, p: Precision) -> Result<()> {
        if self.supports(p) {
            Ok(())
        } else {
            Err(CostError::UnsupportedPrecision { device: self.name.clone(), precision: p })
        }
    }

    /// Peak CUDA-core rate in operations/s (0 when not listed).
    pub fn cuda_peak(&self, p: Precision) -> f64 {
        self.tables.cuda[p.index()]
    }

    /// Peak Tensor Core rate in operations/s (0 when the device has none for `p`).
    pub fn tensor_peak(&self, p: Precision) -> f64 {
        self.tables.tc[p.index()]
    }

    /// Tensor Core alignment for `p` (0 when no Tensor Cores for `p`).
    pub fn alignment(&self, p: Precision) -> u32 {
        self.tables.align[p.index()]
    }

    /// DRAM bandwidth in bytes/s.
    pub fn mem_bytes_per_s(&self) -> f64 {
        self.memory_bandwidth_gb_s * 1e9
    }

    /// Per-direction intra-node bandwidth in bytes/s.
    pub fn intra_node_bytes_per_s(&self) -> f64 {
        self.intra_node.bandwidth_gb_s * 1e9 / 2.0
    }

    /// Network bandwidth in bytes/s.
    pub fn network_bytes_per_s(&self) -> f64 {
        self.network_gbit_s * 1e9 / 8.0
    }

    /// Kernel launch overhead in seconds.
    pub fn launch_s(&self) -> f64 {
        self.launch_overhead_us * 1e-6
    }

    /// Host seconds of one view operator per pass (`view_op_us`).
    pub fn view_op_s(&self) -> f64 {
        self.view_op_us * 1e-6
    }

    /// Default available-memory fraction.
    pub fn default_memory_fraction(&self) -> f64 {
        self.available_memory_fraction.unwrap_or(1.0)
    }
}

/// Devices by name.
#[derive(Clone, Debug, Default)]
pub struct DeviceDb {
    devices: BTreeMap<String, Device>,
}

impl DeviceDb {
    /// The bundled devices. The files are tested, so failure here means a
    /// broken build; it is still an error, not a panic.
    pub fn bundled() -> Result<DeviceDb> {
        let mut db = DeviceDb::default();
        for (file, text) in BUNDLED {
            db.insert(Device::from_json(text, &format!("devices/{file}"))?);
        }
        Ok(db)
    }

    /// The names and texts of the bundled device files.
    pub fn bundled_files() -> &'static [(&'static str, &'static str)] {
        &BUNDLED
    }

    /// Load a device file (`--device-file`); a device of the same name is replaced.
    pub fn load_file(&mut self, path: impl AsRef<Path>) -> Result<&Device> {
        let path = path.as_ref();
        let text =
            std::fs::read_to_string(path).map_err(|source| CostError::Io { path: path.to_path_buf(), source })?;
        let d = Device::from_json(&text, &path.display().to_string())?;
        let name = d.name.clone();
        self.insert(d);
        self.get(&name)
    }

    pub fn insert(&mut self, d: Device) {
        self.devices.insert(d.name.clone(), d);
    }

    /// The device called `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Result<&Device> {
        let key = name.trim().to_ascii_lowercase();
        self.devices
            .get(&key)
            .ok_or_else(|| CostError::UnknownDevice { name: name.to_string(), known: self.names().join(", ") })
    }

    pub fn names(&self) -> Vec<String> {
        self.devices.keys().cloned().collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Device> {
        self.devices.values()
    }
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}
