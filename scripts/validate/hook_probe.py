#!/usr/bin/env python3
"""One bucket's synchronization through the DDP hook's machinery, apart from
DDP: what each step of the hook's path costs, timed on every rank.

For each scheme of `--schemes`, a gradient of `--elements` f32 elements:

- `direct_s`: the runtime's `all_reduce_mean` called on the training
  thread (the native GradSync over qsync's TorchTransport, gloo);
- `worker_s`: the same handed to the hook's one worker thread and waited
  on through a `torch.futures.Future`, as `QSyncHook.__call__` runs a CPU
  bucket;
- `skewed_s`: the worker path again, every rank after the barrier first
  computing for a time drawn per rank and round (`--skew-ms`, uniform
  0..skew), timed from the end of its own compute: what a rank waits for
  its slowest peer;
- `phases`: the runtime's phases per call (quantize, exchange, wait,
  dequantize) on the direct path;
- bare collectives through the same transport: an all-gather of 8 bytes a
  rank and an all-to-all of 8 bytes a peer (`gather8_s`, `a2a8_s`).

Rank 0 prints one JSON line per scheme: the slowest rank's median of
`--reps` calls of each.

    torchrun ... scripts/validate/hook_probe.py [--schemes fp16,qgz-int8] [--elements 118000] [--reps 30]
"""
import argparse
import json
import random
import statistics
import time

import numpy
import torch
import torch.distributed as dist

import qsync
from qsync._transport import TorchTransport


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", default="fp16,qgz-int8,nbit-2")
    ap.add_argument("--elements", type=int, default=118000)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--skew-ms", type=float, default=2.0)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tr = TorchTransport()
    rng = numpy.random.default_rng(rank)
    grad = rng.standard_normal(a.elements).astype(numpy.float32)
    skew_rng = random.Random(1000 + rank)

    def slowest_median(times):
        mine = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        return mine.item()

    def timed(call, reps, before=None):
        times = []
        for i in range(reps + 3):
            tr.barrier(60.0)
            if before is not None:
                before()
            t = time.perf_counter()
            call()
            if i >= 3:
                times.append(time.perf_counter() - t)
        return slowest_median(times)

    def spin(seconds):
        end = time.perf_counter() + seconds
        x = 0
        while time.perf_counter() < end:
            x += 1

    bare = {
        "gather8_s": timed(lambda: tr.all_gather(bytearray(8), 60.0), a.reps),
        "a2a8_s": timed(lambda: tr.all_to_all_v(bytearray(8 * tr.size), [8] * tr.size, [8] * tr.size, 60.0), a.reps),
    }
    for name in a.schemes.split(","):
        hook = qsync.comm_hook(name).qsync
        sync = hook._sync_for("cpu", 0, torch.device("cpu"))
        work = grad.copy()
        hook.reset_phases()
        direct = timed(lambda: sync.all_reduce_mean(work), a.reps)
        phases = {k: v / (a.reps + 3) for k, v in hook.phases().items()}
        pool = hook._executor()

        def via_worker():
            fut = torch.futures.Future()

            def run():
                sync.all_reduce_mean(work)
                fut.set_result(None)

            pool.submit(run)
            fut.wait()

        worker = timed(via_worker, a.reps)
        skewed = timed(via_worker, a.reps, before=lambda: spin(skew_rng.uniform(0, a.skew_ms) / 1e3))
        if rank == 0:
            print(json.dumps({"scheme": name, "ranks": tr.size, "elements": a.elements, "reps": a.reps,
                              "direct_s": direct, "worker_s": worker, "skewed_s": skewed,
                              "skew_ms": a.skew_ms, "phases": phases, **bare}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
