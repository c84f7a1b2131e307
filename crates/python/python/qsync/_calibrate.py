"""Calibration statistics for `qsyncc MODEL --stats FILE`, from a PyTorch
model trained for a few steps.

For every Conv / Linear / norm / softmax module a forward hook records the
input activation v and the weight x, and a hook on the output tensor the
gradient arriving at it (grad v). A GEMM-like operation a module calls in its
own forward rather than through such a submodule (attention's
`torch.matmul(q, k.transpose(-1, -2))`, a functional `F.conv2d`) is recorded
too, under the module's name in `calls`: per family (`matmul`, `conv`), each
call in the order it ran, with every tensor operand and its output's
gradient, so that the planner has a range for each input such an operator
reads in INT8. Each statistic -- squared L2 norm, min,
max, numel -- is averaged over the first `iterations` training steps (QSync
averages the first 50; it also halves the batch for profiling, which the
caller controls). The optimizer steps with a small SGD learning rate so the
statistics follow early training.

The file (format `qsync-calibration`, version 1; read by
`qsync_planner::Calibration`):

    {"format": "qsync-calibration", "version": 1, "model": ..., "iterations": N,
     "batch": B, "ops": {"<module name>": {"input": {...}, "weight": {...},
     "grad_output": {...}}, "<module name>": {"calls": {"matmul": [{"inputs":
     [{...}, {...}], "grad_output": {...}}, ...]}}}}

Module names (layer1.0.conv1) match graph nodes by the module the exporter
recorded each node in (its scope), their parameter names
(layer1.0.conv1.weight) or the exporter's scoped node names; a call matches
the node of its family in the module's own scope at the same position.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ._stats import FORMAT, VERSION, Running
from .plan import _FAMILIES


def _tracked():
    return (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear, torch.nn.BatchNorm2d,
            torch.nn.LayerNorm, torch.nn.Softmax)


def tensor_stats(t):
    """Squared L2 norm, min, max and element count of a tensor."""
    t = t.detach().float()
    return {"norm2": float((t * t).sum()), "min": float(t.min()), "max": float(t.max()), "numel": float(t.numel())}


# The GEMM-like families (the operators INT8 is planned for), as
# `apply_plan` groups calls; `torch.addmm(bias, a, b)` and
# `torch.baddbmm(bias, a, b)` multiply their 2nd and 3rd operands.
_GEMM_FAMILIES = ("matmul", "conv")
_BIAS_FIRST = (torch.addmm, torch.baddbmm)


def _operands(func, args, kwargs):
    """The tensor operands of a call, in the order the exported node reads
    them."""
    flat = []
    for a in list(args) + list(kwargs.values()):
        if torch.is_tensor(a):
            flat.append(a)
        elif isinstance(a, (list, tuple)):
            flat.extend(t for t in a if torch.is_tensor(t))
    if func in _BIAS_FIRST and len(flat) >= 3:
        flat = flat[1:3]
    return flat


class _Calls(TorchFunctionMode):
    """Records the GEMM-like calls each module makes in its own forward (not
    inside a tracked submodule, whose hooks record it whole): per module
    path and family, one list of call statistics, the i-th call of each
    forward averaged into entry i."""

    def __init__(self, tracked, active):
        super().__init__()
        self.stack = []  # (path, tracked?, per-family call counter) of the forwards running
        self.tracked = tracked
        self.active = active
        self.stats = {}  # path -> family -> [{"inputs": [Running...], "grad_output": Running}]

    def enter(self, path, module):
        self.stack.append((path, isinstance(module, self.tracked), {}))

    def leave(self):
        if self.stack:
            self.stack.pop()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        fam = _FAMILIES.get(func)
        if fam not in _GEMM_FAMILIES or not self.stack or not self.active["on"]:
            return out
        path, tracked, count = self.stack[-1]
        if tracked:
            return out
        i = count.get(fam, 0)
        count[fam] = i + 1
        calls = self.stats.setdefault(path, {}).setdefault(fam, [])
        while len(calls) <= i:
            calls.append({"inputs": [], "grad_output": Running()})
        entry = calls[i]
        ops = _operands(func, args, kwargs)
        while len(entry["inputs"]) < len(ops):
            entry["inputs"].append(Running())
        for r, t in zip(entry["inputs"], ops):
            r.add(tensor_stats(t))
        if torch.is_tensor(out) and out.requires_grad:
            active = self.active

            def grad(g, r=entry["grad_output"]):
                if active["on"]:
                    r.add(tensor_stats(g))

            out.register_hook(grad)
        return out

    def records(self):
        """path -> {"calls": {family: [{"inputs": [...], "grad_output": ...}]}}."""
        out = {}
        for path, fams in self.stats.items():
            rec = {}
            for fam, calls in fams.items():
                rec[fam] = []
                for c in calls:
                    one = {"inputs": [r.mean() for r in c["inputs"]]}
                    if c["grad_output"].mean() is not None:
                        one["grad_output"] = c["grad_output"].mean()
                    rec[fam].append(one)
            out[path] = {"calls": rec}
        return out


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
    calls = _Calls(_tracked(), active)
    # Which module's own forward is running, for the functional calls.
    for mname, mod in model.named_modules():

        def enter(m, _a, path=mname):
            calls.enter(path, m)

        def leave(_m, _a, _o):
            calls.leave()

        hooks.append(mod.register_forward_pre_hook(enter))
        hooks.append(mod.register_forward_hook(leave, always_call=True))
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
    calls.__enter__()
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
        calls.__exit__(None, None, None)
        for h in hooks:
            h.remove()
        for mod in inplace:
            mod.inplace = True
    ops = {}
    for mname, e in stats.items():
        rec = {k: r.mean() for k, r in e.items() if r.mean() is not None}
        if rec:
            ops[mname] = rec
    for path, rec in calls.records().items():
        ops.setdefault(path, {}).update(rec)
    doc = {"format": FORMAT, "version": VERSION, "model": name or type(model).__name__, "iterations": done,
           "batch": batch, "ops": ops}
    out_path = os.fspath(out_path)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    return out_path
