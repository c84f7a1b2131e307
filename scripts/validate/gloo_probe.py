#!/usr/bin/env python3
"""What the DDP hook's transport costs per byte and per call: the ranks'
all-to-all through `qsync._transport.TorchTransport` (gloo, the transport
the hook's CPU buckets use) as the runtime drives it
(`qsync._native.transport_all_to_all_s`: the native side's vectors and
copies included), `--mib` MiB from every rank in 1 exchange and
in `--many`, and `--tiny-kib` KiB in `--many`, timed on every rank; and
gloo's own all-reduce of an f32 tensor of `--mib` MiB and of
`--small-kib` KiB (what DDP's fp32
synchronization runs); the transport's all-gather (gloo's ring) of 8
bytes a rank; then the two all-to-alls again while every rank
runs a compute thread beside them (`--compute-size`: products of N×N
matrices, which release Python's lock as a backward pass in autograd's C++
does), as the hook's exchanges run beside the backward pass; and what DDP
itself spends on the training thread around a hook (`ddp_bucket_cost`: a
backward under a hook that hands every bucket straight back, against
`no_sync`, with large layers and with many small ones: per element and
per parameter), and what qsync's hook adds to a bucket beyond the runtime's
call (`hook_cost`: a one-bucket backward under `qsync.comm_hook`, against
the hand-back hook, less the call), and what interleaving on a core adds
to a synchronization and a backward pass (`interleave_cost`: the runtime's
all-reduce beside a thread of backward passes, against each alone). Rank 0 prints
one JSON line (the slowest rank's median of `--reps` runs of each).

    torchrun ... scripts/validate/gloo_probe.py [--mib 16] [--many 32] [--reps 5] [--compute-size 512]

`scripts/validate/iterations.py` runs it across two emulated nodes on a link
far faster than the CPU can feed and fits the model's `tcp_r` and
`message_s` for the hook's path from the one-exchange and tiny all-to-alls, as `sync.py`
does for Open MPI, `ring_tcp_r` and `ring_step_s` for gloo's own ring
from the two all-reduce times, `gather_step_s` from the small
all-gather, `busy_round_s` from the all-to-alls
beside compute: what an exchange round waits, beyond its work at the
cores' shared speed, while the rank's cores compute, and `interleave_r`.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from qsync import _native
from qsync._transport import TorchTransport

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from transport import beside_compute  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--many", type=int, default=32)
    ap.add_argument("--tiny-kib", type=int, default=1024,
                    help="the small all-to-alls: KiB a rank in --many exchanges (default 1024)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--small-kib", type=int, default=64, help="the small all-reduce, KiB")
    ap.add_argument("--ring-calls", type=int, default=5, help="all-reduces per timed run (their median)")
    ap.add_argument("--gather-calls", type=int, default=10, help="small all-gathers per timed run")
    ap.add_argument("--ddp-layers", type=int, default=12, help="DDP's bucket cost: linear layers")
    ap.add_argument("--ddp-width", type=int, default=1024, help="DDP's bucket cost: each layer's width")
    ap.add_argument("--ddp-small-layers", type=int, default=192,
                    help="DDP's cost per parameter: as many small linear layers (default 192)")
    ap.add_argument("--ddp-small-width", type=int, default=32, help="DDP's cost per parameter: their width")
    ap.add_argument("--hook-width", type=int, default=256, help="the hook's cost: one linear layer's width")
    ap.add_argument("--hook-scheme", default="fp16", help="the hook's cost: the scheme the hook runs")
    ap.add_argument("--compute-size", type=int, default=512,
                    help="the compute thread's matrices are N×N (default 512)")
    ap.add_argument("--interleave-elements", type=int, default=6_553_600,
                    help="the interleaving's cost: the bucket the runtime all-reduces (default 25 MiB of f32)")
    ap.add_argument("--interleave-scheme", default="qgz-int8", help="the interleaving's cost: the runtime's scheme")
    ap.add_argument("--interleave-calls", type=int, default=8, help="the interleaving's cost: all-reduces a run")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    tr = TorchTransport()
    tr.flat_gather = False  # the small all-gathers time gloo's ring, whatever the layout
    p = tr.size
    total = a.mib << 20
    out = {"ranks": p, "received_bytes_per_rank": total * (p - 1) // p}

    def slowest_median(run):
        """`run()` (seconds) once to warm up, then `--reps` times after a
        barrier: the slowest rank's median."""
        run()
        times = []
        for _ in range(a.reps):
            tr.barrier(120.0)
            times.append(run())
        mine = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        return mine.item()

    def all_to_alls(prefix, runs=(("one_s", total, 1), ("split_s", total, a.many))):
        for key, size, m in runs:
            each = size // m // p  # bytes to each peer in one exchange
            # Through the runtime's own side of the transport (fresh vectors
            # in and out, as a synchronization's exchanges are), not the
            # Python object alone.
            out[prefix + key] = slowest_median(lambda: _native.transport_all_to_all_s(tr, each, m))
            out[key.replace("_s", "_message_bytes")] = each

    all_to_alls("")
    # And `--tiny-kib` in as many exchanges: where the messages' own cost
    # shows beside their bytes (with the one large exchange, the fit per
    # message, `iterations.py`).
    all_to_alls("", (("tiny_s", a.tiny_kib << 10, a.many),))
    out["tiny_received_bytes_per_rank"] = (a.tiny_kib << 10) * (p - 1) // p

    def ring(x):
        # The median call, not the mean: a stall of gloo's loop on DDP's
        # own group (its loop threads are left as gloo starts them, and
        # spin on a busy core until the scheduler's tick, docs/validation.md)
        # lands in a few calls, and DDP's median step meets the median call.
        times = []
        for _ in range(a.ring_calls):
            t = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    # gloo's own all-reduce, as DDP's fp32 synchronization calls it (the
    # tensor handed over in place), at the same size and at a small one.
    for key, nbytes in (("ring", total), ("ring_small", a.small_kib << 10)):
        x = torch.ones(nbytes // 4)
        out[f"{key}_s"] = slowest_median(lambda: ring(x))
        out[f"{key}_bytes"] = nbytes

    # The transport's all-gather (gloo's ring, the last phase of every
    # compressed scheme through the hook) of a few bytes a rank: what each
    # of its P−1 steps costs beyond its bytes, `--gather-calls` back to back
    # as a synchronization's phases follow each other.
    few, all_few = bytearray(8), bytearray(8 * p)

    def gathers():
        t = time.perf_counter()
        for _ in range(a.gather_calls):
            tr.all_gather(few, all_few, [len(few)] * p, 60.0)
        return (time.perf_counter() - t) / a.gather_calls

    out["gather_small_s"] = slowest_median(gathers)
    out["gather_small_bytes"] = len(few)

    # The same all-to-alls while a compute thread keeps the rank's cores
    # busy, as the backward pass does while the hook's worker exchanges.
    with beside_compute(a.compute_size):
        all_to_alls("busy_")
    out["compute_size"] = a.compute_size

    out.update(ddp_bucket_cost(a, slowest_median))
    out.update(hook_cost(a, tr))
    out.update(interleave_cost(a, tr))
    if tr.rank == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def interleave_cost(a, tr):
    """What a synchronization and a backward pass cost beyond their work
    alone where they interleave on one core, as the hook's worker and the
    training thread do: the runtime's all-reduce (`--interleave-scheme`)
    of a bucket (`--interleave-elements`) `--interleave-calls` times, alone;
    forward and backward passes of a stack of 4 linear layers of 1024²
    (16 MiB of weights, their gradients written every pass), alone; then
    both at once, a thread running whole passes until the all-reduces are
    done. The process's CPU over the run beside, less the calls' CPU alone
    and the passes' (as many as the thread ran) alone, is what interleaving
    added to both; per CPU second of synchronization alone, each rank's
    median over `--reps` (at least 5) runs, the mean over ranks
    (`interleave_r`)."""
    import threading

    from qsync._transport import new_gloo_group

    group, loops = new_gloo_group()
    sync = _native.GradSync(TorchTransport(group, _loop_threads=loops), a.interleave_scheme)
    buf = torch.randn(a.interleave_elements).numpy()
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])
    x = torch.randn(2, 1024)

    def one_pass():
        net.zero_grad(set_to_none=True)
        net(x).sum().backward()

    def syncs():
        tr.barrier(120.0)
        c = time.process_time()
        for _ in range(a.interleave_calls):
            sync.all_reduce_mean(buf)
        return time.process_time() - c

    for _ in range(2):
        one_pass()
    syncs()
    runs = []
    for _ in range(max(a.reps, 5)):
        alone_sync = syncs()
        c = time.process_time()
        for _ in range(8):
            one_pass()
        alone_pass = (time.process_time() - c) / 8
        stop, passes = threading.Event(), [0]

        def compute():
            while not stop.is_set():
                one_pass()
                passes[0] += 1

        tr.barrier(120.0)
        c = time.process_time()
        worker = threading.Thread(target=compute)
        worker.start()
        for _ in range(a.interleave_calls):
            sync.all_reduce_mean(buf)
        stop.set()
        worker.join()  # its last pass runs to the end, alone
        total = time.process_time() - c
        if alone_sync > 0:
            extra = total - alone_sync - passes[0] * alone_pass
            runs.append((extra / alone_sync, alone_sync, total, alone_pass, passes[0]))
    mine = statistics.median(r[0] for r in runs) if runs else 0.0
    both = torch.tensor([mine], dtype=torch.float64)
    dist.all_reduce(both)
    med = lambda i: statistics.median(r[i] for r in runs) if runs else 0.0
    return {"interleave_r": both[0].item() / tr.size, "interleave_scheme": a.interleave_scheme,
            "interleave_elements": a.interleave_elements, "interleave_calls": a.interleave_calls,
            # rank 0's medians, for the record
            "interleave_rank0": {"tax": med(0), "syncs_alone_s": med(1), "beside_s": med(2), "pass_alone_s": med(3),
                                 "passes": med(4)}}


def handed_back(_state, bucket):
    """A DDP comm hook that hands every bucket straight back."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def hook_cost(a, tr):
    """What qsync's DDP hook adds to a bucket beyond the runtime's call
    (its `call_s`): handing the bucket to its worker thread (or running it
    in the call, as `last_bucket="auto"` decides for this layout) and the
    result back through the future DDP waits on, and the hook's Python
    around the call. A backward of one linear layer (`--hook-width`², one
    bucket) under `qsync.comm_hook(--hook-scheme)` less its call, against
    the same layer's backward under a hook that hands the bucket straight
    back, every rank after a barrier; each rank's medians over `--reps`
    (at least 20), the slowest rank's difference."""
    import qsync

    reps = max(a.reps, 20)
    torch.manual_seed(0)
    hook = qsync.comm_hook(a.hook_scheme)
    models = {}
    for name, h in (("hook", hook), ("back", handed_back)):
        m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(a.hook_width, a.hook_width))
        m.register_comm_hook(None, h)
        models[name] = m
    x = torch.randn(2, a.hook_width)

    def backward(m):
        m.zero_grad(set_to_none=True)
        loss = m(x).pow(2).mean()
        t = time.perf_counter()
        loss.backward()
        return time.perf_counter() - t

    times = {"hook": [], "back": []}
    for i in range(reps + 2):
        for name, m in models.items():
            tr.barrier(120.0)
            if name == "hook":
                hook.qsync.reset_phases()
                t = backward(m) - hook.qsync.phases()["call_s"]
            else:
                t = backward(m)
            if i >= 2:  # the first steps build DDP's buckets and the hook's state
                times[name].append(t)
    mine = torch.tensor([statistics.median(times["hook"]) - statistics.median(times["back"])], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return {"hook_overhead_s": mine.item(), "hook_scheme": a.hook_scheme, "hook_elements": a.hook_width ** 2 + a.hook_width}


def ddp_bucket_cost(a, slowest_median):
    """What DDP itself does with the gradient on the training thread, around
    any hook: a backward pass of a stack of linear layers (`--ddp-layers`
    of `--ddp-width`², about a ResNet-18's parameters by default) under a
    comm hook that hands every bucket straight back, against the same
    backward under `no_sync` (the slowest rank's medians). The difference
    is DDP's copies of the gradients into their buckets and back and its
    work per parameter tensor (its autograd hook, its bookkeeping). The
    same again with many small layers (`--ddp-small-layers` of
    `--ddp-small-width`²: few elements, many tensors) tells the two apart
    (`iterations.py` fits one a element and one a tensor)."""
    out = {}
    for prefix, n, width in (("ddp", a.ddp_layers, a.ddp_width), ("ddp_small", a.ddp_small_layers, a.ddp_small_width)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(n)])
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(None, handed_back)
        x = torch.randn(2, width)

        def backward(sync):
            ddp.zero_grad(set_to_none=True)
            with ddp.no_sync() if not sync else contextlib.nullcontext():
                loss = ddp(x).pow(2).mean()
                t = time.perf_counter()
                loss.backward()
                return time.perf_counter() - t

        backward(True)  # DDP builds its buckets in the first synchronized step
        params = list(model.parameters())
        out[f"{prefix}_hook_backward_s"] = slowest_median(lambda: backward(True))
        out[f"{prefix}_no_sync_backward_s"] = slowest_median(lambda: backward(False))
        out[f"{prefix}_elements"] = sum(q.numel() for q in params)
        out[f"{prefix}_tensors"] = len(params)
    return out


if __name__ == "__main__":
    main()
