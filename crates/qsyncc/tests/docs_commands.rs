//! Every command a page of `docs/` shows in a code block runs, as written,
//! the way `readme_commands.rs` runs the README's: in page order, from the
//! repository root, this build's `qsyncc` first on `PATH`, one shell session
//! per page (a command sees what the ones before it exported and wrote),
//! and exits 0; a ```console transcript prints exactly what the page shows.
//! What cannot run here is in `SKIP` with the reason, and what covers it
//! instead. One test per page, so a failure names its page; the pages write
//! under `target/` only. The synopses of docs/cli.md (```text, with
//! placeholders) are checked against each command's `--help` instead.

mod doc_commands;
use doc_commands::{root, shown, Session};

/// Commands the docs show that these tests do not run: (page, command, why
/// and what runs instead). Every entry must still be on its page (a stale
/// entry fails), and the scripts and files it names must exist.
const SKIP: &[(&str, &str, &str)] = &[
    (
        "calibration.md",
        "cargo build --release -p qsyncc && taskset -c 0 target/release/qsyncc host-kernels --threads 1 --elements 16777216 -o crates/sim/data/host-kernels.json",
        "rewrites the built-in host measurement, a tracked file, with this machine's timings (a release build \
         first); qsync-sim's the_built_in_host_is_the_committed_measurement checks the committed file, and \
         tests/cluster.rs's host_kernels_* tests run the command itself",
    ),
    (
        "calibration.md",
        "scripts/gpu-measure.sh prepare      # here: models at a symbolic batch, target/gpu-measure/worklist.json",
        "builds qsyncc with cargo (features full) unless $QSYNCC names one, then rebatches every shared model \
         (~30 s); tests/gpu_measure.rs runs `scripts/gpu-measure.sh prepare DIR` with QSYNCC set to this build \
         and checks the worklist it writes",
    ),
    (
        "calibration.md",
        "scripts/gpu-measure.sh run          # on the GPU machine (carry target/gpu-measure): ops.json, iterations.json",
        "needs an NVIDIA GPU and PyTorch with CUDA; tests/gpu_measure.rs feeds the step after it synthetic \
         measurements instead",
    ),
    (
        "calibration.md",
        "scripts/gpu-measure.sh analyze      # here: table.md, results.json, profile-full.json",
        "reads what `run` measured on a GPU; tests/gpu_measure.rs runs scripts/gpu/analyze.py on synthetic \
         measurements of a hidden device and checks it recovers that device",
    ),
    (
        "python.md",
        "pip install maturin && cd crates/python && maturin build --release -o ../../target/wheels && pip install ../../target/wheels/qsync-*.whl",
        "installs maturin and the package into the user's Python, outside the repository, and a release build \
         of the extension takes minutes; tests/python.rs builds the same wheel with maturin and installs it with \
         pip (the README's test skips the same command)",
    ),
    (
        "python.md",
        "python examples/train_ddp.py plan --model transformer --targets v100:2,t4:2 --batch 8 -o target/ddp-plan",
        "needs PyTorch (the environment scripts/setup.sh makes) to export the model; tests/python.rs \
         ddp_transformer_joint_plan_every_scheme runs `train_ddp.py plan --model transformer --targets \
         v100:2,t4:2 --batch 8 -o DIR` in that environment",
    ),
    (
        "runtime.md",
        "OMP_NUM_THREADS=1 torchrun --nproc-per-node 4 scripts/bench/transport.py",
        "a benchmark (timings, nothing to assert) that needs PyTorch and the wheel installed into its \
         environment; tests/python.rs runs the same GradSync over TorchTransport under torchrun for every \
         scheme (ddp_transformer_joint_plan_every_scheme, across_nodes) and python_groups.rs the uneven \
         all-gathers of a hierarchical hook",
    ),
    (
        "python.md",
        "torchrun --standalone --nproc-per-node 4 examples/train_ddp.py train --plan target/ddp-plan --steps 5",
        "needs PyTorch and the wheel installed into its environment, and four ranks take ~30 s; tests/python.rs \
         ddp_transformer_joint_plan_every_scheme runs `torchrun --standalone --nproc-per-node 4 \
         examples/train_ddp.py train --model transformer --plan DIR` on that plan, the replicas identical \
         after every step",
    ),
    (
        "results.md",
        "torchrun --standalone --nproc-per-node 4 examples/train_ddp.py bench --model resnet18 --hooks ddp,torch-fp16,fp16,qgz-int8,qgz-int4,nbit-2 --reps 5",
        "a measurement (ResNet-18 on four CPU ranks, every hook five times: minutes) needing PyTorch; \
         tests/python.rs hook_bench_times_each_hook_against_ddp_in_one_job runs the same `train_ddp.py bench` \
         on the small transformer with two repetitions",
    ),
    (
        "runtime.md",
        "cargo test -p qsync-runtime        # 4 and 8 ranks × 1 and 2 nodes, kill/panic/stall, digests",
        "one of the test suite's own crates, which scripts/test.sh (`cargo test --workspace`) runs",
    ),
    (
        "runtime.md",
        "cargo test -p qsyncc --test syncbench",
        "one of the test suite's own tests, which scripts/test.sh (`cargo test --workspace`) runs",
    ),
    (
        "runtime.md",
        "scripts/sync-bench.sh 4M           # every scheme on 4 and 8 ranks, a table",
        "22 mpirun jobs of up to 8 ranks, about a minute of two cores' time for a benchmark table; \
         tests/syncbench.rs the_table_script_runs_narrowed runs the same script narrowed to two schemes \
         on 4 ranks (SYNC_BENCH_SCHEMES, SYNC_BENCH_RANKS), and wire_fractions_errors_and_agreement_at_eight_ranks \
         runs 8-rank jobs of its schemes",
    ),
    (
        "runtime.md",
        "cargo test -p qsync-runtime --test shard_jobs      # bounds, agreement, NaN/inf, faults, 2–4 ranks",
        "one of the test suite's own tests, which scripts/test.sh (`cargo test --workspace`) runs",
    ),
    (
        "runtime.md",
        "scripts/gpu-sync-check.sh prepare     # here: NCCL-only build + MPI reference digests",
        "a release build of qsync-sync-check with only the `nccl` feature and of the PTX kernels (minutes, LLVM); \
         runtime/tests/mpi_jobs.rs recorded_digests_are_reproduced_and_a_changed_one_fails records and \
         checks the same `digests` suite under mpirun",
    ),
    (
        "runtime.md",
        "scripts/gpu-sync-check.sh run         # on the GPU machine (carry target/gpu-sync-check)",
        "needs an NVIDIA GPU and NCCL; runtime/tests check NCCL's absence is reported (LibraryMissing) and run \
         2-rank NCCL jobs where a GPU and NCCL exist",
    ),
    (
        "planner.md",
        "python3 scripts/gen_llama.py --size 7b -o target/llama/llama-7b.onnx",
        "the llama-commands block: tests/llama.rs the_documented_llama_commands_run_as_written runs its four \
         commands as written and checks what they print (the fourth is refused, which a command here may not be)",
    ),
    (
        "planner.md",
        "qsyncc inspect target/llama/llama-7b.onnx --batch 1 --dim seq=2048",
        "the llama-commands block: run as written by tests/llama.rs the_documented_llama_commands_run_as_written",
    ),
    (
        "planner.md",
        "qsyncc target/llama/llama-7b.onnx --targets a100-80gb:8,t4:16 --batch 1 --dim seq=2048 -o target/llama/plan-7b",
        "the llama-commands block: run as written by tests/llama.rs the_documented_llama_commands_run_as_written",
    ),
    (
        "planner.md",
        "qsyncc target/llama/llama-7b.onnx --targets t4:4 --batch 1 --dim seq=2048 -o target/llama/plan-7b-t4",
        "shown as refused (the model does not fit four T4s), so it exits 2: tests/llama.rs \
         the_documented_llama_commands_run_as_written runs it as written and checks the refusal the page quotes",
    ),
    (
        "validation.md",
        "scripts/validate.sh",
        "root, network namespaces and tc-shaped links, PyTorch, and about 30 minutes of measurement; \
         tests/netcluster.rs runs sync-bench across the same scripts/netcluster.sh cluster where root and \
         `ip netns` exist",
    ),
    (
        "validation-compute.md",
        "scripts/validate-compute.sh",
        "about 12 minutes of PyTorch measurement on the CPU; tests/gpu_measure.rs runs the same pipeline's \
         steps (the worklist, `qsyncc profile build`, scripts/gpu/analyze.py) on synthetic measurements",
    ),
];

/// Every page of `docs/`, each with its test below.
const PAGES: &[&str] = &[
    "accuracy.md",
    "calibration.md",
    "cli.md",
    "codegen.md",
    "experiments.md",
    "passes.md",
    "plan-directory.md",
    "planner.md",
    "python.md",
    "results.md",
    "robustness.md",
    "runtime.md",
    "validation-compute.md",
    "validation.md",
];

fn page(name: &str) -> String {
    std::fs::read_to_string(root().join("docs").join(name)).unwrap_or_else(|e| panic!("docs/{name}: {e}"))
}

fn skipped(page: &str, cmd: &str) -> bool {
    SKIP.iter().any(|(p, c, _)| *p == page && *c == cmd)
}

/// Runs what `docs/NAME` shows, in order, but the skipped commands.
fn run_page(name: &str) {
    assert!(PAGES.contains(&name), "{name} is not in PAGES");
    let session = Session::new(&format!("docs/{name}"));
    for s in shown(&page(name)) {
        if !skipped(name, s.command()) {
            session.play(&s);
        }
    }
}

macro_rules! pages {
    ($($test:ident => $name:literal,)*) => {
        $(#[test] fn $test() { run_page($name); })*
        const TESTED: &[&str] = &[$($name),*];
    };
}

pages! {
    accuracy_md => "accuracy.md",
    calibration_md => "calibration.md",
    cli_md => "cli.md",
    codegen_md => "codegen.md",
    experiments_md => "experiments.md",
    passes_md => "passes.md",
    plan_directory_md => "plan-directory.md",
    planner_md => "planner.md",
    python_md => "python.md",
    results_md => "results.md",
    robustness_md => "robustness.md",
    runtime_md => "runtime.md",
    validation_compute_md => "validation-compute.md",
    validation_md => "validation.md",
}

#[test]
fn every_page_of_docs_has_its_test() {
    let mut found: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    found.sort();
    assert_eq!(found, PAGES, "docs/ and PAGES differ: a new page needs its line in PAGES and in pages! below");
    assert_eq!(TESTED, PAGES, "every page in PAGES has its test in pages!");
}

/// A skipped command is still shown on its page, and what it names exists:
/// the scripts, examples and files it runs or reads (a skipped command can
/// drift too).
#[test]
fn every_skipped_command_is_shown_and_names_what_exists() {
    for (name, cmd, why) in SKIP {
        assert!(!why.trim().is_empty(), "{name}: `{cmd}` is skipped without a reason");
        let cmds: Vec<String> = shown(&page(name)).iter().map(|s| s.command().to_string()).collect();
        assert!(cmds.iter().any(|c| c == cmd), "SKIP lists `{cmd}`, which docs/{name} no longer shows: {cmds:?}");
        for word in cmd.split_whitespace().take_while(|w| !w.starts_with('#')) {
            if ["scripts/", "examples/", "crates/"].iter().any(|p| word.starts_with(p)) {
                let p = root().join(word);
                assert!(p.exists(), "docs/{name}: `{cmd}` names {word}, which does not exist");
                if word.ends_with(".sh") {
                    let st = std::process::Command::new("bash").arg("-n").arg(&p).status().expect("bash -n");
                    assert!(st.success(), "docs/{name}: `{cmd}`: {word} does not parse (bash -n)");
                }
            }
        }
    }
}

/// A page is one reader's shell: what a command exports and the folder it
/// changes to hold for the commands after it; a transcript's command may
/// fail, and its status does not stop the page.
#[test]
fn a_session_carries_exports_and_the_folder() {
    let s = Session::new("session-check");
    s.run("export QSYNC_DOC_CHECK=carried && cd crates/qsyncc");
    s.run("test \"$QSYNC_DOC_CHECK\" = carried && test -f Cargo.toml");
    s.transcript("echo printed; echo to-stderr >&2; false", "printed\nto-stderr\n");
    s.run("test -f Cargo.toml");
}

/// The synopses docs/cli.md shows (```text lines starting with `qsyncc`,
/// indented lines continuing them) are not run, having placeholders, but
/// every `--flag` in one is a flag of that command's `--help`.
#[test]
fn cli_synopses_name_only_flags_their_command_has() {
    let md = page("cli.md");
    let mut synopses: Vec<String> = Vec::new();
    let mut in_text = false;
    for line in md.lines() {
        if let Some(lang) = line.strip_prefix("```") {
            in_text = !in_text && lang.trim() == "text";
            continue;
        }
        if !in_text {
            continue;
        }
        match synopses.last_mut() {
            Some(last) if line.starts_with(' ') => last.push_str(line),
            _ if line.starts_with("qsyncc ") => synopses.push(line.to_string()),
            _ => {}
        }
    }
    assert!(synopses.len() >= 8, "docs/cli.md's synopses: {synopses:?}");
    let commands = ["inspect", "opt", "simulate", "profile", "codegen", "sync-bench"];
    for synopsis in &synopses {
        let words: Vec<&str> = synopsis.split(|c: char| c.is_whitespace() || "[]|".contains(c)).collect();
        let sub = words.get(1).filter(|w| commands.contains(w)).copied().unwrap_or("plan");
        let help =
            std::process::Command::new(env!("CARGO_BIN_EXE_qsyncc")).args([sub, "--help"]).output().expect("help");
        assert!(help.status.success(), "qsyncc {sub} --help: {}", String::from_utf8_lossy(&help.stderr));
        let help = String::from_utf8_lossy(&help.stdout);
        for flag in words.iter().take_while(|w| !w.starts_with('#')).filter(|w| w.starts_with("--")) {
            let flag = flag.split('=').next().unwrap_or(flag);
            assert!(
                help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).any(|w| w == flag),
                "docs/cli.md: `{synopsis}` shows {flag}, which `qsyncc {sub} --help` does not list"
            );
        }
    }
}
