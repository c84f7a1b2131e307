//! The commands README.md and docs/*.md show in code blocks, and a shell
//! session that runs them as a reader would: in document order, from the
//! repository root, this build's `qsyncc` first on `PATH`, each command
//! seeing the variables the ones before it exported and the folder they
//! changed to.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// One thing a page shows to type.
#[derive(Debug, PartialEq)]
pub enum Shown {
    /// A shell command, which must exit 0.
    Command(String),
    /// A `$ command` of a ```console block and the lines after it: what the
    /// command prints (stdout and stderr together), exit status aside.
    Transcript { command: String, output: String },
}

impl Shown {
    pub fn command(&self) -> &str {
        match self {
            Shown::Command(c) | Shown::Transcript { command: c, .. } => c,
        }
    }
}

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// What a page shows to type, in page order. Shell code blocks are indented
/// by four spaces after a blank line, or fenced with ``` (sh, bash, shell or
/// no language); in them a line ending in `\` continues on the next and a
/// line starting with `#` is a comment. A ```console block is transcripts:
/// `$ command` lines, each followed by its output. Other languages (text,
/// python, json, toml …) are not commands.
pub fn shown(md: &str) -> Vec<Shown> {
    #[derive(Clone, Copy, PartialEq)]
    enum Fence {
        Shell,
        Console,
        Other,
    }
    let mut out = Vec::new();
    let mut fenced: Option<Fence> = None;
    let mut prev_blank = true;
    let mut in_indented = false;
    let mut pending = String::new();
    let mut push = |line: &str, out: &mut Vec<Shown>| {
        let line = line.trim();
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head.trim_end());
            pending.push(' ');
            return;
        }
        pending.push_str(line);
        let cmd = std::mem::take(&mut pending).trim().to_string();
        if !cmd.is_empty() && !cmd.starts_with('#') {
            out.push(Shown::Command(cmd));
        }
    };
    for line in md.lines() {
        if let Some(fence) = fenced {
            if line.trim_start().starts_with("```") {
                fenced = None;
            } else if fence == Fence::Shell {
                push(line, &mut out);
            } else if fence == Fence::Console {
                if let Some(cmd) = line.strip_prefix("$ ") {
                    out.push(Shown::Transcript { command: cmd.trim().to_string(), output: String::new() });
                } else if let Some(Shown::Transcript { output, .. }) = out.last_mut() {
                    output.push_str(line);
                    output.push('\n');
                } else {
                    panic!("a ```console block starts with output, not a `$ ` command: {line}");
                }
            }
            continue;
        }
        if let Some(lang) = line.trim_start().strip_prefix("```") {
            fenced = Some(match lang.trim() {
                "" | "sh" | "bash" | "shell" => Fence::Shell,
                "console" => Fence::Console,
                _ => Fence::Other,
            });
            in_indented = false;
            continue;
        }
        if line.starts_with("    ") && (prev_blank || in_indented) {
            in_indented = true;
            push(line, &mut out);
        } else if !line.trim().is_empty() {
            in_indented = false;
        }
        prev_blank = line.trim().is_empty();
    }
    out
}

/// The shell commands of [`shown`] (transcripts' commands included).
pub fn code_blocks(md: &str) -> Vec<String> {
    shown(md).iter().map(|s| s.command().to_string()).collect()
}

/// One reader's shell: commands run one after another, each in its own
/// `bash`, carrying the exported variables and the working folder from
/// one to the next (kept in a scratch folder under the test target dir).
pub struct Session {
    page: String,
    state: PathBuf,
    path: String,
}

impl Session {
    /// A fresh session in the repository root for `page` (a name for
    /// messages and for the scratch folder).
    pub fn new(page: &str) -> Session {
        let state = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("doc-commands").join(page.replace(['/', '.'], "_"));
        let _ = std::fs::remove_dir_all(&state);
        std::fs::create_dir_all(&state).expect("session folder");
        std::fs::write(state.join("env"), "").expect("session env");
        std::fs::write(state.join("cwd"), root().to_str().expect("root is UTF-8")).expect("session cwd");
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_qsyncc")).parent().expect("bin dir").to_path_buf();
        let path = std::env::join_paths(
            std::iter::once(bin_dir).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
        )
        .expect("PATH");
        Session { page: page.to_string(), state, path: path.to_str().expect("PATH is UTF-8").to_string() }
    }

    fn exec(&self, cmd: &str, strict: bool) -> Output {
        let cwd = std::fs::read_to_string(self.state.join("cwd")).expect("session cwd");
        // The state is saved whatever the command's status, which is the
        // script's: a transcript's command may fail, and says so.
        let script = [
            if strict { "set -euo pipefail" } else { "exec 2>&1" },
            ". \"$QSYNC_DOC_STATE/env\"",
            cmd,
            "qsync_doc_status=$?",
            "(unset PWD OLDPWD SHLVL QSYNC_DOC_STATE; export -p) > \"$QSYNC_DOC_STATE/env\"",
            "pwd > \"$QSYNC_DOC_STATE/cwd\"",
            "exit $qsync_doc_status",
        ]
        .join("\n");
        Command::new("bash")
            .args(["-c", &script])
            .current_dir(cwd.trim_end())
            .env("PATH", &self.path)
            .env("QSYNC_DOC_STATE", &self.state)
            // The scripts' overrides: a shown command runs what `PATH` finds.
            .env_remove("QSYNCC")
            .env_remove("QSYNC_MODELS")
            .output()
            .unwrap_or_else(|e| panic!("{cmd}: bash: {e}"))
    }

    /// Runs a command, which must exit 0.
    pub fn run(&self, cmd: &str) {
        let t = std::time::Instant::now();
        let out = self.exec(cmd, true);
        assert!(
            out.status.success(),
            "{}: command failed ({}): {cmd}\nstdout:\n{}\nstderr:\n{}",
            self.page,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{}: ok ({:.1} s): {cmd}", self.page, t.elapsed().as_secs_f64());
    }

    /// Runs a transcript's command: it must print what the page shows.
    pub fn transcript(&self, cmd: &str, shown: &str) {
        let t = std::time::Instant::now();
        let out = self.exec(cmd, false);
        let printed = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            printed, shown,
            "{}: `$ {cmd}` ({}) prints what is on the left, the page shows what is on the right",
            self.page, out.status
        );
        eprintln!("{}: ok ({:.1} s): $ {cmd}", self.page, t.elapsed().as_secs_f64());
    }

    /// Runs what the page shows, in order.
    pub fn play(&self, shown: &Shown) {
        match shown {
            Shown::Command(c) => self.run(c),
            Shown::Transcript { command, output } => self.transcript(command, output),
        }
    }
}
