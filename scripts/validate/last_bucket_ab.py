#!/usr/bin/env python3
"""Where the DDP hook's last bucket should synchronize, measured as table 3
measures a hook: `examples/train_ddp.py bench` across two emulated nodes
(2 ranks a node on a core of its own), one job per hook with the last
bucket in the hook call (`--last-bucket call`) and one with it on the
hook's worker (`worker`), alternated `--rounds` times. Prints one line a
job: the hook's backward, DDP's own in the same job, and their ratio.
Root.

    python3 scripts/validate/last_bucket_ab.py [--rate 10gbit] [--model resnet18] [--hooks fp16,nbit-4] [--rounds 2]
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from iterations import NETCLUSTER, json_lines, nodes_up, torchrun_nodes  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--model", default="resnet18", choices=["resnet18", "transformer"])
    ap.add_argument("--hooks", default="fp16,nbit-4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--python", default=os.path.expanduser("~/.cache/qsync/torch-venv/bin/python"))
    ap.add_argument("--prefix", default="qsa")
    ap.add_argument("--subnet", default="10.88.5")
    a = ap.parse_args()
    nodes, k = 2, 2
    cores = max(1, (os.cpu_count() or 1) // nodes)
    torchrun = os.path.join(os.path.dirname(a.python), "torchrun")
    ns, addr = nodes_up(a, nodes, a.rate)
    try:
        for _ in range(a.rounds):
            for h in a.hooks.split(","):
                for last in ("call", "worker"):
                    outs = torchrun_nodes(a, ns, addr, k, cores, torchrun, f"bench {h} --last-bucket {last}",
                                          [os.path.join(ROOT, "examples", "train_ddp.py"), "bench", "--model",
                                           a.model, "--hooks", h, "--batch", "2", "--reps", str(a.reps),
                                           "--last-bucket", last])
                    got = {r["hook"]: r for r in json_lines(outs)}
                    print(f"{a.rate} {a.model} {h} {last}: backward {got[h]['backward_s'] * 1e3:.1f} ms, "
                          f"DDP's all-reduce {got['ddp']['backward_s'] * 1e3:.1f} ms, "
                          f"ratio {got[h]['backward_vs_ddp']:.3f}", flush=True)
    finally:
        subprocess.run(["bash", NETCLUSTER, "down", "--prefix", a.prefix])


if __name__ == "__main__":
    main()
