//! The `qsyncc` command line: its flags, and each subcommand's module run
//! with them. [`main`] is the whole command; the binary (`main.rs`) and the
//! Python package's `qsyncc` console command both call it with their argv.
//!
//! Exit codes: 0 success, 2 any error (bad input, bad flags, failed pass).

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::{codegen, hostkernels, inspect, load, opt, parse_dim_binding, plan, planner, profile, simulate, syncbench};

const TOP_EXAMPLES: &str = "\
Examples:
  qsyncc examples/squeezenet1_1.onnx --targets v100:16,t4:16 -o plan/
  qsyncc plan bert_base_train.onnx --targets a100:8,t4:8 --dim seq=128 -o plan/
  qsyncc inspect examples/squeezenet1_1.onnx
  qsyncc simulate examples/squeezenet1_1.onnx --targets v100:4,t4:4 --precision t4=fp16
  qsyncc help plan

`qsyncc MODEL ...` is short for `qsyncc plan MODEL ...`.";

const PLAN_EXAMPLES: &str = "\
Examples:
  qsyncc examples/squeezenet1_1.onnx --targets v100:16,t4:16 -o plan/
  qsyncc plan bert_base_train.onnx --targets a100:8,t4:8 --dim seq=128 -o plan/ --json
  qsyncc plan resnet50_train.onnx --targets v100:16,t4:16 --memory t4=30% --precisions fp32,fp16 -o plan/
  qsyncc plan model.onnx --targets v100:4,t4:4 --emit onnx,mlir,ptx --sync auto -o plan/

The plan directory holds manifest.json (schema qsync-plan/4, described by
crates/qsyncc/schema/qsync-plan-4.schema.json), report.md, timeline.json and
one <device>/ directory per device type (model.onnx, plan.json, and the
--emit files).";

const INSPECT_EXAMPLES: &str = "\
Examples:
  qsyncc inspect examples/squeezenet1_1.onnx
  qsyncc inspect bert_base_train.onnx --batch 8 --dim seq=128 --json
  qsyncc inspect plan/t4/model.onnx --target t4     # a planned model: casts, FLOP share, predicted time";

const OPT_EXAMPLES: &str = "\
Examples:
  qsyncc opt examples/squeezenet1_1.onnx --passes amp --target t4             # summary on stdout
  qsyncc opt examples/squeezenet1_1.onnx --passes uniform=fp16 -o sq16.onnx
  qsyncc opt model.onnx --passes infer-shapes,fold-constants,dce -o out.qir  # text IR (+ out.qir.bin)
  qsyncc opt model.onnx --passes egraph-casts --target v100 --json
  qsyncc opt model.onnx --passes verify -o -                                 # the whole text IR on stdout";

const SIMULATE_EXAMPLES: &str = "\
Examples:
  qsyncc simulate examples/squeezenet1_1.onnx --targets v100:16,t4:16
  qsyncc simulate bert_base_train.onnx --targets a100:8 --precision a100=bf16 --dim seq=128
  qsyncc simulate plan/t4/model.onnx --targets t4:16 --batch 24 --json     # a planned model
  qsyncc simulate model.onnx --targets t4 --profile t4.profile.json --trace trace.json";

const PROFILE_EXAMPLES: &str = "\
Examples:
  qsyncc profile worklist resnet50_train.onnx bert_tiny.onnx --batch 32 --dim seq=128 -o ops.json
  qsyncc profile build measured.json --device t4 -o t4.profile.json
  qsyncc simulate model.onnx --targets t4 --profile t4.profile.json";

const CODEGEN_EXAMPLES: &str = "\
Examples:
  qsyncc codegen examples/squeezenet1_1.onnx --target t4 -o out/
  qsyncc codegen plan/v100/model.onnx --target v100 --emit ptx -o out/";

const HOST_KERNELS_EXAMPLES: &str = "\
Examples:
  qsyncc host-kernels -o host.json --threads 2
  qsyncc simulate --cluster examples/clusters/aws-v100-t4.toml --host-kernels host.json --sync fp16 --gradient 64MiB";

const SYNC_BENCH_EXAMPLES: &str = "\
Examples:
  mpirun -n 4 qsyncc sync-bench --scheme qgz-int4-hier --bytes 64M --nodes 2
  mpirun -n 2 qsyncc sync-bench --scheme fp16 --bytes 16M --json";

/// The passes `opt --passes` and `--pipeline` take, for `--help`.
const PASSES_HELP: &str = "\
Comma-separated pipeline of passes, run in order:
  infer-shapes    re-infer dtypes and shapes (applies --batch / --dim)
  fold-constants  evaluate nodes whose inputs are all constant
  dce             remove nodes nothing reads
  verify          check the graph (also run after every pass unless --no-verify)
  amp             TF-AMP style mixed precision (policy=tf-amp|FILE.json)
  autocast        torch.autocast style mixed precision (policy=torch-autocast|FILE.json)
  uniform=P       every plannable op at precision P (fp16, bf16, fp8e4m3, int8, fp32)
  cascade=P       lower ops to P where the cast cost pays off
  campo           Campo's cost-aware casts (padding=on|off, refresh=on|off)
  comp            variance-proxy mixed precision (threshold=X)
  egraph-casts    equality-saturation cast optimization (iters=, nodes=, time_ms=, exact=, refresh=)
Precision passes also take dtype=P, mode=training|inference and
override=PATTERN=P (repeatable; exact node name or glob). Precisions: fp32,
bf16, fp16, fp8e4m3, int8 (or the IR's names f32, f16, f8e4m3, i8).
Example: `infer-shapes,amp(override=*Softmax*=fp32),egraph-casts,dce`.";

#[derive(Parser, Debug)]
#[command(
    name = "qsyncc",
    version,
    about = "Mixed-precision planning compiler for hybrid GPU clusters",
    long_about = "Mixed-precision planning compiler for hybrid GPU clusters: given a model and a cluster \
                  (`--targets v100:16,t4:16`), `qsyncc plan` chooses each device type's precisions and \
                  batch share and writes a plan directory.",
    after_help = TOP_EXAMPLES,
    subcommand_required = true,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

// One `Cmd` is parsed per process and lives on `main`'s stack: the largest
// variant's 568 bytes cost nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Cmd {
    /// The main command: plan per-device precision and batch split for a hybrid cluster and write a plan
    /// directory (`qsyncc MODEL ...` is short for `qsyncc plan MODEL ...`).
    #[command(after_help = PLAN_EXAMPLES)]
    Plan(planner::PlanArgs),
    /// Summarise a model: op histogram, parameters, FLOPs per op class, inputs and outputs.
    #[command(after_help = INSPECT_EXAMPLES)]
    Inspect {
        /// An ONNX model (.onnx), a TorchScript archive (.pt) or qsync text IR (.qir).
        model: PathBuf,
        #[command(flatten)]
        dims: DimArgs,
        /// Print the text IR (large tensors elided).
        #[arg(long)]
        ir: bool,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also predict the planned model's iteration time on this device (a name of the device
        /// table or an alias such as `a100`).
        #[arg(long, value_parser = crate::devices::parse_target_flag)]
        target: Option<String>,
    },
    /// Run passes over a model; print a summary of the result or write it (`-o`).
    #[command(after_help = OPT_EXAMPLES)]
    Opt {
        /// The model to transform: an ONNX model (.onnx), a TorchScript archive (.pt) or qsync
        /// text IR (.qir).
        model: PathBuf,
        #[arg(long, default_value = "verify", long_help = PASSES_HELP, help = "Comma-separated pipeline of passes (see --help for the list)")]
        passes: String,
        /// Output file: `.onnx` writes ONNX, `.qir` writes text IR (large weights to `FILE.bin`),
        /// `-` writes the whole text IR to stdout. Without it a summary is printed.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Print the whole text IR on stdout instead of the summary (as `-o -`).
        #[arg(long, conflicts_with = "json")]
        print_ir: bool,
        #[command(flatten)]
        dims: DimArgs,
        /// Skip verification after each pass (on by default).
        #[arg(long)]
        no_verify: bool,
        /// The device precision passes plan for (its precisions bound what they may choose), and
        /// the device the summary's predicted time is for.
        #[arg(long, value_parser = crate::devices::parse_target_flag)]
        target: Option<String>,
        /// `training` keeps FP32 master weights cast per use; `inference` stores weights low.
        #[arg(long, default_value = "training", value_parser = ["training", "inference"])]
        mode: String,
        /// Calibration statistics (what `scripts/calibrate.py` writes): the activations' ranges,
        /// which scale INT8 / FP8 activations. Without a range an INT8-planned node computes in f32.
        #[arg(long)]
        stats: Option<PathBuf>,
        /// Print the summary as one JSON object on stdout (the model then goes only to `-o`).
        #[arg(long)]
        json: bool,
    },
    /// Predict iteration time and memory on a hybrid data-parallel cluster.
    #[command(after_help = SIMULATE_EXAMPLES)]
    Simulate(simulate::SimulateArgs),
    /// GPU calibration: the operators to measure, and the timing profile built from the measurements.
    #[command(subcommand, after_help = PROFILE_EXAMPLES)]
    Profile(profile::ProfileCmd),
    /// Emit the code one device runs: `DIR/model.mlir` and `DIR/kernels.ptx`.
    #[command(after_help = CODEGEN_EXAMPLES)]
    Codegen {
        /// The model: an ONNX model (.onnx), a TorchScript archive (.pt) or qsync text IR (.qir).
        model: PathBuf,
        /// Device name from the device database (t4, v100, a100-40gb, …; aliases such as `a100`)
        /// or an `sm_XX`.
        #[arg(long)]
        target: String,
        #[arg(long, default_value = "verify", long_help = PASSES_HELP, help = "Comma-separated pipeline run before emission (see --help for the list)")]
        passes: String,
        /// What to write: `mlir`, `ptx` or both (`mlir,ptx`).
        #[arg(long, default_value = "mlir,ptx")]
        emit: String,
        /// Output directory (created if missing).
        #[arg(short, long)]
        output: PathBuf,
        /// Emit every kernel qsync has, not only those the plan needs.
        #[arg(long)]
        all_kernels: bool,
        #[command(flatten)]
        dims: DimArgs,
    },
    /// Benchmark a gradient-synchronization scheme on a running job (launch under mpirun).
    #[command(after_help = SYNC_BENCH_EXAMPLES)]
    SyncBench(syncbench::SyncBenchArgs),
    /// Measure the synchronization kernels on this host (what `--host-kernels` takes).
    #[command(after_help = HOST_KERNELS_EXAMPLES)]
    HostKernels(hostkernels::HostKernelsArgs),
}

#[derive(Args, Debug, Clone, Default)]
struct DimArgs {
    /// Bind the leading symbolic (batch) dimension of the inputs.
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..=crate::MAX_DIM))]
    batch: Option<i64>,
    /// Bind a named symbolic dimension: `--dim seq=128` (repeatable).
    #[arg(long = "dim", value_parser = parse_dim_binding)]
    dims: Vec<(String, i64)>,
    /// Give an input its type: `--input x=f32[1,3,224,224]` (repeatable).
    /// Needed for TorchScript archives without recorded traced inputs.
    #[arg(long = "input", value_parser = qsync_torchscript::InputSpec::parse)]
    inputs: Vec<qsync_torchscript::InputSpec>,
}

impl DimArgs {
    fn options(&self) -> qsync_ir::infer::InferOptions {
        qsync_ir::infer::InferOptions { batch: self.batch, dims: self.dims.iter().cloned().collect() }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Plan(args) => write_stdout(&planner::run(&args)?),
        Cmd::Inspect { model, dims, ir, json, target } => {
            let loaded = load::load_model(&model, &dims.options(), &dims.inputs)?;
            let out = inspect::render(&model, &loaded, ir, json, target.as_deref(), &dims.options())?;
            write_stdout(&out)
        }
        Cmd::Codegen { model, target, passes, emit, output, all_kernels, dims } => {
            codegen::require("`qsyncc codegen`")?;
            let (target, note) =
                crate::devices::resolve(&target, |n| qsync_passes::precision::KNOWN_TARGETS.contains(&n));
            if let Some(n) = note {
                eprintln!("note: {n}");
            }
            let mut loaded = load::load_model(&model, &dims.options(), &dims.inputs)?;
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            let mut pm = qsync_passes::pipeline_from_spec(&passes)?;
            pm.verify_each(true);
            let mut cx = qsync_passes::PassContext { infer: dims.options(), ..Default::default() };
            pm.run(&mut loaded.model, &mut cx).with_context(|| format!("{}", model.display()))?;
            for w in &cx.warnings {
                eprintln!("warning: {w}");
            }
            let summary = codegen::run(&model, &loaded.model, &target, &emit, &output, all_kernels)?;
            eprint!("{summary}");
            Ok(())
        }
        Cmd::Opt { model, passes, output, print_ir, dims, no_verify, target, mode, stats, json } => {
            let req = opt::OptRequest {
                passes,
                infer: dims.options(),
                inputs: dims.inputs.clone(),
                verify: !no_verify,
                target: target.clone(),
                inference: mode == "inference",
                stats,
            };
            let opt::Optimized { input, model: result, report } =
                opt::optimize(&model, &req, &mut |w| eprintln!("warning: {w}"))?;
            eprint!("{report}");
            let to_stdout = print_ir || output.as_deref().is_some_and(|p| p.as_os_str() == "-");
            if to_stdout {
                if json {
                    anyhow::bail!("--json and the text IR on stdout (`-o -`) exclude each other");
                }
                return write_stdout(&qsync_ir::text::print_model(&result));
            }
            if let Some(path) = &output {
                load::save_model(&result, path)?;
            }
            let figures = plan::figures(&input.graph, &result.graph, target.as_deref(), &mode, &dims.options());
            if json {
                return write_stdout(&(serde_json::to_string_pretty(&figures)? + "\n"));
            }
            if output.is_some() {
                // The model went to the file; the summary goes to stderr
                // beside the pass report, so stdout stays empty as before.
                eprint!("{}", plan::summary_text(&model, &figures));
                return Ok(());
            }
            write_stdout(&plan::summary_text(&model, &figures))
        }
        Cmd::Simulate(args) => write_stdout(&simulate::run(&args)?),
        Cmd::HostKernels(args) => write_stdout(&hostkernels::run(&args)?),
        Cmd::SyncBench(args) => match syncbench::run(&args)? {
            Some(out) => write_stdout(&out),
            None => Ok(()),
        },
        Cmd::Profile(cmd) => write_stdout(&profile::run(&cmd)?),
    }
}

fn write_stdout(s: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        // A closed pipe (`qsyncc … | head`) is not an error worth reporting.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing to stdout"),
    }
}

/// `qsyncc MODEL …` is `qsyncc plan MODEL …`: a first argument that is no
/// subcommand (nor `help`, nor a flag) but names a file, or looks like a
/// path (a `/` or an extension), is a model. Anything else goes to clap as
/// written, so a mistyped subcommand (`inpsect`) gets clap's "unrecognized
/// subcommand" with its suggestion rather than "cannot read inpsect".
fn with_plan_inserted(mut args: Vec<OsString>) -> Vec<OsString> {
    use clap::CommandFactory;
    let Some(first) = args.get(1) else { return args };
    let s = first.to_string_lossy();
    let subcommand = s == "help" || Cli::command().get_subcommands().any(|c| c.get_name() == s);
    let path = std::path::Path::new(first);
    let looks_like_model =
        path.exists() || s.contains('/') || s.contains(std::path::MAIN_SEPARATOR) || path.extension().is_some();
    if !s.starts_with('-') && !subcommand && looks_like_model {
        args.insert(1, "plan".into());
    }
    args
}

/// Runs the command line `args` (the program name first, as
/// `std::env::args_os` gives it) and returns the exit status.
pub fn main(args: impl IntoIterator<Item = OsString>) -> u8 {
    let args = with_plan_inserted(args.into_iter().collect());
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    }
}
