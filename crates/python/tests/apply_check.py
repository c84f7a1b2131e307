"""apply_plan against the shared models' PyTorch counterparts.

For each shared export (dynamo and legacy exporters, and the TorchScript
archives) and the example's two models (`examples/train_ddp.py plan`),
plan it with qsyncc, rebuild the same architecture in PyTorch
(torchvision / transformers / the example, random weights), apply every
device type's plan and run one training-mode forward and backward, then
one optimizer step. Prints one JSON line per (model, device): mapped,
unmapped (with reasons), the precisions applied, the planned calls no
forward reached, and the executed dtypes against plan.json:

- every planned operator, and every precision-dependent operator that is a
  leaf module (ReLU, pooling, dropout), is matched with the torch call that
  ran it (by module and kind, in call order) and the dtype of its inputs
  recorded during the forward (a TorchFunctionMode) must be the dtype its
  planned precision computes in (16-bit floats themselves; FP32, TF32 and
  INT8/FP8, simulated by quantize-dequantize, in FP32) — weights too, for
  convolutions and matmuls;
- every refreshed copy the plan lists is held as a parameter's copy, is
  what its operator reads (the same storage), and equals its master in the
  low precision after the optimizer step;
- the model's output is FP32.

Exits 1 if anything is unmapped, unreached or differs.

usage: apply_check.py QSYNCC MODELS_DIR WORK_DIR [NAME ...]
"""

import json
import os
import subprocess
import sys
from collections import defaultdict

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

import qsync
from qsync.plan import _widest, compute_dtype

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../..")
sys.path.insert(0, os.path.join(ROOT, "examples"))


class Wrap(nn.Module):
    """How the shared BERT exports were made: the model as attribute `m`."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        out = self.m(input_ids=input_ids, attention_mask=attention_mask)
        return out[0]


def bert(kind, attn):
    from transformers import BertConfig, BertForQuestionAnswering, BertModel

    if kind == "tiny":
        cfg = BertConfig(vocab_size=1024, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=512, attn_implementation=attn)
        return Wrap(BertModel(cfg))
    cfg = BertConfig(attn_implementation=attn)
    return Wrap(BertForQuestionAnswering(cfg))


def vision(name):
    import torchvision

    return getattr(torchvision.models, name)()


# The check is about which dtype each operator reads, which no input size
# changes; the inputs are small because this CPU runs FP16 convolutions and
# matmuls through slow generic kernels: at 224 x 224 one VGG-16 forward and
# backward with the plan applied took 50 s (64 x 64: the convolutions see
# 12 times fewer pixels), BERT-base's at 128 tokens 35 s.
def image(batch):
    return (torch.randn(batch, 3, 64, 64),)


def tokens(batch, seq=32, vocab=1024):
    return (torch.randint(0, vocab, (batch, seq)), torch.ones(batch, seq, dtype=torch.int64))


def example(name):
    import train_ddp

    return train_ddp.make_model(name, 0)


def example_input(name):
    import train_ddp

    return lambda b: (train_ddp.example_input(name, b),)


# name -> (file, qsyncc extra args, counterpart builder, input builder, prefix);
# a file `example:NAME` is planned by `examples/train_ddp.py plan --model NAME`.
CASES = {
    "squeezenet1_1.onnx": ("squeezenet1_1.onnx", [], lambda: vision("squeezenet1_1"), image, None),
    "resnet50.onnx": ("resnet50.onnx", [], lambda: vision("resnet50"), image, None),
    "resnet50_train.onnx": ("resnet50_train.onnx", [], lambda: vision("resnet50"), image, None),
    "vgg16.onnx": ("vgg16.onnx", [], lambda: vision("vgg16"), image, None),
    "vgg16_bn.onnx": ("vgg16_bn.onnx", [], lambda: vision("vgg16_bn"), image, None),
    "bert_tiny.onnx": ("bert_tiny.onnx", [], lambda: bert("tiny", "sdpa"), lambda b: tokens(b), None),
    "bert_base_qa.onnx": ("bert_base_qa.onnx", [], lambda: bert("base", "sdpa"),
                          lambda b: tokens(b, vocab=30522), None),
    "bert_base_train.onnx": ("bert_base_train.onnx", ["--dim", "seq=128"], lambda: bert("base", "eager"),
                             lambda b: tokens(b, vocab=30522), None),
    # TorchScript archives: attribute paths from the traced module's root.
    "squeezenet1_1.pt": ("squeezenet1_1.pt", [], lambda: vision("squeezenet1_1"), image, None),
    # Traced with eager attention: its matmuls and softmax are separate calls.
    "bert_tiny.pt": ("bert_tiny.pt", [], lambda: bert("tiny", "eager").m, lambda b: tokens(b), None),
    # The example's models, exported by the legacy exporter in training mode.
    "example:transformer": ("example:transformer", [], lambda: example("transformer"),
                            example_input("transformer"), None),
    "example:resnet18": ("example:resnet18", ["--method", "qsync"], lambda: example("resnet18"),
                         example_input("resnet18"), None),
}


# ---- executed dtypes against the plan ------------------------------------------

# torch call name -> kind; plan op -> kind.
CALL_KIND = {
    "conv1d": "conv", "conv2d": "conv", "conv3d": "conv",
    "linear": "matmul", "matmul": "matmul", "__matmul__": "matmul", "bmm": "matmul", "mm": "matmul",
    "baddbmm": "matmul", "addmm": "matmul", "einsum": "matmul",
    "softmax": "softmax", "log_softmax": "log_softmax",
    "layer_norm": "norm", "batch_norm": "norm", "group_norm": "norm", "instance_norm": "norm",
    "relu": "relu", "relu_": "relu", "gelu": "gelu", "tanh": "tanh",
    "max_pool2d": "maxpool", "_max_pool2d": "maxpool", "max_pool2d_with_indices": "maxpool",
    "adaptive_avg_pool2d": "avgpool", "avg_pool2d": "avgpool",
    "dropout": "dropout", "scaled_dot_product_attention": "attention",
}
OP_KIND = {
    "Conv": "conv", "MatMul": "matmul", "Gemm": "matmul", "Einsum": "matmul",
    "Softmax": "softmax", "LogSoftmax": "log_softmax",
    "LayerNormalization": "norm", "BatchNormalization": "norm", "GroupNormalization": "norm",
    "InstanceNormalization": "norm", "Relu": "relu", "Gelu": "gelu", "Tanh": "tanh",
    "MaxPool": "maxpool", "AveragePool": "avgpool", "GlobalAveragePool": "avgpool", "Dropout": "dropout",
}
# Kinds whose weights (every floating argument) run at the precision too.
ALL_ARGS = {"conv", "matmul", "attention"}


def _flat(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _flat(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _flat(y)
    else:
        yield x


class Recorder(TorchFunctionMode):
    """Records, per module path, every call of a kind above with the dtype
    and storage of its floating arguments, attributing each call to the
    innermost module whose forward is running."""

    def __init__(self, model):
        super().__init__()
        self.stack = []
        self.calls = defaultdict(list)  # path -> [(kind, [(dtype, ptr)])]
        self.handles = []
        for name, m in model.named_modules():
            self.handles.append(m.register_forward_pre_hook(lambda _m, _a, name=name: self.stack.append(name)))
            self.handles.append(m.register_forward_hook(self._leave, always_call=True))

    def _leave(self, _m, _a, _o):
        self.stack.pop()

    def remove(self):
        for h in self.handles:
            h.remove()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = CALL_KIND.get(getattr(func, "__name__", ""))
        if kind is not None and self.stack:
            fl = [(t.dtype, t.data_ptr()) for t in _flat((args, kwargs))
                  if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if fl:
                self.calls[self.stack[-1]].append((kind, fl))
        return func(*args, **kwargs)


def call_kind(n):
    """The kind of torch call that runs plan node `n`, by its op; a Conv
    the dynamo exporter fused into the batch norm after it (its recorded
    call is the batch norm's) is run by that batch norm. Ops without a kind
    (a Linear's bias Add) are computed inside another node's call."""
    kind = OP_KIND.get(n["op"])
    if kind is not None and "batch_norm" in (n.get("call") or ""):
        return "norm"
    return kind


def dtype_mismatches(dplan, report, rec, model, prefix):
    """Operator by operator: the plan's precision against the recorded
    dtypes. Returns a list of descriptions (empty when everything agrees)."""
    names = {n for n, _ in model.named_modules()}
    leaves = {n for n, m in model.named_modules() if not list(m.children())}
    # The prefix apply_plan chose: the one that maps the operator's module.
    mapped = {n: path for n, path, _ in report.mapped}
    bad = []
    want = defaultdict(list)  # (path, kind, fused call) -> [(node, precision)]
    for n in dplan["nodes"]:
        kind = call_kind(n)
        fused = None
        if (n.get("call") or "").startswith("scaled_dot_product_attention"):
            # One fused call computes these nodes (its matmuls and softmax): it
            # runs at the widest of their precisions, as apply_plan documents.
            kind, fused = "attention", n["call"]
        if kind is None:
            continue
        if n["name"] in mapped:
            path = mapped[n["name"]]
        elif not n.get("planned") and n.get("module") is not None:
            path = n["module"]
            if prefix and path.startswith(prefix + "."):
                path = path[len(prefix) + 1:]
            if path not in names or path not in leaves:
                continue  # inside a module's own code: follows type promotion
        else:
            continue
        want[(path, kind, fused)].append((n["name"], n["precision"]))
    fused_calls = defaultdict(list)
    for (path, kind, fused), nodes in list(want.items()):
        if fused is not None:
            del want[(path, kind, fused)]
            fused_calls[(path, kind)].append((nodes[0][0], _widest([p for _, p in nodes])))
    want.update({(path, kind, None): v for (path, kind), v in fused_calls.items()})
    for (path, kind, _), nodes in want.items():
        got = [fl for k, fl in rec.calls.get(path, []) if k == kind]
        if len(got) < len(nodes):
            bad.append(f"{path}: {len(nodes)} {kind} operators planned, {len(got)} ran")
        for (node, p), fl in zip(nodes, got):
            dt = compute_dtype(p)
            seen = [d for d, _ in (fl if kind in ALL_ARGS else fl[:1])]
            if any(d != dt for d in seen):
                bad.append(f"{node} ({path}, {kind}): planned {p}, read {[str(d) for d in seen]}")
    return bad



def main():
    qsyncc, models, work = sys.argv[1:4]
    names = sys.argv[4:] or list(CASES)
    bad = 0
    for name in names:
        file, extra, build, inputs, prefix = CASES[name]
        out = os.path.join(work, name.replace(".", "_").replace(":", "_"))
        if file.startswith("example:"):
            cmd = [sys.executable, os.path.join(ROOT, "examples/train_ddp.py"), "plan", "--model",
                   file.split(":", 1)[1], "--targets", "v100:1,t4:1", "--batch", "2", "-o", out, "--"] + extra
            r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, QSYNCC=qsyncc))
        else:
            cmd = [qsyncc, os.path.join(models, file), "--targets", "v100:1,t4:1", "--batch", "1",
                   "--method", "qsync", "-o", out] + extra
            r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(json.dumps({"model": name, "error": r.stderr.strip()[-2000:]}), flush=True)
            bad += 1
            continue
        plan = qsync.Plan.load(out)
        for dev in plan.devices:
            torch.manual_seed(0)
            model = build()
            model.train()
            report = qsync.apply_plan(model, out, dev, prefix=prefix)
            dplan = plan.device_plan(dev)
            args = inputs(plan.local_batch(dev))
            rec = Recorder(model)
            with rec:
                if name.startswith("bert_tiny.pt"):
                    y = model(input_ids=args[0], attention_mask=args[1])[0]
                else:
                    y = model(*args)
            rec.remove()
            y = y[0] if isinstance(y, (tuple, list)) else y
            problems = dtype_mismatches(dplan, report, rec, model, prefix)
            if y.dtype != torch.float32:
                problems.append(f"the model's output is {y.dtype}, not FP32")
            # Refreshed copies: every one the plan lists is held, read by its
            # operator, and rewritten after the optimizer step.
            listed = len(dplan.get("refreshed_copies", []))
            held = getattr(report, "copies", [])
            # A copy whose master is a parameter must be held; one whose master
            # the exporter derived from several (a Conv weight with its
            # BatchNorm folded in) has no parameter to copy: listed, not held.
            params = {k for k, _ in model.named_parameters()}
            masters = {c["copy"]: c["master"] for c in dplan.get("refreshed_copies", [])}
            lost = [c for c, _ in getattr(report, "unmapped_copies", [])
                    if masters.get(c) in params or masters.get(c, "").split(".", 1)[-1] in params]
            derived = len(getattr(report, "unmapped_copies", [])) - len(lost)
            if lost or listed > derived and not held:
                problems.append(f"{len(lost)} of the plan's {listed} refreshed copies of parameters not held: "
                                f"{lost[:3]}")
            read = {p for calls in rec.calls.values() for _, fl in calls for _, p in fl}
            unread = [c.name for c in held if c.tensor.data_ptr() not in read]
            if unread:
                problems.append(f"refreshed copies no operator read: {unread[:3]}")
            y.float().square().mean().backward()
            finite = all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            if hasattr(report, "attach"):
                report.attach(opt)
            before = [c.refreshes for c in held]
            opt.step()
            for c, b in zip(held, before):
                if c.refreshes != b + 1 or not torch.equal(c.tensor, c.master.detach().to(c.dtype)):
                    problems.append(f"refreshed copy of {c.name} not rewritten after the optimizer step")
                    break
            out_rec = {
                "model": name, "device": dev, "mapped": len(report.mapped), "unmapped": len(report.unmapped),
                "unmapped_reasons": report.unmapped[:5], "precisions": dict(report.per_precision),
                "unreached": report.unmatched_calls()[:5], "finite_grads": finite,
                "checked": sum(len(v) for v in rec.calls.values()), "copies": len(held), "derived_copies": derived,
                "dtype_mismatches": len(problems), "first_mismatches": problems[:5],
            }
            print(json.dumps(out_rec), flush=True)
            if report.unmapped or report.unmatched_calls() or not report.mapped or not finite or problems:
                bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
