#!/usr/bin/env python3
"""Numerics of a precision-planned model against its FP32 original.

Usage: numerics.py ORIGINAL.onnx PLANNED.onnx [RTOL ATOL]

Checks the planned file with onnx.checker, runs both in onnxruntime (CPU,
one thread) on the same seeded inputs (float: normal; int64: ids in
[0, 100), `*mask*` inputs: ones; symbolic dims: 2, or 8 for sequence dims;
the planned model's shapes, the original run on slices of the batch it fixes)
and asserts every output is within FP16 tolerance of the original
(default rtol 2e-2, atol 2e-2 relative to the output's max magnitude).
Prints the worst relative error per output. Exits non-zero on failure.
"""
import sys

import numpy as np
import onnx
import onnxruntime as ort


def feeds(sess):
    rng = np.random.default_rng(0)
    out = {}
    for i in sess.get_inputs():
        dims = [d if isinstance(d, int) else (8 if "seq" in str(d) else 2) for d in i.shape]
        if "int64" in i.type:
            out[i.name] = np.ones(dims, np.int64) if "mask" in i.name else rng.integers(0, 100, dims, dtype=np.int64)
        elif "float16" in i.type:
            out[i.name] = rng.standard_normal(dims).astype(np.float16)
        else:
            out[i.name] = rng.standard_normal(dims).astype(np.float32)
    return out


def session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def main():
    orig, planned = sys.argv[1], sys.argv[2]
    rtol = float(sys.argv[3]) if len(sys.argv) > 3 else 2e-2
    atol = float(sys.argv[4]) if len(sys.argv) > 4 else 2e-2
    onnx.checker.check_model(onnx.load(planned), full_check=True)
    a, b = session(orig), session(planned)
    # The planned model may be written at another batch than the original
    # fixes (qsyncc rebatches fixed-batch graphs and writes each device's
    # model at its local batch): feed the planned model's shapes, and run
    # the original on slices of its own batch.
    f = feeds(b)
    rb = b.run(None, f)
    lead = {i.name: i.shape[0] for i in a.get_inputs() if i.shape and isinstance(i.shape[0], int)}
    n = next(iter(f.values())).shape[0] if f else 0
    step = min(lead.values()) if lead else 0
    if lead and step < n and n % step == 0:
        parts = [a.run(None, {k: v[s:s + step] for k, v in f.items()}) for s in range(0, n, step)]
        ra = [np.concatenate([p[j] for p in parts]) for j in range(len(parts[0]))]
    else:
        ra = a.run(None, f)
    ok = True
    for out, x, y in zip(a.get_outputs(), ra, rb):
        x = x.astype(np.float64)
        y = y.astype(np.float64)
        scale = max(np.abs(x).max(), 1e-6)
        err = np.abs(x - y).max() / scale
        good = np.allclose(y, x, rtol=rtol, atol=atol * scale) and np.isfinite(y).all()
        print(f"{out.name}: max |diff| / max |ref| = {err:.2e} {'ok' if good else 'FAIL'}")
        ok &= bool(good)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
