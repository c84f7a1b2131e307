#!/usr/bin/env python3
"""Whole iterations on real links against the model (docs/validation.md, table 3).

    python3 scripts/validate/iterations.py --qsyncc target/release/qsyncc --out target/validate \
        [--rates 200mbit,10gbit] [--models transformer,resnet18]

For each link rate, a 2-node emulated cluster (scripts/netcluster.sh), 2
ranks a node pinned to the node's own cores, gloo bound to each node's
shaped interface. For each model, `qsyncc plan --sync auto` on a cluster
file of the same links names a scheme and lists every scheme it weighed;
then `examples/train_ddp.py bench` under torchrun (one torchrun per node
namespace) times the backward pass under DDP's own all-reduce and the
qsync hook of each of those schemes, round-robin in one job, next to the
backward with synchronization switched off (`no_sync`, forward included). What the synchronization adds —
the backward with it minus the backward without — is the claim under test:
`qsyncc simulate` of the same model (exported to ONNX by train_ddp.py) on
a cluster file of the same links predicts the iteration with the scheme
and without any synchronization (fp32 with the network taken as free is
not expressible, so: iteration minus the compute stream), and the predicted
exposed synchronization is compared with the measured one. Then `qsyncc
plan --sync auto` on the same cluster file names a scheme; the table says
whether it is the one that measured fastest among all it weighed.

The compute itself is not the claim here (table 2 checks it): the cpu
device file is this CPU as `scripts/cpu/device.py` measures it.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NETCLUSTER = os.path.join(ROOT, "scripts", "netcluster.sh")
sys.path.insert(0, HERE)
from sync import cluster_toml, host_kernels, measure_host, measure_links, sh  # noqa: E402



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qsyncc", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--python", default=os.path.expanduser("~/.cache/qsync/torch-venv/bin/python"))
    ap.add_argument("--rates", default="200mbit,10gbit")
    ap.add_argument("--models", default="transformer,resnet18")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prefix", default="qsi")
    ap.add_argument("--subnet", default="10.88.8")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    nodes, k = 2, 2
    venv_bin = os.path.dirname(a.python)
    torchrun = os.path.join(venv_bin, "torchrun")
    cores = max(1, (os.cpu_count() or 1) // nodes)
    # Three measurements back to back; the model is given their medians.
    host_file = host_kernels(a, nodes, k, cores, [measure_host(a, nodes, k, cores, i) for i in range(3)],
                             "host-kernels-iterations.json")
    cpu = os.path.join(a.out, "cpu.json")
    if not os.path.exists(cpu):
        sh([a.python, os.path.join(ROOT, "scripts", "cpu", "device.py"), cpu, "--name", "cpu"])
    # Each model exported to ONNX as train_ddp.py's `plan` exports it.
    onnx = {}
    export = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import train_ddp as t; "
              "m = t.make_model(sys.argv[2], 0); m.train(); "
              "torch.onnx.export(m, (t.example_input(sys.argv[2], int(sys.argv[3])),), sys.argv[4], dynamo=False, "
              "training=torch.onnx.TrainingMode.TRAINING, input_names=['x'], do_constant_folding=False)")
    for m in a.models.split(","):
        onnx[m] = os.path.join(a.out, f"{m}.onnx")
        sh([a.python, "-c", export, os.path.join(ROOT, "examples"), m, str(a.batch), onnx[m]])
    out = open(os.path.join(a.out, "iterations.jsonl"), "w")
    for rate in a.rates.split(","):
        sh(["bash", NETCLUSTER, "down", "--prefix", a.prefix])
        sh(["bash", NETCLUSTER, "up", "--nodes", str(nodes), "--rate", rate, "--prefix", a.prefix, "--subnet", a.subnet])
        try:
            ns = [f"{a.prefix}{i}" for i in range(nodes)]
            addr = [f"{a.subnet}.{i + 2}" for i in range(nodes)]
            cluster = os.path.join(a.out, f"iter-cluster-{rate}.toml")
            with open(cluster, "w") as f:
                f.write(cluster_toml(f"netcluster-{rate}", "cpu", nodes, k, rate, measure_links(ns, addr, rate, k),
                                     cores))
            for m in a.models.split(","):
                plan_dir = os.path.join(a.out, f"auto-{m}-{rate}")
                auto = json.loads(sh([a.qsyncc, onnx[m], "--cluster", cluster, "--device-file", cpu,
                                      "--host-kernels", host_file, "--batch", str(a.batch), "--sync", "auto",
                                      "--sync-error-budget", "1", "--precisions", "fp32", "--json",
                                      "-o", plan_dir]).stdout)
                manifest = json.load(open(os.path.join(plan_dir, "manifest.json")))
                weighed = [c["scheme"] for c in manifest["sync"]["considered"]]
                hooks = ["ddp"] + [h for h in weighed if h != "fp32"]
                procs = []
                for i in range(nodes):
                    env = {**os.environ, "GLOO_SOCKET_IFNAME": f"{a.prefix}n{i}", "OMP_NUM_THREADS": "1",
                           "PYTHONUNBUFFERED": "1"}
                    pin = ["taskset", "-c", f"{i * cores}-{i * cores + cores - 1}"]
                    cmd = ["ip", "netns", "exec", ns[i], *pin, "env", *[f"{k_}={v}" for k_, v in env.items()
                                                                   if k_ in ("GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS",
                                                                             "PYTHONUNBUFFERED", "PATH", "HOME")],
                           torchrun, "--nnodes", str(nodes), "--node-rank", str(i), "--nproc-per-node", str(k),
                           "--master-addr", addr[0], "--master-port", "29517",
                           os.path.join(ROOT, "examples", "train_ddp.py"), "bench", "--model", m,
                           "--hooks", ",".join(hooks), "--batch", str(a.batch), "--reps", str(a.reps)]
                    procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                outs = [p.communicate(timeout=1800) for p in procs]
                if any(p.returncode != 0 for p in procs):
                    raise SystemExit(f"validate: bench {m} at {rate} failed:\n" + "\n".join(o[1][-3000:] for o in outs))
                rows = [json.loads(l) for l in outs[0][0].splitlines() if l.startswith("{")]
                measured = {r["hook"]: r for r in rows}
                predicted = {}
                for h in hooks:
                    scheme = "fp32" if h == "ddp" else h
                    p = json.loads(sh([a.qsyncc, "simulate", onnx[m], "--cluster", cluster, "--device-file", cpu,
                                       "--host-kernels", host_file, "--batch", str(a.batch), "--sync", scheme,
                                       "--json"]).stdout)
                    d = p["devices"]["cpu"]
                    predicted[h] = {"exposed_s": (p["iteration_ms"] - d["compute_ms"]) / 1e3,
                                    "compute_s": d["compute_ms"] / 1e3}
                fastest = min(hooks, key=lambda h: measured[h]["backward_s"])
                for h in hooks:
                    r = measured[h]
                    row = {"rate": rate, "model": m, "hook": h, "backward_s": r["backward_s"],
                           "no_sync_backward_s": r["no_sync_backward_s"], "exposed_s": r["exposed_sync_s"],
                           "predicted_exposed_s": predicted[h]["exposed_s"],
                           "predicted_backward_s": r["no_sync_backward_s"] + predicted[h]["exposed_s"],
                           "auto": auto["sync"]["scheme"], "measured_fastest": "fp32" if fastest == "ddp" else fastest}
                    row["error"] = row["predicted_backward_s"] / row["backward_s"] - 1
                    print(json.dumps(row), file=out, flush=True)
                    print(f"{rate:>8} {m:<12} {h:<9} backward {r['backward_s']:.4f} s (no sync {r['no_sync_backward_s']:.4f})"
                          f" predicted {row['predicted_backward_s']:.4f} ({row['error']:+.1%})", file=sys.stderr)
        finally:
            subprocess.run(["bash", NETCLUSTER, "down", "--prefix", a.prefix])
    out.close()


if __name__ == "__main__":
    main()
