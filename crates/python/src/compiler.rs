//! The compiler in the wheel: the `qsyncc` console command and the
//! planning API (`qsync.plan`, `qsync.passes.run`), over `qsyncc`'s
//! library: the same code as the `qsyncc` binary, so the same plans and the
//! same messages.
//!
//! Failures raise the class of `qsync.errors` their kind names
//! ([`qsyncc::embed::Kind::class_name`]), with the CLI's message.

use std::ffi::OsString;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyType;

fn raise(py: Python<'_>, e: qsyncc::embed::Error) -> PyErr {
    let class = py
        .import("qsync.errors")
        .and_then(|m| m.getattr(e.kind.class_name()))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match class {
        Ok(ty) => PyErr::from_type(ty, e.message),
        Err(err) => err,
    }
}

/// Runs the `qsyncc` command line `argv` (program name first) and returns
/// its exit status; the GIL is released meanwhile.
#[pyfunction]
pub fn qsyncc_main(py: Python<'_>, argv: Vec<OsString>) -> u8 {
    py.detach(|| qsyncc::cli::main(argv))
}

/// `qsyncc plan FLAGS…` (model, `--targets`, `-o DIR` and any other flag):
/// writes the plan directory; returns `(summary JSON, notes, warnings)`.
#[pyfunction]
pub fn plan(py: Python<'_>, flags: Vec<String>) -> PyResult<(String, Vec<String>, Vec<String>)> {
    let written = py.detach(|| qsyncc::embed::plan(&flags)).map_err(|e| raise(py, e))?;
    Ok((written.summary.to_string(), written.notes, written.warnings))
}

/// `qsyncc opt MODEL --passes PIPELINE -o OUTPUT …`: returns `(report,
/// warnings)`.
#[pyfunction]
#[pyo3(signature = (model, pipeline, output, *, target=None, batch=None, dims=Vec::new(), mode="training", stats=None, verify=true))]
#[allow(clippy::too_many_arguments)]
pub fn run_passes(
    py: Python<'_>,
    model: PathBuf,
    pipeline: &str,
    output: PathBuf,
    target: Option<&str>,
    batch: Option<i64>,
    dims: Vec<(String, i64)>,
    mode: &str,
    stats: Option<PathBuf>,
    verify: bool,
) -> PyResult<(String, Vec<String>)> {
    let o = qsyncc::embed::PassOptions { target, batch, dims, mode, stats: stats.as_deref(), verify };
    py.detach(|| qsyncc::embed::passes(&model, pipeline, &o, &output)).map_err(|e| raise(py, e))
}

/// The passes a pipeline may name.
#[pyfunction]
pub fn available_passes() -> Vec<String> {
    qsync_passes::available_passes().iter().map(|p| p.to_string()).collect()
}
