#!/usr/bin/env python3
"""The DDP hook's path on real links, step by step, against the model: one
bucket's synchronization through the hook's machinery apart from DDP
(`hook_probe.py`: on the training thread, every rank starting together; gloo's bare
collectives) next to `qsyncc simulate --gradient` for that bucket, and the
last bucket of a DDP step timed per rank (`last_bucket.py`: in the hook call
against handed to the worker). Root; run after `scripts/validate.sh
iterations` (or `scripts/validate/iterations.py --host-only`, which
measures only that), whose host description (`--from`: its
`host-kernels-gloo.json` and `cpu.json`) it predicts with.

    python3 scripts/validate/hook_paths.py --qsyncc target/release/qsyncc --from target/validate \\
        [--rate 10gbit] [--schemes fp16,qgz-int8,nbit-2] [--elements 118000] [--model transformer]
        [--ranks-per-node 2]

Prints one JSON line per scheme and measurement, then a table.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from iterations import NETCLUSTER, json_lines, nodes_up, torchrun_nodes  # noqa: E402
from sync import cluster_toml, measure_links, sh  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qsyncc", required=True)
    ap.add_argument("--from", dest="src", required=True, help="an iterations run's output folder")
    ap.add_argument("--python", default=os.path.expanduser("~/.cache/qsync/torch-venv/bin/python"))
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--schemes", default="fp16,qgz-int8,nbit-2")
    ap.add_argument("--elements", type=int, default=118000, help="the bucket (default: the transformer's gradient)")
    ap.add_argument("--model", default="transformer", help="the model whose last bucket last_bucket.py times")
    ap.add_argument("--ranks-per-node", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--prefix", default="qsh")
    ap.add_argument("--subnet", default="10.88.9")
    a = ap.parse_args()
    host_file, cpu = os.path.join(a.src, "host-kernels-gloo.json"), os.path.join(a.src, "cpu.json")
    for f in (host_file, cpu):
        if not os.path.exists(f):
            raise SystemExit(f"hook_paths: {f} is missing: run scripts/validate.sh iterations first")
    nodes, k = 2, a.ranks_per_node
    cores = max(1, (os.cpu_count() or 1) // nodes)
    torchrun = os.path.join(os.path.dirname(a.python), "torchrun")
    ns, addr = nodes_up(a, nodes, a.rate)
    rows = []
    try:
        cluster = os.path.join(a.src, f"hook-paths-{a.rate}-{k}.toml")
        with open(cluster, "w") as f:
            links = measure_links(ns, addr, a.rate, k, link_cost=False)
            f.write(cluster_toml(f"netcluster-{a.rate}", "cpu", nodes, k, a.rate, links, cores))
        outs = torchrun_nodes(a, ns, addr, k, cores, torchrun, "the hook probe",
                              [os.path.join(HERE, "hook_probe.py"), "--schemes", a.schemes,
                               "--elements", str(a.elements), "--reps", str(a.reps)])
        for r in json_lines(outs):
            g = json.loads(sh([a.qsyncc, "simulate", "--gradient", str(4 * r["elements"]), "--cluster", cluster,
                               "--device-file", cpu, "--host-kernels", host_file, "--sync", r["scheme"],
                               "--json"]).stdout)
            r["predicted_s"] = g["per_type_breakdown"]["cpu"]["total_seconds"]
            rows.append(r)
            print(json.dumps(r), flush=True)
        ddp = {}
        for scheme in a.schemes.split(","):
            outs = torchrun_nodes(a, ns, addr, k, cores, torchrun, f"the last bucket, {scheme}",
                                  [os.path.join(HERE, "last_bucket.py"), "--scheme", scheme, "--model", a.model,
                                   "--reps", str(a.reps)])
            for r in json_lines(outs):
                ddp[(scheme, r["variant"])] = r
                print(json.dumps(r), flush=True)
    finally:
        subprocess.run(["bash", NETCLUSTER, "down", "--prefix", a.prefix])
    print(f"\n{a.rate}, 2 nodes x {k} ranks, a bucket of {a.elements} elements (ms):")
    print("| scheme | training thread | all-gather: gloo's ring | as an all-to-all | predicted "
          "| DDP: after the slowest compute, in the call "
          "| handed to the worker | backward, in the call | handed to the worker | no-sync backward "
          "| ranks leave the barrier apart | in the call: runtime call, last start to last end |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        s = r["scheme"]
        h, w, n = ddp[(s, "hook")], ddp[(s, "worker")], ddp[(s, "no-sync")]
        print(f"| {s} | {r['direct_s'] * 1e3:.2f} | {r['direct_ring_s'] * 1e3:.2f} | {r['direct_flat_s'] * 1e3:.2f} "
              f"| {r['predicted_s'] * 1e3:.2f} "
              f"| {h['after_slowest_ms']:.2f} | {w['after_slowest_ms']:.2f} | {h['backward_ms']:.2f} "
              f"| {w['backward_ms']:.2f} | {n['backward_ms']:.2f} | {h['skew_ms']:.2f} | {h['sync_ms']:.2f} |")


if __name__ == "__main__":
    main()
