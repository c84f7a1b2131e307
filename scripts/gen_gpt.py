#!/usr/bin/env python3
"""Generate GPT-style decoder training graphs as ONNX, for planner scale tests.

Usage:
    gen_gpt.py -o OUT.onnx [--layers 48] [--hidden 768] [--heads 12]
               [--seq seq|N] [--batch batch|N] [--vocab 50257] [--positions 1024]
               [--dropout P] [--no-loss] [--with-weights] [--seed 0]

The graph is what PyTorch's legacy exporter writes for a GPT-2-style model in
training (opset 17), built node by node with the `onnx` package (nothing is
downloaded or traced):

- token and position embeddings (`Gather`), positions from `Shape` → `Gather`
  → `Range` arithmetic, as exporters emit for a symbolic sequence length;
- per layer: `LayerNormalization`; the fused QKV projection (`MatMul` + bias
  `Add`, `Split`); heads by `Shape`/`Gather`/`Unsqueeze`/`Concat` → `Reshape`
  → `Transpose`; scaled scores (`MatMul`, `Div`), a causal mask `Slice`d from
  a shared buffer and `Add`ed, `Softmax`, context `MatMul`, heads merged back;
  output projection, residual `Add`; `LayerNormalization`, MLP with GELU
  decomposed as the exporter writes it (`Div`, `Erf`, `Add`, `Mul`, `Mul`),
  residual `Add`; optional training `Dropout`s (`--dropout P`, three a layer);
- final `LayerNormalization`, the LM head `MatMul`, and (unless `--no-loss`)
  `SoftmaxCrossEntropyLoss` against a `labels` input.

That is 40 nodes a layer and 12 around them (43 a layer with dropout): 48
layers give 1,932 nodes, 256 layers 10,252.

`--batch` / `--seq` take a dimension name (symbolic, bound by the planner's
`--batch` / `--dim seq=N`) or an integer (fixed). Without `--with-weights`
every weight (tensors over 1,024 elements) is external data in
`OUT.onnx.data`, which is NOT written — the shape of real exports shipped
without their weights; small constants are always inline. With
`--with-weights` all weights are inline, seeded normal values (std 0.02, as
GPT-2 initializes): meant for tiny configurations that onnxruntime can run.

Output is deterministic: the same arguments give the same bytes.
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

EXTERNAL_THRESHOLD = 1024


class Builder:
    def __init__(self, args, out_path):
        self.nodes = []
        self.inits = []
        self.with_weights = args.with_weights
        self.rng = np.random.default_rng(args.seed)
        self.location = os.path.basename(out_path) + ".data"
        self.offset = 0
        self.counts = {}

    def node(self, scope, op, inputs, n_out=1, **attrs):
        """Add a node named like the legacy exporter's (`/scope/Op_k`);
        returns its output names."""
        k = self.counts.get((scope, op), 0)
        self.counts[(scope, op)] = k + 1
        name = f"{scope}/{op}" + (f"_{k}" if k else "")
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs if n_out > 1 else outs[0]

    def const(self, name, array):
        """A small constant, always inline."""
        self.inits.append(onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, name, dims, fill=None):
        """A float parameter: inline when small or `--with-weights`, else
        external data in the (unwritten) `OUT.onnx.data`."""
        numel = int(np.prod(dims))
        if self.with_weights or numel <= EXTERNAL_THRESHOLD:
            if fill is None:
                vals = (self.rng.standard_normal(dims) * 0.02).astype(np.float32)
            else:
                vals = np.full(dims, fill, dtype=np.float32)
            self.inits.append(onnx.numpy_helper.from_array(vals, name))
            return name
        t = TensorProto()
        t.name = name
        t.data_type = TensorProto.FLOAT
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        length = numel * 4
        for k, v in (("location", self.location), ("offset", str(self.offset)), ("length", str(length))):
            e = t.external_data.add()
            e.key, e.value = k, v
        self.offset += length
        self.inits.append(t)
        return name

    def mask(self, name, positions):
        """The causal-mask buffer [1, 1, P, P]: 0 on and below the diagonal,
        -10000 above (GPT-2's masked bias)."""
        if self.with_weights or positions * positions <= EXTERNAL_THRESHOLD:
            m = np.triu(np.full((positions, positions), -10000.0, dtype=np.float32), k=1)
            self.inits.append(onnx.numpy_helper.from_array(m.reshape(1, 1, positions, positions), name))
            return name
        return self.weight(name, [1, 1, positions, positions])


def dim(s):
    return int(s) if s.isdigit() else s


def build(args, out_path):
    if args.hidden % args.heads:
        sys.exit(f"gen_gpt.py: --hidden {args.hidden} is not a multiple of --heads {args.heads}")
    if isinstance(args.seq, int) and args.seq > args.positions:
        sys.exit(f"gen_gpt.py: --seq {args.seq} exceeds --positions {args.positions}")
    b = Builder(args, out_path)
    H, nh = args.hidden, args.heads
    hd = H // nh
    V, P = args.vocab, args.positions

    # Shared small constants (exporters deduplicate identical ones).
    c_i0 = b.const("const_0", np.array(0, dtype=np.int64))
    c_i1 = b.const("const_1", np.array(1, dtype=np.int64))
    c_ax0 = b.const("axes_0", np.array([0], dtype=np.int64))
    c_nh = b.const("const_heads", np.array([nh], dtype=np.int64))
    c_hd = b.const("const_head_dim", np.array([hd], dtype=np.int64))
    c_h = b.const("const_hidden", np.array([H], dtype=np.int64))
    c_split = b.const("const_split", np.array([H, H, H], dtype=np.int64))
    c_zero2 = b.const("const_zeros_2", np.array([0, 0], dtype=np.int64))
    c_axes23 = b.const("const_axes_2_3", np.array([2, 3], dtype=np.int64))
    c_scale = b.const("const_scale", np.array(np.sqrt(hd), dtype=np.float32))
    c_sqrt2 = b.const("const_sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
    c_one = b.const("const_one", np.array(1.0, dtype=np.float32))
    c_half = b.const("const_half", np.array(0.5, dtype=np.float32))
    mask = b.mask("transformer.causal_mask", P)

    ids = "input_ids"
    inputs = [helper.make_tensor_value_info(ids, TensorProto.INT64, [args.batch, args.seq])]

    # Embeddings; positions 0..seq from the input's shape.
    s = "/transformer"
    shape = b.node(s, "Shape", [ids])
    seq = b.node(s, "Gather", [shape, c_i1], axis=0)
    pos = b.node(s, "Range", [c_i0, seq, c_i1])
    pos = b.node(s, "Unsqueeze", [pos, c_ax0])
    wte = b.weight("transformer.wte.weight", [V, H])
    wpe = b.weight("transformer.wpe.weight", [P, H])
    tok = b.node(f"{s}/wte", "Gather", [wte, ids])
    pe = b.node(f"{s}/wpe", "Gather", [wpe, pos])
    x = b.node(s, "Add", [tok, pe])

    def dropout(scope, t):
        if args.dropout <= 0:
            return t
        ratio = b.const(f"{scope.strip('/').replace('/', '.')}.dropout_ratio", np.array(args.dropout, dtype=np.float32))
        training = b.const(f"{scope.strip('/').replace('/', '.')}.training", np.array(True))
        return b.node(scope, "Dropout", [t, ratio, training], seed=args.seed)

    def linear(scope, t, fan_in, fan_out, prefix):
        w = b.weight(f"{prefix}.weight", [fan_in, fan_out])
        bias = b.weight(f"{prefix}.bias", [fan_out], fill=0.0)
        return b.node(scope, "Add", [b.node(scope, "MatMul", [t, w]), bias])

    def layernorm(scope, t, prefix):
        g = b.weight(f"{prefix}.weight", [H], fill=1.0)
        beta = b.weight(f"{prefix}.bias", [H], fill=0.0)
        return b.node(scope, "LayerNormalization", [t, g, beta], axis=-1, epsilon=1e-5)

    for i in range(args.layers):
        s = f"/transformer/h.{i}"
        p = f"transformer.h.{i}"
        h = layernorm(f"{s}/ln_1", x, f"{p}.ln_1")
        a = f"{s}/attn"
        qkv = linear(f"{a}/c_attn", h, H, 3 * H, f"{p}.attn.c_attn")
        q, k, v = b.node(a, "Split", [qkv, c_split], n_out=3, axis=2)
        # Sizes from the activation's shape, as traced code `x.size(0)` writes.
        shp = b.node(a, "Shape", [h])
        bsz = b.node(a, "Unsqueeze", [b.node(a, "Gather", [shp, c_i0], axis=0), c_ax0])
        sl = b.node(a, "Unsqueeze", [b.node(a, "Gather", [shp, c_i1], axis=0), c_ax0])
        heads_shape = b.node(a, "Concat", [bsz, sl, c_nh, c_hd], axis=0)
        q = b.node(a, "Transpose", [b.node(a, "Reshape", [q, heads_shape])], perm=[0, 2, 1, 3])
        k = b.node(a, "Transpose", [b.node(a, "Reshape", [k, heads_shape])], perm=[0, 2, 3, 1])
        v = b.node(a, "Transpose", [b.node(a, "Reshape", [v, heads_shape])], perm=[0, 2, 1, 3])
        scores = b.node(a, "Div", [b.node(a, "MatMul", [q, k]), c_scale])
        ends = b.node(a, "Concat", [sl, sl], axis=0)
        causal = b.node(a, "Slice", [mask, c_zero2, ends, c_axes23])
        probs = b.node(a, "Softmax", [b.node(a, "Add", [scores, causal])], axis=-1)
        probs = dropout(f"{a}/attn_dropout", probs)
        ctx = b.node(a, "Transpose", [b.node(a, "MatMul", [probs, v])], perm=[0, 2, 1, 3])
        merged = b.node(a, "Reshape", [ctx, b.node(a, "Concat", [bsz, sl, c_h], axis=0)])
        out = linear(f"{a}/c_proj", merged, H, H, f"{p}.attn.c_proj")
        out = dropout(f"{a}/resid_dropout", out)
        x = b.node(s, "Add", [x, out])
        h = layernorm(f"{s}/ln_2", x, f"{p}.ln_2")
        m = f"{s}/mlp"
        u = linear(f"{m}/c_fc", h, H, 4 * H, f"{p}.mlp.c_fc")
        gate = b.node(f"{m}/act", "Add", [b.node(f"{m}/act", "Erf", [b.node(f"{m}/act", "Div", [u, c_sqrt2])]), c_one])
        u = b.node(f"{m}/act", "Mul", [b.node(f"{m}/act", "Mul", [u, gate]), c_half])
        out = linear(f"{m}/c_proj", u, 4 * H, H, f"{p}.mlp.c_proj")
        out = dropout(f"{m}/dropout", out)
        x = b.node(s, "Add", [x, out])

    h = layernorm("/transformer/ln_f", x, "transformer.ln_f")
    logits = b.node("/lm_head", "MatMul", [h, b.weight("lm_head.weight", [H, V])])
    outputs = []
    if args.loss:
        labels = "labels"
        inputs.append(helper.make_tensor_value_info(labels, TensorProto.INT64, [args.batch, args.seq]))
        flat = b.node("/loss", "Reshape", [logits, b.const("const_flat_logits", np.array([-1, V], dtype=np.int64))])
        flat_labels = b.node("/loss", "Reshape", [labels, b.const("const_flat", np.array([-1], dtype=np.int64))])
        loss = b.node("/loss", "SoftmaxCrossEntropyLoss", [flat, flat_labels], reduction="mean")
        outputs.append(helper.make_tensor_value_info(loss, TensorProto.FLOAT, []))
    outputs.append(helper.make_tensor_value_info(logits, TensorProto.FLOAT, [args.batch, args.seq, V]))

    graph = helper.make_graph(b.nodes, "gpt", inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="qsync gen_gpt.py")
    model.ir_version = 8
    return model, b.offset


def check(data, name, external_bytes):
    """The full checker (shape inference included) on the written bytes; the
    absent external data is stood in for by a sparse file of the right size
    in a temporary directory, so the check covers the structure."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        if external_bytes:
            with open(path + ".data", "wb") as f:
                f.truncate(external_bytes)
        onnx.checker.check_model(path, full_check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=dim, default="seq")
    ap.add_argument("--batch", type=dim, default="batch")
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--no-loss", dest="loss", action="store_false")
    ap.add_argument("--with-weights", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for name in ("layers", "hidden", "heads", "vocab", "positions"):
        if getattr(args, name) < 1:
            sys.exit(f"gen_gpt.py: --{name} must be positive")
    model, external_bytes = build(args, args.output)
    data = model.SerializeToString(deterministic=True)
    check(data, os.path.basename(args.output), external_bytes)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "wb") as f:
        f.write(data)
    print(f"{args.output}: {len(model.graph.node)} nodes, {len(model.graph.initializer)} initializers")


if __name__ == "__main__":
    main()
