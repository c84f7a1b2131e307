//! Real multi-process MPI jobs: `mpirun` runs `qsync-sync-check` on 4 and 8
//! ranks (oversubscribed: CI machines have 2 cores) with 1 and 2 emulated
//! nodes, and the failure cases. Every job runs under `timeout`, so a hang
//! is a test failure, not a stuck CI. Jobs run one at a time (they would
//! otherwise compete for the same cores and stretch each other's deadlines).
//!
//! Needs Open MPI's `mpirun` (`scripts/setup.sh` installs it).

use std::process::Output;
use std::time::Duration;

mod launch;
use launch::text;

fn mpirun(ranks: usize, args: &[&str], limit: Duration) -> (Output, Duration) {
    launch::mpirun(env!("CARGO_BIN_EXE_qsync-sync-check"), ranks, args, limit)
}

fn expect_pass(ranks: usize, nodes: usize, suite: &str) {
    let (out, took) = mpirun(ranks, &["--suite", suite, "--nodes", &nodes.to_string()], Duration::from_secs(300));
    let log = text(&out);
    assert!(out.status.success(), "{ranks} ranks, {nodes} nodes, suite {suite} failed ({:?}):\n{log}", out.status);
    assert!(log.contains(" 0 failures over all ranks"), "no summary line:\n{log}");
    eprintln!("{ranks} ranks / {nodes} nodes / {suite}: {took:.1?}\n{log}");
}

#[test]
fn four_ranks_one_node() {
    expect_pass(4, 1, "bounds");
}

#[test]
fn four_ranks_two_nodes() {
    expect_pass(4, 2, "all");
}

/// Nodes of different sizes (a node of two ranks and a node of one), given
/// as an explicit rank → node map: every scheme, hierarchical ones
/// included, is bitwise identical across ranks and within its bound of the
/// exact mean.
#[test]
fn three_ranks_on_uneven_nodes() {
    for map in ["0,0,1", "1,0,0"] {
        let (out, took) = mpirun(3, &["--suite", "bounds", "--node-map", map], Duration::from_secs(300));
        let log = text(&out);
        assert!(out.status.success(), "3 ranks, node map {map}: failed ({:?}):\n{log}", out.status);
        assert!(log.contains(" 0 failures over all ranks"), "no summary line:\n{log}");
        eprintln!("3 ranks / node map {map}: {took:.1?}");
    }
}

/// Every rank alone on its node: hierarchical qgZ has no intra-node stage
/// and is the one-shot scheme at its inter-node width, bit for bit, within
/// a bound without intra-node error.
#[test]
fn two_ranks_each_alone_on_its_node() {
    expect_pass(2, 2, "bounds");
}

#[test]
fn eight_ranks_one_node() {
    expect_pass(8, 1, "bounds");
}

#[test]
fn eight_ranks_two_nodes() {
    expect_pass(8, 2, "all");
}

/// A failing rank ends the job within seconds, with a non-zero status and a
/// message naming the failure.
fn expect_failure(fault: &str, needles: &[&str]) {
    expect_failure_with(fault, &[], needles)
}

fn expect_failure_with(fault: &str, extra: &[&str], needles: &[&str]) {
    let args = ["--suite", "fault", "--fault", fault, "--fault-rank", "1", "--nodes", "2", "--timeout", "3"];
    let (out, took) = mpirun(4, &[&args[..], extra].concat(), Duration::from_secs(60));
    let log = text(&out);
    let code = out.status.code();
    assert_ne!(code, Some(0), "job with a failed rank ({fault}) succeeded:\n{log}");
    assert_ne!(code, Some(124), "job with a failed rank ({fault}) hung until the timeout:\n{log}");
    assert!(took < Duration::from_secs(30), "job with a failed rank ({fault}) took {took:?} to end:\n{log}");
    for n in needles {
        assert!(log.contains(n), "`{n}` missing from the job's output ({fault}):\n{log}");
    }
    eprintln!("fault {fault}: job ended in {took:.1?} with {:?}", out.status);
}

// The survivors of a dead or panicking rank are ended by mpirun (SIGTERM)
// before their own deadlines fire; each prints what ended it. mpirun's
// output forwarding sometimes drops the last lines of a rank it is killing,
// so at least one survivor's message is required, not all of them.
const SURVIVOR: &str = "terminated by the launcher during";

#[test]
fn killed_rank_ends_the_job() {
    expect_failure("exit", &["rank 1: injected fault: exiting abruptly inside", SURVIVOR]);
}

#[test]
fn panicking_rank_ends_the_job() {
    expect_failure("panic", &["injected panic", "rank 1 panicked; calling MPI_Abort", SURVIVOR]);
}

#[test]
fn stalled_rank_gives_the_deadline_error() {
    // Our own messages only: when several ranks hit the deadline at once,
    // Open MPI's aggregated "MPI_ABORT was invoked" banner is sometimes lost
    // ("ORTE_ERROR_LOG: Data unpack would read past end of buffer" in
    // show_help.c), while the job still ends, non-zero, within seconds.
    expect_failure("stall", &["stalling", "did not complete within 3.0s"]);
}

#[test]
fn rank_stalled_while_splitting_gives_an_error_naming_split() {
    // Every other rank is inside the split when rank 1 stalls: a deadline
    // error naming the split, within seconds, not a job blocked in MPI.
    expect_failure_with(
        "stall",
        &["--fault-at", "split"],
        &["stalling", "inside split", "split did not complete within 3.0s"],
    );
}

/// The `digests` suite (what the GPU check compares NCCL against): digests
/// recorded by one job are matched bit for bit by a second job, and a
/// recorded digest that differs is reported as a failure.
#[test]
fn recorded_digests_are_reproduced_and_a_changed_one_fails() {
    let dir = std::env::temp_dir().join(format!("qsync-digests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("expected-4r-2n.txt");
    let path = file.to_str().expect("utf-8 path");
    let base = ["--suite", "digests", "--nodes", "2"];
    let (out, _) = mpirun(4, &[&base[..], &["--write", path]].concat(), Duration::from_secs(300));
    assert!(out.status.success(), "recording failed:\n{}", text(&out));
    let recorded = std::fs::read_to_string(&file).expect("recorded digests");
    // 16 schemes × 9 inputs, and 4 error-feedback schemes × 3 sizes over 3 steps.
    assert_eq!(recorded.lines().count(), 16 * 9 + 4 * 3, "{recorded}");

    let (out, _) = mpirun(4, &[&base[..], &["--expect", path]].concat(), Duration::from_secs(300));
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("147 results compared bit for bit"), "{log}");

    // Flip one digit of one quantized scheme's digest.
    let changed: Vec<String> = recorded
        .lines()
        .map(|l| match l.strip_prefix("qgz-int4 n=1000 group=64 normal") {
            Some(_) => {
                let (k, d) = l.rsplit_once('\t').expect("tab");
                let flipped = match d.strip_prefix('0') {
                    Some(rest) => format!("1{rest}"),
                    None => format!("0{}", &d[1..]),
                };
                format!("{k}\t{flipped}")
            }
            None => l.to_string(),
        })
        .collect();
    assert_ne!(changed.join("\n") + "\n", recorded, "no line was changed");
    std::fs::write(&file, changed.join("\n") + "\n").expect("write");
    let (out, _) = mpirun(4, &[&base[..], &["--expect", path]].concat(), Duration::from_secs(300));
    let log = text(&out);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(log.contains("differs from the recorded"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn device_kernels_on_a_cpu_engine_are_a_clear_error() {
    // `--kernels device` needs the GPU of an NCCL communicator: over MPI
    // every rank must fail at once, saying so, not fall back silently.
    let (out, took) = mpirun(2, &["--suite", "digests", "--kernels", "device"], Duration::from_secs(120));
    let log = text(&out);
    assert!(!out.status.success(), "device kernels over MPI must fail:\n{log}");
    assert!(log.contains("unsupported by mpi") && log.contains("device kernels"), "{log}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
}
