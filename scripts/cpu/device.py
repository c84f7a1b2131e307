#!/usr/bin/env python3
"""Describe this machine's CPU as a qsync device file, for checking the cost
model against measurements without a GPU (the compute check).

    python3 scripts/cpu/device.py OUT.json [--name cpu]

Every figure is either read from the machine (lscpu, /proc/meminfo) or
measured here with PyTorch (in CPU time of the process, the time a call
takes alone on a shared machine), and its `sources` entry says which and
how:

The device is the cores PyTorch computes on (`torch.get_num_threads()`,
set with OMP_NUM_THREADS), at most lscpu's CPU(s).

- peak FP32 rate: those cores x 32 FP32 FLOP per cycle (two 256-bit FMA
  pipes when lscpu lists avx2 and fma; 16 otherwise) x the clock lscpu
  reports (its max MHz, else BogoMIPS / 2);
- its fraction reached (`efficiency.cuda_core`): the best of 5 timed
  2048 x 2048 FP32 matrix products on every thread;
- memory bandwidth: the best of 5 copies of a 256 MiB tensor (bytes read +
  written per second), so `efficiency.memory` is 1;
- launch overhead: PyTorch's time per operator on tiny tensors, forward and
  backward of a chain of 200 multiplications on 16 elements (what the CPU
  pays per kernel the cost model counts);
- view overhead (`view_op_us`): the same chain of 200 views (`.view`), per
  view and pass, less the sum at its end (what PyTorch pays for an ONNX
  Reshape / Squeeze / Unsqueeze / Expand of a tensor, which the cost model
  otherwise prices as free);
- occupancy: the cores as "SMs" (one block each), with blocks of 1024
  outputs (an assumption: oneDNN cuts work per thread in its own way).

BF16 is listed only when lscpu shows avx512_bf16 or amx_bf16 (native BF16
arithmetic); otherwise the device is FP32 only.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch


def lscpu():
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    info = {}
    for line in out.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            info[k.strip()] = v.strip()
    return info


def best_s(fn, reps=5):
    """The least CPU time of the process (user + system) over `reps` calls:
    what a call takes alone on a machine shared with other work."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--name", default="cpu")
    a = ap.parse_args()
    info = lscpu()
    flags = set(info.get("Flags", "").split())
    # The device is the cores PyTorch computes on (OMP_NUM_THREADS): on a
    # shared machine one thread is timed far more steadily than two.
    cpus = int(info.get("CPU(s)", os.cpu_count() or 1))
    cores = min(cpus, torch.get_num_threads())
    if "CPU max MHz" in info:
        ghz, clock_src = float(info["CPU max MHz"]) / 1e3, "lscpu 'CPU max MHz'"
    else:
        ghz, clock_src = float(info.get("BogoMIPS", "2000")) / 2e3, "lscpu BogoMIPS / 2 (no max MHz reported)"
    per_cycle = 32 if {"avx2", "fma"} <= flags else 16
    peak_tflops = cores * per_cycle * ghz / 1e3
    model = info.get("Model name", platform.processor() or "unknown CPU")
    threads = torch.get_num_threads()

    n = 2048
    x, y = torch.rand(n, n), torch.rand(n, n)
    mm_s = best_s(lambda: torch.mm(x, y))
    mm_tflops = 2 * n**3 / mm_s / 1e12
    big = torch.rand(64 << 20)  # 256 MiB of FP32
    dst = torch.empty_like(big)
    copy_s = best_s(lambda: dst.copy_(big))
    bw_gb_s = 2 * big.numel() * 4 / copy_s / 1e9
    chain = 200
    leaf = torch.rand(16, requires_grad=True)

    def ops():
        h = leaf
        for _ in range(chain):
            h = h * 1.0001
        h.sum().backward()
    per_op_us = statistics.median(best_s(ops, 3) for _ in range(3)) / (2 * chain + 2) * 1e6

    def views():
        # What eager PyTorch runs for an ONNX Reshape / Squeeze / Unsqueeze /
        # Expand of a tensor: one view per pass, and its backward's view.
        h = leaf
        for i in range(chain):
            h = h.view(4, 4) if i % 2 == 0 else h.view(16)
        h.sum().backward()
    per_view_us = max(0.0, (statistics.median(best_s(views, 3) for _ in range(3)) - 2 * per_op_us * 1e-6)
                      / (2 * chain) * 1e6)
    with open("/proc/meminfo") as f:
        mem_kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    bf16 = bool({"avx512_bf16", "amx_bf16"} & flags)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    measured = f"measured {date} with PyTorch {torch.__version__} on {threads} thread(s), process CPU time"
    dev = {
        "name": a.name,
        "full_name": f"{model} ({cores} of {cpus} cores, host CPU as a device)",
        "arch": "cpu",
        "memory_bytes": mem_kib * 1024,
        "memory_bandwidth_gb_s": round(bw_gb_s, 2),
        "cuda_core_tflops": {"fp32": round(peak_tflops, 4), **({"bf16": round(peak_tflops, 4)} if bf16 else {})},
        "supported_precisions": ["fp32"] + (["bf16"] if bf16 else []),
        "intra_node": {"kind": "pcie", "bandwidth_gb_s": 32},
        "network_gbit_s": 10,
        "launch_overhead_us": round(per_op_us, 2),
        "view_op_us": round(per_view_us, 2),
        "workspace_bytes": 268435456,
        "efficiency": {"tensor_core": 1.0, "cuda_core": round(min(1.0, mm_tflops / peak_tflops), 4), "memory": 1.0},
        "occupancy": {"sm_count": cores, "tiles_per_sm": 1, "tile_outputs": 1024, "split_k_min": 256},
        "sources": {
            "arch": "host CPU: not a GPU; simulated only",
            "memory_bytes": "/proc/meminfo MemTotal",
            "memory_bandwidth_gb_s": f"{measured}: best of 5 copies of a 256 MiB FP32 tensor, bytes read + written",
            "intra_node": "assumption: unused (single-process measurements)",
            "network_gbit_s": "assumption: unused (single-process measurements)",
            "launch_overhead_us": f"{measured}: forward + backward of a chain of {chain} multiplications on 16 "
                                  "elements, time per operator (PyTorch dispatch and autograd per op)",
            "view_op_us": f"{measured}: forward + backward of a chain of {chain} views (.view) of 16 elements, "
                          "time per view and pass (PyTorch dispatch and autograd; shape arithmetic exported from "
                          "Python ints is not run by PyTorch and is not charged)",
            "workspace_bytes": "assumption: allocator and library workspaces",
            "efficiency": f"cuda_core: {measured}, best of 5 torch.mm {n}x{n}x{n} FP32 = {mm_tflops * 1e3:.1f} "
                          f"GFLOP/s over the peak; memory 1 (bandwidth measured); tensor_core unused",
            "cuda_core_tflops.fp32": f"lscpu: {model}; {cores} core(s) used of {cpus} (PyTorch threads), "
                                     f"{per_cycle} FP32 FLOP/cycle/core "
                                     f"({'AVX2 + FMA: two 256-bit FMA pipes' if per_cycle == 32 else 'no FMA'}), "
                                     f"{ghz:.3f} GHz from {clock_src}",
            "occupancy.sm_count": f"the {cores} core(s) PyTorch computes on (lscpu: {cpus} CPU(s)); one block per core",
            "occupancy.tiles": "assumption: blocks of 1024 outputs, split-K slices of 256 (oneDNN's own "
                               "partitioning is not modelled)",
        },
    }
    if bf16:
        dev["sources"]["cuda_core_tflops.bf16"] = "lscpu lists native BF16 (avx512_bf16/amx_bf16): the FP32 rate"
    with open(a.out, "w") as f:
        json.dump(dev, f, indent=2)
        f.write("\n")
    print(f"{a.out}: {model}, {cores} cores, peak {peak_tflops * 1e3:.1f} GFLOP/s (mm {mm_tflops * 1e3:.1f}), "
          f"{bw_gb_s:.1f} GB/s, {per_op_us:.2f} us/op, bf16 {'yes' if bf16 else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
