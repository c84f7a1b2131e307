//! Llama-style training graphs from `scripts/gen_llama.py` (1.3B, 2.7B, 7B;
//! weights as absent external data): the frontend counts the published
//! models' parameters, the graphs verify, the bytes are deterministic, and
//! the planner either plans them within every device's memory or refuses
//! naming a device and the memory it would need — never a panic, never a
//! plan over memory.
//!
//! Under data-parallel training every device would hold the whole model
//! and its Adam state, which the T4s of both clusters cannot; the planner
//! shards weights and optimizer state (FSDP / ZeRO-3) and plans all three.
//! Clusters too small for the 7B however it is split must be refused, and a
//! shallow grouped-query variant plans.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{check_plan_dir, inspect_json, qsyncc, stderr, tmpdir};

const GIB: f64 = (1u64 << 30) as f64;

/// Run `gen_llama.py --size SIZE -o OUT EXTRA…`; returns its stdout.
fn generate(size: &str, out: &Path, extra: &[&str]) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gen_llama.py");
    let o = Command::new("python3")
        .arg(script)
        .args(["--size", size, "-o", out.to_str().expect("utf8")])
        .args(extra)
        .output()
        .expect("python3 runs scripts/gen_llama.py (scripts/setup.sh installs onnx)");
    assert!(o.status.success(), "gen_llama.py --size {size} {extra:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Llama parameters: embedding and untied LM head 2·V·d; per layer
/// Q and O 2·d², K and V 2·d·kv·hd, SwiGLU 3·d·f, two RMSNorm gains 2·d;
/// the final norm d; and the rotary `inv_freq` buffer, hd/2 floats, which
/// `inspect` counts with the float initializers.
fn llama_parameters(d: u64, layers: u64, heads: u64, kv: u64, f: u64, v: u64) -> u64 {
    let hd = d / heads;
    2 * v * d + layers * (2 * d * d + 2 * d * kv * hd + 3 * d * f + 2 * d) + d + hd / 2
}

/// (size, its configuration, the published parameter count of the model it
/// copies: Sheared-LLaMA-1.3B, Sheared-LLaMA-2.7B, Llama 2 7B).
/// (hidden, layers, heads, kv heads, ffn, vocab).
type Config = (u64, u64, u64, u64, u64, u64);

const SIZES: [(&str, Config, u64); 3] = [
    ("1.3b", (2048, 24, 16, 16, 5504, 32000), 1_345_423_360),
    ("2.7b", (2560, 32, 20, 20, 6912, 32000), 2_701_560_320),
    ("7b", (4096, 32, 32, 32, 11008, 32000), 6_738_415_616),
];

#[test]
fn generated_llamas_have_the_published_parameter_counts_and_verify() {
    let dir = tmpdir("llama-count");
    for (size, (d, l, h, kv, f, v), published) in SIZES {
        let model = dir.join(format!("llama-{size}.onnx"));
        let printed = generate(size, &model, &[]);
        let s = inspect_json(&model, &["--batch", "2", "--dim", "seq=64"]);
        let counted = s["parameters"].as_u64().expect("parameters");
        let expected = llama_parameters(d, l, h, kv, f, v);
        assert_eq!(counted, expected, "{size}: inspect's parameter count");
        let off = (counted as f64 - published as f64).abs() / published as f64;
        assert!(off < 0.02, "{size}: {counted} parameters, {:.2}% from the published {published}", off * 100.0);
        assert!(
            printed.contains(&format!("{} parameters", thousands(expected))),
            "{size}: the script prints {printed}"
        );
        // 17 nodes a layer, 16 around them; every value typed.
        assert_eq!(s["onnx_nodes"].as_u64(), Some(17 * l + 16), "{size}: node count");
        assert_eq!(s["unknown_shapes"].as_u64(), Some(0), "{size}: every shape inferred");
        let o = qsyncc(&[
            "opt",
            model.to_str().expect("utf8"),
            "--passes",
            "infer-shapes,verify",
            "--batch",
            "2",
            "--dim",
            "seq=64",
        ]);
        assert!(o.status.success(), "{size}: opt --passes infer-shapes,verify: {}", stderr(&o));
    }
    // The 7B by hand: 2·32000·4096 + 32·(2·4096² + 2·4096·32·128 + 3·4096·11008
    // + 2·4096) + 4096 + 128/2 = 262,144,000 + 32·202,383,360 + 4,160.
    assert_eq!(262_144_000 + 32 * 202_383_360 + 4_160, 6_738_415_680u64);
    assert_eq!(llama_parameters(4096, 32, 32, 32, 11008, 32000), 6_738_415_680);
    // Deterministic: the same arguments give the same bytes.
    // (The file name is an argument: the external data is `NAME.data`.)
    let (a, b) = (dir.join("a/gqa.onnx"), dir.join("b/gqa.onnx"));
    generate("1.3b", &a, &["--kv-heads", "4", "--seq", "128"]);
    generate("1.3b", &b, &["--kv-heads", "4", "--seq", "128"]);
    assert!(std::fs::read(&a).expect("a") == std::fs::read(&b).expect("b"), "gen_llama.py is not deterministic");
    // Grouped-query attention shrinks K and V: 24·2·2048·(2048 − 4·128) fewer.
    let gqa = inspect_json(&a, &["--batch", "1"])["parameters"].as_u64().expect("parameters");
    assert_eq!(gqa, 1_345_423_424 - 24 * 2 * 2048 * (2048 - 4 * 128));
    assert_eq!(gqa, llama_parameters(2048, 24, 16, 4, 5504, 32000));
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The clusters and their devices' memory (GiB, from `crates/cost/devices/`).
const CLUSTERS: [(&str, &[(&str, f64)]); 2] =
    [("v100:8,t4:8", &[("v100", 32.0), ("t4", 16.0)]), ("a100-80gb:8,t4:16", &[("a100-80gb", 80.0), ("t4", 16.0)])];

/// Plan `model` on `targets` at batch 1, seq 2048: either a plan whose every
/// device's predicted peak fits its memory, or a refusal naming the smallest
/// memory a device would need (sharded) and what it has. Returns whether it
/// planned.
fn plan_or_refusal(model: &Path, parameters: u64, targets: &str, devices: &[(&str, f64)], dir: &Path) -> bool {
    let out = dir.join(format!(
        "plan-{}-{}",
        model.file_stem().expect("stem").to_string_lossy(),
        targets.replace([':', ','], "-")
    ));
    let o = qsyncc(&[
        model.to_str().expect("utf8"),
        "--targets",
        targets,
        "--batch",
        "1",
        "--dim",
        "seq=2048",
        "-o",
        out.to_str().expect("utf8"),
    ]);
    let what = format!("{} on {targets}", model.display());
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{what}: panicked: {err}");
    if o.status.success() {
        let manifest = check_plan_dir(&out);
        for (name, dev) in manifest["devices"].as_object().expect("devices") {
            let peak = dev["peak_memory_bytes"].as_u64().expect("peak_memory_bytes");
            let cap = dev["memory_capacity_bytes"].as_u64().expect("memory_capacity_bytes");
            assert!(peak <= cap, "{what}: {name} planned at {peak} bytes, over its {cap}");
            assert_eq!(dev["fits"], true, "{what}: {name}");
        }
        // Never predicted below the run's FSDP baselines (those that fit).
        let sps = manifest["samples_per_s"].as_f64().expect("samples_per_s");
        for key in ["fsdp", "fsdp-dbs"] {
            let Some(b) = manifest["methods"].get(key).filter(|b| b["fits"] == true) else { continue };
            let base = b["samples_per_s"].as_f64().expect("baseline samples_per_s");
            assert!(sps >= base * (1.0 - 1e-9), "{what}: chosen {sps} samples/s below {key}'s {base}");
        }
        // A baseline that does not fit is never compared with: its row
        // says so, and the verdict does not measure against it.
        let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
        for (key, row, name) in [("up", "| UP (uniform precision) |", "UP"), ("dbs", "| DBS (", "DBS")] {
            if manifest["methods"].get(key).is_some_and(|m| m["fits"] == false) {
                let line = report.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("{what}: {row}"));
                assert!(line.contains("| – | does not fit |"), "{what}: {line}");
                assert!(!report.contains("against the best baseline (UP or DBS)"), "{what}: {report}");
                for words in [format!("% against {name}"), format!("% over {name}")] {
                    assert!(!report.contains(&words), "{what}: `{words}`, but {key} does not fit: {report}");
                }
            }
        }
        return true;
    }
    assert!(matches!(o.status.code(), Some(1 | 2)), "{what}: exit {:?} (not a refusal): {err}", o.status);
    assert!(err.contains("does not fit"), "{what}: refused without saying it does not fit: {err}");
    // `… the smallest memory it needs is X GiB on each DEVICE against Y GiB
    // available`. However the model is split, the devices together hold at
    // least its fp32 weights, gradients and Adam's two moments, 16 bytes a
    // parameter: X ≥ 16·P / devices.
    let count: u64 = targets.split(',').map(|t| t.split(':').nth(1).expect("count").parse::<u64>().expect("n")).sum();
    let floor = 16.0 * parameters as f64 / count as f64 / GIB;
    let key = "the smallest memory it needs is ";
    let at = err.find(key).unwrap_or_else(|| panic!("{what}: the refusal names no smallest memory needed: {err}"));
    let words: Vec<&str> = err[at + key.len()..].split_whitespace().take(8).collect();
    // X GiB on each DEVICE against Y GiB available
    let (need, dev, avail) = match words[..] {
        [x, "GiB", "on", "each", d, "against", y, "GiB"] => (x.parse::<f64>().ok(), d, y.parse::<f64>().ok()),
        _ => panic!("{what}: `{key}X GiB on each DEVICE against Y GiB available` expected: {err}"),
    };
    let (need, avail) = (need.expect("X is a number"), avail.expect("Y is a number"));
    let cap = devices.iter().find(|(d, _)| *d == dev).map(|&(_, c)| c);
    let cap = cap.unwrap_or_else(|| panic!("{what}: the refusal names `{dev}`, not a device of the cluster: {err}"));
    assert_eq!(avail, cap, "{what}: {dev} has {cap} GiB: {err}");
    assert!(need > cap, "{what}: {dev} refused at {need} GiB, within its {cap} GiB: {err}");
    assert!(
        need >= floor,
        "{what}: {dev} needs {need} GiB, below the {floor:.2} GiB floor of 16 bytes a parameter: {err}"
    );
    false
}

#[test]
fn llamas_plan_within_memory_or_are_refused_naming_the_memory_needed() {
    let dir = tmpdir("llama-plan");
    let mut seven_b = PathBuf::new();
    for (size, (d, l, h, kv, f, v), _) in SIZES {
        let model = dir.join(format!("llama-{size}.onnx"));
        generate(size, &model, &[]);
        let p = llama_parameters(d, l, h, kv, f, v);
        for (targets, devices) in CLUSTERS {
            plan_or_refusal(&model, p, targets, devices, &dir);
        }
        seven_b = model;
    }
    // Clusters that cannot hold the 7B's 16 bytes a parameter however it is
    // split (16 · 6,738,415,680 B = 100.4 GiB): four T4s have 64 GiB, two
    // V100s and two T4s 96 GiB. They must be refused.
    let p7 = llama_parameters(4096, 32, 32, 32, 11008, 32000);
    assert_eq!(16 * p7, 107_814_650_880);
    for (targets, devices) in [("t4:4", &[("t4", 16.0)][..]), ("v100:2,t4:2", &[("v100", 32.0), ("t4", 16.0)][..])] {
        assert!(!plan_or_refusal(&seven_b, p7, targets, devices, &dir), "the 7B cannot fit on {targets}");
    }
    // A shallow grouped-query variant of the 7B (2 layers, 8 KV heads) fits
    // every device of both clusters even unsharded.
    let small = dir.join("llama-7b-2layers-gqa.onnx");
    generate("7b", &small, &["--layers", "2", "--kv-heads", "8"]);
    let p = llama_parameters(4096, 2, 32, 8, 11008, 32000);
    for (targets, devices) in CLUSTERS {
        assert!(plan_or_refusal(&small, p, targets, devices, &dir), "the 2-layer 7B variant plans on {targets}");
    }
}

/// The commands `docs/planner.md` shows under `<!-- llama-commands -->` run
/// as written from the repository root (this build's `qsyncc` first on
/// `PATH`): the generator and `inspect` succeed, the 7B plans sharded with
/// the per-device state the page works out, and the four-T4 plan is refused
/// with the words the page quotes.
#[test]
fn the_documented_llama_commands_run_as_written() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let page = std::fs::read_to_string(root.join("docs/planner.md")).expect("docs/planner.md");
    let flat = page.split_whitespace().collect::<Vec<_>>().join(" ");
    let block = page.split("<!-- llama-commands -->").nth(1).expect("docs/planner.md: the llama-commands marker");
    let block =
        block.split("```sh\n").nth(1).and_then(|b| b.split("```").next()).expect("a ```sh block after the marker");
    let cmds: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(cmds.len(), 4, "generate, inspect, plan, refused plan: {cmds:?}");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_qsyncc"));
    let path = format!("{}:{}", bin.parent().expect("bin dir").display(), std::env::var("PATH").unwrap_or_default());
    let outputs: Vec<_> = cmds
        .iter()
        .map(|cmd| Command::new("sh").args(["-c", cmd]).current_dir(&root).env("PATH", &path).output().expect("sh"))
        .collect();
    for (cmd, o) in cmds.iter().zip(&outputs).take(3) {
        assert!(o.status.success(), "`{cmd}`: {}", stderr(o));
    }
    let inspect = String::from_utf8_lossy(&outputs[1].stdout);
    assert!(inspect.contains("parameters  6738415680 "), "`{}` counts the 7B's parameters: {inspect}", cmds[1]);

    // Sharded over 24 devices: 16 bytes a parameter each, split evenly.
    let said = String::from_utf8_lossy(&outputs[2].stdout);
    assert!(said.contains("chosen: sharded"), "`{}`: {said}", cmds[2]);
    assert_eq!(16 * 6_738_415_680u64 / 24, 4_492_277_120);
    assert!(flat.contains("16 · 6,738,415,680 / 24 = 4,492,277,120 bytes each"), "the page works the state out");
    let manifest = check_plan_dir(&root.join("target/llama/plan-7b"));
    for (name, dev) in manifest["sharding"]["devices"].as_object().expect("sharding.devices") {
        let state = dev["memory"]["sharded_state"].as_f64().expect("sharded_state");
        assert_eq!(state, 4_492_277_120.0, "{name}'s sharded state");
    }

    // The README shows this plan as `scripts/llama-table.sh --summary`
    // prints it from the manifest: the lines there are that output.
    let summary = Command::new(root.join("scripts/llama-table.sh"))
        .args(["--summary", "target/llama/plan-7b"])
        .current_dir(&root)
        .output()
        .expect("scripts/llama-table.sh runs");
    assert!(summary.status.success(), "llama-table.sh --summary: {}", stderr(&summary));
    let printed = String::from_utf8_lossy(&summary.stdout);
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let shown = readme
        .split("<!-- llama-summary -->")
        .nth(1)
        .and_then(|b| b.split("```text\n").nth(1))
        .and_then(|b| b.split("```").next())
        .expect("README.md: a ```text block after <!-- llama-summary -->");
    assert_eq!(shown, printed, "README.md's Llama plan is not what `scripts/llama-table.sh --summary` prints now");

    let (refused, err) = (&outputs[3], stderr(&outputs[3]));
    assert!(!refused.status.success(), "`{}` now plans: update docs/planner.md, which says it is refused", cmds[3]);
    let quoted = "sharded (FSDP, ZeRO++, activation checkpointing) the smallest memory it needs is 29.05 GiB on each t4 against 16.00 GiB available";
    assert!(flat.contains(quoted), "docs/planner.md quotes the refusal `{quoted}`");
    assert!(err.contains(quoted), "`{}`: the refusal docs/planner.md quotes, got: {err}", cmds[3]);
}
