//! The whole plan command in process (`qsyncc::planner::run`: import, UP,
//! greedy, ours, DBS, materialize + `egraph-casts` per device type, write the
//! plan directory) on generated GPT-style training graphs
//! (`scripts/gen_gpt.py`, no downloads) for 1,024 GPUs of four types
//! (`h100-sxm:256,a100-80gb:256,l4:256,t4:256`), batch 1, seq 128.
//!
//! The 2k-node graph (48 layers, hidden 768, 1,932 nodes) always runs. The
//! 10k-node one (256 layers, hidden 256, 10,252 nodes) runs with
//! `QSYNC_BENCH_10K=1`: its allocator phases take minutes per plan today, so
//! ten samples would hold CI for most of an hour.
//!
//! `llama7b/32-gpus-3-types`: the Llama 2 7B of `scripts/gen_llama.py --size
//! 7b` (32 layers, 560 nodes) for `h100-sxm:8,a100-80gb:8,t4:16`, batch 1,
//! seq 2048: no device holds it data-parallel, so the plan is sharded.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use clap::Parser;
use criterion::{criterion_group, criterion_main, Criterion};
use qsyncc::planner::{run, PlanArgs};

/// Generate (or reuse) `gpt-{layers}x{hidden}.onnx`.
fn generated(layers: u32, hidden: u32, heads: u32) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("gpt-{layers}x{hidden}.onnx"));
    if !out.is_file() {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gen_gpt.py");
        let (l, h, n) = (layers.to_string(), hidden.to_string(), heads.to_string());
        let o = Command::new("python3")
            .arg(script)
            .args(["-o", out.to_str().expect("utf8"), "--layers", &l, "--hidden", &h, "--heads", &n])
            .output()
            .expect("python3 runs scripts/gen_gpt.py (scripts/setup.sh installs onnx)");
        assert!(o.status.success(), "gen_gpt.py: {}", String::from_utf8_lossy(&o.stderr));
    }
    out
}

/// Generate (or reuse) `llama-{size}.onnx`.
fn generated_llama(size: &str) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("llama-{size}.onnx"));
    if !out.is_file() {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gen_llama.py");
        let o = Command::new("python3")
            .arg(script)
            .args(["--size", size, "-o", out.to_str().expect("utf8")])
            .output()
            .expect("python3 runs scripts/gen_llama.py (scripts/setup.sh installs onnx)");
        assert!(o.status.success(), "gen_llama.py: {}", String::from_utf8_lossy(&o.stderr));
    }
    out
}

fn bench_llama(c: &mut Criterion) {
    let model = generated_llama("7b");
    let out = std::env::temp_dir().join(format!("qsyncc-bench-plan-llama-{}", std::process::id()));
    let args = PlanArgs::parse_from([
        "qsyncc",
        model.to_str().expect("utf8"),
        "--targets",
        "h100-sxm:8,a100-80gb:8,t4:16",
        "--batch",
        "1",
        "--dim",
        "seq=2048",
        "-o",
        out.to_str().expect("utf8"),
        "--json",
    ]);
    let mut g = c.benchmark_group("plan-scale");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("llama7b/32-gpus-3-types", |b| b.iter(|| run(&args).expect("plan")));
    g.finish();
    let _ = std::fs::remove_dir_all(&out);
}

fn bench(c: &mut Criterion) {
    let mut sizes = vec![(48, 768, 12)];
    if std::env::var("QSYNC_BENCH_10K").is_ok_and(|v| v == "1") {
        sizes.push((256, 256, 4));
    }
    for (layers, hidden, heads) in sizes {
        let model = generated(layers, hidden, heads);
        let out = std::env::temp_dir().join(format!("qsyncc-bench-plan-scale-{layers}-{}", std::process::id()));
        let args = PlanArgs::parse_from([
            "qsyncc",
            model.to_str().expect("utf8"),
            "--targets",
            "h100-sxm:256,a100-80gb:256,l4:256,t4:256",
            "--batch",
            "1",
            "--dim",
            "seq=128",
            "-o",
            out.to_str().expect("utf8"),
            "--json",
        ]);
        let mut g = c.benchmark_group("plan-scale");
        g.sample_size(10).measurement_time(Duration::from_secs(30));
        g.bench_function(format!("gpt{layers}x{hidden}/4x256-gpus"), |b| b.iter(|| run(&args).expect("plan")));
        g.finish();
        let _ = std::fs::remove_dir_all(&out);
    }
}

criterion_group!(benches, bench, bench_llama);
criterion_main!(benches);
