//! The `qsyncc` driver as a library: its subcommands' modules, so that
//! benches and tests can run them in process, and the command line itself
//! ([`cli::main`], which the binary `main.rs` and the Python package's
//! `qsyncc` command run); [`embed`] is what the Python package calls.

pub mod cli;
pub mod codegen;
pub mod embed;
pub mod hostkernels;
pub mod inspect;
pub mod opt;
pub mod plan;
pub mod planner;
pub mod profile;
pub mod shardbench;
pub mod simulate;
pub mod syncbench;

/// The plan pipeline's model loading, device names and report, which the
/// other commands share.
pub use qsync_pipeline::{devices, load, report};

/// The largest `--batch` and `--dim` value of every command: 2^24 (see
/// [`qsync_pipeline::MAX_DIM`]).
pub use qsync_pipeline::MAX_DIM;

/// The error of a command this build left out: `what` needs `feature`
/// (which needs `needs` on the build machine), and how to build it in.
/// Like every error it exits with status 2.
pub fn feature_off(what: &str, feature: &str, needs: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{what} needs qsyncc's `{feature}` feature ({needs}), which this build lacks; \
         rebuild with `cargo install --path crates/qsyncc --features {feature}`"
    )
}

/// `NAME=N` for `--dim`.
pub fn parse_dim_binding(s: &str) -> Result<(String, i64), String> {
    let (name, val) = s.split_once('=').ok_or_else(|| format!("`{s}` is not NAME=N"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("`{s}` has an empty dimension name"));
    }
    let v: i64 = val.trim().parse().map_err(|_| format!("`{val}` is not an integer"))?;
    if !(1..=MAX_DIM).contains(&v) {
        return Err(format!("dimension `{name}` must be in 1..={MAX_DIM}, got {v}"));
    }
    Ok((name.to_string(), v))
}
