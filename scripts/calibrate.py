#!/usr/bin/env python3
"""Write a qsync calibration file (indicator statistics) for a PyTorch model.

Usage (as a library):
    from calibrate import calibrate
    calibrate(model, batches, loss_fn, "calib.json", iterations=50)

or from the command line for a torchvision model with random data:
    calibrate.py resnet50 calib.json [--batch 16] [--iterations 50]

For every Conv / Linear / norm / softmax module it registers a forward hook
(recording the input activation v and the weight x) and a full backward
hook (recording the gradient arriving at the output, grad v). Each
statistic -- squared L2 norm, min, max, numel -- is averaged over the first
`iterations` training steps (QSync averages the first 50; it also halves
the batch for profiling, which the caller controls). The optimizer steps
with a small SGD learning rate so the statistics follow early training.

The format (version 1) is documented in crates/planner/src/indicator.rs:
    {"format": "qsync-calibration", "version": 1, "model": ..., "iterations": N,
     "batch": B, "ops": {"<module name>": {"input": {...}, "weight": {...},
     "grad_output": {...}}}}
Module names (layer1.0.conv1) match graph nodes by their parameter names
(layer1.0.conv1.weight) or the exporter's scoped node names.
"""
import argparse
import json

import torch

TRACKED = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear, torch.nn.BatchNorm2d,
           torch.nn.LayerNorm, torch.nn.Softmax)


def _stats(t):
    t = t.detach().float()
    return {"norm2": float((t * t).sum()), "min": float(t.min()), "max": float(t.max()), "numel": float(t.numel())}


class _Running:
    """Running means of the statistics of one (module, tensor) pair."""

    def __init__(self):
        self.sum = {}
        self.n = 0

    def add(self, s):
        for k, v in s.items():
            self.sum[k] = self.sum.get(k, 0.0) + v
        self.n += 1

    def mean(self):
        return {k: v / self.n for k, v in self.sum.items()} if self.n else None


def calibrate(model, batches, loss_fn, out_path, iterations=50, name="model", lr=1e-3):
    """Train `iterations` steps on `batches` (an iterable of (inputs, targets)),
    averaging per-module statistics, and write the calibration JSON."""
    stats = {}
    active = {"on": True}
    hooks = []
    # Full backward hooks wrap module outputs in a view; an in-place op on it
    # (torchvision's ReLU(inplace=True)) is forbidden, so turn in-place off.
    for mod in model.modules():
        if getattr(mod, "inplace", False) is True:
            mod.inplace = False
    for mname, mod in model.named_modules():
        if not isinstance(mod, TRACKED) or not mname:
            continue
        entry = stats.setdefault(mname, {"input": _Running(), "weight": _Running(), "grad_output": _Running()})

        def fwd(m, inp, out, entry=entry):
            if active["on"] and inp and torch.is_tensor(inp[0]):
                entry["input"].add(_stats(inp[0]))
                w = getattr(m, "weight", None)
                if w is not None:
                    entry["weight"].add(_stats(w))

        def bwd(m, grad_in, grad_out, entry=entry):
            if active["on"] and grad_out and grad_out[0] is not None:
                entry["grad_output"].add(_stats(grad_out[0]))

        hooks.append(mod.register_forward_hook(fwd))
        hooks.append(mod.register_full_backward_hook(bwd))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    batch = None
    done = 0
    for x, y in batches:
        if done >= iterations:
            break
        batch = x.shape[0]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        done += 1
    for h in hooks:
        h.remove()
    ops = {}
    for mname, e in stats.items():
        rec = {k: r.mean() for k, r in e.items() if r.mean() is not None}
        if rec:
            ops[mname] = rec
    doc = {"format": "qsync-calibration", "version": 1, "model": name, "iterations": done, "batch": batch, "ops": ops}
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a torchvision model name (resnet50, vgg16, squeezenet1_1, ...)")
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=50)
    a = ap.parse_args()
    import torchvision  # only needed for the command-line path

    model = getattr(torchvision.models, a.model)(weights=None)
    gen = torch.Generator().manual_seed(0)

    def batches():
        while True:
            yield torch.randn(a.batch, 3, 224, 224, generator=gen), torch.randint(0, 1000, (a.batch,), generator=gen)

    calibrate(model, batches(), torch.nn.functional.cross_entropy, a.out, a.iterations, a.model)


if __name__ == "__main__":
    main()
