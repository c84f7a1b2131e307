#!/usr/bin/env python3
"""Time the DDP hook's synchronization on CPU tensors (the runtime's
`GradSync` over `qsync._transport.TorchTransport`, gloo) against gloo's own
f32 all-reduce of the same tensor, and how long each scheme spends inside
the transport's calls (the rest is kernels and the runtime's copies).

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 4 scripts/bench/transport.py \\
        [--elements 6500000] [--schemes fp16,qgz-int8,nbit-2] [--reps 5] [--nodes 2] \\
        [--beside-compute [--compute-size 128]]

Needs the `qsync` package installed beside PyTorch (`scripts/setup.sh`
makes the virtual environment; `maturin build` in crates/python, then
`pip install` the wheel). Rank 0 prints one line per scheme: seconds per
synchronization (mean of `--reps` after one warm-up), and per transport
method its calls and seconds per synchronization. With --beside-compute,
every rank runs a compute-bound thread (matrix products, as a backward pass
keeps a core busy) while it synchronizes, and rank 0 also prints the CPU
time of the synchronizing thread and gloo's own all-reduce timed beside the
same compute: as in DDP on CPU tensors, where the hook's worker thread and
gloo's threads share the rank's cores with autograd.
"""
import argparse
import contextlib
import os
import threading
import time

import torch
import torch.distributed as dist

from qsync import _native
from qsync._transport import TorchTransport

METHODS = ["all_gather", "all_to_all_v", "all_reduce_f32"]


def compute(stop, n, nice=0):
    """Products of n×n matrices until `stop` is set. Torch releases the GIL
    inside each product and takes it back between them: small products
    hold the GIL often (as Python-heavy work does), large ones seldom (as
    autograd's C++ backward pass does)."""
    if nice:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    x = torch.randn(n, n)
    while not stop.is_set():
        torch.mm(x, x)


@contextlib.contextmanager
def beside_compute(size, nice=0):
    """A thread of `size`×`size` matrix products (`compute`) runs for the
    block."""
    stop = threading.Event()
    busy = threading.Thread(target=compute, args=(stop, size, nice))
    busy.start()
    try:
        yield
    finally:
        stop.set()
        busy.join()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=6_500_000)
    ap.add_argument("--schemes", default="fp16,qgz-int8,nbit-2")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--beside-compute", action="store_true",
                    help="a compute-bound thread runs in every rank while it synchronizes")
    ap.add_argument("--compute-size", type=int, default=128,
                    help="the compute thread's matrices are N×N (default 128)")
    ap.add_argument("--compute-nice", type=int, default=0,
                    help="the compute thread's nice value (default 0, as the synchronizing thread's)")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spent = {}
    for name in METHODS:
        f = getattr(TorchTransport, name)

        def timed(self, *args, _f=f, _n=name):
            t = time.perf_counter()
            r = _f(self, *args)
            c = spent.setdefault(_n, [0, 0.0])
            c[0] += 1
            c[1] += time.perf_counter() - t
            return r

        setattr(TorchTransport, name, timed)
    transport = TorchTransport()
    x = torch.randn(a.elements, generator=torch.Generator().manual_seed(rank))
    y = x.clone()
    dist.all_reduce(y)
    t = time.perf_counter()
    for _ in range(a.reps):
        dist.all_reduce(y)
    if rank == 0:
        print(f"gloo fp32 all-reduce: {(time.perf_counter() - t) / a.reps:.4f} s", flush=True)
    if a.beside_compute:
        # gloo's own all-reduce beside the same compute: what any gloo
        # collective pays there, the hook's transport or not.
        with beside_compute(a.compute_size, a.compute_nice):
            t = time.perf_counter()
            for _ in range(a.reps):
                dist.all_reduce(y)
            beside = (time.perf_counter() - t) / a.reps
        if rank == 0:
            print(f"gloo fp32 all-reduce beside compute: {beside:.4f} s", flush=True)
    for scheme in a.schemes.split(","):
        s = _native.GradSync(transport, scheme, nodes=a.nodes, node_of=None, group=512, seed=0, timeout_s=60.0,
                             gather_f32=False)
        g = x.clone()
        s.all_reduce_mean(g.numpy())
        spent.clear()
        with beside_compute(a.compute_size, a.compute_nice) if a.beside_compute else contextlib.nullcontext():
            t, c = time.perf_counter(), time.thread_time()
            for _ in range(a.reps):
                s.all_reduce_mean(g.numpy())
            total, cpu = (time.perf_counter() - t) / a.reps, (time.thread_time() - c) / a.reps
        if rank == 0:
            calls = ", ".join(f"{k} {v[0] // a.reps}x {v[1] / a.reps:.4f} s" for k, v in sorted(spent.items()))
            beside = f", beside compute; the synchronizing thread's CPU {cpu:.4f} s" if a.beside_compute else ""
            print(f"{scheme}: {total:.4f} s ({calls}{beside})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
