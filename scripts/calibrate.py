#!/usr/bin/env python3
"""Write a qsync calibration file (indicator statistics and INT8 activation
ranges) for a PyTorch model or an ONNX model.

Usage (as a library): the package's own implementation,
    import qsync
    qsync.calibrate(model, batches, "calib.json", iterations=50)
(`calibrate(model, batches, loss_fn, out_path, ...)` below is the same
function with this script's older argument order).

or from the command line for a torchvision model with random data:
    calibrate.py resnet50 calib.json [--batch 16] [--iterations 50]

or for an ONNX model, run in onnxruntime (no PyTorch needed):
    calibrate.py model.onnx calib.json [--inputs a.npz b.npz ...] [--random N --seed S]

A PyTorch model is trained for a few steps by `qsync.calibrate` (see its
doc: per Conv / Linear / norm / softmax module, the statistics of the input
activation, the weight and the gradient at the output, averaged over the
first `iterations` steps).

An ONNX model is run forward only: for every node of a tracked op type
(Conv, ConvTranspose, MatMul, Gemm, norms, Softmax) the statistics of its
activation input -- its first float input that is not an initializer --
are averaged over the given inputs (`--inputs`: one .npz per run, arrays
named by graph input; else `--random N` seeded inputs: float normal, int64
ids in [0, 100), `*mask*` inputs ones, symbolic dims 1, or 128 for
sequence dims). Keys are node names; there is no `grad_output` (qsync then
estimates gradients from shapes). `min`/`max` are the inputs' mean minimum
and maximum, so qsync's INT8 scale max(|min|, |max|) / 127 clips only the
rarest values of a run.

The format (version 1) is documented in crates/planner/src/indicator.rs:
    {"format": "qsync-calibration", "version": 1, "model": ..., "iterations": N,
     "batch": B, "ops": {"<module name>": {"input": {...}, "weight": {...},
     "grad_output": {...}}}}
Module names (layer1.0.conv1) match graph nodes by their parameter names
(layer1.0.conv1.weight) or the exporter's scoped node names; node names
match themselves. `qsyncc MODEL --stats calib.json` reads it.
"""
import argparse
import json


ONNX_TRACKED = ("Conv", "ConvTranspose", "MatMul", "Gemm", "BatchNormalization", "LayerNormalization",
                "InstanceNormalization", "GroupNormalization", "Softmax", "LogSoftmax")


def _stats_module():
    """The package's calibration format and `Running` means (qsync/_stats.py,
    plain Python): this checkout's file, loaded by path, so that the ONNX
    path runs without the package built or installed; else the installed
    package's."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "python", "python", "qsync",
                        "_stats.py")
    if not os.path.exists(path):
        from qsync import _stats

        return _stats
    spec = importlib.util.spec_from_file_location("qsync_calibration_stats", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def calibrate(model, batches, loss_fn, out_path, iterations=50, name="model", lr=1e-3):
    """`qsync.calibrate` with this script's argument order; returns the
    document written."""
    import qsync

    path = qsync.calibrate(model, batches, out_path, loss_fn=lambda out, y: loss_fn(out, y),
                           iterations=iterations, name=name, lr=lr)
    with open(path) as f:
        return json.load(f)


def _np_stats(a):
    import numpy as np

    a = np.asarray(a, dtype=np.float64)
    return {"norm2": float((a * a).sum()), "min": float(a.min()), "max": float(a.max()), "numel": float(a.size)}


def random_feeds(session, seed):
    """One seeded feed for an onnxruntime session (see the module doc)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for i in session.get_inputs():
        dims = [d if isinstance(d, int) else (128 if "seq" in str(d) else 1) for d in i.shape]
        if "int64" in i.type:
            out[i.name] = np.ones(dims, np.int64) if "mask" in i.name else rng.integers(0, 100, dims, dtype=np.int64)
        elif "float16" in i.type:
            out[i.name] = rng.standard_normal(dims).astype(np.float16)
        else:
            out[i.name] = rng.standard_normal(dims).astype(np.float32)
    return out


def calibrate_onnx(model_path, feeds, out_path, name=None):
    """Run the ONNX model on each feed (a dict input name -> array) in
    onnxruntime, averaging the statistics of every tracked node's activation
    input, and write the calibration JSON."""
    import onnx
    import onnxruntime as ort

    stats = _stats_module()
    model = onnx.load(model_path)
    inferred = onnx.shape_inference.infer_shapes(model)
    inits = {t.name for t in model.graph.initializer}
    consts = {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    infos = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)

    def is_float(v):
        info = infos.get(v)
        return info is not None and info.type.tensor_type.elem_type in floats

    # Node -> the value its `input` statistics describe.
    watched = {}
    for i, n in enumerate(model.graph.node):
        if n.op_type not in ONNX_TRACKED:
            continue
        act = next((v for v in n.input if v and v not in inits and v not in consts and is_float(v)), None)
        if act is not None:
            watched[n.name or f"{n.op_type}_{i}"] = act
    existing = {o.name for o in model.graph.output}
    for v in sorted(set(watched.values()) - existing):
        model.graph.output.append(infos[v])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    runs = {}
    batch = None
    for f in feeds:
        vals = dict(zip(names, sess.run(None, f)))
        batch = next(iter(f.values())).shape[0] if f and next(iter(f.values())).ndim else batch
        for node, v in watched.items():
            runs.setdefault(node, stats.Running()).add(_np_stats(vals[v]))
    ops = {node: {"input": r.mean()} for node, r in sorted(runs.items()) if r.mean() is not None}
    doc = {"format": stats.FORMAT, "version": stats.VERSION, "model": name or model_path, "iterations": len(feeds),
           "batch": batch, "ops": ops}
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    return doc


def main_onnx(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="an ONNX model (.onnx)")
    ap.add_argument("out")
    ap.add_argument("--inputs", nargs="*", default=[], help=".npz files, one run each, arrays named by input")
    ap.add_argument("--random", type=int, default=8, help="seeded random runs when no --inputs (default 8)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.inputs:
        import numpy as np

        feeds = [dict(np.load(p)) for p in a.inputs]
    else:
        import onnxruntime as ort

        sess = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"])
        feeds = [random_feeds(sess, a.seed + i) for i in range(a.random)]
    doc = calibrate_onnx(a.model, feeds, a.out)
    print(f"{a.out}: {len(doc['ops'])} operators over {len(feeds)} runs")


def main():
    import sys

    if len(sys.argv) > 1 and sys.argv[1].endswith(".onnx"):
        return main_onnx(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a torchvision model name (resnet50, vgg16, squeezenet1_1, ...)")
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=50)
    a = ap.parse_args()
    import torch
    import torchvision  # only needed for the command-line path

    model = getattr(torchvision.models, a.model)(weights=None)
    gen = torch.Generator().manual_seed(0)

    def batches():
        while True:
            yield torch.randn(a.batch, 3, 224, 224, generator=gen), torch.randint(0, 1000, (a.batch,), generator=gen)

    calibrate(model, batches(), torch.nn.functional.cross_entropy, a.out, a.iterations, a.model)


if __name__ == "__main__":
    main()
