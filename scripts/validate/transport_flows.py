#!/usr/bin/env python3
"""The hook's transport on a slow emulated link, collective by collective,
against the link time of the bytes it moves: qsync's TorchTransport (gloo)
all-to-all of `--bytes` a rank (every rank sending to every peer at once:
a node's ranks keep 2·(P−L) flows a direction; every receive posted
before any send), gloo's own all-to-all of the same bytes (a send and a
receive a peer in turn, which the transport replaced), its ring all-gather of
blocks of `--bytes`/P (one flow a direction at each step) and gloo's own
ring all-reduce of `--bytes` (DDP's fp32), 2 nodes × 2 ranks under
torchrun. Root; the interfaces' byte counters are read around the job.

    python3 scripts/validate/transport_flows.py [--rate 200mbit] [--bytes 8388608] [--reps 5]

Prints one JSON line: per collective, the slowest rank's median seconds,
the bytes a node's link carries each way (from the collective's shape) and
their time at the rate's TCP payload share; then the node's counted bytes.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def rank_main(a):
    import torch
    import torch.distributed as dist
    from qsync._transport import TorchTransport

    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    tr = TorchTransport()
    tr.flat_gather = False  # gloo's ring, as the hook runs it with 2 ranks a node

    def timed(f):
        ts = []
        for i in range(a.reps + 1):
            tr.barrier(60.0)
            t = time.perf_counter()
            f()
            if i:
                ts.append(time.perf_counter() - t)
        m = torch.tensor([statistics.median(ts)], dtype=torch.float64)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        return m.item()

    s = a.bytes - a.bytes % (4 * p)
    send, recv, block, x = bytearray(s), bytearray(s), bytearray(s // p), torch.zeros(s // 4)
    y, got = torch.zeros(s, dtype=torch.uint8), torch.empty(s, dtype=torch.uint8)
    out = {
        "all_to_all_s": timed(lambda: tr.all_to_all_v(send, [s // p] * p, recv, [s // p] * p, 60.0)),
        "gloo_all_to_all_s": timed(lambda: dist.all_to_all_single(got, y, group=tr.group)),
        "ring_all_gather_s": timed(lambda: tr.all_gather(block, recv, [s // p] * p, 60.0)),
        "gloo_all_reduce_s": timed(lambda: dist.all_reduce(x)),
    }
    if rank == 0:
        print(json.dumps({"bytes": s, "ranks": p, **out}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--bytes", type=int, default=8 << 20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--python", default=os.path.expanduser("~/.cache/qsync/torch-venv/bin/python"))
    ap.add_argument("--prefix", default="qtf")
    ap.add_argument("--subnet", default="10.88.6")
    a = ap.parse_args()
    if "RANK" in os.environ:
        return rank_main(a)
    sys.path.insert(0, HERE)
    from iterations import NETCLUSTER, torchrun_nodes
    from sync import TCP_PAYLOAD_SHARE, parse_rate, sh

    nodes, k = 2, 2
    cores = max(1, (os.cpu_count() or 1) // nodes)
    ns = [f"{a.prefix}{i}" for i in range(nodes)]
    addr = [f"{a.subnet}.{i + 2}" for i in range(nodes)]
    subprocess.run(["bash", NETCLUSTER, "down", "--prefix", a.prefix], capture_output=True)
    sh(["bash", NETCLUSTER, "up", "--nodes", str(nodes), "--rate", a.rate, "--prefix", a.prefix, "--subnet", a.subnet])

    def counted():
        return json.loads(sh(["bash", NETCLUSTER, "stats", "--prefix", a.prefix, "--json"]).stdout)["nodes"][0]

    try:
        before = counted()
        torchrun = os.path.join(os.path.dirname(a.python), "torchrun")
        outs = torchrun_nodes(a, ns, addr, k, cores, torchrun, "the transport probe",
                              [os.path.abspath(__file__), "--bytes", str(a.bytes), "--reps", str(a.reps)])
        after = counted()
    finally:
        subprocess.run(["bash", NETCLUSTER, "down", "--prefix", a.prefix], capture_output=True)
    r = json.loads(next(l for l in outs[0][0].splitlines() if l.startswith("{")))
    s, p = r["bytes"], r["ranks"]
    remote = p - k  # peers on the other node
    # Bytes a node's link carries each way, per call: the all-to-all's
    # blocks from each of its ranks to each remote peer; the node-major
    # ring's one block a step across each node boundary, P−1 steps (the
    # all-reduce: reduce-scatter and all-gather, 2(P−1)).
    across = {"all_to_all_s": k * remote * s / p, "gloo_all_to_all_s": k * remote * s / p,
              "ring_all_gather_s": (p - 1) * s / p,
              "gloo_all_reduce_s": 2 * (p - 1) * s / p}
    rate = parse_rate(a.rate) * 1e9 / 8 * TCP_PAYLOAD_SHARE
    for key, b in across.items():
        name = key.removesuffix("_s")
        r[f"{name}_link_bytes"] = b
        r[f"{name}_link_s"] = b / rate
        r[f"{name}_vs_link"] = r[key] / (b / rate)
    r["node0_tx_bytes_counted"] = after["tx_bytes"] - before["tx_bytes"]
    r["node0_tx_bytes_expected"] = sum(across.values()) * (a.reps + 1)
    r["rate"] = a.rate
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
