#!/usr/bin/env python3
"""Where a DDP step's last bucket spends its time under the qsync hook, per
rank: the last bucket in the hook call, on the training thread
(`comm_hook(..., last_bucket="call")`, variant `hook`), against handed to
the hook's worker thread like the others (`last_bucket="worker"`, variant
`worker`), and the backward without synchronization (`no-sync`),
round-robin in the same job.

Per backward and rank, from the backward's start: when DDP called the hook
for the last bucket (`call`: that rank's compute is done), when the
runtime's synchronization started and ended (`start`, `end`) and when the
future DDP waits on completed (`done`). Rank 0 prints one JSON line per
variant: medians over rounds, the backward (the slowest rank's median, as
`examples/train_ddp.py bench` reports it) and what the step took after the
slowest rank's compute (`after_slowest_ms`: per round, the slowest rank's
backward minus the latest hook call, each from its own rank's barrier
exit, so it carries how far apart the ranks left the barrier). On one clock for every rank
(`perf_counter` is `CLOCK_MONOTONIC`, shared by the processes of this
machine, emulated nodes included): how far apart the ranks left the
barrier that starts each backward (`skew_ms`), the step's end after the
latest hook call (`after_latest_call_ms`) and the runtime's call from the
last rank's start to the last rank's end (`sync_ms`); and each rank's
median of its process's minor page faults during the runtime's call
(`faults`) and how long the calling thread waited runnable for a core
in it (`runqueue_ms`, the scheduler's account), and the runtime's phases
per backward (`phases_ms`: each phase's largest mean over the ranks).

    torchrun ... scripts/validate/last_bucket.py --scheme fp16 [--model transformer] [--reps 30]
"""
import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import qsync

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "examples"))
import train_ddp  # noqa: E402


class _Timed:
    """A GradSync whose `all_reduce_mean` notes when it starts and ends."""

    def __init__(self, sync, marks):
        self._sync, self._marks = sync, marks

    def __getattr__(self, name):
        return getattr(self._sync, name)

    def all_reduce_mean(self, grad):
        f0, q0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, _queued_s()
        self._marks["start"] = time.perf_counter()
        out = self._sync.all_reduce_mean(grad)
        self._marks["end"] = time.perf_counter()
        self._marks["faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        self._marks["runqueue"] = _queued_s() - q0
        return out


def _queued_s():
    """Seconds the calling thread has waited runnable for a core, from the
    scheduler's own account (`/proc/thread-self/schedstat`'s second
    field); 0 where there is none."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def timed_hook(scheme, marks, inline):
    """The DDP hook that notes its times in `marks`, and its `QSyncHook`."""
    hook = qsync.comm_hook(scheme, last_bucket="call" if inline else "worker")
    q = hook.qsync
    make = q._sync_for
    q._sync_for = lambda *a, **k: _Timed(make(*a, **k), marks)

    def call(state, bucket):
        marks["call"] = time.perf_counter()
        fut = hook(state, bucket)

        def done(f):
            marks["done"] = time.perf_counter()
            return f.value()

        return fut.then(done)

    return call, q


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scheme", default="fp16")
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    marks = {}
    ddps = {}
    qhooks = {}
    for name in ("hook", "worker", "no-sync"):
        ddp = nn.parallel.DistributedDataParallel(train_ddp.make_model(a.model, 0))
        if name != "no-sync":
            call, qhooks[name] = timed_hook(a.scheme, marks, inline=name == "hook")
            ddp.register_comm_hook(None, call)
        ddps[name] = ddp
    x, y = train_ddp.global_batch(a.model, a.batch * world, 0, 0)
    x, y = x[rank * a.batch:(rank + 1) * a.batch], y[rank * a.batch:(rank + 1) * a.batch]

    def backward(name):
        ddp = ddps[name]
        ddp.zero_grad(set_to_none=True)
        with ddp.no_sync() if name == "no-sync" else contextlib.nullcontext():
            loss = F.cross_entropy(ddp(x), y)
            dist.barrier()
            marks.clear()
            t0 = time.perf_counter()
            loss.backward()
            t1 = time.perf_counter()
        # perf_counter is CLOCK_MONOTONIC, one clock for every process of
        # this machine (the emulated nodes included): `t0` lines ranks up.
        return {"wall": t1 - t0, "t0": t0,
                **{k: v if k in ("faults", "runqueue") else v - t0 for k, v in marks.items()}}

    for name in ddps:
        for _ in range(2):
            backward(name)
    rec = {name: [] for name in ddps}
    for q in qhooks.values():
        q.reset_phases()
    for _ in range(a.reps):
        for name in ddps:
            rec[name].append(backward(name))
    # The runtime's phases per backward, this rank's (the mean over reps).
    phases = {name: {k: v / a.reps for k, v in q.phases().items()} for name, q in qhooks.items()}
    every = [None] * world
    dist.all_gather_object(every, (rec, phases))
    every, all_phases = [e[0] for e in every], [e[1] for e in every]
    if rank == 0:
        med = statistics.median
        for name in ddps:
            rounds = [[every[r][name][i] for r in range(world)] for i in range(a.reps)]
            out = {"scheme": a.scheme, "model": a.model, "variant": name, "ranks": world,
                   "backward_ms": max(med(every[r][name][i]["wall"] for i in range(a.reps)) for r in range(world)) * 1e3}
            # how far apart the ranks left the barrier that starts a backward
            out["skew_ms"] = med(max(x["t0"] for x in rd) - min(x["t0"] for x in rd) for rd in rounds) * 1e3
            if name != "no-sync":
                # the step's end after the latest hook call, on the one clock
                out["after_latest_call_ms"] = med(max(x["t0"] + x["wall"] for x in rd) - max(x["t0"] + x["call"] for x in rd)
                                                  for rd in rounds) * 1e3
                out["sync_ms"] = med(max(x["t0"] + x["end"] for x in rd) - max(x["t0"] + x["start"] for x in rd)
                                     for rd in rounds) * 1e3
                # the process's minor page faults during the runtime's call
                out["faults"] = [med(every[r][name][i]["faults"] for i in range(a.reps)) for r in range(world)]
                # ms the calling thread waited runnable for a core during the call
                out["runqueue_ms"] = [round(med(every[r][name][i]["runqueue"] for i in range(a.reps)) * 1e3, 3)
                                      for r in range(world)]
                for key in ("call", "start", "end", "done"):
                    out[f"{key}_ms"] = [round(med(every[r][name][i][key] for i in range(a.reps)) * 1e3, 3)
                                        for r in range(world)]
                # each phase's largest mean over ranks, ms per backward
                out["phases_ms"] = {k: round(max(p[name][k] for p in all_phases) * 1e3, 3)
                                    for k in all_phases[0][name]}
                out["after_slowest_ms"] = med(max(x["wall"] for x in rd) - max(x["call"] for x in rd)
                                              for rd in rounds) * 1e3
            print(json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
