"""`qsync.calibrate` on the accuracy run's small transformer
(`scripts/accuracy/digits.py`): exports it to ONNX as `digits.py prepare`
does (the legacy exporter, training mode) and calibrates it for three steps
on random data, writing `WORK_DIR/transformer.onnx` and
`WORK_DIR/calibration.json` for the Rust side to match (every GEMM-like
operator must find its activations' statistics). Prints one JSON line.

usage: calibrate_transformer.py WORK_DIR
"""

import importlib.util
import json
import os
import sys

import torch

import qsync

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../..")


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)
    spec = importlib.util.spec_from_file_location("digits", os.path.join(ROOT, "scripts/accuracy/digits.py"))
    digits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(digits)
    batch = digits.GLOBAL_PER_DEVICE
    model = digits.make_model("transformer", 0)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.rand(batch, 1, 8, 8, generator=gen), torch.randint(0, 10, (batch,), generator=gen))
               for _ in range(3)]
    onnx_path = os.path.join(work, "transformer.onnx")
    model.train()
    torch.onnx.export(model, (batches[0][0],), onnx_path, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                      input_names=["x"], do_constant_folding=False)
    stats = qsync.calibrate(digits.make_model("transformer", 0), batches, os.path.join(work, "calibration.json"),
                            iterations=3, name="digits_transformer")
    with open(stats) as f:
        doc = json.load(f)
    calls = {k: {fam: len(v) for fam, v in e["calls"].items()} for k, e in doc["ops"].items() if "calls" in e}
    print(json.dumps({"onnx": onnx_path, "stats": stats, "modules": len(doc["ops"]), "calls": calls}), flush=True)


if __name__ == "__main__":
    main()
