//! `egraph-casts` on generated GPT-style training graphs (`scripts/gen_gpt.py`,
//! no downloads) at about 2k and 10k nodes — 48 layers (hidden 768, 1,932
//! nodes) and 256 layers (hidden 256, 10,252 nodes) — after `amp`, target
//! t4, batch 1, seq 128: the pass should grow about linearly in the graph.
//! The graphs are generated once into Cargo's target tmpdir (Python with
//! the `onnx` package, which `scripts/setup.sh` installs).

use std::path::PathBuf;
use std::process::Command;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use qsync_ir::infer::InferOptions;
use qsync_passes::{pipeline_from_spec, PassContext};

/// Generate (or reuse) `gpt-{layers}x{hidden}.onnx`.
fn generated(layers: u32, hidden: u32, heads: u32) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("gpt-{layers}x{hidden}.onnx"));
    if !out.is_file() {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/gen_gpt.py");
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
    for (layers, hidden, heads) in [(48, 768, 12), (256, 256, 4)] {
        let path = generated(layers, hidden, heads);
        let mut m = qsync_onnx::import_file(&path).expect("import");
        let cx = || PassContext {
            target: Some("t4".into()),
            infer: InferOptions { batch: Some(1), dims: [("seq".to_string(), 128)].into_iter().collect() },
            ..PassContext::default()
        };
        pipeline_from_spec("infer-shapes,amp").expect("spec").run(&mut m, &mut cx()).expect("plan");
        let mut pm = pipeline_from_spec("egraph-casts").expect("spec");
        pm.verify_each(false);
        let nodes = m.graph.node_count();
        let mut g = c.benchmark_group("egraph-casts-scale");
        g.sample_size(10);
        g.bench_function(format!("gpt{layers}x{hidden}/{nodes}-nodes-after-amp"), |b| {
            b.iter_batched(
                || m.clone(),
                |mut m| {
                    pm.run(&mut m, &mut cx()).expect("pass");
                    m
                },
                BatchSize::LargeInput,
            );
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
