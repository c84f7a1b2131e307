//! Launching a check binary under `mpirun`, one job at a time, for the
//! runtime's multi-rank tests.

use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ONE_JOB_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `mpirun -n RANKS BIN ARGS` killed past `limit` (root in containers; more
/// ranks than cores): its output and how long it took.
pub fn mpirun(bin: &str, ranks: usize, args: &[&str], limit: Duration) -> (Output, Duration) {
    let _guard = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let found = Command::new("mpirun").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    assert!(found, "mpirun not found: run scripts/setup.sh (it installs Debian's Open MPI)");
    let start = Instant::now();
    let out = Command::new("timeout")
        .args(["-k", "5", &limit.as_secs().to_string(), "mpirun", "-n", &ranks.to_string(), "--bind-to", "none"])
        .arg(bin)
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .output()
        .expect("spawn timeout/mpirun");
    (out, start.elapsed())
}

/// Standard output and error together.
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}
