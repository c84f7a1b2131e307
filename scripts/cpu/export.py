#!/usr/bin/env python3
"""Export the models scripts/cpu/train.py trains that the shared models do
not hold, as training-mode ONNX graphs with a symbolic batch (the form of
`resnet50_train.onnx` / `bert_base_train.onnx`: PyTorch's TorchScript-based
exporter in training mode, BatchNorm and Dropout kept, outputs before the
loss), so that qsync costs exactly the network that is timed.

    python3 scripts/cpu/export.py OUT_DIR [--models resnet18,bert_tiny]

Writes OUT_DIR/resnet18_train.onnx (torchvision ResNet-18, input `x`
[batch, 3, 224, 224]) and OUT_DIR/bert_tiny_train.onnx (BERT-tiny question
answering, eager attention, inputs `input_ids` and `attention_mask`
[batch, seq]). Random weights; nothing is downloaded.
"""
import argparse
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
from train import BERT  # noqa: E402  (the same configurations as the timed models)


class QaLogits(torch.nn.Module):
    """BERT QA with positional inputs and the two logits as outputs."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        o = self.m(input_ids=input_ids, attention_mask=attention_mask)
        return o.start_logits, o.end_logits


def export(model, args, path, names, axes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, path, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=names, dynamic_axes=axes, opset_version=17)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--models", default="resnet18,bert_tiny")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    torch.manual_seed(0)
    for name in [m for m in a.models.split(",") if m]:
        path = os.path.join(a.out_dir, f"{name}_train.onnx")
        if name == "resnet18":
            import torchvision

            m = torchvision.models.resnet18(weights=None).train()
            export(m, (torch.randn(2, 3, 224, 224),), path, ["x"], {"x": {0: "batch"}})
        elif name in BERT:
            import transformers

            cfg = transformers.BertConfig(**BERT[name])
            m = transformers.BertForQuestionAnswering._from_config(cfg, attn_implementation="eager").train()
            ids = torch.randint(0, cfg.vocab_size, (2, 128))
            mask = torch.ones(2, 128, dtype=torch.long)
            axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
            export(QaLogits(m), (ids, mask), path, ["input_ids", "attention_mask"], axes)
        else:
            print(f"error: no export for `{name}` (resnet18, bert_tiny, bert_base)", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
