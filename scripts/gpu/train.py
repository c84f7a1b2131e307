#!/usr/bin/env python3
"""Measure real training iterations on a GPU: torchvision ResNet-50 and
VGG-16 and Hugging Face BERT-base (question answering, the graph of
`bert_base_train.onnx`), random init, synthetic data, at FP32, TF32, AMP
FP16 and AMP BF16. Writes a `qsync-iterations/1` file that
`scripts/gpu/analyze.py` compares with `qsyncc simulate`.

    python3 scripts/gpu/train.py OUT.json [--models resnet50,vgg16,bert_base]
        [--precisions fp32,tf32,amp_fp16,amp_bf16] [--batch 32] [--seq 128] [--warmup 15] [--iters 40]
        [--kernel-iters 5]

One iteration is what a training loop does: forward, loss, backward,
optimizer step (SGD with momentum for the CNNs, AdamW for BERT, PyTorch's
default foreach implementations), `zero_grad(set_to_none=True)`; AMP FP16
goes through a GradScaler (its inf check synchronizes every step, as it
does for users). Each iteration is timed with CUDA events recorded on the
stream before and after it; the median over --iters iterations after
--warmup is reported, with the 10th and 90th percentiles and the peak of
allocated memory. Events recorded between the phases also give each
phase's median (forward with the loss, backward, optimizer step with
`zero_grad`), what `qsyncc simulate --trace` predicts per phase, and the
host's time issuing each phase (`host_phases_ms`, wall clock around the
Python calls): where it exceeds the GPU's, the step is host-bound.

`--kernel-iters N` (default 5; 0: off) then runs N more iterations under
torch.profiler and records, per iteration, the GPU time of the kernels each
ATen operator launched itself (`self device time`), the operator's calls,
and the kernels' total: set against the median iteration it says how much
of the step the GPU was busy, and per operator it is what
`scripts/gpu/breakdown.py` compares with the replayer's per-op prediction.

FP32 runs with TF32 off everywhere (cuDNN and cuBLAS), TF32 with it on in
both; PyTorch's own default (TF32 for convolutions only) is neither, so it
is not a row. BERT runs with eager attention (explicit MatMul / Softmax,
the computation the ONNX export describes), not SDPA.

Needs torch, torchvision and transformers (all on the lent GPU machines; no
network: weights are random, nothing is downloaded).
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

# scripts/gpu/profile.py shadows the standard library's `profile`, which
# PyTorch imports (torch._dynamo → cProfile): keep this directory off the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import torch  # noqa: E402

MODELS = {
    # name: (qsync model file, family, optimizer name as qsyncc --optimizer takes it)
    "resnet50": ("resnet50_train.onnx", "resnet50", "momentum"),
    "vgg16": ("vgg16.onnx", "vgg16", "momentum"),
    "bert_base": ("bert_base_train.onnx", "bert_base", "adam"),
}
PRECISIONS = ("fp32", "tf32", "amp_fp16", "amp_bf16")


def build(name, batch, seq):
    """(model, make_batch, loss_fn, optimizer) on the GPU."""
    dev = "cuda"
    if name in ("resnet50", "vgg16"):
        import torchvision

        model = getattr(torchvision.models, name)(weights=None).to(dev).train()
        x = torch.randn(batch, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)
        crit = torch.nn.CrossEntropyLoss()
        loss = lambda m: crit(m(x), y)  # noqa: E731
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        return model, loss, opt
    if name == "bert_base":
        import transformers

        cfg = transformers.BertConfig()  # BERT-base: 12 layers, hidden 768, 12 heads, vocab 30522
        model = transformers.BertForQuestionAnswering._from_config(cfg, attn_implementation="eager")
        model = model.to(dev).train()
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
        mask = torch.ones(batch, seq, dtype=torch.long, device=dev)
        start = torch.randint(0, seq, (batch,), device=dev)
        end = torch.randint(0, seq, (batch,), device=dev)
        loss = lambda m: m(input_ids=ids, attention_mask=mask, start_positions=start, end_positions=end).loss  # noqa: E731
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return model, loss, opt
    raise SystemExit(f"error: unknown model `{name}` (known: {', '.join(MODELS)})")


def kernel_breakdown(step, iters):
    """Per ATen operator, the GPU time (us) and calls of one iteration,
    from torch.profiler over `iters` iterations; the kernels' total too."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    from torch.autograd import DeviceType

    ops, total = {}, 0.0
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0.0)
        if us <= 0:
            continue
        if e.device_type != DeviceType.CPU:
            # The kernels and copies themselves (not a range a user marked).
            if not getattr(e, "is_user_annotation", False):
                total += us
        elif e.key.startswith("aten::"):
            ops[e.key] = {"us": round(us / iters, 3), "calls": round(e.count / iters, 3)}
    return {"ops": ops, "kernels_us": round(total / iters, 3), "iterations": iters}


def run(name, precision, batch, seq, warmup, iters, kernel_iters=0):
    torch.manual_seed(0)
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    model, loss_fn, opt = build(name, batch, seq)
    amp = {"amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda") if precision == "amp_fp16" else None

    def step(marks=None, host=None):
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_fn(model)
        if marks:
            marks[0].record()
        t1 = time.perf_counter()
        if scaler is not None:
            scaler.scale(loss).backward()
            if marks:
                marks[1].record()
            t2 = time.perf_counter()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            if marks:
                marks[1].record()
            t2 = time.perf_counter()
            opt.step()
        opt.zero_grad(set_to_none=True)
        if host is not None:
            host.append((t1 - t0, t2 - t1, time.perf_counter() - t2))

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    events = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(iters)]
    host = []
    for s, f, b, e in events:
        s.record()
        step((f, b), host)
        e.record()
    torch.cuda.synchronize()
    # What issuing each phase cost the CPU (Python, autograd, dispatch and
    # launches; it blocks only where the loop synchronizes, as GradScaler's
    # inf check does): the GPU waits for it where its kernels are shorter.
    host_phases = {k: statistics.median(h[i] for h in host) * 1e3
                   for i, k in enumerate(("forward", "backward", "optimizer"))}
    ms = sorted(s.elapsed_time(e) for s, _, _, e in events)
    phases = {
        "forward": statistics.median(s.elapsed_time(f) for s, f, _, _ in events),
        "backward": statistics.median(f.elapsed_time(b) for _, f, b, _ in events),
        "optimizer": statistics.median(b.elapsed_time(e) for _, _, b, e in events),
    }
    peak = torch.cuda.max_memory_allocated()
    kernels = kernel_breakdown(step, kernel_iters) if kernel_iters > 0 else None
    del model, opt
    torch.cuda.empty_cache()
    q = statistics.quantiles(ms, n=10)
    qsync_model, family, optimizer = MODELS[name]
    return {
        "model": name, "qsync_model": qsync_model, "family": family, "optimizer": optimizer,
        "precision": precision, "batch": batch, "seq": seq if name == "bert_base" else None,
        "median_ms": round(statistics.median(ms), 4), "p10_ms": round(q[0], 4), "p90_ms": round(q[-1], 4),
        "iterations": iters, "peak_memory_bytes": peak,
        "phases_ms": {k: round(v, 4) for k, v in phases.items()},
        "host_phases_ms": {k: round(v, 4) for k, v in host_phases.items()},
        **({"kernels": kernels} if kernels else {}),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--kernel-iters", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: no CUDA GPU visible to PyTorch: nothing to measure", file=sys.stderr)
        return 2
    runs = []
    for name in [m for m in args.models.split(",") if m]:
        if name not in MODELS:
            print(f"error: unknown model `{name}` (known: {', '.join(MODELS)})", file=sys.stderr)
            return 2
        for p in [p for p in args.precisions.split(",") if p]:
            if p not in PRECISIONS:
                print(f"error: unknown precision `{p}` (known: {', '.join(PRECISIONS)})", file=sys.stderr)
                return 2
            r = run(name, p, args.batch, args.seq, args.warmup, args.iters, args.kernel_iters)
            busy = f", kernels {r['kernels']['kernels_us'] / 1e3:.3f} ms" if "kernels" in r else ""
            ph, hp = r["phases_ms"], r["host_phases_ms"]
            print(f"{name:<10} {p:<9} median {r['median_ms']:.3f} ms (p10 {r['p10_ms']:.3f}, p90 {r['p90_ms']:.3f}; "
                  f"fwd {ph['forward']:.2f} bwd {ph['backward']:.2f} opt {ph['optimizer']:.2f}{busy}; host "
                  f"{hp['forward']:.2f} / {hp['backward']:.2f} / {hp['optimizer']:.2f}), "
                  f"peak {r['peak_memory_bytes'] / 2**30:.2f} GiB", flush=True)
            runs.append(r)
            # After every run, so a job stopped part-way keeps what it measured.
            write(args.out, runs)
    print(f"wrote {args.out}: {len(runs)} runs")
    return 0


def write(path, runs):
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    for mod in ("torchvision", "transformers"):
        try:
            meta[mod] = __import__(mod).__version__
        except ImportError:
            pass
    with open(path + ".tmp", "w") as f:
        json.dump({"schema": "qsync-iterations/1", "meta": meta, "runs": runs}, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
