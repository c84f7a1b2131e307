#!/usr/bin/env python3
"""Give a fixed-batch ONNX export a symbolic batch, so that qsync costs and
profiles it at the batch it is trained at (qsync otherwise scales the batch-1
graph's work linearly, which a GPU does not do).

    python3 scripts/gpu/rebatch.py IN.onnx OUT.onnx

The leading dimension of every graph input and output becomes the symbol
`batch`; the leading entry of constant Reshape shapes, when it is the old batch, is
replaced by 0 ("copy the input's dimension", ONNX Reshape with allowzero=0)
or, under allowzero=1, by -1 (inferred) — or, when the shape already has a
-1 and no literal 0, by 0 with allowzero turned off (the same semantics for
every other entry) — which keeps the batch flowing through. Inferred `value_info` is dropped (qsync infers shapes again).
Weights stored as external data stay where they are: the output refers to
them by the same relative path, so write OUT next to IN or accept absent
weights (qsync costs shapes, not values). Fails with exit 2 and a message
naming the node when a Reshape could not let the batch through.
"""
import sys

import onnx
from onnx import numpy_helper


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    try:
        model = onnx.load(src, load_external_data=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file is reported the same way
        print(f"error: {src}: cannot read ONNX: {e}", file=sys.stderr)
        return 2
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consts = {n.output[0]: n for n in g.node if n.op_type == "Constant"}
    batch = None
    for vi in list(g.input) + list(g.output):
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value"):
            batch = batch or dims[0].dim_value
            dims[0].ClearField("dim_value")
            dims[0].dim_param = "batch"
    # A shape constant may be shared by several Reshapes: decide its new
    # value once (0 where every reader copies dimensions, else -1), then
    # make every reader agree with it.
    readers = {}
    for n in g.node:
        if n.op_type == "Reshape" and len(n.input) > 1 and (n.input[1] in inits or n.input[1] in consts):
            readers.setdefault(n.input[1], []).append(n)
    for shape, nodes in readers.items():
        if shape in inits:
            holder, name = inits[shape], shape
        else:
            holder = next((a.t for a in consts[shape].attribute if a.name == "value"), None)
            if holder is None:
                continue
            name = holder.name
        arr = numpy_helper.to_array(holder).copy()
        if not arr.size or arr[0] != batch:
            continue
        allowzero = lambda n: next((a for a in n.attribute if a.name == "allowzero" and a.i == 1), None)  # noqa: E731
        if -1 not in arr and all(allowzero(n) for n in nodes):
            arr[0] = -1
        elif 0 not in arr:
            # No literal zero: allowzero makes no difference but to the 0 we write.
            for n in nodes:
                az = allowzero(n)
                if az is not None:
                    az.i = 0
            arr[0] = 0
        elif not any(allowzero(n) for n in nodes):
            arr[0] = 0
        else:
            print(f"error: {src}: Reshape `{nodes[0].name}` has allowzero=1 and its shape a literal 0: "
                  "the batch cannot flow", file=sys.stderr)
            return 2
        holder.CopyFrom(numpy_helper.from_array(arr, name))
    del g.value_info[:]
    onnx.save(model, dst)
    print(f"{src}: batch {batch} -> symbolic `batch` ({dst})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
