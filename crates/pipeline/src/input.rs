//! The pipeline's inputs, typed. Each parses from the CLI's spelling with
//! the CLI's error message, so that `qsyncc` only turns flags into these.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use qsync_cost::{Optimizer, Precision};
use qsync_planner::{Method, Objective, TMin, TrainPrecision};
use qsync_sim::topology::ClusterFile;
use qsync_sim::{CollectiveChoices, SyncKernels, SyncPath, SyncScheme};

use crate::error::{Error, Result};

/// The largest batch and dimension value: 2^24. Beyond it FLOP and byte
/// counts of the shared models leave the range the cost model counts
/// exactly in (i64 FLOPs of a VGG-16 layer at 2^24 samples are about 2^59).
pub const MAX_DIM: i64 = 1 << 24;

/// One device type of `--targets`: `t4:16/4` is 16 T4s, 4 per node. The
/// name is checked against the device table (and its aliases resolved)
/// when the cluster is resolved, where `--device-file`s are known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    /// Lower case, as typed (`a100` before it is taken as `a100-40gb`).
    pub device: String,
    pub count: u32,
    /// Devices per node (default: the count, up to 8).
    pub per_node: u32,
}

impl FromStr for TargetSpec {
    type Err = Error;

    /// `name[:count[/per_node]]`.
    fn from_str(s: &str) -> Result<TargetSpec> {
        let s = s.trim();
        let bad = |m: String| Error::Cluster(m);
        let (name, rest) = s.split_once(':').unwrap_or((s, "1"));
        let (count, per_node) = match rest.split_once('/') {
            Some((c, p)) => (c, Some(p)),
            None => (rest, None),
        };
        let count: u32 =
            count.trim().parse().map_err(|e| bad(format!("target `{s}`: `{count}` is not a device count: {e}")))?;
        if count == 0 {
            return Err(bad(format!("target `{s}`: the device count must be at least 1")));
        }
        let per_node = match per_node {
            Some(p) => p
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| bad(format!("target `{s}`: bad devices per node `{p}`")))?,
            None => count.min(8),
        };
        if name.trim().is_empty() {
            return Err(bad(format!("target `{s}` has no device name")));
        }
        Ok(TargetSpec { device: name.trim().to_ascii_lowercase(), count, per_node })
    }
}

/// `--targets`: device types and counts, `v100:16,t4:16`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Targets(pub Vec<TargetSpec>);

impl FromStr for Targets {
    type Err = Error;

    fn from_str(s: &str) -> Result<Targets> {
        s.split(',').map(str::parse).collect::<Result<_>>().map(Targets)
    }
}

/// The cluster: the `--targets` shorthand, or a cluster file
/// (`qsync_sim::topology::ClusterFile`) with the path it was read from.
#[derive(Clone, Debug)]
pub enum ClusterInput {
    Targets(Targets),
    File { path: PathBuf, file: ClusterFile },
}

impl ClusterInput {
    /// Read a cluster file.
    pub fn load(path: &Path) -> Result<ClusterInput> {
        let file = ClusterFile::load(path).map_err(|e| Error::Cluster(format!("--cluster {e}")))?;
        Ok(ClusterInput::File { path: path.to_path_buf(), file })
    }

    /// The cluster of `--targets STR` or `--cluster FILE`, exactly one of
    /// which must be given (`targets` empty: not given).
    pub fn from_flags(targets: &str, cluster: Option<&Path>) -> Result<ClusterInput> {
        match cluster {
            Some(_) if !targets.trim().is_empty() => {
                Err(Error::Cluster("--targets and --cluster both describe the cluster: give one".into()))
            }
            Some(path) => ClusterInput::load(path),
            None if targets.trim().is_empty() => {
                Err(Error::Cluster("no cluster: give --targets (v100:16,t4:16) or --cluster FILE".into()))
            }
            None => Ok(ClusterInput::Targets(targets.parse()?)),
        }
    }
}

impl From<Targets> for ClusterInput {
    fn from(t: Targets) -> ClusterInput {
        ClusterInput::Targets(t)
    }
}

/// `--network`: every node's NIC at this rate (`25gbit`), in Gbit/s.
pub fn parse_network(s: &str) -> Result<f64> {
    qsync_sim::topology::parse_rate_gbit(s).map_err(|e| Error::Cluster(format!("--network {e}")))
}

/// `--memory t4=30%`: the share of a device type's memory the plan may use.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryLimit {
    /// Lower case, as typed; resolved against the targets with the cluster.
    pub device: String,
    /// In (0, 1].
    pub fraction: f64,
}

impl FromStr for MemoryLimit {
    type Err = Error;

    fn from_str(s: &str) -> Result<MemoryLimit> {
        let (device, v) = parse_kv("memory", s).map_err(Error::Cluster)?;
        let fraction = parse_fraction(v).map_err(Error::Cluster)?;
        Ok(MemoryLimit { device, fraction })
    }
}

/// `DEVICE=VALUE` of `--memory` / `--precision`: the device lower-cased.
pub fn parse_kv<'a>(flag: &str, s: &'a str) -> std::result::Result<(String, &'a str), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("--{flag} `{s}` is not DEVICE=VALUE"))?;
    Ok((k.trim().to_ascii_lowercase(), v.trim()))
}

/// `30%` or `0.3`, in (0, 1].
fn parse_fraction(s: &str) -> std::result::Result<f64, String> {
    let f = match s.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|x| x / 100.0),
        None => s.parse::<f64>(),
    }
    .map_err(|e| format!("`{s}` is not a fraction (30% or 0.3): {e}"))?;
    if !(f > 0.0 && f <= 1.0) {
        return Err(format!("memory fraction `{s}` must be in (0, 100%]"));
    }
    Ok(f)
}

/// `--optimizer`: sgd, momentum or adam (also sgd-momentum, adamw).
pub fn parse_optimizer(s: &str) -> Result<Optimizer> {
    Ok(match s {
        "sgd" => Optimizer::Sgd { momentum: false },
        "momentum" | "sgd-momentum" => Optimizer::Sgd { momentum: true },
        "adam" | "adamw" => Optimizer::Adam,
        o => return Err(Error::Request(format!("unknown optimizer `{o}` (sgd, momentum, adam)"))),
    })
}

/// `--precisions fp32,fp16,int8`: the precisions inference devices may use.
pub fn parse_precisions(s: &str) -> Result<Vec<Precision>> {
    s.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<Precision>().map_err(|e| Error::Request(format!("--precisions: {e}"))))
        .collect()
}

/// `--sync`: the gradient synchronization every prediction assumes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SyncChoice {
    /// This scheme (`fp32`: the engine's own all-reduce).
    Given(SyncScheme),
    /// The fastest scheme within the error budget; fp32 when none is
    /// predicted faster.
    Auto,
}

impl FromStr for SyncChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<SyncChoice> {
        if s == "auto" {
            return Ok(SyncChoice::Auto);
        }
        SyncScheme::parse(s).map(SyncChoice::Given).map_err(|e| Error::Request(format!("--sync: {e}")))
    }
}

/// `--pipeline`: the passes run on each device's graph after
/// materialization, checked to name known passes with valid options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassPipeline(String);

impl PassPipeline {
    /// The spec as given (`egraph-casts`, `dce,egraph-casts(refresh=false)`).
    pub fn spec(&self) -> &str {
        &self.0
    }

    /// A fresh pass manager for one device's graph.
    pub fn manager(&self) -> Result<qsync_passes::PassManager> {
        qsync_passes::pipeline_from_spec(&self.0).map_err(|e| Error::Request(format!("--pipeline: {e:#}")))
    }

    /// Whether the pipeline stores FP16/BF16 GEMM weights as refreshed
    /// copies (`egraph-casts` unless told not to): the predictions then
    /// count their rewrite in the optimizer step.
    pub fn weight_copies(&self) -> bool {
        self.0.contains("egraph-casts") && !self.0.contains("refresh=false")
    }
}

impl FromStr for PassPipeline {
    type Err = Error;

    fn from_str(s: &str) -> Result<PassPipeline> {
        let p = PassPipeline(s.to_string());
        p.manager()?;
        Ok(p)
    }
}

impl Default for PassPipeline {
    fn default() -> PassPipeline {
        PassPipeline("egraph-casts".into())
    }
}

/// What each device directory gets besides its `model.onnx`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emit {
    /// `model.mlir`.
    Mlir,
    /// `kernels.ptx`.
    Ptx,
}

impl Emit {
    pub fn name(self) -> &'static str {
        match self {
            Emit::Mlir => "mlir",
            Emit::Ptx => "ptx",
        }
    }

    /// Its file in the device's directory.
    pub fn file(self) -> &'static str {
        match self {
            Emit::Mlir => "model.mlir",
            Emit::Ptx => "kernels.ptx",
        }
    }

    /// `--emit onnx,mlir,ptx`: `onnx` is always written and so dropped.
    pub fn parse_list<S: AsRef<str>>(kinds: &[S]) -> Result<Vec<Emit>> {
        let mut out = Vec::new();
        for k in kinds.iter().map(|k| k.as_ref().trim()) {
            match k {
                "onnx" => {}
                "mlir" => out.push(Emit::Mlir),
                "ptx" => out.push(Emit::Ptx),
                bad => return Err(Error::Request(format!("unknown --emit kind `{bad}` (expected onnx, mlir, ptx)"))),
            }
        }
        Ok(out)
    }
}

/// `--shard-collectives`: the sharded collectives' precisions the search
/// may choose.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardCollectives {
    pub choices: CollectiveChoices,
    /// `auto`: those within the error budget; otherwise each one named must
    /// be within it.
    pub auto: bool,
}

impl FromStr for ShardCollectives {
    type Err = Error;

    fn from_str(s: &str) -> Result<ShardCollectives> {
        let choices = CollectiveChoices::parse(s).map_err(|e| Error::Request(format!("--shard-collectives: {e}")))?;
        Ok(ShardCollectives { choices, auto: s.trim() == "auto" })
    }
}

/// Everything the planner needs; [`PlanRequest::new`] gives the CLI's
/// defaults.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    /// An ONNX model (.onnx), TorchScript archive (.pt) or text IR (.qir).
    pub model: PathBuf,
    /// The device types and counts, or a cluster file.
    pub cluster: ClusterInput,
    /// Every node's NIC at this rate, in Gbit/s.
    pub network: Option<f64>,
    /// Samples per device per iteration before any split (the global batch
    /// is this times the device count), in 1..=[`MAX_DIM`].
    pub batch: i64,
    /// Named symbolic dimensions: `("seq", 128)`.
    pub dims: Vec<(String, i64)>,
    /// Available memory per device type.
    pub memory: Vec<MemoryLimit>,
    /// Precisions inference devices may use.
    pub precisions: Vec<Precision>,
    /// Passes run on each device's graph after materialization.
    pub pipeline: PassPipeline,
    /// Activation / gradient statistics for the indicator (`--stats`,
    /// `qsync_planner::Calibration`'s JSON, what `scripts/calibrate.py`
    /// writes).
    pub stats: Option<PathBuf>,
    /// Timing profiles (`--profile`, what `qsyncc profile build` writes),
    /// one per device type at most: measured op times replace the analytic
    /// model's on the device each names, as in `qsyncc simulate`.
    pub profiles: Vec<PathBuf>,
    pub t_min: TMin,
    pub method: Method,
    pub objective: Objective,
    pub indicator_bound: Option<f64>,
    /// What the training device type computes in (default: AMP in its best
    /// 16-bit type).
    pub train_precision: TrainPrecision,
    pub optimizer: Optimizer,
    /// Extra device description files.
    pub device_files: Vec<PathBuf>,
    /// Code besides the ONNX always written (needs a
    /// [`CodeEmitter`](crate::CodeEmitter) at write time).
    pub emit: Vec<Emit>,
    /// Gradient synchronization.
    pub sync: SyncChoice,
    /// Relative error `auto` (sync and sharded collectives) may accept.
    pub sync_error_budget: f64,
    /// The path compressed schemes run on (`None`: the cluster's default,
    /// or for `auto` every path its devices have).
    pub sync_path: Option<SyncPath>,
    /// The hosts' synchronization kernels (`None`: the build machine's).
    pub host_kernels: Option<SyncKernels>,
    /// Elements per quantization group of the quantized schemes.
    pub sync_group: u32,
    /// The sharded collectives' precisions the sharded search may choose.
    pub shard_collectives: ShardCollectives,
    /// Progress lines with elapsed seconds on stderr.
    pub progress: bool,
}

impl PlanRequest {
    pub fn new(model: impl Into<PathBuf>, cluster: impl Into<ClusterInput>) -> PlanRequest {
        PlanRequest {
            model: model.into(),
            cluster: cluster.into(),
            network: None,
            batch: 32,
            dims: Vec::new(),
            memory: Vec::new(),
            precisions: vec![Precision::Fp32, Precision::Fp16, Precision::Int8],
            pipeline: PassPipeline::default(),
            stats: None,
            profiles: Vec::new(),
            t_min: TMin::Best,
            method: Method::Joint,
            objective: Objective::Indicator,
            indicator_bound: None,
            train_precision: TrainPrecision::Auto,
            optimizer: Optimizer::Adam,
            device_files: Vec::new(),
            emit: Vec::new(),
            sync: SyncChoice::Given(SyncScheme::Fp32),
            sync_error_budget: 0.01,
            sync_path: None,
            host_kernels: None,
            sync_group: 512,
            shard_collectives: ShardCollectives::default(),
            progress: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err<T: std::fmt::Debug>(r: Result<T>) -> String {
        r.expect_err("an error").to_string()
    }

    #[test]
    fn targets_parse_with_the_cli_messages() {
        let t: Targets = " V100:16 , t4:16/4".parse().expect("parses");
        assert_eq!(
            t.0,
            [
                TargetSpec { device: "v100".into(), count: 16, per_node: 8 },
                TargetSpec { device: "t4".into(), count: 16, per_node: 4 },
            ]
        );
        assert_eq!(
            err("v100:x".parse::<Targets>()),
            "target `v100:x`: `x` is not a device count: invalid digit found in string"
        );
        assert_eq!(err("v100:0".parse::<Targets>()), "target `v100:0`: the device count must be at least 1");
        assert_eq!(err("t4:4/0".parse::<Targets>()), "target `t4:4/0`: bad devices per node `0`");
        assert_eq!(err("v100,:4".parse::<Targets>()), "target `:4` has no device name");
        assert!(matches!("v100:x".parse::<Targets>(), Err(Error::Cluster(_))));
    }

    #[test]
    fn flag_values_parse_with_the_cli_messages() {
        assert_eq!(
            "t4=30%".parse::<MemoryLimit>().expect("parses"),
            MemoryLimit { device: "t4".into(), fraction: 0.3 }
        );
        assert_eq!(err("t4".parse::<MemoryLimit>()), "--memory `t4` is not DEVICE=VALUE");
        assert_eq!(err("t4=150%".parse::<MemoryLimit>()), "memory fraction `150%` must be in (0, 100%]");
        assert_eq!(err(parse_optimizer("lion")), "unknown optimizer `lion` (sgd, momentum, adam)");
        assert_eq!(err(Emit::parse_list(&["onnx", "llvm"])), "unknown --emit kind `llvm` (expected onnx, mlir, ptx)");
        assert_eq!(Emit::parse_list(&["onnx", "ptx"]).expect("parses"), [Emit::Ptx]);
        assert_eq!("auto".parse::<SyncChoice>().expect("parses"), SyncChoice::Auto);
        assert!(err("nope".parse::<SyncChoice>()).starts_with("--sync: "));
        assert!(err("no-such-pass".parse::<PassPipeline>()).starts_with("--pipeline: "));
        assert!(err(parse_precisions("fp32,fp7")).starts_with("--precisions: "));
        assert_eq!(
            err(ClusterInput::from_flags(" ", None)),
            "no cluster: give --targets (v100:16,t4:16) or --cluster FILE"
        );
        assert_eq!(
            err(ClusterInput::from_flags("v100", Some(Path::new("c.toml")))),
            "--targets and --cluster both describe the cluster: give one"
        );
    }
}
