#!/usr/bin/env python3
"""Measure a qsync worklist on a GPU with PyTorch: per distinct operator its
forward, input-gradient and weight-gradient time at each precision, plus
casts and optimizer steps by size. Writes a `qsync-ops/1` measurement file
that `qsyncc profile build` turns into a calibration profile.

    python3 scripts/gpu/profile.py WORKLIST.json OUT.json [--precisions fp32,tf32,fp16,bf16,fp8e4m3,int8]
                                   [--reps 7] [--target-ms 2] [--limit N]

Timing: CUDA events around N back-to-back calls (N chosen so one repeat
takes about --target-ms), after warm-up; the median of --reps repeats,
divided by N. Back-to-back calls measure what a training loop sees: the
kernel's time when the GPU is the bottleneck, PyTorch's dispatch time when
the kernel is shorter than it. The backward phases are timed through
`torch.autograd.grad` for just the activations (input gradient) or just the
trained weights (weight gradient), which is how autograd splits them;
an operator with both is also timed asking for both in one call
(`bwd_both_us`, off with QSYNC_OPS_BOTH=0), as a training backward does,
which shows where the two phases timed apart add up to more.

Precisions: fp32 with TF32 off everywhere; tf32 with TF32 on (measured for
Conv/Gemm/MatMul, the only ops it changes; other ops reuse fp32's times,
which is what they run); fp16 / bf16 with every float input in that type
(normalization parameters in FP32 when PyTorch refuses reduced ones, as
autocast keeps them); fp8e4m3: the forward of Gemm/MatMul through
`torch._scaled_mm` (no autograd path; backward left to the analytic model);
int8: QSync's INT8 forward of Gemm/MatMul (quantize activation and weight
per tensor, `torch._int_mm`, dequantize to FP32). An operator PyTorch has no
path for at a precision is listed under `skipped` with the reason, never
timed as something else.

Batch points: when the worklist lists `batch_points` (`qsyncc profile
worklist --batch-points 1,2,32`), every entry is also timed at its shapes at
those batches (`at_batches`); `qsyncc profile build` turns them into the
op's batch curve.

Needs only PyTorch (no network); exits 2 with a message when there is no GPU.
`--device cpu` measures on this machine's CPU instead, as a device of its
own (the compute check): the CPU time of the process (user + system,
`time.process_time`) over N back-to-back calls (N chosen so one repeat
takes about --target-ms), the minimum over --reps repeats divided by N. On a
machine shared with other work the wall clock counts the time other
processes hold the cores; the CPU time of a single-threaded run
(OMP_NUM_THREADS=1) is what it would take alone. Optimizer steps are
measured too, casts only when a reduced precision is asked for. `meta.gpu`
then names the CPU.
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

# This file is named like the standard library's `profile`, which PyTorch
# imports (torch._dynamo → cProfile): keep its own directory off the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

FLOAT = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPES = {
    "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
    "bool": torch.bool,
}
GEMM_OPS = {"Gemm", "MatMul"}
DEVICE = "cuda"
BOTH = os.environ.get("QSYNC_OPS_BOTH", "1") != "0"
# The host's time per call of the last GPU measurement (see bench_us).
LAST_HOST_US = [0.0]


class Unsupported(Exception):
    """PyTorch has no path for this operator (at this precision)."""


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def cpu_name():
    """The CPU as `meta.gpu` names it (scripts/cpu/train.py writes the same)."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU {model} ({torch.get_num_threads()} threads)"


def bench_us(fn, reps, target_ms):
    """Microseconds per call of `fn` (see the module doc)."""
    if DEVICE == "cpu":
        clock = time.process_time
        fn()
        t0 = clock()
        fn()
        once = max(clock() - t0, 1e-7)
        n = max(1, min(1000, int(target_ms * 1e-3 / once)))
        times = []
        for _ in range(reps):
            t0 = clock()
            for _ in range(n):
                fn()
            times.append((clock() - t0) / n)
        return min(times) * 1e6
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    n = max(1, min(500, int(target_ms / once)))
    times, host = [], []
    for _ in range(reps):
        start.record()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        host.append((time.perf_counter() - t0) * 1e6 / n)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / n)
    LAST_HOST_US[0] = statistics.median(host)
    return statistics.median(times)


def with_host(times, key, us):
    """`times[key] = us`, and on a GPU `times[key_host] =` the host's
    time per call of that measurement (what issuing it cost the CPU: the
    host's share of a training step, which the GPU waits for when its
    kernels are shorter)."""
    times[key] = us
    if DEVICE == "cuda":
        times[key.replace("_us", "_host_us")] = round(LAST_HOST_US[0], 3)


def attr(e, name, default=None):
    return e["attrs"].get(name, default)


def const_value(spec):
    v = spec.get("value")
    return None if v is None else [int(x) if float(x).is_integer() else x for x in v]


def make_inputs(e, prec, params_fp32=False):
    """Tensors for every input slot, at `prec` for float ones."""
    dev = DEVICE
    fdt = FLOAT[prec]
    out = []
    for slot, spec in enumerate(e["inputs"]):
        if spec is None:
            out.append(None)
            continue
        shape, dt = spec["shape"], spec["dtype"]
        if dt in ("f32", "f16", "bf16", "f64"):
            keep32 = params_fp32 and spec["role"] != "activation"
            t = torch.rand(shape, device=dev, dtype=torch.float32 if keep32 else fdt) + 0.5
            if spec.get("value") is not None and len(spec["value"]) == t.numel():
                t = torch.tensor(spec["value"], device=dev, dtype=t.dtype).reshape(shape)
            t.requires_grad_(bool(spec["grad"]) or spec["role"] == "weight")
        elif dt == "bool":
            t = torch.rand(shape, device=dev) > 0.5
        elif dt in DTYPES:
            if spec.get("value") is not None:
                t = torch.tensor(const_value(spec), device=dev, dtype=DTYPES[dt]).reshape(shape)
            else:
                hi = index_bound(e, slot)
                t = torch.randint(0, hi, shape, device=dev, dtype=DTYPES[dt])
        else:
            raise Unsupported(f"input {slot} has dtype {dt}")
        out.append(t)
    return out


def index_bound(e, slot):
    """Exclusive upper bound of random integer data for an input slot."""
    if e["op"] in ("Gather", "GatherElements") and slot == 1:
        data = e["inputs"][0]["shape"]
        axis = attr(e, "axis", 0)
        return max(1, data[axis])
    return 2


def conv_pads(e, rank):
    pads = attr(e, "pads", [0] * (2 * rank))
    if attr(e, "auto_pad", "NOTSET") not in ("NOTSET", ""):
        raise Unsupported(f"auto_pad={attr(e, 'auto_pad')}")
    begin, end = pads[:rank], pads[rank:]
    return begin, end


def forward_fn(e):
    """The operator as a function of its input tensors (ONNX semantics)."""
    op = e["op"]
    rank = len(e["inputs"][0]["shape"]) - 2 if e["inputs"] and e["inputs"][0] else 0
    if op == "Conv":
        begin, end = conv_pads(e, rank)
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}.get(rank)
        if conv is None:
            raise Unsupported(f"{rank}-D convolution")
        stride, dil, group = attr(e, "strides", [1] * rank), attr(e, "dilations", [1] * rank), attr(e, "group", 1)
        if begin == end:
            return lambda x, w, b=None: conv(x, w, b, stride, begin, dil, group)
        pad = [p for pair in zip(reversed(begin), reversed(end)) for p in pair]
        return lambda x, w, b=None: conv(F.pad(x, pad), w, b, stride, 0, dil, group)
    if op == "Gemm":
        ta, tb, alpha, beta = attr(e, "transA", 0), attr(e, "transB", 0), attr(e, "alpha", 1.0), attr(e, "beta", 1.0)
        if not ta and tb and alpha == 1.0 and beta == 1.0:
            return lambda a, b, c=None: F.linear(a, b, c)

        def gemm(a, b, c=None):
            a = a.t() if ta else a
            b = b.t() if tb else b
            y = alpha * (a @ b)
            return y if c is None else y + beta * c
        return gemm
    if op == "MatMul":
        return torch.matmul
    if op == "BatchNormalization":
        eps, mom = attr(e, "epsilon", 1e-5), attr(e, "momentum", 0.9)
        return lambda x, s, b, m, v: F.batch_norm(x, m.detach(), v.detach(), s, b, True, 1.0 - mom, eps)
    if op == "LayerNormalization":
        axis, eps = attr(e, "axis", -1), attr(e, "epsilon", 1e-5)
        shape = e["inputs"][0]["shape"]
        norm = shape[axis:] if axis >= 0 else shape[len(shape) + axis:]
        return lambda x, w=None, b=None: F.layer_norm(x, norm, w, b, eps)
    unary = {"Relu": torch.relu, "Tanh": torch.tanh, "Erf": torch.erf, "Sqrt": torch.sqrt, "Sigmoid": torch.sigmoid,
             "Exp": torch.exp, "Log": torch.log, "Neg": torch.neg, "Abs": torch.abs, "Reciprocal": torch.reciprocal,
             "Not": torch.logical_not}
    if op in unary:
        return unary[op]
    if op == "Gelu":
        approx = attr(e, "approximate", "none")
        return lambda x: F.gelu(x, approximate=approx)
    binary = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div, "Pow": torch.pow,
              "Equal": torch.eq, "Less": torch.lt, "Greater": torch.gt, "And": torch.logical_and,
              "Or": torch.logical_or, "Max": torch.maximum, "Min": torch.minimum}
    if op in binary:
        return binary[op]
    if op == "Where":
        return lambda c, x, y: torch.where(c.bool(), x, y)
    if op in ("Softmax", "LogSoftmax"):
        axis = attr(e, "axis", -1)
        return (lambda x: torch.softmax(x, axis)) if op == "Softmax" else (lambda x: torch.log_softmax(x, axis))
    if op in ("MaxPool", "AveragePool"):
        k = attr(e, "kernel_shape")
        begin, end = conv_pads(e, len(k))
        if begin != end:
            raise Unsupported("asymmetric pooling pads")
        s, ceil = attr(e, "strides", [1] * len(k)), bool(attr(e, "ceil_mode", 0))
        if op == "MaxPool":
            dil = attr(e, "dilations", [1] * len(k))
            pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[len(k)]
            return lambda x: pool(x, k, s, begin, dil, ceil)
        cip = bool(attr(e, "count_include_pad", 0))
        pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[len(k)]
        return lambda x: pool(x, k, s, begin, ceil, cip)
    if op == "GlobalAveragePool":
        return lambda x: F.adaptive_avg_pool2d(x, 1) if x.dim() == 4 else x.mean(tuple(range(2, x.dim())), keepdim=True)
    if op in ("ReduceMean", "ReduceSum", "ReduceMax"):
        keep = bool(attr(e, "keepdims", 1))
        axes = attr(e, "axes")
        if axes is None and len(e["inputs"]) > 1 and e["inputs"][1]:
            axes = const_value(e["inputs"][1])
        if axes is None:
            axes = list(range(len(e["inputs"][0]["shape"])))
        red = {"ReduceMean": torch.mean, "ReduceSum": torch.sum, "ReduceMax": torch.amax}[op]
        return lambda x, *_: red(x, dim=tuple(axes), keepdim=keep)
    if op == "Dropout":
        ins = e["inputs"]
        ratio = const_value(ins[1])[0] if len(ins) > 1 and ins[1] and ins[1].get("value") else attr(e, "ratio", 0.5)
        train = bool(const_value(ins[2])[0]) if len(ins) > 2 and ins[2] and ins[2].get("value") else False
        return lambda x, *_: F.dropout(x, ratio, train)
    if op == "Gather":
        axis = attr(e, "axis", 0)
        if axis == 0 and e["inputs"][0]["role"] == "weight":
            return lambda w, i: F.embedding(i, w)
        return lambda d, i: torch.index_select(d, axis, i.reshape(-1)).reshape(
            d.shape[:axis] + i.shape + d.shape[axis + 1:])
    if op == "GatherElements":
        axis = attr(e, "axis", 0)
        return lambda d, i: torch.gather(d, axis, i)
    if op == "Transpose":
        perm = attr(e, "perm")
        return lambda x: x.permute(perm).contiguous() if perm else x.t().contiguous()
    if op == "Concat":
        axis = attr(e, "axis", 0)
        return lambda *xs: torch.cat(xs, axis)
    if op == "Split":
        axis = attr(e, "axis", 0)
        ins = e["inputs"]
        sizes = const_value(ins[1]) if len(ins) > 1 and ins[1] and ins[1].get("value") else attr(e, "split")
        n = len(e["outputs"])
        dim = ins[0]["shape"][axis]
        sizes = sizes or [dim // n] * n
        return lambda x, *_: torch.split(x, sizes, axis)
    if op == "Slice":
        ins = e["inputs"]
        vals = [const_value(s) if s and s.get("value") is not None else None for s in ins[1:]]
        if any(v is None for v in vals[:2]):
            raise Unsupported("Slice with computed starts/ends")
        starts, ends = vals[0], vals[1]
        axes = vals[2] if len(vals) > 2 and vals[2] is not None else list(range(len(starts)))
        steps = vals[3] if len(vals) > 3 and vals[3] is not None else [1] * len(starts)
        rank = len(ins[0]["shape"])

        def sl(x, *_):
            idx = [slice(None)] * rank
            for a, s, t, st in zip(axes, starts, ends, steps):
                idx[a] = slice(s, min(t, 2**62), st)
            return x[tuple(idx)]
        return sl
    raise Unsupported(f"no PyTorch mapping for {op}")


def at_entry(e, at):
    """Entry `e` at one of its other batches: the same op with those shapes."""
    inputs = [None if spec is None else dict(spec, shape=shape) for spec, shape in zip(e["inputs"], at["inputs"])]
    return dict(e, inputs=inputs, outputs=at["outputs"], fwd=at["fwd"], bwd_input=at["bwd_input"],
                bwd_weight=at["bwd_weight"])


def first_float(out):
    outs = out if isinstance(out, (tuple, list)) else (out,)
    for o in outs:
        if torch.is_tensor(o) and o.is_floating_point() and o.requires_grad:
            return o
    return None


def time_float(e, prec, reps, target_ms):
    """fwd / bwd_input / bwd_weight microseconds of entry `e` at a float precision."""
    fn = forward_fn(e)
    norm = e["kind"] == "norm"
    try:
        xs = make_inputs(e, prec)
        fn(*xs)
    except Unsupported:
        raise
    except Exception:  # noqa: BLE001 - PyTorch refuses reduced-precision parameters on some ops
        if prec in ("fp32", "tf32"):
            raise
        xs = make_inputs(e, prec, params_fp32=True)
        fn(*xs)
    times = {}
    with_host(times, "fwd_us", bench_us(lambda: fn(*xs), reps, target_ms))
    specs = e["inputs"]
    acts = [x for x, s in zip(xs, specs) if s and torch.is_tensor(x) and x.requires_grad and s["role"] == "activation"]
    weights = [x for x, s in zip(xs, specs) if s and torch.is_tensor(x) and x.requires_grad and s["role"] == "weight"]
    out = first_float(fn(*xs))
    if out is None:
        return times
    g = torch.rand_like(out)
    # Normalization computes its affine gradients in the input-gradient
    # kernel (the cost model's rule): time them together.
    wrt_in = acts + weights if norm else acts
    if e["bwd_input"]["kernels"] > 0 and wrt_in:
        with_host(times, "bwd_input_us",
                  bench_us(lambda: torch.autograd.grad(out, wrt_in, g, retain_graph=True), reps, target_ms))
    if e["bwd_weight"]["kernels"] > 0 and weights and not norm:
        with_host(times, "bwd_weight_us",
                  bench_us(lambda: torch.autograd.grad(out, weights, g, retain_graph=True), reps, target_ms))
        if "bwd_input_us" in times and BOTH:
            # Both gradients in one call, as a training backward asks for
            # them: how far the two phases timed apart add up to more.
            with_host(times, "bwd_both_us", bench_us(
                lambda: torch.autograd.grad(out, acts + weights, g, retain_graph=True), reps, target_ms))
    return times


def harness_floor(reps, target_ms):
    """The harness's own time per call, per phase (µs), on a call doing
    almost no work (a one-element Relu, and a one-element Linear for the
    weight gradient), timed exactly as every entry is: what `qsyncc
    profile build` takes off a GPU's times (the host runs ahead of the GPU
    in a training loop, so this is not device time)."""
    x = torch.rand(1, 1, device=DEVICE, requires_grad=True)
    w = torch.rand(1, 1, device=DEVICE, requires_grad=True)
    out = F.relu(x)
    lin = F.linear(x, w)
    g = torch.rand_like(out)
    floor = {}
    with_host(floor, "harness_floor_fwd_us", round(bench_us(lambda: F.relu(x), reps, target_ms), 3))
    with_host(floor, "harness_floor_bwd_input_us", round(bench_us(
        lambda: torch.autograd.grad(out, [x], g, retain_graph=True), reps, target_ms), 3))
    with_host(floor, "harness_floor_bwd_weight_us", round(bench_us(
        lambda: torch.autograd.grad(lin, [w], g, retain_graph=True), reps, target_ms), 3))
    return floor


def gemm_operands(e):
    """(M, K, N, weight_is_nk) of a 2-D-able Gemm/MatMul whose second operand is a weight."""
    ins = e["inputs"]
    if e["op"] not in GEMM_OPS or len(ins) < 2 or not ins[1] or ins[1]["role"] != "weight":
        raise Unsupported("only Gemm/MatMul with a weight operand")
    a, b = ins[0]["shape"], ins[1]["shape"]
    if len(b) != 2:
        raise Unsupported("weight is not 2-D")
    if e["op"] == "Gemm":
        if attr(e, "transA", 0):
            raise Unsupported("transA")
        nk = bool(attr(e, "transB", 0))
    else:
        nk = False
    k = a[-1]
    m = math.prod(a[:-1])
    n = b[0] if nk else b[1]
    return m, k, n, nk


def time_fp8(e, reps, target_ms):
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        raise Unsupported("this PyTorch has no torch._scaled_mm")
    if DEVICE != "cuda" or torch.cuda.get_device_capability() < (8, 9):
        raise Unsupported("FP8 GEMMs need sm_89 or newer")
    m, k, n, _ = gemm_operands(e)
    if m % 16 or k % 16 or n % 16:
        raise Unsupported("FP8 GEMM dimensions must be multiples of 16")
    a = (torch.rand(m, k, device=DEVICE) + 0.5).to(torch.float8_e4m3fn)
    b = (torch.rand(n, k, device=DEVICE) + 0.5).to(torch.float8_e4m3fn).t()  # column-major K x N
    one = torch.ones((), device=DEVICE)
    fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
    fn()
    return {"fwd_us": bench_us(fn, reps, target_ms)}


def quantize_i8(x):
    scale = x.abs().amax().clamp(min=1e-12) / 127.0
    return torch.clamp(torch.round(x / scale), -127, 127).to(torch.int8), scale


def time_int8(e, reps, target_ms):
    if not hasattr(torch, "_int_mm"):
        raise Unsupported("this PyTorch has no torch._int_mm")
    m, k, n, nk = gemm_operands(e)
    if m <= 16 or k % 8 or n % 8:
        raise Unsupported("torch._int_mm needs M > 16 and K, N multiples of 8")
    x = torch.rand(m, k, device=DEVICE) + 0.5
    w = torch.rand((n, k) if nk else (k, n), device=DEVICE) + 0.5

    def fwd():
        qx, sx = quantize_i8(x)
        qw, sw = quantize_i8(w)
        acc = torch._int_mm(qx, qw.t() if nk else qw)
        return acc.to(torch.float32) * (sx * sw)
    fwd()
    return {"fwd_us": bench_us(fwd, reps, target_ms)}


def cast_samples(reps, target_ms):
    sizes = [1 << s for s in (16, 18, 20, 22, 24, 26)]
    base = {n: torch.rand(n, device=DEVICE) - 0.5 for n in sizes}
    f8 = getattr(torch, "float8_e4m3fn", None)

    def q8(x):
        return quantize_i8(x)[0]

    def to_f8(x):
        scale = x.abs().amax().clamp(min=1e-12) / 448.0
        return (x / scale).to(f8)
    pairs = [
        ("fp32", "fp16", lambda x: x, lambda x: x.half()),
        ("fp16", "fp32", lambda x: x.half(), lambda x: x.float()),
        ("fp32", "bf16", lambda x: x, lambda x: x.bfloat16()),
        ("bf16", "fp32", lambda x: x.bfloat16(), lambda x: x.float()),
        ("fp16", "bf16", lambda x: x.half(), lambda x: x.bfloat16()),
        ("bf16", "fp16", lambda x: x.bfloat16(), lambda x: x.half()),
        ("fp32", "int8", lambda x: x, q8),
        ("fp16", "int8", lambda x: x.half(), q8),
        ("int8", "fp32", q8, lambda q: q.float() * 0.01),
        ("int8", "fp16", q8, lambda q: q.half() * 0.01),
    ]
    if f8 is not None:
        pairs += [("fp32", "fp8e4m3", lambda x: x, to_f8), ("fp8e4m3", "fp32", to_f8, lambda q: q.float() * 0.01),
                  ("fp16", "fp8e4m3", lambda x: x.half(), to_f8), ("fp8e4m3", "fp16", to_f8, lambda q: q.half() * 0.01)]
    out = []
    for src, dst, prep, fn in pairs:
        samples = []
        for n in sizes:
            x = prep(base[n])
            samples.append([n, round(bench_us(lambda: fn(x), reps, target_ms), 3)])
        out.append({"from": src, "to": dst, "samples": samples})
    return out


def step_us(ps, opt, reps, target_ms):
    """Microseconds of one `opt.step()` over `ps`. On a CPU each step is
    timed on its own after its gradients were replaced by fresh tensors, as
    a training iteration with `zero_grad(set_to_none=True)` has them, and
    the median is kept: the step's temporaries (AdamW's denominator) are
    then allocated, page-faulted in and freed as in training, which a loop
    of steps over the same gradients can hide."""
    if DEVICE != "cpu":
        return bench_us(opt.step, reps, target_ms)
    times = []
    for i in range(max(reps, 5) + 2):
        for p in ps:
            p.grad = torch.rand_like(p)
        t0 = time.process_time()
        opt.step()
        if i >= 2:
            times.append(time.process_time() - t0)
    return statistics.median(times) * 1e6


def optimizer_samples(reps, target_ms):
    """One step of each optimizer (PyTorch's defaults: a loop over the tensors
    on a CPU, the multi-tensor kernels on a GPU) over groups of equal tensors,
    one size per group from 2^10 to 2^23 elements (2^24 on a GPU): `tensors`
    holds [elements, microseconds per tensor] (the group's step divided by
    its count; up to 64 tensors, fewer as they grow, so that every group
    also shows what a large tensor costs when it does not stay in cache)."""
    out = []
    makers = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
        "momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        "adam": lambda ps: torch.optim.AdamW(ps, lr=1e-4),
    }
    # A CPU also at every power of two from 2^20: where the step's
    # temporaries outgrow the allocator's reuse its time per element jumps.
    logs = range(10, 25, 2) if DEVICE == "cuda" else [*range(10, 20, 2), *range(20, 24)]
    for name, make in makers.items():
        tensors, host = [], []
        for log2 in logs:
            n = 1 << log2
            count = max(1, min(64, (1 << 22) // n))
            ps = [torch.nn.Parameter(torch.rand(n, device=DEVICE)) for _ in range(count)]
            for p in ps:
                p.grad = torch.rand_like(p)
            opt = make(ps)
            tensors.append([n, round(step_us(ps, opt, reps, target_ms) / count, 3)])
            host.append([n, round(LAST_HOST_US[0] / count, 3)])
            del opt, ps
        # On a GPU also the host's time per tensor of issuing the step.
        out.append({"optimizer": name, "tensors": tensors, **({"host_tensors": host} if DEVICE == "cuda" else {})})
    return out


def meta():
    m = {
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else cpu_name(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "method": "CUDA events, back-to-back calls, median of repeats; cudnn.benchmark on" if DEVICE == "cuda"
        else f"process CPU time, back-to-back calls, minimum of repeats, {torch.get_num_threads()} thread(s)",
    }
    try:
        m["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        m["driver"] = "unknown (nvidia-smi unavailable)"
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("worklist")
    ap.add_argument("out")
    ap.add_argument("--precisions", default="fp32,tf32,fp16,bf16,fp8e4m3,int8")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--target-ms", type=float, default=2.0)
    ap.add_argument("--limit", type=int, default=0, help="measure only the first N entries (smoke runs)")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="stop starting new entries after this many seconds and write what was measured "
                         "(meta.truncated says how many); 0: no limit")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: measure this machine's CPU as the device")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU visible to PyTorch: nothing to measure", file=sys.stderr)
        return 2
    with open(args.worklist) as f:
        work = json.load(f)
    if work.get("schema") != "qsync-worklist/1":
        print(f"error: {args.worklist}: not a qsync-worklist/1 file", file=sys.stderr)
        return 2
    precisions = [p for p in args.precisions.split(",") if p]
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    entries = work["entries"][: args.limit or None]
    started = time.monotonic()
    # Casts and optimizer steps first: they are short, and a run cut by
    # --budget-s still carries them.
    reduced = any(p not in ("fp32", "tf32") for p in precisions)
    casts = cast_samples(args.reps, args.target_ms) if DEVICE == "cuda" or reduced else []
    optimizers = optimizer_samples(args.reps, args.target_ms)
    floor = harness_floor(args.reps, args.target_ms)
    out_entries = []
    for i, e in enumerate(entries):
        if args.budget_s and time.monotonic() - started > args.budget_s:
            print(f"budget of {args.budget_s:g} s spent: {i} of {len(entries)} entries measured", flush=True)
            break
        measured, skipped, at_batches = {}, {}, {}
        for p in precisions:
            try:
                if p in FLOAT:
                    if p == "tf32" and e["op"] not in ("Conv", "Gemm", "MatMul", "ConvTranspose"):
                        if "fp32" in measured:
                            measured["tf32"] = dict(measured["fp32"])
                            if "fp32" in at_batches:
                                at_batches["tf32"] = [dict(t) for t in at_batches["fp32"]]
                        continue
                    set_tf32(p == "tf32")
                    measured[p] = time_float(e, p, args.reps, args.target_ms)
                    points = []
                    for at in e.get("at_batches", []):
                        eb = at_entry(e, at)
                        points.append(dict(time_float(eb, p, args.reps, args.target_ms), batch=at["batch"]))
                    if points:
                        at_batches[p] = points
                elif p == "fp8e4m3":
                    measured[p] = time_fp8(e, args.reps, args.target_ms)
                elif p == "int8":
                    measured[p] = time_int8(e, args.reps, args.target_ms)
                else:
                    skipped[p] = "unknown precision"
            except Unsupported as why:
                skipped[p] = str(why)
            except (RuntimeError, TypeError, ValueError, IndexError) as err:
                skipped[p] = f"PyTorch failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
            finally:
                set_tf32(False)
        for t in list(measured.values()) + [t for pts in at_batches.values() for t in pts]:
            for k in list(t):
                if k != "batch":
                    t[k] = round(t[k], 3)
        out = dict(e, measured=measured, skipped=skipped)
        if at_batches:
            out["at_batches_measured"] = at_batches
        out_entries.append(out)
        print(f"[{i + 1}/{len(entries)}] {e['key'][:90]}: {sorted(measured)}"
              + (f" skipped {sorted(skipped)}" if skipped else ""), flush=True)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    m = meta()
    m.update({k: str(v) for k, v in floor.items()})
    if len(out_entries) < len(entries):
        m["truncated"] = f"{len(out_entries)} of {len(entries)} entries measured within --budget-s {args.budget_s:g}"
    result = {
        "schema": "qsync-ops/1",
        "batch": work["batch"],
        "meta": m,
        "models": work["models"],
        "entries": out_entries,
        "casts": casts,
        "optimizers": optimizers,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    n_meas = sum(len(e["measured"]) for e in out_entries)
    print(f"wrote {args.out}: {len(out_entries)} ops, {n_meas} (op, precision) timings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
