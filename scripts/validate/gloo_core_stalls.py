#!/usr/bin/env python3
"""Whether gloo's exchanges stall when each emulated node has one core (root).

    python3 scripts/validate/gloo_core_stalls.py [--rate 10gbit] [--bytes 32768]
        [--cores own|shared] [--no-shaping] [--iterations 60] [--loop batch|default]

Brings up 2 emulated nodes (scripts/netcluster.sh), one rank each under
torchrun with gloo bound to the node's interface, and times all-to-alls of
`--bytes` a peer through qsync's TorchTransport: every iteration, after a
barrier and 20 ms of quiet, two in a row, on the same process group (even
iterations) or on two groups (odd ones). `--cores own` pins each node to a
core of its own (as `scripts/validate.sh iterations-dedicated` runs),
`shared` lets both processes use every core; `--no-shaping` removes the
links' qdiscs after `up`. `--loop` sets `QSYNC_GLOO_LOOP`: the policy of
the event-loop threads of the groups the transport makes (`batch`, the
default: no preemption on wake-up; `default`: as gloo starts them). Prints one JSON line: the median milliseconds of
each of the four timed calls, and how many calls took over 1 ms. Needs the
`qsync` wheel installed in the PyTorch environment (scripts/validate.sh
installs it). Takes the nodes down at the end, also on failure.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PREFIX, SUBNET = "qgc", "10.88.10"


def worker():
    import torch.distributed as dist
    from qsync._transport import TorchTransport

    dist.init_process_group("gloo")
    p = dist.get_world_size()
    a, b = TorchTransport(), TorchTransport()
    n = int(os.environ["QGC_BYTES"])
    send, recv = bytearray(n * p), bytearray(n * p)

    def timed(t):
        t0 = time.perf_counter()
        t.all_to_all_v(send, [n] * p, recv, [n] * p, 30.0)
        return time.perf_counter() - t0

    calls = {"same_first": [], "same_second": [], "switch_first": [], "switch_second": []}
    for i in range(int(os.environ["QGC_ITERATIONS"])):
        dist.barrier()
        time.sleep(0.02)
        kind = "same" if i % 2 == 0 else "switch"
        calls[f"{kind}_first"].append(timed(a))
        calls[f"{kind}_second"].append(timed(a if kind == "same" else b))
    if dist.get_rank() == 0:
        out = {k: round(statistics.median(v[2:]) * 1e3, 3) for k, v in calls.items()}
        out["over_1ms"] = sum(x > 1e-3 for v in calls.values() for x in v[2:])
        out["calls"] = sum(len(v[2:]) for v in calls.values())
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--bytes", type=int, default=32768)
    ap.add_argument("--cores", choices=["own", "shared"], default="own")
    ap.add_argument("--no-shaping", action="store_true")
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--loop", choices=["batch", "default"], default="batch")
    ap.add_argument("--torchrun", default=os.path.expanduser("~/.cache/qsync/torch-venv/bin/torchrun"))
    a = ap.parse_args()
    nc = os.path.join(HERE, "..", "netcluster.sh")
    subprocess.run(["bash", nc, "down", "--prefix", PREFIX], capture_output=True)
    subprocess.run(["bash", nc, "up", "--nodes", "2", "--rate", a.rate, "--prefix", PREFIX, "--subnet", SUBNET],
                   check=True, capture_output=True)
    try:
        if a.no_shaping:
            for i in range(2):
                subprocess.run(["ip", "netns", "exec", f"{PREFIX}{i}", "tc", "qdisc", "del", "dev", f"{PREFIX}n{i}",
                                "root"], check=True)
                subprocess.run(["tc", "qdisc", "del", "dev", f"{PREFIX}h{i}", "root"], check=True)
        procs = []
        for i in range(2):
            cpus = str(i) if a.cores == "own" else f"0-{os.cpu_count() - 1}"
            env = [f"GLOO_SOCKET_IFNAME={PREFIX}n{i}", "OMP_NUM_THREADS=1", f"QGC_BYTES={a.bytes}",
                   f"QGC_ITERATIONS={a.iterations}", "QGC_WORKER=1", f"QSYNC_GLOO_LOOP={a.loop}", f"PATH={os.environ['PATH']}",
                   f"HOME={os.environ.get('HOME', '/root')}"]
            cmd = ["ip", "netns", "exec", f"{PREFIX}{i}", "taskset", "-c", cpus, "env", *env, a.torchrun,
                   "--nnodes", "2", "--node-rank", str(i), "--nproc-per-node", "1", "--master-addr", f"{SUBNET}.2",
                   "--master-port", "29541", os.path.abspath(__file__)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=600) for p in procs]
        if any(p.returncode for p in procs):
            sys.exit("gloo_core_stalls: a node failed:\n" + "\n".join(o[1][-2000:] for o in outs))
        line = next(x for x in outs[0][0].splitlines() if x.startswith("{"))
        result = json.loads(line)
        result.update(rate=a.rate, bytes=a.bytes, cores=a.cores, shaped=not a.no_shaping, loop=a.loop)
        print(json.dumps(result))
    finally:
        subprocess.run(["bash", nc, "down", "--prefix", PREFIX], capture_output=True)


if __name__ == "__main__":
    worker() if os.environ.get("QGC_WORKER") else main()
