//! The whole planner (budget: under 2 s) in process: import
//! `bert_base_train.onnx`, plan `v100:16,t4:16` (UP, greedy, ours, DBS,
//! egraph-casts on each device graph) and write the plan directory to a
//! temporary folder — `qsyncc::planner::run`, what `qsyncc MODEL --targets
//! v100:16,t4:16 -o DIR --json` does minus process start.
//!
//! Measured once (release, a shared 2-core machine, criterion median of 10):
//! median 130 ms (CI 127.7–132.8 ms), budget 2 s.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use criterion::{criterion_group, criterion_main, Criterion};
use qsyncc::planner::{run, PlanArgs};

fn bench(c: &mut Criterion) {
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/bert_base_train.onnx");
    let out = std::env::temp_dir().join(format!("qsyncc-bench-planner-{}", std::process::id()));
    let args = PlanArgs::parse_from([
        "qsyncc",
        model.to_str().expect("utf8"),
        "--targets",
        "v100:16,t4:16",
        "-o",
        out.to_str().expect("utf8"),
        "--json",
    ]);
    let mut g = c.benchmark_group("planner");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("bert_base_v100x16_t4x16", |b| b.iter(|| run(&args).expect("plan")));
    g.finish();
    let _ = std::fs::remove_dir_all(&out);
}

criterion_group!(benches, bench);
criterion_main!(benches);
