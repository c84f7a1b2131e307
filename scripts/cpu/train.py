#!/usr/bin/env python3
"""Measure single-process training iterations on this machine's CPU (issue
27, "Compute"): torchvision ResNet-18 / ResNet-50 and Hugging Face BERT-tiny
/ BERT-base (question answering, eager attention), random init, synthetic
data, FP32, at several batches. Writes a `qsync-iterations/1` file that
`scripts/gpu/analyze.py` compares with `qsyncc simulate` (the same file
format as scripts/gpu/train.py).

    python3 scripts/cpu/train.py OUT.json [--models resnet18,bert_tiny] [--batches 1,2,8,32]
        [--seq 128] [--min-iters 3] [--budget-s 4]

One iteration: forward, loss, backward, optimizer step (SGD with momentum
for the CNNs, AdamW for BERT, PyTorch's defaults), `zero_grad(set_to_none=
True)`. After two warm-up iterations, iterations are timed until at
least --min-iters ran and --budget-s of CPU time passed (at most 30), each
by the CPU time of the process (user + system, `time.process_time`) and by
the wall clock. On a machine shared with other work the wall clock counts
the time other processes hold the cores; with one thread (OMP_NUM_THREADS=1)
the process's CPU time is what the iteration takes alone. Reported: the
median CPU time (`cpu_median_ms`, its minimum and 10th/90th percentiles) and
the wall-clock minimum and median.

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


def run(name, batch, seq, min_iters, budget_s):
    torch.manual_seed(0)
    model, loss_fn, opt = build(name, batch, seq)

    def step():
        loss_fn(model).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    ms, cpu = [], []
    t_end = time.process_time() + budget_s
    while len(ms) < min_iters or (time.process_time() < t_end and len(ms) < 30):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    q = statistics.quantiles(cpu, n=10) if len(cpu) >= 2 else [cpu[0]] * 9
    qsync_model, family, optimizer = MODELS[name]
    return {
        "model": name, "qsync_model": qsync_model, "family": family, "optimizer": optimizer,
        "precision": "fp32", "batch": batch, "seq": seq if name.startswith("bert") else None,
        "cpu_median_ms": round(statistics.median(cpu), 4), "cpu_min_ms": round(min(cpu), 4),
        "p10_ms": round(q[0], 4), "p90_ms": round(q[-1], 4),
        "min_ms": round(min(ms), 4), "median_ms": round(statistics.median(ms), 4), "iterations": len(ms),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--models", default="resnet18,bert_tiny")
    ap.add_argument("--batches", default="1,2,8,32")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--min-iters", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=4.0)
    a = ap.parse_args()
    runs = []
    for name in [m for m in a.models.split(",") if m]:
        if name not in MODELS:
            print(f"error: unknown model `{name}` (known: {', '.join(MODELS)})", file=sys.stderr)
            return 2
        for b in [int(b) for b in a.batches.split(",") if b]:
            r = run(name, b, a.seq, a.min_iters, a.budget_s)
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
