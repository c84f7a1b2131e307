#!/usr/bin/env python3
"""Plans trained to the end on real data: scikit-learn's handwritten digits
(1,797 8x8 images shipped inside the package; a fixed stratified 80/20
split), a small CNN and a small transformer, four ranks as two device types
(torchrun, gloo, CPU).

  python digits.py prepare --model cnn -o DIR      # ONNX export, calibration, qsyncc's plans
  torchrun --nproc-per-node 4 digits.py train --model cnn --plans DIR --configs fp32,up,... --seeds 0,1,2
  python digits.py report RESULTS.jsonl... -o docs/accuracy.md

Configurations (`--configs`):
  fp32          plain FP32 DDP, uniform local batch (the reference)
  fp32-hook     the qsync hook with scheme fp32, uniform batch (must equal fp32)
  up            qsyncc --method up (the UP baseline: the inference device type
                at its uniform level, INT8 GEMMs), applied with apply_plan
  qsync         qsyncc --method qsync (QSync's allocator), applied
  joint         qsyncc's default joint plan (batch split + precision), applied
  SCHEME        any qsync synchronization scheme on FP32 compute, uniform batch

Plans use the local batch and gradient weight their manifest records (the
hook's plan weighting), so every configuration trains on the same global
batches. `train` prints one JSON line per (configuration, seed).
"""

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

GLOBAL_PER_DEVICE = 32  # --batch given to qsyncc; the uniform local batch
TARGETS = "v100:2,t4:2"
# What the inference type (t4) may compute in besides FP32: INT8 only, so
# UP (`--method up`) is the plan with every GEMM-like operator in INT8.
PRECISIONS = "int8"

# ---- data ---------------------------------------------------------------


def digits():
    """(x_train, y_train, x_test, y_test): images scaled to [0, 1], shape
    (N, 1, 8, 8); the split is fixed (stratified, random_state=0)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    idx = list(range(len(y)))
    tr, te = train_test_split(idx, test_size=0.2, random_state=0, stratify=d.target)
    tr, te = torch.tensor(tr), torch.tensor(te)
    return x[tr], y[tr], x[te], y[te]


# ---- models -------------------------------------------------------------


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.conv3(x))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Block(nn.Module):
    """Pre-norm transformer block, attention written out (each matmul and
    softmax an operator the plan sets)."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads
        y = self.ln1(x)

        def split(t):
            return t.reshape(b, s, h, d // h).transpose(1, 2)

        q, k, v = split(self.q(y)), split(self.k(y)), split(self.v(y))
        att = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * (d // h) ** -0.5, dim=-1)
        x = x + self.o(torch.matmul(att, v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class DigitsTransformer(nn.Module):
    """Each image row is a token (8 tokens of 8 pixels)."""

    def __init__(self, d=32, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Linear(8, d)
        self.pos = nn.Parameter(torch.zeros(1, 8, d))
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        x = self.embed(x.reshape(x.shape[0], 8, 8)) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x).mean(dim=1))


MODELS = {"cnn": DigitsCNN, "transformer": DigitsTransformer}
LR = {"cnn": 0.01, "transformer": 0.01}  # peak; cosine decay to 0 over the run


def make_model(name, seed):
    torch.manual_seed(seed)
    return MODELS[name]()


# ---- prepare: plans -----------------------------------------------------

def qsyncc():
    exe = os.environ.get("QSYNCC")
    if exe:
        return exe
    here = os.path.dirname(os.path.abspath(__file__))
    for p in ("../../target/release/qsyncc", "../../target/debug/qsyncc"):
        if os.path.exists(os.path.join(here, p)):
            return os.path.join(here, p)
    return shutil.which("qsyncc") or sys.exit("qsyncc not found: set $QSYNCC or build it")


def cmd_prepare(a):
    import qsync

    os.makedirs(a.output, exist_ok=True)
    model = make_model(a.model, 0)
    x_tr, y_tr, _, _ = digits()
    onnx_path = os.path.join(a.output, f"digits_{a.model}.onnx")
    model.train()
    torch.onnx.export(model, (x_tr[:GLOBAL_PER_DEVICE],), onnx_path, dynamo=False,
                      training=torch.onnx.TrainingMode.TRAINING, input_names=["x"], do_constant_folding=False)
    # Calibration statistics (so the indicator and INT8 activations have
    # measured ranges): 50 steps on the training data.
    n = len(y_tr)
    idx = [torch.arange(i * GLOBAL_PER_DEVICE, (i + 1) * GLOBAL_PER_DEVICE) % n for i in range(50)]
    batches = [(x_tr[i], y_tr[i]) for i in idx]
    stats = os.path.join(a.output, "calibration.json")
    qsync.calibrate(make_model(a.model, 0), batches, stats, name=f"digits_{a.model}")
    for method in ("joint", "qsync", "up"):
        d = os.path.join(a.output, method)
        shutil.rmtree(d, ignore_errors=True)
        cmd = [qsyncc(), onnx_path, "--targets", TARGETS, "--batch", str(GLOBAL_PER_DEVICE), "--stats", stats,
               "--optimizer", "adam", "--precisions", PRECISIONS, "--method", method, "-o", d]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    summary = {}
    for name in ("joint", "qsync", "up"):
        with open(os.path.join(a.output, name, "manifest.json")) as f:
            man = json.load(f)
        omega = man["indicator_sum"]
        precisions = {}
        for t in man["targets"]:
            with open(os.path.join(a.output, name, man["devices"][t["device"]]["files"]["plan"])) as f:
                nodes = json.load(f)["nodes"]
            hist = {}
            for n in nodes:
                if n.get("planned"):
                    hist[n["precision"]] = hist.get(n["precision"], 0) + 1
            precisions[t["device"]] = hist
        summary[name] = {"omega": omega, "chosen": man.get("chosen"),
                         "int8_warnings": [w for w in man.get("warnings", []) if "kept out of INT8" in w],
                         "batches": {t["device"]: t["local_batch"] for t in man["targets"]},
                         "weights": {t["device"]: t["gradient_weight"] for t in man["targets"]},
                         "roles": {t["device"]: t["role"] for t in man["targets"]},
                         "precisions": precisions}
    with open(os.path.join(a.output, "plans.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({"model": a.model, "plans": summary}))


# ---- train --------------------------------------------------------------

PLANS = ("up", "qsync", "joint")


def flat_params(model):
    return torch.cat([p.detach().reshape(-1).float() for _, p in sorted(model.named_parameters())])


def digest(model):
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def evaluate(name, trained, x, y):
    """Test accuracy of the trained (FP32 master) weights, computed in FP32."""
    m = MODELS[name]()
    m.load_state_dict({k: v.detach().float() for k, v in trained.named_parameters()}, strict=True)
    m.eval()
    with torch.no_grad():
        return (m(x).argmax(1) == y).float().mean().item()


def train_one(a, config, seed, data, world, rank):
    import qsync
    import torch.distributed as dist

    x_tr, y_tr, x_te, y_te = data
    plan_dir = os.path.join(a.plans, config) if config in PLANS else None
    model = make_model(a.model, seed)
    report = None
    if plan_dir:
        plan = qsync.Plan.load(plan_dir)
        device = plan.device_for_rank(rank)
        batches = [plan.local_batch(plan.device_for_rank(r)) for r in range(world)]
        report = qsync.apply_plan(model, plan_dir, device)
        if report.unmapped:
            raise SystemExit(f"rank {rank}: {report}")
    else:
        batches = [GLOBAL_PER_DEVICE] * world
    ddp = nn.parallel.DistributedDataParallel(model)
    if plan_dir:
        ddp.register_comm_hook(None, qsync.comm_hook(plan_dir, seed=seed))
    elif config == "fp32-hook":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ddp.register_comm_hook(None, qsync.comm_hook("fp32", seed=seed))
    elif config != "fp32":
        ddp.register_comm_hook(None, qsync.comm_hook(config, seed=seed))
    opt = torch.optim.Adam(ddp.parameters(), lr=a.lr or LR[a.model])
    if report is not None:
        report.attach(opt)
    gbatch = sum(batches)
    start = sum(batches[:rank])
    steps = len(y_tr) // gbatch
    total = steps * a.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * i / total)))
    epoch_loss = []
    for epoch in range(a.epochs):
        g = torch.Generator().manual_seed(seed * 7919 + epoch)
        perm = torch.randperm(len(y_tr), generator=g)
        acc = torch.zeros(1, dtype=torch.float64)
        for s in range(steps):
            idx = perm[s * gbatch + start: s * gbatch + start + batches[rank]]
            loss = F.cross_entropy(ddp(x_tr[idx]).float(), y_tr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            acc += loss.item() * batches[rank] / gbatch
        dist.all_reduce(acc)
        epoch_loss.append(acc.item() / steps)
    digests = [None] * world
    dist.all_gather_object(digests, digest(model))
    rec = {"model": a.model, "config": config, "seed": seed, "epochs": a.epochs, "steps_per_epoch": steps,
           "batches": batches, "epoch_loss": epoch_loss, "digests": digests,
           "identical": all(d == digests[0] for d in digests)}
    if report is not None:
        rec["precisions"] = dict(report.per_precision)
    if rank == 0:
        rec["test_acc"] = evaluate(a.model, model, x_te, y_te)
        rec["finite"] = bool(torch.isfinite(flat_params(model)).all())
    return rec, flat_params(model)


def cmd_train(a):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = digits()
    if a.train_limit:
        data = (data[0][:a.train_limit], data[1][:a.train_limit], data[2], data[3])
    configs = a.configs.split(",")
    ref = {}
    for seed in [int(s) for s in a.seeds.split(",")]:
        for config in configs:
            rec, flat = train_one(a, config, seed, data, world, rank)
            if config == "fp32":
                ref[seed] = flat
            if config == "fp32-hook" and seed in ref:
                rec["vs_fp32_max_abs"] = (flat - ref[seed]).abs().max().item()
                rec["vs_fp32_bitwise"] = bool(torch.equal(flat, ref[seed]))
            if rank == 0:
                print(json.dumps(rec), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo with a hook can abort at interpreter exit on small machines


# ---- report -------------------------------------------------------------


def ranks(v):
    """Average ranks (ties share the mean rank)."""
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(x, y):
    rx, ry = ranks(x), ranks(y)
    n = len(x)
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return float("nan") if sxx == 0 or syy == 0 else sxy / (sxx * syy) ** 0.5


def cmd_report(a):
    import statistics

    recs = []
    for p in a.results:
        with open(p) as f:
            recs += [json.loads(l) for l in f if l.startswith("{")]
    plans = {}
    for m in sorted({r["model"] for r in recs}):
        with open(os.path.join(a.plans_root, m, "plans.json")) as f:
            plans[m] = json.load(f)
    lines = []
    w = lines.append
    pooled = []  # (model, plan, Ω, accuracy minus the model's FP32 DDP accuracy)
    w("# Accuracy of plans and synchronization schemes, trained to the end")
    w("")
    w("Generated by `scripts/accuracy.sh` (do not edit by hand; rerun it).")
    w("")
    w(f"- command: `{a.command}`")
    w(f"- date: {a.date}; machine: {a.machine}; took {a.took}")
    if a.note:
        w(f"- **{a.note}**")
    epochs = sorted({r["epochs"] for r in recs})
    seeds = sorted({r["seed"] for r in recs})
    w(f"- data: scikit-learn `load_digits` (1,797 8×8 images), fixed stratified split 1,437 train / 360 test "
      f"(`random_state=0`); {', '.join(map(str, epochs))} epochs, seeds {', '.join(map(str, seeds))}; "
      f"Adam, learning rate decayed from its peak to 0 by a cosine over the run (peak: CNN {LR['cnn']}, transformer {LR['transformer']})")
    w(f"- cluster: `qsyncc --targets {TARGETS} --batch {GLOBAL_PER_DEVICE}` (global batch "
      f"{4 * GLOBAL_PER_DEVICE}), 4 CPU ranks under torchrun (gloo); ranks 0–1 are v100 (training), 2–3 t4 "
      f"(inference)")
    w("- accuracy: final test accuracy of the trained FP32 master weights (evaluated in FP32), "
      "mean ± sample standard deviation over the seeds; Ω: the plan's indicator sum (`indicator_sum` of its "
      "manifest; UP's equals what every run reports for it in `methods`, `up-lowest` or `up`); 0 for FP32 compute")
    w("")
    for m in sorted(plans):
        mr = [r for r in recs if r["model"] == m]
        configs = []
        for r in mr:
            if r["config"] not in configs:
                configs.append(r["config"])
        w(f"## {m}")
        w("")
        w("| configuration | compute (v100 / t4) | local batch (v100 / t4) | Ω | test accuracy | "
          "first → last epoch loss | replicas identical |")
        w("|---|---|---|---:|---:|---:|---|")
        points = []
        for c in configs:
            rs = [r for r in mr if r["config"] == c]
            accs = [100 * r["test_acc"] for r in rs]
            mean = statistics.mean(accs)
            sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
            l0 = statistics.mean(r["epoch_loss"][0] for r in rs)
            l1 = statistics.mean(r["epoch_loss"][-1] for r in rs)
            ident = all(r["identical"] for r in rs)
            if c in plans[m]:
                p = plans[m][c]
                omega = p["omega"]
                comp = " / ".join(", ".join(f"{k} {v}" for k, v in sorted(p["precisions"][d].items()))
                                  for d in ("v100", "t4"))
                batch = f"{p['batches']['v100']} / {p['batches']['t4']}"
                label = {"up": "UP", "qsync": "QSync allocator", "joint": "joint"}[c]
            else:
                omega = 0.0
                comp = "fp32 / fp32"
                batch = f"{GLOBAL_PER_DEVICE} / {GLOBAL_PER_DEVICE}"
                label = {"fp32": "FP32 DDP (reference)", "fp32-hook": "qsync hook, fp32"}.get(c, f"sync `{c}`")
            if (c == "fp32" or c in plans[m]) and omega is not None:
                points.append((label, omega, mean))
            extra = ""
            if c == "fp32-hook":
                bit = all(r.get("vs_fp32_bitwise") for r in rs)
                extra = " (= FP32 DDP bitwise)" if bit else \
                    f" (max |Δw| vs FP32 DDP {max(r.get('vs_fp32_max_abs', float('nan')) for r in rs):.1e})"
            w(f"| {label}{extra} | {comp} | {batch} | {'n/a' if omega is None else f'{omega:.2f}'} | {mean:.2f} ± {sd:.2f} | {l0:.3f} → {l1:.4f} | "
              f"{'yes' if ident else '**no**'} |")
        w("")
        # Where qsyncc kept GEMM-like operators out of INT8 (no calibrated
        # range for an input), every plan's Ω and UP are without them.
        kept = sorted({x for p in plans[m].values() for x in p.get("int8_warnings", [])})
        for x in kept:
            w(f"qsyncc warned: {x}")
            w("")
        # What the numbers say, computed: configurations clearly below the
        # reference (more than 3 points, or more than 3 of the reference's
        # standard deviations, whichever is larger).
        ref = [100 * r["test_acc"] for r in mr if r["config"] == "fp32"]
        if ref:
            rm = statistics.mean(ref)
            rs_ = statistics.stdev(ref) if len(ref) > 1 else 0.0
            margin = max(3.0, 3 * rs_)
            below = []
            for c in configs:
                accs = [100 * r["test_acc"] for r in mr if r["config"] == c]
                if statistics.mean(accs) < rm - margin:
                    below.append(f"`{c}` ({statistics.mean(accs):.1f})")
            w(f"Clearly below FP32 DDP ({rm:.1f} ± {rs_:.1f}; margin {margin:.1f} points): "
              f"{', '.join(below) if below else 'none'}.")
            w("")
        sds = {}
        for c in configs:
            accs = [100 * r["test_acc"] for r in mr if r["config"] == c]
            sds[c] = statistics.stdev(accs) if len(accs) > 1 else 0.0
        base = [p[2] for p in points if p[0].startswith("FP32 DDP")]
        if base and len(points) > 1:
            spread = max(abs(p[2] - base[0]) for p in points)
            sd_max = max(sds[c] for c in sds if c == "fp32" or c in plans[m])
            if spread < sd_max:
                w(f"The precision plans' mean accuracies differ from FP32 DDP's by at most {spread:.2f} points, "
                  f"less than the seeds' standard deviation (up to {sd_max:.2f}): no plan is measurably better "
                  f"or worse, and the rank correlation below orders noise.")
                w("")
        if base:
            pooled += [(m, p[0], p[1], p[2] - base[0]) for p in points]
        rho = spearman([p[1] for p in points], [p[2] for p in points])
        if rho != rho:
            verdict = "undefined: all Ω or all accuracies tie"
        elif rho < 0:
            verdict = "lower Ω goes with higher accuracy"
        elif rho > 0:
            verdict = "lower Ω goes with lower accuracy"
        else:
            verdict = "no rank relation"
        w(f"Spearman rank correlation between Ω and mean test accuracy over the {len(points)} precision plans "
          f"with an Ω ({', '.join(p[0] for p in points)}): ρ = {rho:.2f} ({verdict}"
          f"{'; with so few plans this is indicative only' if len(points) < 6 else ''}).")
        w("")
    if len({p[0] for p in pooled}) > 1:
        rho = spearman([p[2] for p in pooled], [p[3] for p in pooled])
        w("## Across both models")
        w("")
        w(f"Pooling the {len(pooled)} plans with an Ω of both models, with accuracy taken relative to the "
          f"model's FP32 DDP run (so the models' different accuracy levels do not rank): Spearman ρ(Ω, Δaccuracy) "
          f"= {rho:.2f} ({'lower Ω goes with higher accuracy' if rho < 0 else 'lower Ω does not go with higher accuracy' if rho == rho else 'undefined'}).")
        w("")
        w("| model | plan | Ω | Δ accuracy vs FP32 DDP (points) |")
        w("|---|---|---:|---:|")
        for p in pooled:
            w(f"| {p[0]} | {p[1]} | {p[2]:.2f} | {p[3]:+.2f} |")
        w("")
    w("## How the plans are made")
    w("")
    w(f"`digits.py prepare` exports each model to ONNX (training mode), calibrates it with `qsync.calibrate` "
      f"(50 steps on the training data) and plans it with `qsyncc MODEL --targets {TARGETS} --batch {GLOBAL_PER_DEVICE} "
      f"--stats calibration.json --optimizer adam --precisions {PRECISIONS}` three times: `--method joint` (the default: "
      "the joint plan), `--method qsync` (QSync's allocator at the uniform batch) and `--method up` (QSync's UP "
      "baseline: every planned operator of the inference type (t4) at the lowest uniform level that fits — "
      "INT8 for Conv/MatMul/Gemm, simulated in training as QSync does (quantize–dequantize in FP32, per-channel "
      "weights), FP32 for the others, which `--precisions int8` gives no lower float precision). "
      "Each plan is applied per rank with `qsync.apply_plan` and synchronized with `qsync.comm_hook(plan)`, "
      "which weights each rank's gradient by its type's `local_batch / global_batch`; each rank trains on its "
      "slice of the same global batch. The synchronization schemes run on FP32 compute with a uniform "
      "batch. The accuracy is that of the trained "
      "weights, so a plan's low-precision forward passes matter only through the updates they produce.")
    w("")
    w("On the schemes: `nbit-k` packs every element of a bucket into one of 2^k levels spread over the "
      "bucket's min..max (one range for the whole bucket, here the model's whole gradient), rounding to the "
      "nearest level; the many small elements then round to the same level, a bias that stochastic rounding "
      "(`-sr`) removes in expectation. `qgz-int*` quantizes per group of 512 elements, each with its own "
      "scale; `-ef` (error feedback) carries each quantization site's rounding error into the next step's input.")
    w("")
    os.makedirs(os.path.dirname(a.output) or ".", exist_ok=True)
    with open(a.output, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--model", required=True, choices=list(MODELS))
    p.add_argument("-o", "--output", required=True)
    t = sub.add_parser("train")
    t.add_argument("--model", required=True, choices=list(MODELS))
    t.add_argument("--plans", required=True, help="the model's prepare directory")
    t.add_argument("--configs", required=True)
    t.add_argument("--seeds", default="0,1,2")
    t.add_argument("--epochs", type=int, default=10)
    t.add_argument("--train-limit", type=int, default=None,
                   help="train on the first N training samples only (the CI's quick version)")
    t.add_argument("--lr", type=float, default=None, help="default: the model's (LR)")
    r = sub.add_parser("report")
    r.add_argument("results", nargs="+")
    r.add_argument("--plans-root", required=True, help="holds <model>/plans.json")
    r.add_argument("-o", "--output", required=True)
    r.add_argument("--command", default="scripts/accuracy.sh")
    r.add_argument("--date", default="")
    r.add_argument("--machine", default="")
    r.add_argument("--took", default="")
    r.add_argument("--note", default="")
    a = ap.parse_args()
    {"prepare": cmd_prepare, "train": cmd_train, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
