#!/usr/bin/env python3
"""Check that a rebatched model computes every sample as the original does.

Usage: rebatch_check.py ORIGINAL REBATCHED [--batch B] [--seed S]

ORIGINAL fixes its batch at 1 (a traced export); REBATCHED is what
`qsyncc opt ORIGINAL --batch B --passes infer-shapes -o REBATCHED` wrote.
Both run in onnxruntime on the same random inputs, the rebatched model on
all B samples at once and the original on each sample alone; integer
inputs named like masks get a different padding per sample, so a graph
that reads sample 0's mask for every sample is caught. Prints the largest
absolute difference as JSON and exits 1 above --tolerance.
"""
import argparse
import json
import sys

import numpy as np
import onnxruntime as ort


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("original")
    ap.add_argument("rebatched")
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=1e-5)
    a = ap.parse_args()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    one = ort.InferenceSession(a.original, so, providers=["CPUExecutionProvider"])
    many = ort.InferenceSession(a.rebatched, so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(a.seed)
    feeds = {}
    for i in one.get_inputs():
        shape = [a.batch] + [d if isinstance(d, int) else 1 for d in i.shape[1:]]
        if "int64" in i.type:
            if "mask" in i.name:
                x = np.ones(shape, dtype=np.int64)
                for b in range(a.batch):
                    x[b, shape[1] - (b + 1) * max(1, shape[1] // (a.batch + 2)) :] = 0
            else:
                x = rng.integers(0, 1000, size=shape, dtype=np.int64)
        else:
            x = rng.standard_normal(shape).astype(np.float32)
        feeds[i.name] = x
    batched = many.run(None, feeds)
    worst = 0.0
    for b in range(a.batch):
        alone = one.run(None, {k: v[b : b + 1] for k, v in feeds.items()})
        for x, y in zip(alone, batched):
            worst = max(worst, float(np.abs(x[0].astype(np.float64) - y[b].astype(np.float64)).max()))
    print(json.dumps({"batch": a.batch, "outputs": len(batched), "max_abs_diff": worst}))
    return 0 if worst <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
