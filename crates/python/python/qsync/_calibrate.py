"""Calibration statistics for `qsyncc MODEL --stats FILE`, from a PyTorch
model trained for a few steps.

For every Conv / Linear / norm / softmax module a forward hook records the
input activation v and the weight x, and a hook on the output tensor the
gradient arriving at it (grad v). Each statistic -- squared L2 norm, min,
max, numel -- is averaged over the first `iterations` training steps (QSync
averages the first 50; it also halves the batch for profiling, which the
caller controls). The optimizer steps with a small SGD learning rate so the
statistics follow early training.

The file (format `qsync-calibration`, version 1; read by
`qsync_planner::Calibration`):

    {"format": "qsync-calibration", "version": 1, "model": ..., "iterations": N,
     "batch": B, "ops": {"<module name>": {"input": {...}, "weight": {...},
     "grad_output": {...}}}}

Module names (layer1.0.conv1) match graph nodes by their parameter names
(layer1.0.conv1.weight) or the exporter's scoped node names.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F

FORMAT = "qsync-calibration"
VERSION = 1


def _tracked():
    return (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear, torch.nn.BatchNorm2d,
            torch.nn.LayerNorm, torch.nn.Softmax)


def tensor_stats(t):
    """Squared L2 norm, min, max and element count of a tensor."""
    t = t.detach().float()
    return {"norm2": float((t * t).sum()), "min": float(t.min()), "max": float(t.max()), "numel": float(t.numel())}


class Running:
    """Running means of one (module, tensor) pair's statistics."""

    def __init__(self):
        self.sum = {}
        self.n = 0

    def add(self, s):
        for k, v in s.items():
            self.sum[k] = self.sum.get(k, 0.0) + v
        self.n += 1

    def mean(self):
        return {k: v / self.n for k, v in self.sum.items()} if self.n else None


def _default_loss(out, target):
    if isinstance(out, (tuple, list)):
        out = out[0]
    if target is None:
        return out.float().square().mean()
    return F.cross_entropy(out.float(), target)


def calibrate(model, batches, out_path="calibration.json", *, loss_fn=None, iterations=50, name=None, lr=1e-3):
    """Trains `model` for up to `iterations` steps on `batches`, averaging
    per-module statistics, and writes the calibration file `qsyncc MODEL
    --stats` reads. Returns the path written.

    `batches`: an iterable of `(inputs, targets)` pairs (`inputs` a tensor
    or a tuple of positional inputs), or of inputs alone. `loss_fn(output,
    targets)`: cross entropy by default, the mean square of the output when
    there are no targets. `name`: the model's name in the file (its class
    name by default).
    """
    loss_fn = loss_fn or _default_loss
    stats = {}
    active = {"on": True}
    hooks = []
    # In-place modules (torchvision's ReLU(inplace=True)) would overwrite a
    # module's output before its gradient hook fires: turn in-place off.
    inplace = []
    for mod in model.modules():
        if getattr(mod, "inplace", False) is True:
            mod.inplace = False
            inplace.append(mod)
    for mname, mod in model.named_modules():
        if not isinstance(mod, _tracked()) or not mname:
            continue
        entry = stats.setdefault(mname, {"input": Running(), "weight": Running(), "grad_output": Running()})

        def grad(g, entry=entry):
            if active["on"]:
                entry["grad_output"].add(tensor_stats(g))

        # The gradient at the output is taken with a hook on the output
        # tensor, not a full backward hook: those wrap the output in a view
        # that torchvision's residual `out += identity` may not modify.
        def fwd(m, inp, out, entry=entry, grad=grad):
            if active["on"] and inp and torch.is_tensor(inp[0]):
                entry["input"].add(tensor_stats(inp[0]))
                w = getattr(m, "weight", None)
                if w is not None:
                    entry["weight"].add(tensor_stats(w))
                if torch.is_tensor(out) and out.requires_grad:
                    out.register_hook(grad)

        hooks.append(mod.register_forward_hook(fwd))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    batch = None
    done = 0
    try:
        for item in batches:
            if done >= iterations:
                break
            x, y = item if isinstance(item, (tuple, list)) and len(item) == 2 else (item, None)
            args = x if isinstance(x, tuple) else (x,)
            batch = int(args[0].shape[0]) if torch.is_tensor(args[0]) and args[0].dim() else batch
            opt.zero_grad()
            loss = loss_fn(model(*args), y)
            loss.backward()
            opt.step()
            done += 1
    finally:
        for h in hooks:
            h.remove()
        for mod in inplace:
            mod.inplace = True
    ops = {}
    for mname, e in stats.items():
        rec = {k: r.mean() for k, r in e.items() if r.mean() is not None}
        if rec:
            ops[mname] = rec
    doc = {"format": FORMAT, "version": VERSION, "model": name or type(model).__name__, "iterations": done,
           "batch": batch, "ops": ops}
    out_path = os.fspath(out_path)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    return out_path
