#!/usr/bin/env python3
"""An INT8 device graph against its FP32 original, in onnxruntime.

Usage: int8_check.py ORIGINAL.onnx PLANNED.onnx RUNS SEED

Checks the planned file with onnx.checker, counts its INT8 QuantizeLinear
nodes that quantize an activation (scale not from an initializer's own
data is all it can see: it reports how many read a graph value that is not
an initializer), runs both models in onnxruntime (CPU, one thread) on RUNS
seeded held-out inputs (seeds SEED, SEED+1, ...: float normal, int64 ids in
[0, 100), `*mask*` inputs ones; the planned model's shapes, the original
run on slices of the batch it fixes) and prints one JSON object:

    {"int8_quantize_nodes": N, "activation_quantize_nodes": A,
     "outputs": {NAME: {"rel_l2": e, "max_abs_rel": m, "top1_agreement": t}}}

rel_l2 = ||int8 - fp32||_2 / ||fp32||_2 over all runs; top1_agreement (for
2-D outputs: rows = samples) the fraction of rows whose argmax agrees. The
caller judges the numbers (the Rust test states its tolerance).
"""
import json
import sys

import numpy as np
import onnx
import onnxruntime as ort


def feeds(sess, seed):
    rng = np.random.default_rng(seed)
    out = {}
    for i in sess.get_inputs():
        dims = [d if isinstance(d, int) else (128 if "seq" in str(d) else 1) for d in i.shape]
        if "int64" in i.type:
            out[i.name] = np.ones(dims, np.int64) if "mask" in i.name else rng.integers(0, 100, dims, dtype=np.int64)
        else:
            out[i.name] = rng.standard_normal(dims).astype(np.float32)
    return out


def session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run_original(a, f):
    """The original on the planned model's feed, sliced to the batch it fixes."""
    lead = {i.name: i.shape[0] for i in a.get_inputs() if i.shape and isinstance(i.shape[0], int)}
    n = next(iter(f.values())).shape[0] if f else 0
    step = min(lead.values()) if lead else 0
    if lead and step < n and n % step == 0:
        parts = [a.run(None, {k: v[s:s + step] for k, v in f.items()}) for s in range(0, n, step)]
        return [np.concatenate([p[j] for p in parts]) for j in range(len(parts[0]))]
    return a.run(None, f)


def main():
    orig, planned, runs, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    pm = onnx.load(planned)
    onnx.checker.check_model(pm, full_check=True)
    inits = {t.name for t in pm.graph.initializer}
    q8 = [n for n in pm.graph.node if n.op_type == "QuantizeLinear"
          and any(t.name == n.input[2] and t.data_type == onnx.TensorProto.INT8 for t in pm.graph.initializer)]
    acts = [n for n in q8 if n.input[0] not in inits]
    a, b = session(orig), session(planned)
    ref, got = {}, {}
    for r in range(runs):
        f = feeds(b, seed + r)
        for o, x, y in zip(a.get_outputs(), run_original(a, f), b.run(None, f)):
            ref.setdefault(o.name, []).append(x.astype(np.float64))
            got.setdefault(o.name, []).append(y.astype(np.float64))
    out = {}
    for name in ref:
        x, y = np.concatenate(ref[name]), np.concatenate(got[name])
        rec = {
            "rel_l2": float(np.linalg.norm(y - x) / max(np.linalg.norm(x), 1e-30)),
            "max_abs_rel": float(np.abs(y - x).max() / max(np.abs(x).max(), 1e-30)),
            "finite": bool(np.isfinite(y).all()),
        }
        if x.ndim == 2 and x.shape[1] > 1:
            rec["top1_agreement"] = float((x.argmax(1) == y.argmax(1)).mean())
        out[name] = rec
    print(json.dumps({"int8_quantize_nodes": len(q8), "activation_quantize_nodes": len(acts), "outputs": out},
                     sort_keys=True))


if __name__ == "__main__":
    main()
