//! `qsyncc simulate`: predicted iteration time and memory of a model on a
//! hybrid data-parallel cluster, from the cost model and the replayer.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use qsync_cost::{Plan, Precision};
use qsync_sim::{PredictOptions, Predictor, SimConfig, Target};
use serde::Serialize;

/// Arguments of `qsyncc simulate`.
#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    /// An ONNX model (.onnx) or qsync text IR (.qir); absent with `--gradient`.
    #[arg(required_unless_present = "gradient")]
    pub model: Option<PathBuf>,
    /// Predict one synchronization of a gradient of this size (`64MiB`,
    /// bytes of f32) on the cluster instead of a model's iteration: what
    /// `qsyncc sync-bench` measures.
    #[arg(long, value_parser = crate::syncbench::parse_size, conflicts_with = "model")]
    pub gradient: Option<usize>,
    /// Where compressed schemes run (`host`, `host-staged`, `device`;
    /// default: `host` on CPU devices, `host-staged` on GPUs).
    #[arg(long, value_parser = qsync_sim::SyncPath::parse)]
    pub sync_path: Option<qsync_sim::SyncPath>,
    /// The hosts' synchronization kernels, as `qsyncc host-kernels` measures
    /// them (default: the build machine's measurement).
    #[arg(long)]
    pub host_kernels: Option<PathBuf>,
    /// Device types and counts: `v100:16,t4:16` (a name alone is one device;
    /// `t4:16/4` puts 4 devices in each node; the default is up to 8 a node).
    #[arg(long, default_value = "", required_unless_present = "cluster")]
    pub targets: String,
    /// The cluster as a file (TOML: node groups with their GPUs, NICs and
    /// links; see `examples/clusters/`), instead of `--targets`.
    #[arg(long, conflicts_with = "targets")]
    pub cluster: Option<PathBuf>,
    /// Every node's NIC at this rate (`25gbit`, `800mbit`), overriding the
    /// device files and the cluster file.
    #[arg(long)]
    pub network: Option<String>,
    /// Samples per device per iteration (the global batch is this times the device count).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(i64).range(1..=crate::MAX_DIM))]
    pub batch: i64,
    /// Bind a named symbolic dimension: `--dim seq=128` (repeatable).
    #[arg(long = "dim", value_parser = crate::parse_dim_binding)]
    pub dims: Vec<(String, i64)>,
    /// Uniform precision of a device type: `t4=fp16` (repeatable; default fp32,
    /// or the precisions annotated in the model).
    #[arg(long, value_delimiter = ',')]
    pub precision: Vec<String>,
    /// Available memory of a device type: `t4=30%` or `t4=0.3` (repeatable).
    #[arg(long, value_delimiter = ',')]
    pub memory: Vec<String>,
    /// Optimizer whose state is kept: sgd, momentum or adam.
    #[arg(long, default_value = "adam")]
    pub optimizer: String,
    /// Gradient bucket size in MiB.
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// Extra device description files (JSON, the format of the bundled ones).
    #[arg(long = "device-file")]
    pub device_files: Vec<PathBuf>,
    /// A timing profile (JSON, what `qsyncc profile build` writes; see
    /// `qsync_cost::profile`): measured op times and cast samples override
    /// the analytic model on the device the profile names in its `device`
    /// field (repeatable, one per device type). The planner's `--profile`
    /// takes the same files.
    #[arg(long = "profile")]
    pub profiles: Vec<PathBuf>,
    /// Replaced by `--profile` (timing profiles); kept to say so.
    #[arg(long, hide = true)]
    pub calibration: Option<PathBuf>,
    /// Write a Chrome trace (opens in Perfetto) of the iteration.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Gradient synchronization the runtime runs (qsync-runtime's scheme
    /// names: fp32, fp16, bf16, qgz-int8, qgz-int4, qgz-int4-hier,
    /// qgz-int4-int8-hier, nbit-2, …, with -sr / -ef).
    #[arg(long, default_value = "fp32", value_parser = parse_sync)]
    pub sync: qsync_sim::SyncScheme,
    /// Elements per quantization group of `--sync`.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub sync_group: u32,
}

fn parse_sync(s: &str) -> std::result::Result<qsync_sim::SyncScheme, String> {
    qsync_sim::SyncScheme::parse(s)
}

pub(crate) use qsync_pipeline::input::parse_kv;
pub(crate) use qsync_pipeline::load::{prepare, Prepared};

#[derive(Serialize, Debug)]
struct DeviceJson {
    count: u64,
    local_batch: u32,
    precision: String,
    compute_ms: f64,
    comm_ms: f64,
    idle_ms: f64,
    peak_memory_bytes: u64,
    memory_capacity_bytes: Option<u64>,
    fits: bool,
    memory: qsync_cost::MemoryBreakdown,
}

#[derive(Serialize, Debug)]
struct SimJson {
    model: String,
    iteration_ms: f64,
    samples_per_s: f64,
    global_batch: u64,
    allreduce_bytes: u64,
    devices: BTreeMap<String, DeviceJson>,
    warnings: Vec<String>,
    /// The synchronization scheme, when not fp32.
    #[serde(skip_serializing_if = "Option::is_none")]
    sync: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sync_path: Option<&'static str>,
    /// The cluster as simulated: per type its nodes and their network.
    cluster: serde_json::Value,
}

/// Per device type, where a compressed scheme's predicted time goes, in
/// seconds (`null` for fp32, one engine call): what `sync-bench`'s measured
/// phases are set against (`scripts/validate/render_sync.py`).
fn breakdown(c: &qsync_sim::Cluster, bytes: u64, spec: &qsync_sim::SyncSpec) -> serde_json::Value {
    if spec.scheme == qsync_sim::SyncScheme::Fp32 {
        return serde_json::Value::Null;
    }
    let per_type = (0..c.types.len()).map(|t| {
        let b = c.sync_breakdown(t, bytes, spec);
        let v = serde_json::json!({
            "kernel_seconds": b.kernel_us / 1e6,
            "link_seconds": b.link_us / 1e6,
            "latency_seconds": b.latency_us / 1e6,
            "transport_cpu_seconds": b.transport_cpu_us / 1e6,
            "staging_seconds": b.staging_us / 1e6,
            // DDP's copies into the bucket and back, on the cores a CPU
            // device computes on (0 elsewhere): whatever the scheme; and
            // its work for each parameter tensor (a gradient alone does
            // not say how many tensors it holds).
            "bucket_copy_seconds": c.bucket_copy_us(t, bytes, 0) / 1e6,
            "bucket_tensor_seconds": (c.bucket_copy_us(t, bytes, 1) - c.bucket_copy_us(t, bytes, 0)) / 1e6,
            "pieces": b.pieces,
            "total_seconds": b.total_us / 1e6,
        });
        (c.types[t].name.clone(), v)
    });
    serde_json::Value::Object(per_type.collect())
}

/// `simulate --gradient`: one synchronization of `bytes` of f32 gradient
/// under `spec` on the cluster — the time of its slowest device type, as
/// `sync-bench` measures it (one buffer, no buckets).
fn sync_only(
    targets: &[Target],
    opts: &PredictOptions,
    spec: qsync_sim::SyncSpec,
    bytes: u64,
    cluster: serde_json::Value,
    json: bool,
) -> Result<String> {
    let c = qsync_sim::cluster_of(targets, opts)?;
    // fp32 is the engine's own all-reduce: over Open MPI, recursive halving
    // and doubling (what it runs for large messages); NCCL and gloo, rings.
    let algo = if spec.path == qsync_sim::SyncPath::Mpi {
        qsync_sim::AllReduceAlgo::HalvingDoubling
    } else {
        qsync_sim::AllReduceAlgo::Hierarchical
    };
    let per_type: Vec<(String, f64)> =
        (0..c.types.len()).map(|t| (c.types[t].name.clone(), c.sync_us(t, bytes, &spec, algo))).collect();
    let ring = c.sync_us(0, bytes, &spec, qsync_sim::AllReduceAlgo::Ring);
    let us = per_type.iter().fold(0.0f64, |a, (_, t)| a.max(*t));
    if json {
        let v = serde_json::json!({
            "scheme": spec.scheme.name(), "group": spec.group, "path": spec.path.name(), "bytes": bytes,
            "fp32_algorithm": format!("{algo:?}"),
            "devices": c.device_count(), "nodes": c.node_count(),
            "seconds": us / 1e6,
            "fp32_ring_seconds": if spec.scheme == qsync_sim::SyncScheme::Fp32 { Some(ring / 1e6) } else { None },
            "per_type_seconds": per_type.iter().map(|(n, t)| (n.clone(), serde_json::json!(t / 1e6))).collect::<serde_json::Map<_, _>>(),
            "per_type_breakdown": breakdown(&c, bytes, &spec),
            "cluster": cluster,
        });
        return Ok(serde_json::to_string_pretty(&v)? + "\n");
    }
    Ok(format!(
        "{} of {:.1} MiB on {} devices in {} nodes ({} path): {:.3} ms\n",
        spec.scheme.name(),
        bytes as f64 / (1u64 << 20) as f64,
        c.device_count(),
        c.node_count(),
        spec.path.name(),
        us / 1e3
    ))
}

pub(crate) use qsync_pipeline::cluster::ClusterSpec;

/// Where the cluster comes from: the `--targets` shorthand or a cluster
/// file, and the `--network` override of every node's NIC.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ClusterSource<'a> {
    pub targets: &'a str,
    pub cluster: Option<&'a std::path::Path>,
    pub network: Option<&'a str>,
}

/// Parse `--targets` (or `--cluster`), `--network` and `--memory` into
/// the pipeline's types and resolve the cluster with the `--device-file`s:
/// every target is a known device named once, every fraction names a
/// target.
pub(crate) fn parse_cluster(
    device_files: &[PathBuf],
    src: ClusterSource<'_>,
    memory: &[String],
) -> Result<ClusterSpec> {
    let input = qsync_pipeline::ClusterInput::from_flags(src.targets, src.cluster)?;
    let network = src.network.map(qsync_pipeline::parse_network).transpose()?;
    let memory = memory.iter().map(|m| m.parse()).collect::<Result<Vec<qsync_pipeline::MemoryLimit>, _>>()?;
    Ok(qsync_pipeline::cluster::resolve(device_files, &input, network, &memory)?)
}

/// The old `--calibration` flag, split in two: say which to use.
pub(crate) fn calibration_moved(path: &std::path::Path) -> anyhow::Error {
    anyhow::anyhow!(
        "--calibration {} : the flag was split in two: `--profile FILE` takes a timing profile (what `qsyncc profile \
         build` writes; simulate and the planner), `--stats FILE` the activation and gradient statistics \
         `scripts/calibrate.py` writes (the planner's indicator)",
        path.display()
    )
}

pub fn run(a: &SimulateArgs) -> Result<String> {
    if let Some(p) = &a.calibration {
        return Err(calibration_moved(p));
    }
    let src = ClusterSource { targets: &a.targets, cluster: a.cluster.as_deref(), network: a.network.as_deref() };
    let cluster = parse_cluster(&a.device_files, src, &a.memory)?;
    for n in &cluster.notes {
        eprintln!("note: {n}");
    }
    let mut precisions: BTreeMap<String, Precision> = BTreeMap::new();
    for s in &a.precision {
        let (k, v) = parse_kv("precision", s).map_err(anyhow::Error::msg)?;
        let k = cluster.target_key("precision", &k)?;
        let p: Precision = v.parse().map_err(|e| anyhow::anyhow!("--precision {s}: {e}"))?;
        let d = cluster.db.get(&k)?;
        if !d.supports(p) {
            let known: Vec<String> = d.supported_precisions.iter().map(|p| p.to_string()).collect();
            bail!("--precision {s}: device `{k}` does not support {p} (it supports {})", known.join(", "));
        }
        precisions.insert(k, p);
    }
    let calibrations = qsync_pipeline::cluster::load_profiles(&a.profiles, &cluster)?;
    let networks = cluster.networks.clone();
    let fabric = cluster.fabric;
    let described = cluster.describe();
    let ClusterSpec { db, specs, fractions, .. } = cluster;
    let optimizer = qsync_pipeline::parse_optimizer(&a.optimizer)?;
    if !(a.bucket_mb.is_finite() && a.bucket_mb > 0.0) {
        bail!("--bucket-mb must be positive");
    }

    let host_kernels = match &a.host_kernels {
        Some(p) => crate::hostkernels::load(p)?,
        None => qsync_sim::SyncKernels::host(),
    };
    let base_opts = PredictOptions { fabric, host_kernels, ..PredictOptions::default() };
    let mut plain_targets = Vec::new();
    for (name, count, per_node) in &specs {
        plain_targets.push(Target {
            device: db.get(name)?.clone(),
            count: *count,
            per_node: *per_node,
            local_batch: a.batch as u32,
            plan: Plan::new(),
            memory_fraction: fractions.get(name).copied(),
            calibration: calibrations.get(name).cloned(),
            network: networks.get(name).cloned(),
        });
    }
    let paths = qsync_sim::sync_paths(&plain_targets);
    let path = match a.sync_path {
        Some(p) if !qsync_sim::path_exists(&plain_targets, p) => bail!(
            "--sync-path {}: not a path these devices synchronize on (they have: {})",
            p.name(),
            paths.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
        ),
        Some(p) => p,
        None => paths[0],
    };
    let spec = qsync_sim::SyncSpec::new(a.sync, a.sync_group).with_path(path);
    if let Some(bytes) = a.gradient {
        return sync_only(&plain_targets, &base_opts, spec, bytes as u64, described, a.json);
    }
    let Some(model) = a.model.as_deref() else { bail!("simulate needs a model, or --gradient SIZE") };
    let Prepared { mut loaded, batch, bindings, mut warnings } = prepare(model, a.batch, &a.dims)?;
    // QDQ pairs around an op are its INT8 / FP8 compute: cost them inside
    // the op, as the plan that wrote them did.
    qsync_passes::precision::materialize::unmaterialize_qdq(&mut loaded.model.graph);
    let g = &loaded.model.graph;
    // A planned model carries its plan: a node computes at its precision
    // annotation or, once exported to ONNX (where annotations do not
    // travel), at the dtype of its first float output — the rule
    // `opt --json` and `inspect` predict by. Casts keep the default.
    let mut annotated = Plan::new();
    for n in g.node_ids() {
        if g.node(n).op == qsync_ir::Op::Cast {
            continue;
        }
        let computes = qsync_passes::precision::oracle::compute_precision(g, n);
        if let Some(p) = Precision::from_dtype(computes).filter(|&p| p != Precision::Fp32) {
            annotated.set(n, p);
        }
    }
    let planned = annotated.iter().next().is_some();
    let mut targets = Vec::new();
    for (name, count, per_node) in &specs {
        let device = db.get(name)?.clone();
        let plan = match precisions.get(name) {
            Some(&p) => Plan::uniform(g, p),
            None => annotated.clone(),
        };
        targets.push(Target {
            device,
            count: *count,
            per_node: *per_node,
            local_batch: batch as u32,
            plan,
            memory_fraction: fractions.get(name).copied(),
            calibration: calibrations.get(name).cloned(),
            network: networks.get(name).cloned(),
        });
    }
    let popts = PredictOptions {
        bindings,
        work_scale: 1.0,
        optimizer,
        config: SimConfig {
            bucket_cap_bytes: (a.bucket_mb * (1u64 << 20) as f64) as u64,
            sync: spec,
            ..SimConfig::default()
        },
        // `simulate` costs the plan's nodes as given; refreshed copies the
        // graph already holds are counted, no others assumed.
        weight_copies: false,
        reference_batch: None,
        ..base_opts
    };
    let label = model.display().to_string();
    let mut pred = Predictor::new(g, targets, popts).with_context(|| label.clone())?;
    if let Some(path) = &a.trace {
        std::fs::write(path, pred.chrome_trace_json()).with_context(|| format!("writing {}", path.display()))?;
    }
    let r = pred.result().clone();
    let mut devices = BTreeMap::new();
    for (i, d) in r.devices.iter().enumerate() {
        let precision = precisions.get(&d.name).map_or_else(
            || {
                if planned {
                    "planned".to_string()
                } else {
                    "fp32".to_string()
                }
            },
            |p| p.to_string(),
        );
        if !d.fits {
            warnings.push(format!(
                "{}: the plan does not fit: {:.2} GiB needed, {:.2} GiB available",
                d.name,
                d.peak_memory_bytes as f64 / (1u64 << 30) as f64,
                d.memory_capacity_bytes.unwrap_or(0) as f64 / (1u64 << 30) as f64
            ));
        }
        devices.insert(
            d.name.clone(),
            DeviceJson {
                count: d.count,
                local_batch: batch as u32,
                precision,
                compute_ms: d.compute_us / 1e3,
                comm_ms: d.comm_us / 1e3,
                idle_ms: d.idle_us / 1e3,
                peak_memory_bytes: d.peak_memory_bytes,
                memory_capacity_bytes: d.memory_capacity_bytes,
                fits: d.fits,
                memory: pred.memory(i).copied().unwrap_or_default(),
            },
        );
    }
    let out = SimJson {
        model: label,
        iteration_ms: r.iteration_us / 1e3,
        samples_per_s: r.samples_per_s,
        global_batch: r.global_batch,
        allreduce_bytes: r.allreduce_bytes,
        devices,
        warnings,
        sync: (a.sync != qsync_sim::SyncScheme::Fp32).then(|| a.sync.name()),
        sync_path: (a.sync != qsync_sim::SyncScheme::Fp32).then(|| path.name()),
        cluster: described,
    };
    if a.json {
        return Ok(serde_json::to_string_pretty(&out)? + "\n");
    }
    let mut o = String::new();
    let _ = writeln!(o, "model        {}", out.model);
    let _ = writeln!(
        o,
        "iteration    {:.3} ms  ({:.1} samples/s, global batch {})",
        out.iteration_ms, out.samples_per_s, out.global_batch
    );
    let _ = writeln!(o, "all-reduce   {:.1} MiB of gradients", out.allreduce_bytes as f64 / (1u64 << 20) as f64);
    if let Some(s) = &out.sync {
        let _ = writeln!(o, "sync         {s} (group {})", a.sync_group);
    }
    let _ = writeln!(
        o,
        "{:<12} {:>5} {:>9} {:>12} {:>10} {:>10} {:>12} {:>12}",
        "device", "count", "precision", "compute ms", "comm ms", "idle ms", "memory GiB", "capacity GiB"
    );
    for (name, d) in &out.devices {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let _ = writeln!(
            o,
            "{name:<12} {:>5} {:>9} {:>12.3} {:>10.3} {:>10.3} {:>12.2} {:>12.2}{}",
            d.count,
            d.precision,
            d.compute_ms,
            d.comm_ms,
            d.idle_ms,
            gib(d.peak_memory_bytes),
            gib(d.memory_capacity_bytes.unwrap_or(0)),
            if d.fits { "" } else { "  DOES NOT FIT" }
        );
    }
    for w in &out.warnings {
        let _ = writeln!(o, "warning: {w}");
    }
    Ok(o)
}
