#!/usr/bin/env python3
"""Measure single-process training iterations on this machine's CPU (issue
27, "Compute"): torchvision ResNet-18 / ResNet-50 and Hugging Face BERT-tiny
/ BERT-base (question answering, eager attention), random init, synthetic
data, FP32, at several batches. Writes a `qsync-iterations/1` file that
`scripts/gpu/analyze.py` compares with `qsyncc simulate` (the same file
format as scripts/gpu/train.py).

    python3 scripts/cpu/train.py OUT.json [--models resnet18,bert_tiny] [--batches 1,2,8,32]
        [--seq 128] [--min-iters 3] [--budget-s 4] [--op-iters 0]

One iteration: forward, loss, backward, optimizer step (SGD with momentum
for the CNNs, AdamW for BERT, PyTorch's defaults), `zero_grad(set_to_none=
True)`. After one optimizer step on dense random gradients (the state of a
trained model's optimizer: see `run`) and two warm-up iterations, iterations are timed until at
least --min-iters ran and --budget-s of CPU time passed (at most 30), each
by the CPU time of the process (user + system, `time.process_time`) and by
the wall clock. On a machine shared with other work the wall clock counts
the time other processes hold the cores; with one thread (OMP_NUM_THREADS=1)
the process's CPU time is what the iteration takes alone. Reported: the
median CPU time (`cpu_median_ms`, its minimum and 10th/90th percentiles) and
the wall-clock minimum and median; the CPU time of each phase (forward with
the loss, backward, optimizer step with zero_grad: `phases_ms`); with
--op-iters, each ATen operator's own CPU time (`kernels`).

Only FP32: BF16 autocast on a CPU without native BF16 arithmetic (lscpu's
avx512_bf16 / amx_bf16) emulates it, which is not what the device file
describes. Needs torch, torchvision and transformers; no network.
"""
import argparse
import datetime
import json
import platform
import statistics
import sys
import time

import torch

MODELS = {
    # name: (qsync model file, family, optimizer as qsyncc --optimizer takes it)
    "resnet18": ("resnet18_train.onnx", "resnet18", "momentum"),
    "resnet50": ("resnet50_train.onnx", "resnet50", "momentum"),
    "bert_tiny": ("bert_tiny_train.onnx", "bert_tiny", "adam"),
    "bert_base": ("bert_base_train.onnx", "bert_base", "adam"),
}
BERT = {
    # Google's BERT-tiny (L=2, H=128, A=2) and BERT-base, vocabulary 30522.
    "bert_tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512),
    "bert_base": dict(),
}


def cpu_name():
    """The CPU as `meta.gpu` names it (scripts/gpu/profile.py --device cpu writes the same)."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU {model} ({torch.get_num_threads()} threads)"


def build(name, batch, seq):
    """(model, loss function, optimizer)."""
    if name.startswith("resnet"):
        import torchvision

        model = getattr(torchvision.models, name)(weights=None).train()
        x = torch.randn(batch, 3, 224, 224)
        y = torch.randint(0, 1000, (batch,))
        crit = torch.nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        return model, lambda m: crit(m(x), y), opt
    import transformers

    cfg = transformers.BertConfig(**BERT[name])
    model = transformers.BertForQuestionAnswering._from_config(cfg, attn_implementation="eager").train()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    start, end = torch.randint(0, seq, (batch,)), torch.randint(0, seq, (batch,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss = lambda m: m(input_ids=ids, attention_mask=mask, start_positions=start, end_positions=end).loss  # noqa: E731
    return model, loss, opt


def op_breakdown(step, iters):
    """Per ATen operator, the CPU time spent in the operator itself (its
    self time: not the operators it calls) and its calls in one iteration,
    from torch.profiler over `iters` iterations; their total as `kernels_us`
    (the same fields scripts/gpu/train.py records, with the CPU as the
    device): what the iteration spends outside them is Python, autograd's
    engine and the dispatcher, which no per-operator time shows."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            step()
    ops, total = {}, 0.0
    for e in prof.key_averages():
        if not e.key.startswith("aten::") or e.self_cpu_time_total <= 0:
            continue
        total += e.self_cpu_time_total
        ops[e.key] = {"us": round(e.self_cpu_time_total / iters, 3), "calls": round(e.count / iters, 3)}
    return {"ops": ops, "kernels_us": round(total / iters, 3), "iterations": iters}


def run(name, batch, seq, min_iters, budget_s, op_iters=0):
    torch.manual_seed(0)
    model, loss_fn, opt = build(name, batch, seq)

    def step(phases=None):
        c0 = time.process_time()
        loss = loss_fn(model)
        c1 = time.process_time()
        loss.backward()
        c2 = time.process_time()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if phases is not None:
            phases.append((c1 - c0, c2 - c1, time.process_time() - c2))

    # The optimizer's state as a model that has trained has it: one step on
    # dense random gradients first. The timed steps replay one synthetic
    # batch, so without it the rows of BERT's 30522-row word embedding that
    # batch never uses keep AdamW's second moment at exactly zero, and this
    # CPU's sqrt takes 1.7x as long over zeros as over other values (3.9 M
    # elements: 12.7 against 7.4 ms), a state no real training run stays in.
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    opt.zero_grad(set_to_none=True)
    for _ in range(2):
        step()
    ms, cpu, phases = [], [], []
    t_end = time.process_time() + budget_s
    while len(ms) < min_iters or (time.process_time() < t_end and len(ms) < 30):
        t0, c0 = time.perf_counter(), time.process_time()
        step(phases)
        ms.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    q = statistics.quantiles(cpu, n=10) if len(cpu) >= 2 else [cpu[0]] * 9
    ops = op_breakdown(step, op_iters) if op_iters > 0 else None
    qsync_model, family, optimizer = MODELS[name]
    return {
        "model": name, "qsync_model": qsync_model, "family": family, "optimizer": optimizer,
        "precision": "fp32", "batch": batch, "seq": seq if name.startswith("bert") else None,
        "cpu_median_ms": round(statistics.median(cpu), 4), "cpu_min_ms": round(min(cpu), 4),
        "p10_ms": round(q[0], 4), "p90_ms": round(q[-1], 4),
        "min_ms": round(min(ms), 4), "median_ms": round(statistics.median(ms), 4), "iterations": len(ms),
        # CPU time per phase (medians): forward with the loss, backward,
        # optimizer step with zero_grad.
        "phases_ms": {k: round(statistics.median(p[i] for p in phases) * 1e3, 4)
                      for i, k in enumerate(("forward", "backward", "optimizer"))},
        **({"kernels": ops} if ops else {}),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--models", default="resnet18,bert_tiny")
    ap.add_argument("--batches", default="1,2,8,32")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--min-iters", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=4.0)
    ap.add_argument("--op-iters", type=int, default=0,
                    help="after the timed iterations, this many more under torch.profiler: each ATen operator's "
                         "CPU time (scripts/gpu/breakdown.py sets them against the model's)")
    a = ap.parse_args()
    runs = []
    for name in [m for m in a.models.split(",") if m]:
        if name not in MODELS:
            print(f"error: unknown model `{name}` (known: {', '.join(MODELS)})", file=sys.stderr)
            return 2
        for b in [int(b) for b in a.batches.split(",") if b]:
            r = run(name, b, a.seq, a.min_iters, a.budget_s, a.op_iters)
            print(f"{name:<10} batch {b:<3} CPU time median {r['cpu_median_ms']:.2f} ms (min {r['cpu_min_ms']:.2f}, "
                  f"p10 {r['p10_ms']:.2f}, p90 {r['p90_ms']:.2f}); wall min {r['min_ms']:.2f}, median "
                  f"{r['median_ms']:.2f} ({r['iterations']} iterations)", flush=True)
            runs.append(r)
    meta = {
        "gpu": cpu_name(),
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    for mod in ("torchvision", "transformers"):
        try:
            meta[mod] = __import__(mod).__version__
        except ImportError:
            pass
    with open(a.out, "w") as f:
        json.dump({"schema": "qsync-iterations/1", "meta": meta, "runs": runs}, f, indent=1, sort_keys=True)
    print(f"wrote {a.out}: {len(runs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
