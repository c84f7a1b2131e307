#!/usr/bin/env python3
"""PyTorch's own kernels on 256 MiB f32 tensors, for side-by-side comparison
with qsync's (codegen/tests/gpu.rs): cast to f16/bf16 and back, and
quantize_per_tensor / dequantize to int8. Bytes moved count one read of the
input and one write of the output, as in the Rust measurement."""
import argparse
import json

import torch


def gbs(fn, nbytes, reps=5):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return nbytes / best / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peak", type=float, default=0.0, help="peak memory bandwidth, GB/s")
    args = ap.parse_args()
    n = 64 << 20
    x = (torch.arange(n, device="cuda", dtype=torch.float32) % 1000 - 500) * 0.01
    h = x.half()
    q = torch.quantize_per_tensor(x, 5.0 / 127, 0, torch.qint8)
    rows = {
        "torch_cast_f32_to_f16": gbs(lambda: x.half(), 6 * n),
        "torch_cast_f16_to_f32": gbs(lambda: h.float(), 6 * n),
        "torch_cast_f32_to_bf16": gbs(lambda: x.bfloat16(), 6 * n),
        "torch_quantize_per_tensor_i8": gbs(lambda: torch.quantize_per_tensor(x, 5.0 / 127, 0, torch.qint8), 5 * n),
        "torch_dequantize_i8": gbs(lambda: q.dequantize(), 5 * n),
    }
    for k, v in rows.items():
        frac = f" ({100 * v / args.peak:.0f}% of peak)" if args.peak else ""
        print(f"bandwidth {k}: {v:.1f} GB/s{frac}")
    print(json.dumps({"device": torch.cuda.get_device_name(), "gb_s": rows}))


if __name__ == "__main__":
    main()
