//! Every command the README shows in a code block runs, as written, from the
//! repository root, and exits 0 — or is in `SKIP` below with the reason it
//! cannot run here. `qsyncc` in a command is this build's binary (its folder
//! is put first on `PATH`), as `cargo install --path crates/qsyncc` would
//! put it. Commands run in README order, so later ones may read what earlier
//! ones wrote (`target/example-plan`).

use std::path::{Path, PathBuf};
use std::process::Command;

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
        "cd crates/python && maturin build --release -o ../../target/wheels && pip install ../../target/wheels/qsync-*.whl",
        "needs the PyTorch environment scripts/setup.sh makes (a network download on first run), a release \
         build of the extension takes minutes, and pip would reinstall the package under the Python tests; \
         tests/python.rs builds the same wheel with maturin and installs it with pip",
    ),
    (
        "scripts/test.sh",
        "runs the whole test suite, this test included; it is CI's own command",
    ),
];

/// The README's code blocks: indented by four spaces after a blank line, or
/// fenced with ``` (sh, bash, shell, console or no language). A line ending
/// in `\` continues on the next.
fn code_blocks(readme: &str) -> Vec<String> {
    let mut cmds = Vec::new();
    let mut fenced: Option<bool> = None; // Some(is_shell) inside a fence
    let mut prev_blank = true;
    let mut in_indented = false;
    let mut pending = String::new();
    let mut push = |line: &str, cmds: &mut Vec<String>| {
        let line = line.trim();
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head.trim_end());
            pending.push(' ');
            return;
        }
        pending.push_str(line);
        let cmd = std::mem::take(&mut pending).trim().to_string();
        if !cmd.is_empty() && !cmd.starts_with('#') {
            cmds.push(cmd);
        }
    };
    for line in readme.lines() {
        if let Some(shell) = fenced {
            if line.trim_start().starts_with("```") {
                fenced = None;
            } else if shell {
                push(line, &mut cmds);
            }
            continue;
        }
        if let Some(lang) = line.trim_start().strip_prefix("```") {
            fenced = Some(matches!(lang.trim(), "" | "sh" | "bash" | "shell" | "console"));
            in_indented = false;
            continue;
        }
        if line.starts_with("    ") && (prev_blank || in_indented) {
            in_indented = true;
            push(line, &mut cmds);
        } else if !line.trim().is_empty() {
            in_indented = false;
        }
        prev_blank = line.trim().is_empty();
    }
    cmds
}

fn run(root: &Path, path: &str, cmd: &str) {
    let t = std::time::Instant::now();
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", cmd])
        .current_dir(root)
        .env("PATH", path)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: bash: {e}"));
    assert!(
        out.status.success(),
        "README command failed ({}): {cmd}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("ok ({:.1} s): {cmd}", t.elapsed().as_secs_f64());
}

#[test]
fn every_readme_command_runs_as_written() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("root");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let cmds = code_blocks(&readme);
    assert!(cmds.iter().any(|c| c == "scripts/example.sh"), "the README shows the main job: {cmds:?}");
    for (skipped, why) in SKIP {
        assert!(!why.is_empty());
        assert!(
            cmds.iter().any(|c| c == skipped),
            "SKIP lists `{skipped}`, which the README no longer shows: {cmds:?}"
        );
    }
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_qsyncc")).parent().expect("bin dir").to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin_dir).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .expect("PATH");
    let path = path.to_str().expect("PATH is UTF-8").to_string();
    let mut ran = 0;
    for cmd in &cmds {
        if SKIP.iter().any(|(s, _)| s == cmd) {
            continue;
        }
        run(&root, &path, cmd);
        ran += 1;
    }
    assert!(ran >= 3, "at least the main job and the worked example run: {cmds:?}");
}

#[test]
fn code_blocks_are_found_as_the_readme_writes_them() {
    let md = "text\n\n    cmd one\n    cmd \\\n        two\n\nprose\n    not code\n\n```sh\nthree\n```\n```text\nnot a command\n```\n";
    assert_eq!(code_blocks(md), ["cmd one", "cmd two", "three"]);
}
