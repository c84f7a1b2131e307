"""`qsync.calibrate` writes a statistics file `qsyncc MODEL --stats` plans
with; `scripts/calibrate.py` writes the same through it.

Calibrates torchvision's SqueezeNet 1.1 (random weights and data, two steps
of batch 2) with `qsync.calibrate`, and once more with
`scripts/calibrate.py squeezenet1_1`; plans the shared `squeezenet1_1.onnx`
with each file (`qsyncc ... --stats FILE`): qsyncc must accept it and
report calibrated statistics for the model's operators.

Prints one JSON line per check; exits 1 if any fails.

usage: calibrate_check.py QSYNCC MODELS_DIR WORK_DIR
"""

import json
import os
import subprocess
import sys

import torch
import torchvision

import qsync

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../..")
FAILED = []


def check(name, ok, **info):
    print(json.dumps({"check": name, "ok": bool(ok), **info}), flush=True)
    if not ok:
        FAILED.append(name)


def plan_with(qsyncc, models, stats, out):
    r = subprocess.run([qsyncc, os.path.join(models, "squeezenet1_1.onnx"), "--targets", "v100:1,t4:1", "--batch",
                        "1", "--stats", stats, "-o", out], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()[-1500:]
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f), r.stderr


def main():
    qsyncc, models, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.squeezenet1_1()
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(2, 3, 224, 224, generator=gen), torch.randint(0, 1000, (2,), generator=gen))
               for _ in range(2)]
    path = qsync.calibrate(model, batches, os.path.join(work, "calib.json"), iterations=2, name="squeezenet1_1")
    with open(path) as f:
        doc = json.load(f)
    convs = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]
    check("qsync.calibrate writes every conv's statistics",
          doc["format"] == "qsync-calibration" and doc["iterations"] == 2 and doc["batch"] == 2
          and all(set(doc["ops"].get(c, {})) == {"input", "weight", "grad_output"} for c in convs),
          ops=len(doc["ops"]), convs=len(convs))

    script = os.path.join(work, "script.json")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts/calibrate.py"), "squeezenet1_1", script,
                        "--batch", "2", "--iterations", "1"], capture_output=True, text=True)
    sdoc = json.load(open(script)) if r.returncode == 0 else {}
    check("scripts/calibrate.py writes the same format through qsync.calibrate",
          r.returncode == 0 and set(sdoc.get("ops", {})) == set(doc["ops"]) and sdoc.get("iterations") == 1,
          stderr=r.stderr[-500:])

    for label, stats in (("qsync.calibrate", path), ("scripts/calibrate.py", script)):
        manifest, err = plan_with(qsyncc, models, stats, os.path.join(work, "plan-" + label.replace("/", "_")))
        ind = (manifest or {}).get("indicator", {})
        calibrated = ind.get("sources", {}).get("activations_calibrated", 0)
        check(f"qsyncc --stats accepts the file of {label}",
              manifest is not None and ind.get("calibrated") is True and calibrated >= len(convs) // 2,
              calibrated=calibrated, indicator=ind, error=None if manifest else err)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
