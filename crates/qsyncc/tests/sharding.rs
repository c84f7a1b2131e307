//! Sharded training in the planner: a model too large for a T4 under DDP
//! is planned sharded (the manifest's `sharding` says how), one too large
//! for the cluster even sharded is refused naming the memory it needs, and
//! the sharded search is never slower than its FSDP baselines.

mod common;

use std::path::{Path, PathBuf};

use common::{check_plan_dir, qsyncc, stderr, tmpdir};

/// `layers` blocks of an 8192×8192 MatMul and a Relu: 2^26 parameters a
/// block, so 16 blocks are 2^30 — 16 GiB of FP32 weights, gradients and
/// Adam state, more than a T4 holds.
fn big_mlp(dir: &Path, layers: usize) -> PathBuf {
    let d = 8192;
    let mut s = String::from("graph \"big_mlp\" {\n");
    for i in 0..layers {
        s.push_str(&format!("  init %w{i}: f32[{d},{d}] = absent\n"));
    }
    s.push_str(&format!("  input %x0: f32[batch,{d}]\n"));
    for i in 0..layers {
        s.push_str(&format!("  %h{i}: f32[batch,{d}] = MatMul \"/layers.{i}/MatMul\"(%x{i}, %w{i})\n"));
        s.push_str(&format!("  %x{}: f32[batch,{d}] = Relu \"/layers.{i}/Relu\"(%h{i})\n", i + 1));
    }
    s.push_str(&format!("  output %x{layers}\n}}\n"));
    let path = dir.join(format!("big_mlp_{layers}.qir"));
    std::fs::write(&path, s).expect("write model");
    path
}

fn plan(model: &Path, targets: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "plan",
        model.to_str().expect("utf8"),
        "--targets",
        targets,
        "--batch",
        "8",
        "-o",
        out.to_str().expect("utf8"),
    ];
    args.extend_from_slice(extra);
    qsyncc(&args)
}

#[test]
fn a_model_ddp_cannot_hold_is_planned_sharded() {
    let dir = tmpdir("sharding-fits");
    let model = big_mlp(&dir, 16);
    let out = dir.join("plan");
    let r = plan(&model, "t4:8", &out, &[]);
    assert!(r.status.success(), "{}", stderr(&r));
    let m = check_plan_dir(&out);
    assert_eq!(m["schema"], "qsync-plan/4");
    let methods = m["methods"].as_object().expect("methods");
    // DDP does not fit; the FSDP baseline does, and the search is no slower.
    assert_eq!(methods["up"]["fits"], false, "{m}");
    let f = |k: &str| methods[k]["samples_per_s"].as_f64().expect("samples_per_s");
    assert_eq!(methods["fsdp"]["fits"], true);
    let chosen = m["chosen"].as_str().expect("chosen");
    assert!(["fsdp", "fsdp-dbs", "sharded"].contains(&chosen), "{chosen}");
    assert!(m["samples_per_s"].as_f64().expect("sps") >= f("fsdp") * (1.0 - 1e-9));
    let verdict = m["verdict"].as_str().expect("verdict");
    assert!(
        verdict.contains("does not fit under data parallelism") && verdict.contains("against FSDP FULL_SHARD"),
        "{verdict}"
    );
    // Every device fits, and the manifest says how the state is spread.
    let t4 = &m["devices"]["t4"];
    assert_eq!(t4["fits"], true, "{t4}");
    assert!(t4["peak_memory_bytes"].as_f64() <= t4["memory_capacity_bytes"].as_f64());
    let s = &m["sharding"];
    assert_ne!(s["stage"], "replicate", "{s}");
    assert_eq!(s["unit_rule"], "blocks");
    assert_eq!(s["units"].as_array().expect("units").len(), 16);
    assert_eq!(s["units"][3]["name"], "layers.3");
    assert_eq!(s["units"][3]["parameters"], 1u64 << 26);
    // Each unit is the module a trainer wraps (`/layers.3/MatMul` is
    // PyTorch's `layers.3`), with its checkpointing per device type.
    assert_eq!(s["units"][3]["module"], "layers.3");
    assert_eq!(s["units"][3]["kind"], "block");
    assert_eq!(s["units"][3]["checkpoint"]["t4"], s["devices"]["t4"]["checkpoint"], "{s}");
    let dev = &s["devices"]["t4"];
    // Eight equal shards on one type (uneven shares are equal here too).
    assert!((dev["shard_fraction"].as_f64().expect("fraction") - 0.125).abs() < 1e-12, "{dev}");
    // The T4 trains in FP16 AMP: its weights are gathered in FP16.
    assert_eq!(dev["all_gather"]["precision"], "fp16");
    assert_eq!(dev["reduce_scatter_precision"], "fp32");
    // Collectives in order: the forward's all-gathers first, unit by unit,
    // and the last is the first unit's gradient leaving.
    let c = s["collectives"].as_array().expect("collectives");
    assert_eq!(
        (c[0]["kind"].as_str(), c[0]["phase"].as_str(), c[0]["unit"].as_u64()),
        (Some("all-gather"), Some("forward"), Some(0))
    );
    let last = c.last().expect("last");
    assert_eq!((last["kind"].as_str(), last["unit"].as_u64()), (Some("reduce-scatter"), Some(0)), "{last}");
}

#[test]
fn a_model_that_fits_nowhere_names_the_memory_it_needs() {
    let dir = tmpdir("sharding-nowhere");
    let model = big_mlp(&dir, 16);
    // One T4: sharding over one device holds everything, 16 GiB of state
    // and more; the message names DDP's and the sharded need.
    let r = plan(&model, "t4:1", &dir.join("plan"), &[]);
    assert_eq!(r.status.code(), Some(2));
    let e = stderr(&r);
    assert!(e.contains("does not fit"), "{e}");
    assert!(
        e.contains("the smallest memory it needs is") && e.contains("GiB on each t4 against 16.00 GiB available"),
        "{e}"
    );
    // Eight T4 at 10%: 2 GiB of sharded state alone exceeds 1.6 GiB.
    let r = plan(&model, "t4:8", &dir.join("plan"), &["--memory", "t4=10%"]);
    assert_eq!(r.status.code(), Some(2));
    let e = stderr(&r);
    assert!(e.contains("GiB on each t4 against 1.60 GiB available"), "{e}");
    assert!(!dir.join("plan").exists());
}

#[test]
fn a_model_ddp_holds_is_sharded_only_where_that_is_predicted_faster() {
    // Two blocks of 2^26: 2 GiB of state, DDP fits. On eight T4s across
    // one NIC per node the sharded plan (the reduce-scatters overlap the
    // backward, the gathers the forward) is predicted faster than every
    // DDP method at the same indicator, so it is chosen; QSync's method as
    // published stays DDP.
    let dir = tmpdir("sharding-ddp");
    let model = big_mlp(&dir, 2);
    let out = dir.join("plan");
    let r = plan(&model, "t4:8", &out, &[]);
    assert!(r.status.success(), "{}", stderr(&r));
    let m = check_plan_dir(&out);
    let methods = m["methods"].as_object().expect("methods");
    let best_ddp = ["up", "dbs", "qsync", "qsync-greedy", "joint", "joint-fastest"]
        .iter()
        .filter_map(|k| methods.get(*k))
        .filter(|e| e["fits"] == true)
        .map(|e| e["samples_per_s"].as_f64().expect("sps"))
        .fold(0.0, f64::max);
    assert!(best_ddp > 0.0, "DDP fits: {m}");
    let sps = m["samples_per_s"].as_f64().expect("sps");
    assert_ne!(m["sharding"]["stage"], "replicate");
    assert!(sps > best_ddp, "sharded {sps} chosen over DDP {best_ddp}");
    let out = dir.join("plan-qsync");
    let r = plan(&model, "t4:8", &out, &["--method", "qsync"]);
    assert!(r.status.success(), "{}", stderr(&r));
    let m = check_plan_dir(&out);
    assert_eq!(m["sharding"]["stage"], "replicate");
    assert_eq!(m["sharding"]["devices"]["t4"]["shard_fraction"], 1.0);
    assert!(m["sharding"]["collectives"].as_array().expect("collectives").is_empty());
}

#[test]
fn the_sharded_search_chooses_the_collectives_precisions_within_the_error_budget() {
    // Sixteen blocks of 2^26 on eight T4s, 4 to a node, the nodes joined
    // by 10 Gbit/s: every unit's all-gather moves 2^26·2 bytes in FP16 and
    // its reduce-scatter 2^26·4 in FP32, far longer than the kernels that
    // halve (qwZ: 1 + 4/512 bytes an element) or quarter (qgZ-int8) them,
    // so `auto` within the default budget (0.01: qwZ and qgZ-int8 add
    // 1/(2·127) = 0.0039 each, qgZ-int4 1/(2·7) = 0.071 is left out)
    // takes both. The hand-worked prices are crates/sim/tests/shard.rs's.
    let dir = tmpdir("sharding-collectives");
    let model = big_mlp(&dir, 16);
    let slow = ["--network", "10gbit"];
    let precisions = |extra: &[&str]| {
        let out = dir.join("plan");
        let r = plan(&model, "t4:8/4", &out, extra);
        assert!(r.status.success(), "{extra:?}: {}", stderr(&r));
        let m = check_plan_dir(&out);
        let c = m["sharding"]["collective_precisions"].clone();
        let t4 = &m["sharding"]["devices"]["t4"];
        // The per-type fields say the same.
        assert_eq!(t4["all_gather"]["precision"], c["all_gather"]["precision"], "{m}");
        assert_eq!(t4["reduce_scatter_precision"], c["reduce_scatter"]["precision"], "{m}");
        (
            c["all_gather"]["precision"].as_str().map(String::from),
            c["reduce_scatter"]["precision"].as_str().map(String::from),
            c,
        )
    };
    let auto = [&slow[..], &["--shard-collectives", "auto"]].concat();
    let (g, r, c) = precisions(&auto);
    assert_eq!((g.as_deref(), r.as_deref()), (Some("qwz-int8"), Some("qgz-int8")), "{c}");
    assert_eq!(c["allowed"], serde_json::json!(["qwz", "qgz-int8"]), "{c}");
    assert!((c["all_gather"]["relative_error"].as_f64().expect("error") - 0.5 / 127.0).abs() < 1e-15);
    // The default (fp), and a zero budget, keep the T4's FP16 gathers and
    // FP32 reduce-scatters however slow the link.
    let (g, r, c) = precisions(&slow);
    assert_eq!((g.as_deref(), r.as_deref()), (Some("fp16"), Some("fp32")), "{c}");
    let zero = [&auto[..], &["--sync-error-budget", "0"]].concat();
    let (g, r, c) = precisions(&zero);
    assert_eq!((g.as_deref(), r.as_deref()), (Some("fp16"), Some("fp32")), "{c}");
    assert_eq!(c["allowed"], serde_json::json!([]), "{c}");
    // Fast: eight A100s in one NVLink node (at 20% of their memory, so
    // that DDP does not fit): the bytes qwZ and qgZ save take less time
    // than their kernels, and `auto` keeps BF16 gathers, FP32 reduce-scatters.
    let out = dir.join("plan-fast");
    let r = plan(&model, "a100-80gb:8", &out, &["--memory", "a100-80gb=20%", "--shard-collectives", "auto"]);
    assert!(r.status.success(), "{}", stderr(&r));
    let c = &check_plan_dir(&out)["sharding"]["collective_precisions"];
    assert_eq!(
        (c["all_gather"]["precision"].as_str(), c["reduce_scatter"]["precision"].as_str()),
        (Some("bf16"), Some("fp32")),
        "{c}"
    );
    // Named in a list, a precision over the budget is an error saying so.
    let r = plan(&model, "t4:8/4", &dir.join("refused"), &["--shard-collectives", "qwz,qgz-int4"]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    let e = stderr(&r);
    assert!(e.contains("--shard-collectives qgz-int4: its relative error 0.0714") && e.contains("0.01"), "{e}");
    let r = plan(&model, "t4:8/4", &dir.join("refused"), &["--shard-collectives", "int2"]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(stderr(&r).contains("unknown sharded collective `int2`"), "{}", stderr(&r));
}

#[test]
fn a_small_model_of_many_units_stays_data_parallel() {
    // SqueezeNet (1.2M parameters in 10 units with parameters) on a V100
    // and a T4: a sharded step pays per unit and collective (FSDP's hooks,
    // each collective's launch) what DDP pays once per bucket, so the
    // chosen plan is data-parallel and the sharded search, still priced,
    // is slower.
    let dir = tmpdir("sharding-small");
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/squeezenet1_1.onnx");
    let out = dir.join("plan");
    let r = qsyncc(&[model.to_str().expect("utf8"), "--targets", "v100,t4", "-o", out.to_str().expect("utf8")]);
    assert!(r.status.success(), "{}", stderr(&r));
    let m = check_plan_dir(&out);
    assert_eq!(m["sharding"]["stage"], "replicate", "{}", m["verdict"]);
    let sharded = m["methods"]["sharded"]["samples_per_s"].as_f64().expect("the sharded search ran");
    assert!(sharded < m["samples_per_s"].as_f64().expect("sps"), "{}", m["methods"]);
    let with_params = m["sharding"]["units"].as_array().expect("units").iter().filter(|u| u["parameters"] != 0).count();
    assert_eq!(with_params, 10);
}
