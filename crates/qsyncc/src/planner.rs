//! `qsyncc MODEL --targets v100:16,t4:16 -o plan/`: the plan command's
//! flags, turned into the typed request of the plan pipeline
//! (`qsync-pipeline`, re-exported here), and what it prints.
//!
//! The pipeline itself — the phases, the manifest and the plan directory
//! it writes — is the crate `qsync-pipeline`; this module parses strings
//! and prints. Code generation (`--emit mlir,ptx`, the `codegen`
//! feature) is handed to [`Planned::write_with`] as a
//! [`qsync_pipeline::CodeEmitter`] ([`crate::codegen::PlanCode`]).
//!
//! ```no_run
//! use qsyncc::planner::{plan, PlanRequest};
//!
//! let mut req = PlanRequest::new("examples/squeezenet1_1.onnx", "v100:16,t4:16".parse::<qsyncc::planner::Targets>()?);
//! req.batch = 32;
//! let planned = plan(&req)?;
//! println!("{}: {:.1} samples/s", planned.outcome.chosen, planned.outcome.chosen_eval.samples_per_s);
//! planned.write(std::path::Path::new("plan"))?;
//! # Ok::<(), qsyncc::planner::PipelineError>(())
//! ```

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use serde_json::json;

pub use qsync_pipeline::{
    plan, ClusterInput, DevicePlan, Emit, Error as PipelineError, PlanRequest, Planned, Targets, SCHEMA,
};

#[derive(Parser, Debug)]
#[command(
    name = "qsyncc plan",
    about = "Plan per-device mixed precision and batch split for a hybrid cluster: qsyncc MODEL --targets v100:16,t4:16 -o plan/"
)]
pub struct PlanArgs {
    /// An ONNX model (.onnx), TorchScript archive (.pt) or text IR (.qir).
    pub model: PathBuf,
    /// Device types and counts: `v100:16,t4:16` (`t4:16/4`: 4 per node).
    /// Names are those of the device table (`crates/cost/devices`) or a
    /// short form: `a100` is taken as `a100-40gb`, `h100` as `h100-sxm`
    /// (a note on stderr says so).
    #[arg(long, default_value = "", required_unless_present = "cluster")]
    pub targets: String,
    /// The cluster as a file (TOML: node groups with their GPU, GPUs and
    /// NICs per node, NIC rate and latency, the link inside the node, and
    /// the fabric between groups; see `examples/clusters/`), instead of
    /// `--targets`.
    #[arg(long, conflicts_with = "targets")]
    pub cluster: Option<PathBuf>,
    /// Every node's NIC at this rate (`25gbit`, `800mbit`), overriding the
    /// device files and the cluster file.
    #[arg(long)]
    pub network: Option<String>,
    /// Output directory, written atomically: the plan is built in a hidden
    /// sibling and renamed into place when complete. An existing plan
    /// directory is replaced whole; any other non-empty directory is
    /// refused.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Samples per device per iteration before the split (the global batch
    /// is this times the device count, and is kept).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(i64).range(1..=crate::MAX_DIM))]
    pub batch: i64,
    /// Bind a named symbolic dimension: `--dim seq=128` (repeatable).
    #[arg(long = "dim", value_parser = crate::parse_dim_binding)]
    pub dims: Vec<(String, i64)>,
    /// Available memory of a device type: `t4=30%` (repeatable).
    #[arg(long, value_delimiter = ',')]
    pub memory: Vec<String>,
    /// Precisions inference devices may use: fp32, tf32, fp16, bf16, int8,
    /// fp8e4m3, fp8e5m2 (also spelt f32, f16, i8, f8e4m3, fp8, …).
    #[arg(long, default_value = "fp32,fp16,int8")]
    pub precisions: String,
    /// Passes run on each device's graph after materialization.
    #[arg(long, default_value = "egraph-casts")]
    pub pipeline: String,
    /// Activation and gradient statistics for the indicator (JSON, see
    /// `qsync_planner::Calibration`; `scripts/calibrate.py` writes one).
    /// Without it they are estimated from shapes.
    #[arg(long)]
    pub stats: Option<PathBuf>,
    /// A timing profile (JSON, what `qsyncc profile build` writes; the
    /// format of `qsyncc simulate --profile`): measured op times replace
    /// the analytic model's on the device the profile names (repeatable,
    /// one per device type).
    #[arg(long = "profile")]
    pub profiles: Vec<PathBuf>,
    /// Replaced by `--stats` and `--profile`; kept to say so.
    #[arg(long, hide = true)]
    pub calibration: Option<PathBuf>,
    /// The throughput floor: `best` (max of UP and DBS, computed in the same
    /// run — the plan is never predicted slower than either), `fastest`
    /// (UP) or `lowest` (the paper's T_min: the lowest uniform precision
    /// that fits).
    #[arg(long = "t-min", default_value = "best", value_parser = ["best", "fastest", "lowest"])]
    pub t_min: String,
    /// `joint` (batch split and precision searched together; the best plan
    /// of every method is chosen), `qsync` (QSync's allocator at the
    /// uniform batch, as published) or `up` (QSync's UP baseline itself:
    /// every inference type at the lowest uniform precision level that fits;
    /// `methods` reports it as `up-lowest` where the fastest level, `up`, is
    /// another plan).
    #[arg(long, default_value = "joint", value_parser = ["joint", "qsync", "up"])]
    pub method: String,
    /// `indicator`: the least indicator sum at the throughput floor;
    /// `throughput`: the fastest plan whose indicator sum stays within
    /// `--indicator-bound` (default: UP's).
    #[arg(long, default_value = "indicator", value_parser = ["indicator", "throughput"])]
    pub objective: String,
    /// The largest indicator sum `--objective throughput` accepts.
    #[arg(long)]
    pub indicator_bound: Option<f64>,
    /// What the training device type computes in: `auto` (default; also
    /// `amp`): mixed precision in BF16 where the device has it, else FP16;
    /// `fp32`; `fp16`, `bf16`; `fp8` (GEMMs in FP8 E4M3, H100/L4). A single
    /// device type is always a training cluster.
    #[arg(long, default_value = "auto")]
    pub train_precision: String,
    /// Optimizer whose state is kept: sgd, momentum or adam.
    #[arg(long, default_value = "adam")]
    pub optimizer: String,
    /// Extra device description files.
    #[arg(long = "device-file")]
    pub device_files: Vec<PathBuf>,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    pub json: bool,
    /// What each `<device>/` directory gets: `onnx` (always written), and
    /// `mlir` / `ptx` for the device's `model.mlir` and `kernels.ptx`.
    #[arg(long, default_value = "onnx", value_delimiter = ',')]
    pub emit: Vec<String>,
    /// Gradient synchronization the runtime runs: `fp32`, a scheme
    /// (`fp16`, `bf16`, `qgz-int8`, `qgz-int4`, `qgz-int8-hier`,
    /// `qgz-int4-hier`, `nbit-1|2|4|8`, with `-sr` / `-ef`), or `auto` (the
    /// fastest within `--sync-error-budget`; fp32 when compression does not
    /// pay). Recorded in the manifest's `sync`.
    #[arg(long, default_value = "fp32")]
    pub sync: String,
    /// Relative gradient error `--sync auto` may accept.
    #[arg(long, default_value_t = 0.01)]
    pub sync_error_budget: f64,
    /// Elements per quantization group of the quantized schemes.
    #[arg(long, default_value_t = 512)]
    pub sync_group: u32,
    /// Where compressed schemes run: `host-staged` (CUDA buckets copied to
    /// the host, host kernels — the Python hook's default), `device` (the
    /// hook's `kernels="device"`), `host` (CPU devices). Default: the
    /// cluster's own; `--sync auto` then compares every path it has.
    #[arg(long, value_parser = qsync_sim::SyncPath::parse)]
    pub sync_path: Option<qsync_sim::SyncPath>,
    /// The hosts' synchronization kernels, as `qsyncc host-kernels` measures
    /// them (default: the build machine's measurement).
    #[arg(long)]
    pub host_kernels: Option<PathBuf>,
    /// Precisions the sharded plan's collectives may use: `fp` (16-bit
    /// all-gathers at the AMP type, FP32 reduce-scatters), `auto` (also
    /// qwZ, bf16, qgz-int8, qgz-int4 within `--sync-error-budget`), or a
    /// comma list of those four. The fastest is chosen; the fp pair wins
    /// ties.
    #[arg(long, default_value = "fp")]
    pub shard_collectives: String,
}

impl PlanArgs {
    /// The library request these flags describe. Errors are the
    /// pipeline's: [`PipelineError::Cluster`] for the targets, cluster
    /// file, network and memory limits, [`PipelineError::Request`] for the
    /// other flags.
    pub fn request(&self) -> Result<PlanRequest, PipelineError> {
        use PipelineError::Request;
        if let Some(p) = &self.calibration {
            return Err(Request(format!("{:#}", crate::simulate::calibration_moved(p))));
        }
        let emit = Emit::parse_list(&self.emit)?;
        if let Some(code) = emit.first() {
            crate::codegen::require(&format!("`plan --emit {}`", code.name()))
                .map_err(|e| Request(format!("{e:#}")))?;
        }
        // Flags are checked before any work: a bad pipeline fails at once.
        let pipeline = self.pipeline.parse()?;
        let cluster = ClusterInput::from_flags(&self.targets, self.cluster.as_deref())?;
        let network = self.network.as_deref().map(qsync_pipeline::parse_network).transpose()?;
        let memory = self.memory.iter().map(|m| m.parse()).collect::<Result<Vec<_>, _>>()?;
        let precisions = qsync_pipeline::parse_precisions(&self.precisions)?;
        if let Some(b) = self.indicator_bound {
            if !(b.is_finite() && b >= 0.0) {
                return Err(Request(format!("--indicator-bound must be a finite number ≥ 0, got {b}")));
            }
        }
        fn flag(name: &'static str) -> impl Fn(String) -> PipelineError {
            move |e| PipelineError::Request(format!("--{name}: {e}"))
        }
        Ok(PlanRequest {
            model: self.model.clone(),
            cluster,
            network,
            batch: self.batch,
            dims: self.dims.clone(),
            memory,
            precisions,
            pipeline,
            stats: self.stats.clone(),
            profiles: self.profiles.clone(),
            t_min: self.t_min.parse().map_err(flag("t-min"))?,
            method: self.method.parse().map_err(flag("method"))?,
            objective: self.objective.parse().map_err(flag("objective"))?,
            indicator_bound: self.indicator_bound,
            train_precision: self.train_precision.parse().map_err(flag("train-precision"))?,
            optimizer: qsync_pipeline::parse_optimizer(&self.optimizer)?,
            device_files: self.device_files.clone(),
            emit,
            sync: self.sync.parse()?,
            sync_error_budget: self.sync_error_budget,
            sync_path: self.sync_path,
            host_kernels: self
                .host_kernels
                .as_deref()
                .map(crate::hostkernels::load)
                .transpose()
                .map_err(|e| Request(format!("{e:#}")))?,
            sync_group: self.sync_group,
            shard_collectives: self.shard_collectives.parse()?,
            progress: true,
        })
    }
}

/// Run the planner from CLI flags; returns what goes to stdout.
pub fn run(a: &PlanArgs) -> Result<String> {
    let req = a.request()?;
    let start = std::time::Instant::now();
    let planned = plan(&req)?;
    for n in &planned.notes {
        eprintln!("note: {n}");
    }
    eprintln!("[{:>6.2}s] writing {}", start.elapsed().as_secs_f64(), a.output.display());
    planned.write_with(&a.output, Some(&crate::codegen::PlanCode))?;
    eprintln!("[{:>6.2}s] done", start.elapsed().as_secs_f64());
    if a.json {
        let mut summary = planned.summary.clone();
        summary["output"] = json!(a.output.display().to_string());
        return Ok(serde_json::to_string_pretty(&summary)? + "\n");
    }
    let out = &planned.outcome;
    let mut o = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(o, "{}\n", crate::report::verdict(out));
    let _ = writeln!(o, "{}\n", crate::report::explanation(out));
    let _ = writeln!(o, "{}", crate::report::table(out));
    let _ = writeln!(o, "chosen: {} — wrote {}", out.chosen, a.output.display());
    for w in &planned.warnings {
        let _ = writeln!(o, "warning: {w}");
    }
    Ok(o)
}
