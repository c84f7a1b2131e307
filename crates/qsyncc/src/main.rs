//! `qsyncc`: the qsync command-line driver.
//!
//! Exit codes: 0 success, 2 any error (bad input, bad flags, failed pass).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

mod codegen;
mod inspect;
mod load;

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
        /// An ONNX model (.onnx) or qsync text IR (.qir).
        model: PathBuf,
        #[command(flatten)]
        dims: DimArgs,
        /// Print the text IR (large tensors elided).
        #[arg(long)]
        ir: bool,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
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
    },
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
}

#[derive(Args, Debug, Clone, Default)]
struct DimArgs {
    /// Bind the leading symbolic (batch) dimension of the inputs.
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..=1 << 40))]
    batch: Option<i64>,
    /// Bind a named symbolic dimension: `--dim seq=128` (repeatable).
    #[arg(long = "dim", value_parser = parse_dim_binding)]
    dims: Vec<(String, i64)>,
}

fn parse_dim_binding(s: &str) -> Result<(String, i64), String> {
    let (name, val) = s.split_once('=').ok_or_else(|| format!("`{s}` is not NAME=N"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("`{s}` has an empty dimension name"));
    }
    let v: i64 = val.trim().parse().map_err(|_| format!("`{val}` is not an integer"))?;
    if v < 1 {
        return Err(format!("dimension `{name}` must be at least 1, got {v}"));
    }
    Ok((name.to_string(), v))
}

impl DimArgs {
    fn options(&self) -> qsync_ir::infer::InferOptions {
        qsync_ir::infer::InferOptions { batch: self.batch, dims: self.dims.iter().cloned().collect() }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Inspect { model, dims, ir, json } => {
            let loaded = load::load_model(&model, &dims.options())?;
            let out = inspect::render(&model, &loaded, ir, json)?;
            write_stdout(&out)
        }
        Cmd::Codegen { model, target, passes, emit, output, all_kernels, dims } => {
            let mut loaded = load::load_model(&model, &dims.options())?;
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            let mut pm = qsync_passes::pipeline_from_spec(&passes)?;
            pm.verify_each(true);
            let mut cx = qsync_passes::PassContext { infer: dims.options(), warnings: Vec::new() };
            pm.run(&mut loaded.model, &mut cx).with_context(|| format!("{}", model.display()))?;
            for w in &cx.warnings {
                eprintln!("warning: {w}");
            }
            let summary = codegen::run(&model, &loaded.model, &target, &emit, &output, all_kernels)?;
            eprint!("{summary}");
            Ok(())
        }
        Cmd::Opt { model, passes, output, dims, no_verify } => {
            let mut loaded = load::load_model(&model, &dims.options())?;
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            let mut pm = qsync_passes::pipeline_from_spec(&passes)?;
            pm.verify_each(!no_verify);
            let mut cx = qsync_passes::PassContext { infer: dims.options(), warnings: Vec::new() };
            let report = pm.run(&mut loaded.model, &mut cx).with_context(|| format!("{}", model.display()))?;
            for w in &cx.warnings {
                eprintln!("warning: {w}");
            }
            eprint!("{report}");
            match output {
                Some(path) => load::save_model(&loaded.model, &path),
                None => write_stdout(&qsync_ir::text::print_model(&loaded.model)),
            }
        }
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

fn main() -> ExitCode {
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
