//! The cluster as users describe it (`--cluster FILE`, `--network`), the
//! synchronization paths, and "each type alone" at the same global batch,
//! through the CLI.

mod common;

use std::path::PathBuf;

use common::{check_plan_dir, models_dir, qsyncc, stderr, tmpdir};

fn example(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/clusters")
        .join(name)
        .to_str()
        .expect("utf8")
        .to_string()
}

fn json(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

#[test]
fn every_example_cluster_file_loads_with_every_figure_sourced() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/clusters");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("examples/clusters") {
        let p = e.expect("entry").path();
        let c = qsync_sim::topology::ClusterFile::load(&p).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.unsourced().is_empty(), "{}: figures without a source: {:?}", p.display(), c.unsourced());
        let o = qsyncc(&["simulate", "--cluster", p.to_str().expect("utf8"), "--gradient", "64MiB", "--sync", "fp16"]);
        assert!(o.status.success(), "{}: {}", p.display(), stderr(&o));
        n += 1;
    }
    assert!(n >= 3, "the planner doc's clusters have example files");
}

#[test]
fn simulate_records_the_cluster_and_the_nic_is_shared() {
    // The README cluster from its file: 2 p3.16xlarge (8 V100 on one 25 Gbit/s
    // NIC) and 4 g4dn.12xlarge (4 T4 on one 50 Gbit/s NIC).
    let m = models_dir().join("resnet50_train.onnx");
    let m = m.to_str().expect("utf8");
    let file = example("aws-v100-t4.toml");
    let j = json(&qsyncc(&["simulate", m, "--cluster", &file, "--batch", "32", "--json"]));
    let groups = j["cluster"]["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 2);
    assert_eq!((groups[0]["device"].as_str(), groups[0]["nodes"].as_u64()), (Some("v100"), Some(2)));
    assert_eq!(groups[0]["nic_gbit_s"], 25.0);
    assert_eq!(groups[1]["gpus_per_node"], 4);
    // The same GPUs as `--targets` (one device-file NIC per node, 8 a node):
    // the cluster file's slower, shared NICs make communication longer.
    let t = json(&qsyncc(&["simulate", m, "--targets", "v100:16,t4:16/4", "--batch", "32", "--json"]));
    let comm = |v: &serde_json::Value| v["devices"]["v100"]["comm_ms"].as_f64().expect("comm");
    assert!(comm(&j) > comm(&t), "cluster file {} ms vs --targets {} ms", comm(&j), comm(&t));
    // --network overrides every NIC: 8x the rate, a fraction of the time.
    let fast = json(&qsyncc(&["simulate", m, "--cluster", &file, "--network", "200gbit", "--batch", "32", "--json"]));
    assert!(fast["cluster"]["groups"].as_array().expect("groups").iter().all(|g| g["nic_gbit_s"] == 200.0));
    assert!(comm(&fast) < comm(&j) / 2.0, "{} vs {}", comm(&fast), comm(&j));
}

#[test]
fn a_nic_whose_work_lands_on_the_host_is_recorded_and_priced() {
    // Two nodes of one CPU rank each, 10 Gbit/s between them, one core a
    // node, free kernels, the TCP stack at 1 ns a byte (a host-kernels
    // file); then the same with the link's own work on the cores at 2 ns a
    // byte sent or received. fp16 of 64 MiB (E = 2^24) over MPI receives
    // 2·E/P = 2^24 B a phase from the other node, two phases, and sends as
    // much: the stack's 2^25 ns, and the NIC's 2·2^25·2 ns = 134.2 ms more,
    // all of it CPU that outlasts the wire (2^25 B at 1.25 GB/s = 26.8 ms):
    // the call takes the CPU's time.
    let dir = tmpdir("niccpu");
    let host = dir.join("host.json");
    std::fs::write(
        &host,
        r#"{"schema":"qsync-host-kernels/1","cpu":"hand","threads":1,"elements":[1,2],
            "kernels":{"quantize_r":0,"quantize_c":0,"dequantize_r":0,"dequantize_c":0,"cast16_r":0,"cast16_c":0,
                       "tcp_r":1e-9},
            "measured_s":{}}"#,
    )
    .expect("write");
    // The host's cores as a device (as scripts/validate/sync.py describes
    // them): only its network and kernels matter to a synchronization.
    let device = dir.join("cpu-host.json");
    let why = "not used: a synchronization is priced from the cluster file and --host-kernels";
    let sources: serde_json::Map<String, serde_json::Value> = [
        "arch",
        "memory_bytes",
        "memory_bandwidth_gb_s",
        "cuda_core_tflops.fp32",
        "intra_node",
        "network_gbit_s",
        "launch_overhead_us",
        "workspace_bytes",
        "efficiency",
    ]
    .iter()
    .map(|k| (k.to_string(), why.into()))
    .collect();
    let dev = serde_json::json!({
        "name": "cpu-host", "full_name": "a host's CPU", "arch": "cpu", "memory_bytes": 1u64 << 34,
        "memory_bandwidth_gb_s": 10, "cuda_core_tflops": {"fp32": 0.1}, "supported_precisions": ["fp32"],
        "intra_node": {"kind": "pcie", "bandwidth_gb_s": 10}, "network_gbit_s": 1, "launch_overhead_us": 5,
        "workspace_bytes": 0, "efficiency": {"tensor_core": 1, "cuda_core": 1, "memory": 1}, "sources": sources,
    });
    std::fs::write(&device, dev.to_string()).expect("write");
    let file = |extra: &str| {
        let p = dir.join(format!("c{}.toml", extra.len()));
        std::fs::write(
            &p,
            format!("[[group]]\ngpu = \"cpu-host\"\nnodes = 2\ngpus_per_node = 1\nnic_gbit_s = 10\nhost_cores_per_node = 1\n{extra}"),
        )
        .expect("write");
        p
    };
    let run = |p: &std::path::Path| {
        json(&qsyncc(&[
            "simulate",
            "--cluster",
            p.to_str().expect("utf8"),
            "--gradient",
            "64MiB",
            "--sync",
            "fp16",
            "--sync-path",
            "mpi",
            "--host-kernels",
            host.to_str().expect("utf8"),
            "--device-file",
            device.to_str().expect("utf8"),
            "--json",
        ]))
    };
    let (plain, nic) = (run(&file("")), run(&file("nic_cpu_ns_per_byte = 2\n")));
    assert!(plain["cluster"]["groups"][0].get("nic_cpu_ns_per_byte").is_none(), "{plain}");
    assert_eq!(nic["cluster"]["groups"][0]["nic_cpu_ns_per_byte"], 2.0);
    assert_eq!(nic["cluster"]["groups"][0]["host_cores_per_node"], 1);
    let cpu =
        |v: &serde_json::Value| v["per_type_breakdown"]["cpu-host"]["transport_cpu_seconds"].as_f64().expect("cpu");
    let more = cpu(&nic) - cpu(&plain);
    let (stack, want) = (f64::from(1u32 << 25) * 1e-9, 2.0 * f64::from(1u32 << 25) * 2.0 * 1e-9);
    assert!((more - want).abs() < 1e-9, "{more} vs {want}: {nic}");
    assert!((nic["seconds"].as_f64().expect("seconds") - (stack + want)).abs() < 1e-9, "{nic}");
}

#[test]
fn sync_predictions_by_hand() {
    // One fp16 synchronization of 64 MiB (E = 2^24 elements) on the DGX file:
    // 2 nodes x 8 H100, 8 NICs of 400 Gbit/s = 400 GB/s a node, 50 GB/s per
    // GPU when all 8 send; 450 GB/s inside; latencies 5 us across, 3 inside.
    // The all-to-all receives 2E/P = 2^21 B from each of 15 peers: 7 inside
    // (7·2^21 B at 450e3 B/us = 32.62 us), 8 outside (8·2^21 B at 50e3 B/us
    // = 335.54 us) -> 335.54 + 5 us. The hook's all-gather is NCCL's ring:
    // 15 pieces cross each node's NICs once, 15·2^21/8 B per GPU at 50e3 B/us
    // = 78.64 us (inside: 15·2^21·7/8 B at 450e3 = 61.17 us) -> 78.64 + 5.
    // Host-staged (default on GPUs) adds the copies: the hook's 2·S, and each
    // phase's buffers both ways, own share included: 2·(15·2^21·16/15) B a
    // phase, over 8 GB/s: (2^27 + 2·2^26) / 8e3 us = 33554.4 us; plus the
    // host's casts, given here as a file.
    let host = tmpdir("hostk").join("host.json");
    std::fs::write(
        &host,
        r#"{"schema":"qsync-host-kernels/1","cpu":"hand","threads":1,"elements":[1,2],
            "kernels":{"quantize_r":0,"quantize_c":0,"dequantize_r":0,"dequantize_c":0,"cast16_r":1e-9,"cast16_c":0},
            "measured_s":{}}"#,
    )
    .expect("write");
    let base = ["simulate", "--gradient", "64MiB", "--sync", "fp16", "--json", "--host-kernels"];
    let run = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.push(host.to_str().expect("utf8"));
        let f = example("dgx-h100.toml");
        a.extend_from_slice(&["--cluster", &f]);
        a.extend_from_slice(extra);
        let v = json(&qsyncc(&a));
        // The parts `scripts/validate` sets measured phases against: the
        // casts, and what the rest of the time is made of.
        let parts = v["per_type_breakdown"].as_object().and_then(|m| m.values().next()).expect("a type's breakdown");
        let secs = |k: &str| parts[k].as_f64().unwrap_or_else(|| panic!("{k} missing in {v}"));
        assert_eq!(secs("total_seconds"), v["seconds"].as_f64().expect("seconds"));
        for k in ["kernel_seconds", "link_seconds", "latency_seconds", "staging_seconds"] {
            assert!(secs(k) > 0.0, "{k} in {v}");
        }
        assert_eq!(secs("transport_cpu_seconds"), 0.0, "no host transport on NCCL's path: {v}");
        assert_eq!(secs("bucket_copy_seconds"), 0.0, "DDP's bucket copies of a GPU take no host core: {v}");
        v["seconds"].as_f64().expect("seconds") * 1e6
    };
    let e = (1u64 << 24) as f64;
    let comm = (8.0 * 2f64.powi(21) / 50e3 + 5.0) + (15.0 * 2f64.powi(21) / 8.0 / 50e3 + 5.0);
    let staging = (2.0 * 4.0 * e + 2.0 * 2.0 * 16.0 * 2f64.powi(21)) / 8e3;
    // fp16 casts 3E + E/P elements at 1 ns.
    let casts = (3.0 * e + e / 16.0) * 1e-3;
    let got = run(&[]);
    assert!((got - (comm + staging + casts)).abs() < 1e-6 * got, "{got} vs {}", comm + staging + casts);
    // Device kernels: the device's cast model instead of the host's.
    let dev = run(&["--sync-path", "device"]);
    assert!(dev < got, "{dev} vs {got}");
    // A CPU path does not exist for GPUs.
    let mut a: Vec<&str> = base.to_vec();
    a.push(host.to_str().expect("utf8"));
    let f = example("dgx-h100.toml");
    a.extend_from_slice(&["--cluster", &f, "--sync-path", "host"]);
    let o = qsyncc(&a);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a path these devices synchronize on"), "{}", stderr(&o));
}

#[test]
fn the_plan_records_its_cluster_and_sync_path() {
    let m = models_dir().join("squeezenet1_1.onnx");
    let out = tmpdir("cluster-plan");
    let file = example("cloud-a100-l4.toml");
    let o = qsyncc(&[
        m.to_str().expect("utf8"),
        "--cluster",
        &file,
        "--sync",
        "auto",
        "--sync-error-budget",
        "0.05",
        "-o",
        out.to_str().expect("utf8"),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let manifest = check_plan_dir(&out);
    assert_eq!(manifest["cluster"]["groups"][0]["device"], "a100-40gb");
    assert_eq!(manifest["cluster"]["groups"][1]["nic_gbit_s"], 40.0);
    let sync = &manifest["sync"];
    assert_eq!(sync["paths_available"], serde_json::json!(["host-staged", "device"]));
    // Every candidate on both paths was compared, by whole iterations, and
    // the choice is the fastest of them.
    let considered = sync["considered"].as_array().expect("considered");
    assert!(considered.iter().any(|c| c["path"] == "device") && considered.iter().any(|c| c["path"] == "host-staged"));
    let best = considered.iter().filter_map(|c| c["iteration_us"].as_f64()).fold(f64::INFINITY, f64::min);
    assert_eq!(sync["iteration_us"].as_f64(), Some(best));
    assert!(sync["path"]["name"].is_string() && sync["path"]["overlaps_backward"].is_boolean());
    // --targets and --cluster together are refused, as is a bad file.
    let o = qsyncc(&[m.to_str().expect("utf8"), "--cluster", &file, "--targets", "t4:2", "-o", "/tmp/never"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let bad = tmpdir("badcluster").join("c.toml");
    std::fs::write(&bad, "[[group]]\ngpu = \"t4\"\nnodes = 1\ngpus_per_node = 0\n").expect("write");
    let o = qsyncc(&[m.to_str().expect("utf8"), "--cluster", bad.to_str().expect("utf8"), "-o", "/tmp/never"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("c.toml") && stderr(&o).contains("gpus_per_node"), "{}", stderr(&o));
    let o = qsyncc(&[m.to_str().expect("utf8"), "--targets", "t4:2", "--network", "fast", "-o", "/tmp/never"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--network"), "{}", stderr(&o));
}

#[test]
fn each_type_alone_trains_the_same_global_batch() {
    // 16 V100 + 16 T4 at 32 a device: 1024 samples a step. The V100s alone
    // take 64 each; the T4s alone, limited to 30% of their memory, cannot
    // hold 64 ResNet-50 samples and accumulate gradients over several passes.
    let m = models_dir().join("resnet50_train.onnx");
    let out = tmpdir("alone-accum");
    let o = qsyncc(&[
        m.to_str().expect("utf8"),
        "--targets",
        "v100:16,t4:16",
        "--batch",
        "32",
        "--memory",
        "t4=30%",
        "-o",
        out.to_str().expect("utf8"),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let manifest = check_plan_dir(&out);
    let v = &manifest["alone"]["v100"];
    assert_eq!((v["local_batches"]["v100"].as_u64(), v["accumulation_steps"]["v100"].as_u64()), (Some(64), Some(1)));
    let t = &manifest["alone"]["t4"];
    let (b, k) = (t["local_batches"]["t4"].as_u64().expect("b"), t["accumulation_steps"]["t4"].as_u64().expect("k"));
    assert!(k > 1 && b * k >= 64 && b * (k - 1) < 64, "t4 alone: {k} passes of {b}: {s}");
    let report = std::fs::read_to_string(out.join("report.md")).expect("report");
    assert!(report.contains(&format!("t4 {k}×{b}")), "{report}");
}

#[test]
fn the_planner_doc_cluster_commands_run_as_written() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("docs/planner.md")).expect("docs/planner.md");
    let cmds: Vec<&str> = readme
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("qsyncc ") && l.contains("examples/clusters/"))
        .collect();
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    for c in cmds {
        let args: Vec<&str> = c.split_whitespace().skip(1).collect();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_qsyncc"))
            .args(&args)
            .current_dir(&root)
            .output()
            .expect("runs");
        assert!(o.status.success(), "{c}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// `qsyncc host-kernels --corun N` times the ladder again in N processes
/// at once, one a core, and writes their medians as `corun_by_size`, which
/// `simulate` reads; it refuses fewer than 2 processes, and more than the
/// cores it may run on, saying why.
#[test]
fn host_kernels_times_the_ladder_on_every_core_at_once() {
    let dir = tmpdir("host-kernels-corun");
    let before = corun_dirs();
    let out = dir.join("host.json");
    let path = out.to_str().expect("utf8");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let o = qsyncc(&["host-kernels", "--elements", "16384", "--repeats", "1", "--corun", "1", "-o", path]);
    assert!(!o.status.success() && stderr(&o).contains("at least 2"), "{}", stderr(&o));
    let o = qsyncc(&["host-kernels", "--elements", "16384", "--repeats", "1", "--corun", "256", "-o", path]);
    assert!(!o.status.success() && stderr(&o).contains("one process a core needs 256"), "{}", stderr(&o));
    assert!(!out.exists(), "a refused measurement writes no file");
    if cores < 2 {
        eprintln!("skipped: timing on every core at once needs 2 cores, this machine gives {cores}");
        return;
    }
    let o = qsyncc(&["host-kernels", "--elements", "16384", "--repeats", "2", "--corun", "2", "-o", path]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("written")).expect("JSON");
    let k = &v["kernels"];
    let sizes = |ladder: &serde_json::Value| -> Vec<f64> {
        ladder
            .as_array()
            .unwrap_or_else(|| panic!("a ladder: {v}"))
            .iter()
            .map(|r| r["elements"].as_f64().expect("elements"))
            .collect()
    };
    assert_eq!(sizes(&k["corun_by_size"]), sizes(&k["by_size"]), "{v}");
    for rung in k["corun_by_size"].as_array().expect("ladder") {
        for rate in ["quantize", "dequantize", "cast16", "bf16", "nbit_finish", "sum", "bucket"] {
            let r = rung[rate].as_f64().unwrap_or_else(|| panic!("{rate} missing: {rung}"));
            assert!(r > 0.0 && r < 1e-6, "{rate} = {r} s an element at {}: {v}", rung["elements"]);
        }
    }
    let cluster = example("aws-v100-t4.toml");
    let o =
        qsyncc(&["simulate", "--cluster", &cluster, "--gradient", "64MiB", "--sync", "nbit-2", "--host-kernels", path]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The processes' files are gone with them.
    assert_eq!(corun_dirs(), before, "a qsync-corun-* directory was left in the temporary directory");
}

/// The `qsync-corun-*` directories in the temporary directory.
fn corun_dirs() -> Vec<std::ffi::OsString> {
    let mut v: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .filter(|n| n.to_string_lossy().starts_with("qsync-corun-"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `qsyncc host-kernels` measures every kernel the host paths are priced
/// with, and `simulate --host-kernels` takes the file as written: each
/// rate positive and finite (a kernel left unmeasured, or timed as
/// nothing, would make a scheme look free).
#[test]
fn host_kernels_measures_what_simulate_reads() {
    let dir = tmpdir("host-kernels");
    let out = dir.join("host.json");
    let o = qsyncc(&["host-kernels", "--elements", "65536", "--repeats", "3", "-o", out.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("written")).expect("JSON");
    assert_eq!(v["schema"], "qsync-host-kernels/1", "{v}");
    let k = &v["kernels"];
    for rate in [
        "quantize_r",
        "dequantize_r",
        "cast16_r",
        "bf16_r",
        "quantize4_r",
        "dequantize4_r",
        "pack_r",
        "unpack_r",
        "nbit_finish_r",
        "zero_r",
        "sum_r",
    ] {
        let r = k[rate].as_f64().unwrap_or_else(|| panic!("{rate} missing: {v}"));
        assert!(r > 0.0 && r.is_finite() && r < 1e-6, "{rate} = {r} s an element: {v}");
    }
    // n-bit's one-pass decoding beyond its buffers: fitted through the
    // decoding of 4 buffers and of one, so 0 where the two say so.
    let d = k["nbit_decode_r"].as_f64().unwrap_or_else(|| panic!("nbit_decode_r missing: {v}"));
    assert!((0.0..1e-6).contains(&d), "nbit_decode_r = {d}: {v}");
    assert_eq!(v["measured_s"]["mean"].as_array().map(Vec::len), Some(5), "{v}");
    // qgZ's likewise: its blocks decoded 4 at a time and one at a time.
    let d = k["qgz_decode_r"].as_f64().unwrap_or_else(|| panic!("qgz_decode_r missing: {v}"));
    assert!((0.0..1e-6).contains(&d), "qgz_decode_r = {d}: {v}");
    for one in ["qmean", "qmean4"] {
        assert_eq!(v["measured_s"][one].as_array().map(Vec::len), Some(5), "{one}: {v}");
    }
    for widths in ["nbit_pack_r", "nbit_unpack_r"] {
        let w = k[widths].as_array().unwrap_or_else(|| panic!("{widths} missing: {v}"));
        assert_eq!(w.len(), 4, "1, 2, 4 and 8 bits: {v}");
        assert!(w.iter().all(|r| r.as_f64().is_some_and(|r| r > 0.0 && r < 1e-6)), "{widths}: {v}");
    }
    // The ladder: five sizes up to --elements, each twice the one before,
    // every kernel's seconds per element at each.
    let ladder = k["by_size"].as_array().unwrap_or_else(|| panic!("by_size missing: {v}"));
    let sizes: Vec<f64> = ladder.iter().map(|r| r["elements"].as_f64().expect("elements")).collect();
    assert_eq!(sizes, [4096.0, 8192.0, 16384.0, 32768.0, 65536.0], "{v}");
    for rung in ladder {
        for rate in ["quantize", "dequantize", "cast16", "bf16", "nbit_finish", "sum", "bucket"] {
            let r = rung[rate].as_f64().unwrap_or_else(|| panic!("{rate} missing: {rung}"));
            assert!(r > 0.0 && r < 1e-6, "{rate} = {r} s an element at {}: {v}", rung["elements"]);
        }
        for pass in ["nbit_decode", "qgz_decode"] {
            assert!(rung[pass].as_f64().is_some_and(|d| (0.0..1e-6).contains(&d)), "{pass}: {rung}");
        }
    }
    assert_eq!(v["measured_s"]["quantize"].as_array().map(Vec::len), Some(5), "{v}");
    // The pipelined schemes' kernels: on one piece (the whole 65536 here,
    // under the pipeline's chunk) and piece by piece at every size.
    let pieces = &k["pieces"];
    assert_eq!(pieces["cached"]["elements"].as_f64(), Some(65536.0), "{v}");
    let streamed = pieces["streamed"].as_array().unwrap_or_else(|| panic!("pieces.streamed missing: {v}"));
    let at: Vec<f64> = streamed.iter().map(|r| r["elements"].as_f64().expect("elements")).collect();
    assert_eq!(at, sizes, "{v}");
    for row in streamed.iter().chain([&pieces["cached"]]) {
        for rate in ["cast16", "bf16", "quantize", "dequantize", "quantize4", "dequantize4"] {
            let r = row[rate].as_f64().unwrap_or_else(|| panic!("{rate} missing: {row}"));
            assert!(r > 0.0 && r < 1e-6, "{rate} = {r} s an element at {}: {v}", row["elements"]);
        }
    }
    // A ladder whose sizes do not grow is refused, naming the file; so is
    // a piece rate that is not a number of seconds.
    let mut bad = v.clone();
    bad["kernels"]["by_size"][3]["elements"] = serde_json::json!(1.0);
    let bad_path = dir.join("bad.json");
    std::fs::write(&bad_path, bad.to_string()).expect("write");
    let mut bad_pieces = v.clone();
    bad_pieces["kernels"]["pieces"]["cached"]["cast16"] = serde_json::json!(-1.0);
    let bad_pieces_path = dir.join("bad-pieces.json");
    std::fs::write(&bad_pieces_path, bad_pieces.to_string()).expect("write");
    // `simulate` of a 64 MiB gradient with `file` as the host kernels.
    let simulate = |file: &std::path::Path, more: &[&str]| {
        let cluster = example("aws-v100-t4.toml");
        let mut args = vec!["simulate", "--cluster", &cluster, "--gradient", "64MiB"];
        args.extend(["--host-kernels", file.to_str().expect("utf8")]);
        args.extend(more);
        qsyncc(&args)
    };
    let o = simulate(&bad_path, &[]);
    assert!(!o.status.success() && stderr(&o).contains("bad.json") && stderr(&o).contains("by_size"), "{}", stderr(&o));
    let o = simulate(&bad_pieces_path, &[]);
    assert!(
        !o.status.success() && stderr(&o).contains("bad-pieces.json") && stderr(&o).contains("pieces holds -1"),
        "{}",
        stderr(&o)
    );
    let o = simulate(&out, &["--sync", "fp16", "--sync-path", "host-staged", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let kernels = p["per_type_breakdown"].as_object().expect("parts").values().map(|t| t["kernel_seconds"].as_f64());
    assert!(kernels.into_iter().all(|s| s.is_some_and(|s| s > 0.0)), "the casts are priced from the file: {p}");
    // A plan names where its host kernels' rates come from: the file, or
    // the built-in measurement.
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/squeezenet1_1.onnx");
    for (file, source) in [(Some(&out), "given (--host-kernels)"), (None, "built-in: `qsyncc host-kernels`")] {
        let plan = dir.join(if file.is_some() { "plan-given" } else { "plan-built-in" });
        let mut args = vec![model.to_str().expect("utf8"), "--targets", "v100:8,t4:8", "--sync", "qgz-int8"];
        args.extend(["-o", plan.to_str().expect("utf8")]);
        if let Some(f) = file {
            args.extend(["--host-kernels", f.to_str().expect("utf8")]);
        }
        let o = qsyncc(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let path = &check_plan_dir(&plan)["sync"]["path"];
        assert_eq!(path["kernels"], "host", "{path}");
        let named = path["host_kernels"].as_str().unwrap_or_else(|| panic!("no host_kernels: {path}"));
        assert!(named.starts_with(source), "{named}");
    }
}
