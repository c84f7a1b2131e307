//! Planning a transformer that data parallelism cannot hold: a GPT-style
//! graph of 24 layers at hidden 2048 (`scripts/gen_gpt.py`: 972 nodes,
//! 1.2B parameters, 19 GiB of FP32 weights, gradients and Adam state a
//! device) on `v100:8,t4:8`, batch 4, seq 1024. Every DDP method fails for
//! memory; the sharded search (FSDP baselines, stage × hpZ × uneven shares
//! × checkpointing × batch split) finds the plan. The whole pipeline in
//! process (`qsyncc::planner::plan`: import, every method, materialize and
//! `egraph-casts` per device type), without writing the directory.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use qsyncc::planner::{plan, PlanRequest};

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

fn bench(c: &mut Criterion) {
    let model = generated(24, 2048, 16);
    let mut req = PlanRequest::new(model, "v100:8,t4:8".parse::<qsyncc::planner::Targets>().expect("targets"));
    req.batch = 4;
    req.dims = vec![("seq".to_string(), 1024)];
    let planned = plan(&req).expect("plan");
    assert_eq!(planned.outcome.chosen, "sharded", "DDP cannot hold the model: the plan is sharded");
    let mut g = c.benchmark_group("plan-sharded");
    g.sample_size(10).measurement_time(Duration::from_secs(30));
    g.bench_function("gpt24x2048/v100x8-t4x8", |b| b.iter(|| plan(&req).expect("plan")));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
