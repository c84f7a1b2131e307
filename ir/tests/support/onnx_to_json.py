#!/usr/bin/env python3
"""Dump an ONNX model's graph to JSON for qsync-ir's inference tests.

Usage: onnx_to_json.py MODEL.onnx OUT.json

Writes nodes (name, op_type, domain, inputs, outputs, attributes; tensor
attributes as dtype/dims plus small values), graph inputs/outputs with
their element types and dims (int, symbol string, or null), initializers
(dtype, dims, and values only for small inline tensors), the default-domain
opset, and "ref": the types onnx.shape_inference infers for every value.
"""
import json
import math
import sys

import onnx
from onnx import numpy_helper, shape_inference

SMALL = 64


def fnum(x):
    """JSON has no inf/nan: write those as strings."""
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def tensor_json(t):
    out = {"dtype": t.data_type, "dims": list(t.dims)}
    n = 1
    for d in t.dims:
        n *= d
    if n <= SMALL and t.data_location != onnx.TensorProto.EXTERNAL:
        try:
            arr = numpy_helper.to_array(t).reshape(-1)
            if arr.dtype.kind in "iub":
                out["ints"] = [int(x) for x in arr]
            elif arr.dtype.kind == "f":
                out["floats"] = [fnum(float(x)) for x in arr]
        except Exception:  # noqa: BLE001
            pass
    return out


def attr_json(a):
    T = onnx.AttributeProto
    if a.type == T.INT:
        return {"int": a.i}
    if a.type == T.FLOAT:
        return {"float": fnum(a.f)}
    if a.type == T.STRING:
        return {"string": a.s.decode("utf-8", "replace")}
    if a.type == T.INTS:
        return {"ints": list(a.ints)}
    if a.type == T.FLOATS:
        return {"floats": [fnum(f) for f in a.floats]}
    if a.type == T.STRINGS:
        return {"strings": [s.decode("utf-8", "replace") for s in a.strings]}
    if a.type == T.TENSOR:
        return {"tensor": tensor_json(a.t)}
    return None


def vtype(vi):
    tt = vi.type.tensor_type
    dims = None
    if tt.HasField("shape"):
        dims = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
    return {"name": vi.name, "dtype": tt.elem_type, "dims": dims}


def main():
    path, out = sys.argv[1], sys.argv[2]
    m = onnx.load(path, load_external_data=False)
    g = m.graph
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)
    nodes = []
    for n in g.node:
        attrs = {}
        for a in n.attribute:
            j = attr_json(a)
            if j is not None:
                attrs[a.name] = j
        nodes.append({"name": n.name, "op_type": n.op_type, "domain": n.domain, "inputs": list(n.input),
                      "outputs": list(n.output), "attrs": attrs})
    ref = {}
    try:
        inferred = shape_inference.infer_shapes(m)
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            ref[vi.name] = vtype(vi)
    except Exception as e:  # noqa: BLE001
        print(f"onnx shape inference failed: {e}", file=sys.stderr)
    doc = {
        "opset": opset,
        "inputs": [vtype(i) for i in g.input],
        "outputs": [o.name for o in g.output],
        "initializers": [dict(name=t.name, **tensor_json(t)) for t in g.initializer],
        "value_info": [vtype(v) for v in g.value_info],
        "nodes": nodes,
        "ref": ref,
    }
    with open(out, "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    main()
