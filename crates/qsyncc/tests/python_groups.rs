//! The `qsync` Python package's process groups, in real torchrun jobs (CPU,
//! gloo), driven by `crates/python/tests/groups_check.py`:
//! - two Python threads synchronizing forked `GradSync` siblings at once get
//!   exact results (a split of a transport is a new group: the siblings'
//!   traffic never meets); the transport's groups' gloo event-loop threads
//!   take the policy asked for (`SCHED_BATCH`), DDP's default group's keep
//!   gloo's;
//! - nodes of different sizes (two torchrun agents of 2 and 1 ranks): the
//!   DDP hook's hierarchical scheme takes every rank's node from the
//!   launcher, replicas stay bitwise identical and track FP32 DDP.
//!
//! Needs the PyTorch environment `scripts/setup.sh` makes (as
//! `tests/python.rs`).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

mod pyenv;
use pyenv::{root, venv};

static SERIAL: Mutex<()> = Mutex::new(());
static INSTALLED: OnceLock<()> = OnceLock::new();

/// Builds the wheel and installs it into the torch environment (once).
fn install() {
    INSTALLED.get_or_init(|| {
        pyenv::install_wheel("wheels-test-groups");
    });
}

fn script() -> PathBuf {
    root().join("crates/python/tests/groups_check.py")
}

fn spawn(mut c: Command) -> Child {
    c.env("OMP_NUM_THREADS", "1").current_dir(root()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.spawn().expect("spawn torchrun")
}

/// Waits for every child, killing all of them past `limit` (a hang).
fn wait_all(children: Vec<Child>, limit: Duration) -> Vec<Output> {
    let start = Instant::now();
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    loop {
        let done = children.iter_mut().all(|c| c.as_mut().is_none_or(|c| c.try_wait().expect("wait").is_some()));
        if done {
            break;
        }
        if start.elapsed() > limit {
            let mut log = String::new();
            for c in children.iter_mut().flatten() {
                let _ = c.kill();
            }
            for c in children.into_iter().flatten() {
                let out = c.wait_with_output().expect("output");
                log += &String::from_utf8_lossy(&out.stderr);
            }
            panic!("torchrun did not finish within {limit:?} (a hang)\n{log}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    children.into_iter().flatten().map(|c| c.wait_with_output().expect("output")).collect()
}

fn check(outs: &[Output], mode: &str, ranks: usize) {
    let mut log = String::new();
    for o in outs {
        log += &format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    }
    for o in outs {
        assert!(o.status.success(), "{mode}: torchrun failed ({:?}):\n{log}", o.status);
    }
    for r in 0..ranks {
        assert!(log.contains(&format!("OK {mode} rank {r}")), "{mode}: rank {r} did not pass:\n{log}");
    }
}

#[test]
fn forked_siblings_on_two_python_threads_do_not_share_traffic() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    install();
    let mut c = Command::new(venv().join("bin/torchrun"));
    c.args(["--standalone", "--nproc-per-node", "3"]).arg(script()).arg("threads");
    // The transport's groups' loop threads in SCHED_BATCH whatever the
    // machine's cores (`auto` would choose by them; the script checks that
    // rule on its own).
    c.env("QSYNC_GLOO_LOOP", "batch");
    let outs = wait_all(vec![spawn(c)], Duration::from_secs(300));
    check(&outs, "threads", 3);
}

#[test]
fn hierarchical_hook_on_nodes_of_two_and_one_ranks() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    install();
    let port = TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let agent = |node: usize, procs: usize| {
        let mut c = Command::new(venv().join("bin/torchrun"));
        c.args(["--nnodes", "2", "--node-rank", &node.to_string(), "--nproc-per-node", &procs.to_string()])
            .args(["--master-addr", "127.0.0.1", "--master-port", &port.to_string()])
            .arg(script())
            .arg("uneven");
        spawn(c)
    };
    let children = vec![agent(0, 2), agent(1, 1)];
    let outs = wait_all(children, Duration::from_secs(300));
    check(&outs, "uneven", 3);
}
