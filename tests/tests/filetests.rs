//! Filetests: each `filetests/**/*.qir` file starts with comment lines that
//! say what to do, then holds a model in text IR:
//!
//! ```text
//! # passes: infer-shapes,fold-constants,dce
//! # bind: batch=4 seq=16          (optional; `batch=N` binds the leading input dim)
//! # expect: error                 (optional; the snapshot is then the error)
//! # target: v100                  (optional; the device planning passes target)
//! # mode: inference               (optional; training by default)
//! # ranges: x=2.54 h=1.5          (optional; calibrated activation absmax by value name)
//! ```
//!
//! The output (printed model, or the error) is checked against an insta
//! snapshot in `tests/snapshots/`; `cargo insta review` blesses changes.

use std::collections::BTreeMap;

use qsync_ir::infer::InferOptions;
use qsync_passes::{pipeline_from_spec, PassContext};

fn run_filetest(src: &str) -> String {
    let mut passes = None;
    let mut opts = InferOptions::default();
    let mut expect_error = false;
    let mut target = None;
    let mut inference = false;
    let mut ranges = qsync_passes::precision::ActivationRanges::default();
    for line in src.lines().take_while(|l| l.starts_with('#')) {
        let body = line.trim_start_matches('#').trim();
        if let Some(p) = body.strip_prefix("passes:") {
            passes = Some(p.trim().to_string());
        } else if let Some(b) = body.strip_prefix("bind:") {
            let mut dims = BTreeMap::new();
            for kv in b.split_whitespace() {
                let (k, v) = kv.split_once('=').expect("bind: NAME=N");
                let v: i64 = v.parse().expect("bind value");
                if k == "batch" {
                    opts.batch = Some(v);
                } else {
                    dims.insert(k.to_string(), v);
                }
            }
            opts.dims = dims;
        } else if let Some(t) = body.strip_prefix("target:") {
            target = Some(t.trim().to_string());
        } else if let Some(r) = body.strip_prefix("ranges:") {
            for kv in r.split_whitespace() {
                let (k, v) = kv.split_once('=').expect("ranges: NAME=ABSMAX");
                assert!(ranges.insert(k, v.parse().expect("range value")), "unusable range {kv}");
            }
        } else if body == "mode: inference" {
            inference = true;
        } else if body == "expect: error" {
            expect_error = true;
        }
    }
    let passes = passes.expect("a filetest needs a `# passes:` line");
    let mut model = match qsync_ir::text::parse_model(src) {
        Ok(m) => m,
        Err(e) if expect_error => return format!("parse error: {e}\n"),
        Err(e) => panic!("parse error: {e}"),
    };
    let mut pm = pipeline_from_spec(&passes).unwrap_or_else(|e| panic!("{e}"));
    pm.verify_each(true);
    let mut cx = PassContext { infer: opts, target, inference, activation_ranges: ranges, ..PassContext::default() };
    match pm.run(&mut model, &mut cx) {
        Ok(_) if expect_error => panic!("expected an error, but the pipeline succeeded"),
        Ok(report) => {
            let mut out = String::new();
            for r in &report.runs {
                out.push_str(&format!("# {}: {}\n", r.pass, r.outcome.summary));
            }
            for w in &cx.warnings {
                out.push_str(&format!("# warning: {w}\n"));
            }
            out + &qsync_ir::text::print_model(&model)
        }
        Err(e) if expect_error => format!("error: {e}\n"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn filetests() {
    let dir = qsync_tests::filetests_dir();
    assert!(dir.is_dir(), "missing {}", dir.display());
    insta::glob!("../filetests", "**/*.qir", |path| {
        let src = std::fs::read_to_string(path).expect("read filetest");
        let out = run_filetest(&src);
        insta::assert_snapshot!(out);
    });
}
