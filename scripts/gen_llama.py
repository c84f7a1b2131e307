#!/usr/bin/env python3
"""Generate Llama-style decoder training graphs as ONNX, for planner scale tests.

Usage:
    gen_llama.py --size 1.3b|2.7b|7b -o OUT.onnx [--seq seq|N] [--batch batch|N]
                 [--layers N] [--kv-heads N] [--no-loss]

The graph is a forward training graph (opset 23; the planner derives the
backward pass and the optimizer state itself), built node by node with the
`onnx` package — nothing is downloaded or traced:

- token embedding (`Gather`); rotary tables computed in the graph the way
  exporters of Hugging Face's Llama write them: positions `Range(0, seq)`,
  `Cast`, times the `inv_freq` buffer (`[head_dim / 2]`, base 10000), `Cos`
  and `Sin` → `[seq, head_dim / 2]`, and position ids `Expand`ed to
  `[batch, seq]`;
- per layer (17 nodes): `RMSNormalization`; Q, K, V projections (`MatMul`,
  no bias; K and V `kv_heads * head_dim` wide); `RotaryEmbedding` on Q and
  K; `Attention` (3-D inputs, `q_num_heads` / `kv_num_heads` — grouped-query
  attention when they differ — and `is_causal`); output projection,
  residual `Add`; `RMSNormalization`; SwiGLU MLP: gate and up `MatMul`s,
  SiLU as exporters write it (`Sigmoid`, `Mul`), `Mul` by up, down
  `MatMul`, residual `Add`;
- final `RMSNormalization`, the LM head `MatMul` (untied), and (unless
  `--no-loss`) `SoftmaxCrossEntropyLoss` against a `labels` input.

That is 17 nodes a layer and 16 around them (13 with `--no-loss`): 24
layers give 424 nodes, 32 layers 560.

Configurations (hidden, layers, heads, kv heads, ffn, vocab), from the
published Hugging Face `config.json` of each model:

- `1.3b`: Sheared-LLaMA-1.3B (Xia et al., "Sheared LLaMA", 2023;
  princeton-nlp/Sheared-LLaMA-1.3B): 2048, 24, 16, 16, 5504, 32000 —
  1,345,423,360 parameters;
- `2.7b`: Sheared-LLaMA-2.7B (princeton-nlp/Sheared-LLaMA-2.7B): 2560, 32,
  20, 20, 6912, 32000 — 2,701,560,320 parameters;
- `7b`: Llama 2 7B (Touvron et al., "Llama 2", 2023; meta-llama/Llama-2-7b-hf):
  4096, 32, 32, 32, 11008, 32000 — 6,738,415,616 parameters.

The parameter count is the models' own: 2·vocab·hidden (embedding and LM
head) + layers·(2·hidden² + 2·hidden·kv_heads·head_dim + 3·hidden·ffn +
2·hidden) + hidden, plus the `inv_freq` buffer (head_dim / 2 floats), which
`qsyncc inspect` counts with the float initializers. These three published
models use full multi-head attention (kv heads = heads); `--kv-heads N`
makes a grouped-query variant (Llama 2 70B uses 8), `--layers N` a shallower
one (tests and benches).

`--batch` / `--seq` take a dimension name (symbolic, bound by the planner's
`--batch` / `--dim seq=N`) or an integer (fixed); `--seq` is at most 4096
(Llama 2's context). Every weight over 1,024 elements is external data in
`OUT.onnx.data`, which is NOT written (the 7B's would be 27 GB): the
frontend plans such a model from shapes alone. Output is deterministic: the
same arguments give the same bytes.
"""
import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_gpt  # noqa: E402
from gen_gpt import check, dim  # noqa: E402

OPSET = 23
MAX_POSITIONS = 4096
ROPE_BASE = 10000.0

# size: (hidden, layers, heads, kv_heads, ffn, vocab, published parameter count)
CONFIGS = {
    "1.3b": (2048, 24, 16, 16, 5504, 32000, 1_345_423_360),
    "2.7b": (2560, 32, 20, 20, 6912, 32000, 2_701_560_320),
    "7b": (4096, 32, 32, 32, 11008, 32000, 6_738_415_616),
}


class Builder(gen_gpt.Builder):
    """`gen_gpt.py`'s builder (exporter-style node names, weights as
    external data in the unwritten `OUT.onnx.data`), never writing weights,
    small ones filled with a constant, and counting the parameters."""

    def __init__(self, out_path):
        super().__init__(argparse.Namespace(with_weights=False, seed=0), out_path)
        self.parameters = 0

    def const(self, name, array):
        array = np.asarray(array)
        if array.dtype.kind == "f":
            self.parameters += array.size
        return super().const(name, array)

    def weight(self, name, dims, fill=1.0):
        self.parameters += int(np.prod(dims))
        return super().weight(name, dims, fill)


def build(args, out_path):
    H, L, nh, nkv, F, V, _ = CONFIGS[args.size]
    if args.layers is not None:
        L = args.layers
    if args.kv_heads is not None:
        nkv = args.kv_heads
    if nh % nkv:
        sys.exit(f"gen_llama.py: --kv-heads {nkv} does not divide the {nh} query heads of {args.size}")
    if isinstance(args.seq, int) and not 1 <= args.seq <= MAX_POSITIONS:
        sys.exit(f"gen_llama.py: --seq {args.seq} is outside 1..{MAX_POSITIONS}")
    if isinstance(args.batch, int) and args.batch < 1:
        sys.exit(f"gen_llama.py: --batch {args.batch} must be positive")
    hd = H // nh
    b = Builder(out_path)

    c_i0 = b.const("const_0", np.array(0, dtype=np.int64))
    c_i1 = b.const("const_1", np.array(1, dtype=np.int64))
    c_ax0 = b.const("axes_0", np.array([0], dtype=np.int64))
    c_ax1 = b.const("axes_1", np.array([1], dtype=np.int64))
    inv_freq = b.const(
        "model.rotary_emb.inv_freq",
        (1.0 / ROPE_BASE ** (np.arange(0, hd, 2, dtype=np.float64) / hd)).astype(np.float32),
    )

    ids = "input_ids"
    inputs = [helper.make_tensor_value_info(ids, TensorProto.INT64, [args.batch, args.seq])]

    s = "/model"
    shape = b.node(s, "Shape", [ids])
    seq = b.node(s, "Gather", [shape, c_i1], axis=0)
    pos = b.node(s, "Range", [c_i0, seq, c_i1])
    position_ids = b.node(s, "Expand", [b.node(s, "Unsqueeze", [pos, c_ax0]), shape])
    r = "/model/rotary_emb"
    posf = b.node(r, "Cast", [b.node(r, "Unsqueeze", [pos, c_ax1])], to=TensorProto.FLOAT)
    freqs = b.node(r, "Mul", [posf, inv_freq])
    cos = b.node(r, "Cos", [freqs])
    sin = b.node(r, "Sin", [freqs])
    x = b.node(f"{s}/embed_tokens", "Gather", [b.weight("model.embed_tokens.weight", [V, H]), ids])

    def rmsnorm(scope, t, prefix):
        return b.node(scope, "RMSNormalization", [t, b.weight(f"{prefix}.weight", [H])], axis=-1, epsilon=1e-5)

    def linear(scope, t, fan_in, fan_out, prefix):
        return b.node(scope, "MatMul", [t, b.weight(f"{prefix}.weight", [fan_in, fan_out])])

    for i in range(L):
        s = f"/model/layers.{i}"
        p = f"model.layers.{i}"
        h = rmsnorm(f"{s}/input_layernorm", x, f"{p}.input_layernorm")
        a = f"{s}/self_attn"
        q = linear(f"{a}/q_proj", h, H, nh * hd, f"{p}.self_attn.q_proj")
        k = linear(f"{a}/k_proj", h, H, nkv * hd, f"{p}.self_attn.k_proj")
        v = linear(f"{a}/v_proj", h, H, nkv * hd, f"{p}.self_attn.v_proj")
        q = b.node(a, "RotaryEmbedding", [q, cos, sin, position_ids], num_heads=nh)
        k = b.node(a, "RotaryEmbedding", [k, cos, sin, position_ids], num_heads=nkv)
        ctx = b.node(a, "Attention", [q, k, v], q_num_heads=nh, kv_num_heads=nkv, is_causal=1)
        x = b.node(s, "Add", [x, linear(f"{a}/o_proj", ctx, nh * hd, H, f"{p}.self_attn.o_proj")])
        h = rmsnorm(f"{s}/post_attention_layernorm", x, f"{p}.post_attention_layernorm")
        m = f"{s}/mlp"
        gate = linear(f"{m}/gate_proj", h, H, F, f"{p}.mlp.gate_proj")
        up = linear(f"{m}/up_proj", h, H, F, f"{p}.mlp.up_proj")
        act = b.node(f"{m}/act_fn", "Mul", [gate, b.node(f"{m}/act_fn", "Sigmoid", [gate])])
        down = linear(f"{m}/down_proj", b.node(m, "Mul", [act, up]), F, H, f"{p}.mlp.down_proj")
        x = b.node(s, "Add", [x, down])

    h = rmsnorm("/model/norm", x, "model.norm")
    logits = linear("/lm_head", h, H, V, "lm_head")
    outputs = []
    if args.loss:
        labels = "labels"
        inputs.append(helper.make_tensor_value_info(labels, TensorProto.INT64, [args.batch, args.seq]))
        flat = b.node("/loss", "Reshape", [logits, b.const("const_flat_logits", np.array([-1, V], dtype=np.int64))])
        flat_labels = b.node("/loss", "Reshape", [labels, b.const("const_flat", np.array([-1], dtype=np.int64))])
        loss = b.node("/loss", "SoftmaxCrossEntropyLoss", [flat, flat_labels], reduction="mean")
        outputs.append(helper.make_tensor_value_info(loss, TensorProto.FLOAT, []))
    outputs.append(helper.make_tensor_value_info(logits, TensorProto.FLOAT, [args.batch, args.seq, V]))

    graph = helper.make_graph(b.nodes, f"llama-{args.size}", inputs, outputs, b.inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="qsync gen_llama.py"
    )
    model.ir_version = 10
    return model, b.offset, b.parameters


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--size", required=True, choices=sorted(CONFIGS))
    ap.add_argument("--seq", type=dim, default="seq")
    ap.add_argument("--batch", type=dim, default="batch")
    ap.add_argument("--layers", type=int, help="fewer (or more) layers than the configuration")
    ap.add_argument("--kv-heads", type=int, help="key/value heads (grouped-query attention)")
    ap.add_argument("--no-loss", dest="loss", action="store_false")
    args = ap.parse_args()
    for name in ("layers", "kv_heads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            sys.exit(f"gen_llama.py: --{name.replace('_', '-')} must be positive")
    model, external_bytes, parameters = build(args, args.output)
    data = model.SerializeToString(deterministic=True)
    check(data, os.path.basename(args.output), external_bytes)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "wb") as f:
        f.write(data)
    print(
        f"{args.output}: llama {args.size}, {len(model.graph.node)} nodes, "
        f"{len(model.graph.initializer)} initializers, {parameters:,} parameters"
    )


if __name__ == "__main__":
    main()
