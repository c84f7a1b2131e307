//! Import of `bert_tiny.pt` (archive read, pickles, code parse, lowering,
//! shape inference). Budget: under 100 ms in release.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};

fn bench(c: &mut Criterion) {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/bert_tiny.pt");
    let Ok(bytes) = std::fs::read(&p) else {
        eprintln!("skipping: {} not found", p.display());
        return;
    };
    c.bench_function("import bert_tiny.pt", |b| {
        b.iter(|| {
            qsync_torchscript::import_bytes(black_box(&bytes), "bert_tiny.pt", &[]).map(|(m, _)| m.graph.node_count())
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
