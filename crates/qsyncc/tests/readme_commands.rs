//! Every command the README shows in a code block runs, as written, from the
//! repository root, and exits 0 — or is in `SKIP` below with the reason it
//! cannot run here. `qsyncc` in a command is this build's binary (its folder
//! is put first on `PATH`), as `cargo install --path crates/qsyncc` would
//! put it. Commands run in README order, so later ones may read what earlier
//! ones wrote (`target/example-plan`).

mod doc_commands;
use doc_commands::{code_blocks, root, shown, Session};

/// Commands the README shows that this test does not run, each with why.
/// Every entry must still be in the README (a stale entry fails).
const SKIP: &[(&str, &str)] = &[
    (
        "cargo install --path crates/qsyncc",
        "builds a release qsyncc for minutes and installs it into ~/.cargo/bin, outside the repository; \
         scripts/bare-check.sh (the end of scripts/test.sh) builds and checks that same featureless qsyncc, \
         and scripts/example.sh below runs it",
    ),
    (
        "pip install maturin && cd crates/python && maturin build --release -o ../../target/wheels && pip install ../../target/wheels/qsync-*.whl",
        "installs maturin and the package into the user's Python, outside the repository, and a release build \
         of the extension takes minutes; tests/python.rs builds the same wheel with maturin and installs it with pip",
    ),
    (
        "scripts/test.sh",
        "runs the whole test suite, this test included; it is CI's own command",
    ),
];

#[test]
fn every_readme_command_runs_as_written() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let cmds = code_blocks(&readme);
    assert!(cmds.iter().any(|c| c == "scripts/example.sh"), "the README shows the main job: {cmds:?}");
    for (skipped, why) in SKIP {
        assert!(!why.is_empty());
        assert!(
            cmds.iter().any(|c| c == skipped),
            "SKIP lists `{skipped}`, which the README no longer shows: {cmds:?}"
        );
    }
    let session = Session::new("README.md");
    let mut ran = 0;
    for shown in shown(&readme) {
        if SKIP.iter().any(|(s, _)| *s == shown.command()) {
            continue;
        }
        session.play(&shown);
        ran += 1;
    }
    assert!(ran >= 3, "at least the main job and the worked example run: {cmds:?}");
}

#[test]
fn code_blocks_are_found_as_the_readme_writes_them() {
    let md = "text\n\n    cmd one\n    cmd \\\n        two\n\nprose\n    not code\n\n```sh\nthree\n```\n```text\nnot a command\n```\n\
              ```python\nimport qsync\n```\n```console\n$ four\nprinted\n  and this\n$ five\n```\n";
    assert_eq!(code_blocks(md), ["cmd one", "cmd two", "three", "four", "five"]);
    assert_eq!(
        shown(md)[3],
        doc_commands::Shown::Transcript { command: "four".into(), output: "printed\n  and this\n".into() }
    );
}
