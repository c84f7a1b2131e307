#!/usr/bin/env python3
"""Where a training iteration's time goes on the GPU (or on this CPU as a
device), measured against predicted: per phase (forward, backward,
optimizer step) and per kind of operator (convolutions, matrix products,
normalizations, ...), so an error in Table III (or in the compute table of
docs/validation-compute.md) can be traced to the operators that make it.

    python3 scripts/gpu/breakdown.py --iterations ITER.json --models-dir DIR --profile PROFILE.json
        [--qsyncc target/debug/qsyncc] [--device NAME] [--device-file FILE] [--out-dir DIR] [--json OUT.json]

On the CPU, ITER.json comes from scripts/cpu/train.py --op-iters N: its
`phases_ms` are the CPU time of each phase, its `kernels` each ATen
operator's own CPU time, and the measured iteration is the median CPU
time (`cpu_median_ms`); pass the device file the profile was built with
(`--device cpu --device-file cpu.json`).

ITER.json comes from scripts/gpu/train.py: each run's `phases_ms` (CUDA
events between the phases) and `kernels` (torch.profiler: the GPU time of
the kernels each ATen operator launched, per iteration). For each run this
calls `qsyncc simulate --trace` with PROFILE (the in-sample profile shows
the profile's own bias; a leave-one-out one adds the transfer error) and
sums the trace's spans per phase and per kind, the kind read from the ONNX
node each span names. Measured kinds come from the ATen operators' names.
The measured kernels' total beside the measured iteration says how much of
the step the GPU was busy: what is left is the host's time the GPU waited
for, which no per-operator time shows.
"""
import argparse
import json
import os
import sys

import onnx

# The same simulate call as Table III's (this directory is on the path).
from analyze import Failure, load, qsyncc, simulate_args  # noqa: E402

# ONNX op type -> kind.
ONNX_KIND = {
    "Conv": "conv", "ConvTranspose": "conv",
    "Gemm": "matmul", "MatMul": "matmul",
    "BatchNormalization": "norm", "LayerNormalization": "norm",
    "MaxPool": "pool", "AveragePool": "pool", "GlobalAveragePool": "pool", "ReduceMean": "pool",
    "Softmax": "softmax", "LogSoftmax": "softmax",
    "SoftmaxCrossEntropyLoss": "loss", "NegativeLogLikelihoodLoss": "loss",
    "Cast": "cast",
    "Gather": "embedding",
}
# ATen operator (prefix) -> kind; the rest is "elementwise/other".
ATEN_KIND = [
    ("aten::cudnn_convolution", "conv"), ("aten::convolution_backward", "conv"), ("aten::_convolution", "conv"),
    ("aten::convolution", "conv"), ("aten::conv", "conv"), ("aten::mkldnn_convolution", "conv"),
    ("aten::_slow_conv2d", "conv"), ("aten::thnn_conv", "conv"),
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::bmm", "matmul"), ("aten::baddbmm", "matmul"),
    ("aten::matmul", "matmul"), ("aten::linear", "matmul"), ("aten::_scaled_mm", "matmul"),
    ("aten::cudnn_batch_norm", "norm"), ("aten::native_batch_norm", "norm"), ("aten::batch_norm", "norm"),
    ("aten::_batch_norm", "norm"), ("aten::native_layer_norm", "norm"), ("aten::layer_norm", "norm"),
    ("aten::max_pool", "pool"), ("aten::avg_pool", "pool"), ("aten::adaptive_avg_pool", "pool"),
    ("aten::_adaptive_avg_pool", "pool"), ("aten::mean", "pool"),
    ("aten::_softmax", "softmax"), ("aten::softmax", "softmax"), ("aten::_log_softmax", "softmax"),
    ("aten::nll_loss", "loss"), ("aten::cross_entropy", "loss"),
    ("aten::_foreach", "optimizer"), ("aten::_fused", "optimizer"), ("aten::_amp", "optimizer"),
    ("aten::copy_", "cast"), ("aten::_to_copy", "cast"), ("aten::to", "cast"),
    ("aten::embedding", "embedding"), ("aten::index_select", "embedding"),
]
KINDS = ["conv", "matmul", "norm", "pool", "softmax", "loss", "embedding", "cast", "elementwise/other", "optimizer"]


def aten_kind(name, device="GPU"):
    if device == "CPU" and name.startswith("aten::copy_"):
        # FP32 on the CPU casts nothing: its copies make tensors contiguous.
        return "elementwise/other"
    for prefix, kind in ATEN_KIND:
        if name.startswith(prefix):
            return kind
    return "elementwise/other"


def node_kinds(path):
    m = onnx.load(path, load_external_data=False)
    return {n.name: ONNX_KIND.get(n.op_type, "elementwise/other") for n in m.graph.node}


def profile_for(a, run):
    """The profile that predicts `run`: the one given for its family
    (`--profile FAMILY=PATH`, e.g. the leave-one-out profile without it),
    else the one given for every run (`--profile PATH`)."""
    plain = [p for p in a.profile if "=" not in p]
    for p in a.profile:
        fam, _, path = p.partition("=")
        if path and fam == run["family"]:
            return path
    if not plain:
        raise SystemExit(f"error: no --profile for family `{run['family']}` (run {run['model']})")
    return plain[-1]


def predicted(a, run):
    """(per phase ms, per kind ms) from `qsyncc simulate --trace`."""
    model = os.path.join(a.models_dir, run["qsync_model"])
    kinds = node_kinds(model)
    trace = os.path.join(a.out_dir, f"trace-{run['model']}-{run['precision']}-{run.get('batch')}.json")
    devfiles = [x for f in a.device_file for x in ("--device-file", f)]
    target, args = simulate_args(a.qsyncc, run, model, a.device, a.out_dir, devfiles)
    out = json.loads(qsyncc(a.qsyncc, "simulate", target, *args, "--profile", profile_for(a, run), "--trace", trace))
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    phases, per_kind = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}, {k: 0.0 for k in KINDS}
    for e in events:
        if e.get("ph") != "X" or e.get("pid") != 1 or e.get("tid") != 0:
            continue
        ms = e["dur"] / 1e3
        cat = e.get("cat")
        if cat not in phases:
            continue
        phases[cat] += ms
        if cat == "optimizer":
            per_kind["optimizer"] += ms
            continue
        node = e["name"].rsplit(".", 1)[0] if cat == "backward" else e["name"]
        kind = kinds.get(node) or ("cast" if "cast" in node.lower() else "elementwise/other")
        per_kind[kind] += ms
    return out["iteration_ms"], phases, per_kind


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", required=True)
    ap.add_argument("--models-dir", required=True)
    ap.add_argument("--profile", required=True, action="append",
                    help="PATH for every run, or FAMILY=PATH for that family's runs (repeatable)")
    ap.add_argument("--qsyncc", default="target/debug/qsyncc")
    ap.add_argument("--device", default="h100-sxm")
    ap.add_argument("--device-file", action="append", default=[],
                    help="a device file simulate needs for --device (the CPU's, from scripts/cpu/device.py)")
    ap.add_argument("--out-dir", default="target/gpu-measure/breakdown")
    ap.add_argument("--json")
    ap.add_argument("--phases-markdown", help="write one table, a row per run: each phase measured / predicted")
    a = ap.parse_args()
    try:
        return breakdown(a)
    except Failure as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def breakdown(a):
    os.makedirs(a.out_dir, exist_ok=True)
    its = load(a.iterations, "qsync-iterations/1")
    rows = []
    for run in its["runs"]:
        if "kernels" not in run or "phases_ms" not in run:
            continue
        it_ms, phases, kinds = predicted(a, run)
        # On the CPU the iteration is its CPU time (scripts/cpu/train.py).
        device = "CPU" if "cpu_median_ms" in run else "GPU"
        measured_ms = run.get("cpu_median_ms", run["median_ms"])
        measured = {k: 0.0 for k in KINDS}
        for name, v in run["kernels"]["ops"].items():
            measured[aten_kind(name, device)] += v["us"] / 1e3
        rows.append({"model": run["model"], "precision": run["precision"], "batch": run.get("batch"),
                     "measured_ms": measured_ms, "device": device,
                     "kernels_ms": run["kernels"]["kernels_us"] / 1e3, "predicted_ms": it_ms,
                     "phases_measured": run["phases_ms"], "phases_predicted": phases,
                     "kinds_measured": measured, "kinds_predicted": kinds})
    if not rows:
        raise SystemExit(f"error: {a.iterations}: no run has `phases_ms` and `kernels` "
                         "(scripts/gpu/train.py --kernel-iters, scripts/cpu/train.py --op-iters)")
    for r in rows:
        where = "GPU busy" if r["device"] == "GPU" else "in ATen operators"
        batch = f" batch {r['batch']}" if r.get("batch") else ""
        print(f"\n{r['model']} {r['precision']}{batch}: iteration measured {r['measured_ms']:.2f} ms "
              f"({where} {r['kernels_ms']:.2f} ms, {100 * r['kernels_ms'] / r['measured_ms']:.0f}%), "
              f"predicted {r['predicted_ms']:.2f} ms")
        print("| phase / kind | measured ms | predicted ms | predicted / measured |")
        print("|---|---:|---:|---:|")
        for k in ("forward", "backward", "optimizer"):
            m, p = r["phases_measured"][k], r["phases_predicted"][k]
            what = "events" if r["device"] == "GPU" else "CPU time"
            print(f"| {k} ({what}) | {m:.2f} | {p:.2f} | {p / m if m > 0 else float('nan'):.2f} |")
        for k in KINDS:
            m, p = r["kinds_measured"][k], r["kinds_predicted"][k]
            if m > 0.005 or p > 0.005:
                what = "kernels" if r["device"] == "GPU" else "ops"
                print(f"| {k} ({what}) | {m:.2f} | {p:.2f} | {p / m if m > 0 else float('inf'):.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1, sort_keys=True)
    if a.phases_markdown:
        with open(a.phases_markdown, "w") as f:
            f.write(phases_table(rows))
    return 0


def phases_table(rows):
    """A row per run: the iteration and each phase, measured / predicted (ms)."""
    out = ["| model | batch | iteration ms | forward ms | backward ms | optimizer ms |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        pm, pp = r["phases_measured"], r["phases_predicted"]
        cells = [f"{pm[k]:.1f} / {pp[k]:.1f}" for k in ("forward", "backward", "optimizer")]
        out.append(f"| {r['model']} | {r.get('batch') or ''} | {r['measured_ms']:.1f} / {r['predicted_ms']:.1f} | "
                   + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
