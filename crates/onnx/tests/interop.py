#!/usr/bin/env python3
"""Interop check for an exported model.

Usage: interop.py ORIGINAL.onnx EXPORTED.onnx

1. Runs onnx.checker.check_model(full_check=True) on the exported file. When
   its external data files are absent (models shipped without weights), the
   check runs on a temporary copy beside sparse zero-filled stand-ins of the
   right size, so the structure and shape inference are still checked.
2. Checks that both files have the same number of nodes, initializers,
   inputs and outputs.
3. When the weights of both models are present, runs both in onnxruntime
   (CPU, one thread) on the same seeded random inputs (float: normal; int64:
   ids in [0, 100), `*mask*` inputs: ones; symbolic dims: 2, or 8 for
   sequence dims) and asserts the outputs are bitwise equal.
Exits non-zero with a message on any failure.
"""
import os
import shutil
import sys
import tempfile

import numpy as np
import onnx
from onnx import helper


def external_needs(model):
    """{location: bytes needed} for every external initializer."""
    need = {}
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        kv = {e.key: e.value for e in t.external_data}
        n = 1
        for d in t.dims:
            n *= d
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        length = int(kv.get("length", n * itemsize))
        end = int(kv.get("offset", 0)) + length
        loc = kv["location"]
        need[loc] = max(need.get(loc, 0), end)
    return need


def weights_present(path, model):
    base = os.path.dirname(os.path.abspath(path))
    return all(os.path.isfile(os.path.join(base, loc)) for loc in external_needs(model))


def check(path):
    model = onnx.load(path, load_external_data=False)
    if weights_present(path, model):
        onnx.checker.check_model(path, full_check=True)
        return model, True
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, os.path.basename(path))
        shutil.copyfile(path, copy)
        for loc, size in external_needs(model).items():
            p = os.path.join(tmp, loc)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.truncate(size)
        onnx.checker.check_model(copy, full_check=True)
    return model, False


def feeds(sess, seed=1234):
    rng = np.random.default_rng(seed)
    out = {}
    for i in sess.get_inputs():
        shape = []
        for d in i.shape:
            if isinstance(d, int) and d >= 0:
                shape.append(d)
            else:
                shape.append(8 if "seq" in str(d).lower() else 2)
        if i.type == "tensor(float)":
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
        elif i.type == "tensor(int64)":
            if "mask" in i.name.lower():
                out[i.name] = np.ones(shape, dtype=np.int64)
            else:
                out[i.name] = rng.integers(0, 100, size=shape, dtype=np.int64)
        elif i.type == "tensor(int32)":
            out[i.name] = rng.integers(0, 100, size=shape, dtype=np.int32)
        else:
            raise SystemExit(f"interop: unsupported input type {i.type} for {i.name}")
    return out


def run(path, inputs):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    if inputs is None:
        inputs = feeds(sess)
    return sess, inputs, sess.run(None, inputs)


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: interop.py ORIGINAL.onnx EXPORTED.onnx")
    orig, exp = sys.argv[1], sys.argv[2]
    exp_model, exp_weights = check(exp)
    orig_model = onnx.load(orig, load_external_data=False)
    g0, g1 = orig_model.graph, exp_model.graph
    for what, a, b in [
        ("nodes", len(g0.node), len(g1.node)),
        ("initializers", len(g0.initializer), len(g1.initializer)),
        ("inputs", len(g0.input), len(g1.input)),
        ("outputs", len(g0.output), len(g1.output)),
    ]:
        if a != b:
            raise SystemExit(f"interop: {exp}: {what} {b} != original {a}")
    if not (exp_weights and weights_present(orig, orig_model)):
        print(f"interop: {exp}: checker OK (weights absent: onnxruntime comparison skipped)")
        return
    _, inputs, want = run(orig, None)
    _, _, got = run(exp, inputs)
    if len(want) != len(got):
        raise SystemExit(f"interop: {exp}: {len(got)} outputs, original {len(want)}")
    for k, (w, g) in enumerate(zip(want, got)):
        w, g = np.asarray(w), np.asarray(g)
        if w.dtype != g.dtype or w.shape != g.shape or w.tobytes() != g.tobytes():
            diff = np.max(np.abs(w.astype(np.float64) - g.astype(np.float64))) if w.shape == g.shape else "shape"
            raise SystemExit(f"interop: {exp}: output {k} differs from the original (max abs diff {diff})")
    print(f"interop: {exp}: checker OK, {len(want)} outputs bitwise equal in onnxruntime")


if __name__ == "__main__":
    main()
