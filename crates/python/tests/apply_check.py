"""apply_plan against the shared models' PyTorch counterparts.

For each shared export (dynamo and legacy exporters, and the TorchScript
archives), plan it with qsyncc, rebuild the same architecture in PyTorch
(torchvision / transformers, random weights), apply every device type's plan
and run one training-mode forward and backward. Prints one JSON line per
(model, device): mapped, unmapped (with reasons), the precisions applied and
the planned calls no forward reached. Exits 1 if anything is unmapped or
unreached.

usage: apply_check.py QSYNCC MODELS_DIR WORK_DIR [NAME ...]
"""

import json
import os
import subprocess
import sys

import torch
import torch.nn as nn

import qsync


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


def image(batch):
    return (torch.randn(batch, 3, 224, 224),)


def tokens(batch, seq=128, vocab=1024):
    return (torch.randint(0, vocab, (batch, seq)), torch.ones(batch, seq, dtype=torch.int64))


# name -> (file, qsyncc extra args, counterpart builder, input builder, prefix)
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
}


def main():
    qsyncc, models, work = sys.argv[1:4]
    names = sys.argv[4:] or list(CASES)
    bad = 0
    for name in names:
        file, extra, build, inputs, prefix = CASES[name]
        out = os.path.join(work, name.replace(".", "_"))
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
            args = inputs(plan.local_batch(dev))
            if name.startswith("bert_tiny.pt"):
                y = model(input_ids=args[0], attention_mask=args[1])[0]
            else:
                y = model(*args)
            y = y[0] if isinstance(y, (tuple, list)) else y
            y.float().square().mean().backward()
            finite = all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
            rec = {
                "model": name, "device": dev, "mapped": len(report.mapped), "unmapped": len(report.unmapped),
                "unmapped_reasons": report.unmapped[:5], "precisions": dict(report.per_precision),
                "unreached": report.unmatched_calls()[:5], "finite_grads": finite,
            }
            print(json.dumps(rec), flush=True)
            if report.unmapped or report.unmatched_calls() or not report.mapped or not finite:
                bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
