//! `qsyncc`: the qsync command-line driver.
//!
//! Exit codes: 0 success, 2 any error (bad input, bad flags, failed pass).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use qsyncc::syncbench;
use qsyncc::{codegen, inspect, load, parse_dim_binding, plan, planner, profile, simulate};

#[derive(Parser, Debug)]
#[command(name = "qsyncc", version, about = "Mixed-precision planning compiler for hybrid GPU clusters")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Summarise a model: op histogram, parameters, FLOPs per op class, inputs and outputs.
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
        /// Also predict the planned model's iteration time on this device.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(qsync_passes::precision::KNOWN_TARGETS))]
        target: Option<String>,
    },
    /// Run passes over a model and write the result.
    Opt {
        model: PathBuf,
        /// Comma-separated pipeline, e.g. `infer-shapes,fold-constants,dce`.
        #[arg(long, default_value = "verify")]
        passes: String,
        /// Output file: `.onnx` writes ONNX, `.qir` writes text IR; omitted: text IR on stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        dims: DimArgs,
        /// Skip verification after each pass (on by default).
        #[arg(long)]
        no_verify: bool,
        /// The device precision passes plan for (its precisions bound what they may choose).
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(qsync_passes::precision::KNOWN_TARGETS))]
        target: Option<String>,
        /// `training` keeps FP32 master weights cast per use; `inference` stores weights low.
        #[arg(long, default_value = "training", value_parser = ["training", "inference"])]
        mode: String,
        /// Print planning figures as one JSON object on stdout (the model then
        /// goes only to `-o`).
        #[arg(long)]
        json: bool,
    },
    /// Predict iteration time and memory on a hybrid data-parallel cluster.
    Simulate(simulate::SimulateArgs),
    /// GPU calibration: the operators to measure, and the profile built from the measurements.
    #[command(subcommand)]
    Profile(profile::ProfileCmd),
    /// Emit the code one device runs: `DIR/model.mlir` and `DIR/kernels.ptx`.
    Codegen {
        model: PathBuf,
        /// Device name from the device database (t4, v100, a100-40gb, …) or an `sm_XX`.
        #[arg(long)]
        target: String,
        /// Comma-separated pipeline run before emission.
        #[arg(long, default_value = "verify")]
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
    SyncBench(syncbench::SyncBenchArgs),
}

#[derive(Args, Debug, Clone, Default)]
struct DimArgs {
    /// Bind the leading symbolic (batch) dimension of the inputs.
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..=1 << 40))]
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
        Cmd::Inspect { model, dims, ir, json, target } => {
            let loaded = load::load_model(&model, &dims.options(), &dims.inputs)?;
            let out = inspect::render(&model, &loaded, ir, json, target.as_deref(), &dims.options())?;
            write_stdout(&out)
        }
        Cmd::Codegen { model, target, passes, emit, output, all_kernels, dims } => {
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
        Cmd::Opt { model, passes, output, dims, no_verify, target, mode, json } => {
            let mut loaded = load::load_model(&model, &dims.options(), &dims.inputs)?;
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            let mut pm = qsync_passes::pipeline_from_spec(&passes)?;
            pm.verify_each(!no_verify);
            let input = loaded.model.clone();
            let mut cx = qsync_passes::PassContext {
                infer: dims.options(),
                warnings: Vec::new(),
                target: target.clone(),
                inference: mode == "inference",
            };
            let report = pm.run(&mut loaded.model, &mut cx).with_context(|| format!("{}", model.display()))?;
            for w in &cx.warnings {
                eprintln!("warning: {w}");
            }
            eprint!("{report}");
            if json {
                let figures =
                    plan::figures(&input.graph, &loaded.model.graph, target.as_deref(), &mode, &dims.options());
                if let Some(path) = &output {
                    load::save_model(&loaded.model, path)?;
                }
                return write_stdout(&(serde_json::to_string_pretty(&figures)? + "\n"));
            }
            match output {
                Some(path) => load::save_model(&loaded.model, &path),
                None => write_stdout(&qsync_ir::text::print_model(&loaded.model)),
            }
        }
        Cmd::Simulate(args) => write_stdout(&simulate::run(&args)?),
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

/// Whether `arg` names a subcommand (or `help`); any other first argument
/// is a model path for the planner.
fn is_subcommand(arg: &str) -> bool {
    use clap::CommandFactory;
    arg == "help" || Cli::command().get_subcommands().any(|c| c.get_name() == arg)
}

fn main() -> ExitCode {
    let first = std::env::args().nth(1);
    if first.is_some_and(|f| !f.starts_with('-') && !is_subcommand(&f)) {
        let args = match planner::PlanArgs::try_parse() {
            Ok(a) => a,
            Err(e) => {
                let code = if e.use_stderr() { 2 } else { 0 };
                let _ = e.print();
                return ExitCode::from(code);
            }
        };
        return match planner::run(&args).and_then(|s| write_stdout(&s)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
