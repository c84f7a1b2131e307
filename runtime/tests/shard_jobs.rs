//! The sharded collectives (qwZ all-gather, hpZ, qgZ reduce-scatter) in real
//! `mpirun` jobs of `qsync-shard-check`: 2 and 4 ranks on 1 and 2 emulated
//! nodes, 3 and 4 ranks on nodes of different sizes (explicit rank → node
//! maps), uneven shard sizes (an empty one included) in every job; the wire
//! fractions against fp16 all-gather and fp32 reduce-scatter; a stalled or
//! dead rank. Every job runs under `timeout`, one at a time.
//!
//! Needs Open MPI's `mpirun` (`scripts/setup.sh` installs it).

use std::process::Output;
use std::time::Duration;

mod launch;
use launch::text;

fn mpirun(ranks: usize, args: &[&str], limit: Duration) -> (Output, Duration) {
    launch::mpirun(env!("CARGO_BIN_EXE_qsync-shard-check"), ranks, args, limit)
}

fn expect_pass(ranks: usize, args: &[&str]) -> String {
    let (out, took) = mpirun(ranks, args, Duration::from_secs(300));
    let log = text(&out);
    assert!(out.status.success(), "{ranks} ranks {args:?} failed ({:?}):\n{log}", out.status);
    assert!(log.contains(" 0 failures over all ranks"), "no summary line:\n{log}");
    eprintln!("{ranks} ranks {args:?}: {took:.1?}");
    log
}

#[test]
fn two_ranks_one_node() {
    expect_pass(2, &["--suite", "bounds", "--nodes", "1"]);
}

#[test]
fn two_ranks_two_nodes() {
    expect_pass(2, &["--suite", "bounds", "--nodes", "2"]);
}

#[test]
fn four_ranks_one_node() {
    expect_pass(4, &["--suite", "bounds", "--nodes", "1"]);
}

#[test]
fn four_ranks_two_nodes() {
    expect_pass(4, &["--suite", "bounds", "--nodes", "2"]);
}

/// Nodes of 2 + 1 ranks (either order), and 3 + 1 not node-major: the
/// secondary build and the hierarchical reduce-scatter run over the world.
#[test]
fn uneven_node_layouts() {
    for (ranks, map) in [(3, "0,0,1"), (3, "1,0,0"), (4, "0,1,0,0")] {
        expect_pass(ranks, &["--suite", "bounds", "--node-map", map]);
    }
}

/// The bytes on the wire (a count, not a timing): qwZ ≤ 0.52 of the fp16
/// all-gather's (scales included), qgZ-int4 ≤ 0.14 of the fp32
/// reduce-scatter's, one-shot and hierarchical; hpZ's gather crosses no
/// node. The job itself checks the limits; the printed fractions are
/// checked here too.
#[test]
fn wire_fractions() {
    let log = expect_pass(4, &["--suite", "wire", "--nodes", "2"]);
    let fraction = |key: &str| -> f64 {
        let line = log.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no `{key}` line:\n{log}"));
        line[key.len()..].split_whitespace().next().and_then(|v| v.parse().ok()).expect("a fraction")
    };
    let qwz = fraction("wire fraction all-gather qwz:");
    assert!(qwz > 0.5 && qwz <= 0.52, "qwZ: {qwz}");
    for s in ["qgz-int4:", "qgz-int4-hier:"] {
        let f = fraction(&format!("wire fraction reduce-scatter {s}"));
        assert!(f > 0.125 && f <= 0.14, "{s} {f}");
    }
}

fn expect_failure(fault: &str, call: &str, needles: &[&[&str]]) {
    let args = ["--suite", "fault", "--fault", fault, "--fault-call", call, "--nodes", "2", "--timeout", "3"];
    let (out, took) = mpirun(4, &args, Duration::from_secs(60));
    let log = text(&out);
    let code = out.status.code();
    assert_ne!(code, Some(0), "job with a failed rank ({fault}) succeeded:\n{log}");
    assert_ne!(code, Some(124), "job with a failed rank ({fault}) hung until the timeout:\n{log}");
    assert!(took < Duration::from_secs(30), "job with a failed rank ({fault}) took {took:?} to end:\n{log}");
    // Each needle group: at least one of its alternatives.
    for any in needles {
        assert!(any.iter().any(|n| log.contains(n)), "none of {any:?} in the job's output ({fault}):\n{log}");
    }
}

#[test]
fn stalled_rank_in_an_all_gather_is_an_error_naming_it() {
    // Rank 1 stalls in hpZ's gather: its node peer times out there, the
    // other node's ranks in the following qwZ all-gather.
    expect_failure(
        "stall",
        "2",
        &[&["stalling"], &["hpZ qwZ all-gather: rank", "qwZ all-gather: rank"], &["did not complete within 3.0s"]],
    );
}

#[test]
fn stalled_rank_in_a_reduce_scatter_is_an_error_naming_it() {
    expect_failure(
        "stall",
        "4",
        &[&["stalling"], &["qgZ hierarchical reduce-scatter: rank"], &["did not complete within 3.0s"]],
    );
}

#[test]
fn dead_rank_ends_the_job() {
    expect_failure(
        "exit",
        "3",
        &[&["rank 1: injected fault: exiting abruptly inside all_gather_v"], &["terminated by the launcher during"]],
    );
}
