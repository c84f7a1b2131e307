#!/usr/bin/env python3
"""Plan a model with qsync, then train it with DistributedDataParallel.

  # 1. export the PyTorch model to ONNX and plan it for a hybrid cluster
  python examples/train_ddp.py plan --model resnet18 --targets v100:2,t4:2 --batch 8 -o target/ddp-plan
  # 2. train the model the plan was made for: each rank applies its device
  #    type's plan and the qsync hook
  torchrun --nproc-per-node 4 examples/train_ddp.py train --plan target/ddp-plan --steps 5
  # 3. time each hook's synchronization against DDP's own all-reduce, in one job
  torchrun --nproc-per-node 4 examples/train_ddp.py bench --model resnet18

`train --plan` builds the model the plan names (the manifest's `model`:
`plan` exports the model as `<name>.onnx`); `--model` with a plan must name
the same model, and a plan that does not fit the model is refused
(`qsync.apply_plan` raises). `train` without `--plan` is plain FP32 DDP over
the same global batches (the baseline, `--model` or resnet18); `--scheme S` overrides the plan's synchronization scheme (or,
without a plan, tries scheme S alone). Every rank draws the same synthetic
global batch each step and trains on its own slice of it, sized by its device
type's local batch, so a plan's uneven split and the uniform baseline see the
same samples. Rank 0 prints one JSON line per step: the global loss (the
batch-weighted mean of the ranks' losses) and, per rank, a digest of every
parameter, so a test can check that the replicas stay identical.

CPU only here (gloo); with CUDA devices visible, `--device cuda` trains on
them with the runtime's NCCL path.
"""

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


# ---- models ------------------------------------------------------------------


class Block(nn.Module):
    """A pre-norm transformer block with its attention written out, so each
    matmul and softmax is an operator the plan can set."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def attend(self, x):
        b, s, d = x.shape
        h = self.heads

        def split(t):
            return t.reshape(b, s, h, d // h).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.matmul(q, k.transpose(-1, -2)) * (d // h) ** -0.5
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, s, d)
        return self.o(y)

    def forward(self, x):
        x = x + self.attend(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab=256, d=64, heads=4, layers=2, seq=16, classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, seq, d))
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x).mean(dim=1))


MODELS = ("resnet18", "transformer")


def model_for(plan, requested):
    """The model `train` builds: the one the plan was made for (its
    manifest's `model` name), else `requested`, else resnet18."""
    if plan is None:
        return requested or "resnet18"
    planned = plan.model_name
    if planned not in MODELS:
        raise SystemExit(f"{plan.path}: the plan was made for model {planned!r}, which this example cannot build "
                         f"({', '.join(MODELS)}); plan one of them with `train_ddp.py plan --model NAME`")
    if requested and requested != planned:
        raise SystemExit(f"{plan.path}: the plan was made for model {planned!r}, not --model {requested!r}: "
                         f"plan {requested} (`train_ddp.py plan --model {requested}`) or drop --model")
    return planned


def make_model(name, seed):
    torch.manual_seed(seed)
    if name == "resnet18":
        import torchvision

        return torchvision.models.resnet18(num_classes=10)
    if name == "transformer":
        return Transformer()
    raise SystemExit(f"unknown model {name!r} (resnet18, transformer)")


def example_input(name, batch):
    if name == "resnet18":
        return torch.randn(batch, 3, 32, 32)
    return torch.randint(0, 256, (batch, 16))


def global_batch(name, batch, step, seed):
    """The step's synthetic global batch, the same on every rank."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    if name == "resnet18":
        x = torch.randn(batch, 3, 32, 32, generator=g)
    else:
        x = torch.randint(0, 256, (batch, 16), generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    return x, y


# ---- plan --------------------------------------------------------------------


def qsyncc_binary():
    exe = os.environ.get("QSYNCC")
    if exe:
        return exe
    here = os.path.dirname(os.path.abspath(__file__))
    for p in ("../target/release/qsyncc", "../target/debug/qsyncc"):
        cand = os.path.join(here, p)
        if os.path.exists(cand):
            return cand
    found = shutil.which("qsyncc")
    if found:
        return found
    raise SystemExit("qsyncc not found: build it (cargo build --release -p qsyncc) or set $QSYNCC")


def cmd_plan(a):
    model = make_model(a.model, a.seed)
    model.train()
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.path.join(tmp, f"{a.model}.onnx")
        torch.onnx.export(model, (example_input(a.model, a.batch),), onnx_path, dynamo=a.exporter == "dynamo",
                          training=torch.onnx.TrainingMode.TRAINING, input_names=["x"],
                          **({} if a.exporter == "dynamo" else {"do_constant_folding": False}))
        cmd = [qsyncc_binary(), onnx_path, "--targets", a.targets, "--batch", str(a.batch), "-o", a.output]
        cmd += a.qsyncc_args
        print("+ " + " ".join(cmd), file=sys.stderr)
        r = subprocess.run(cmd)
        if r.returncode != 0:
            raise SystemExit(r.returncode)


# ---- train -------------------------------------------------------------------


def digest(model):
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def backend_for(kind):
    """gloo on CPUs; on GPUs NCCL for CUDA tensors and gloo for the CPU ones
    (the step's loss, the digests)."""
    return "gloo" if kind == "cpu" else "cpu:gloo,cuda:nccl"


def local_device(kind):
    """This rank's device: the CPU, or the GPU of its local rank (ranks share
    the GPUs round-robin when there are more ranks than GPUs, as on a
    one-GPU machine)."""
    if kind == "cpu":
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", 0))
    return torch.device(f"cuda:{local % max(torch.cuda.device_count(), 1)}")


def cmd_train(a):
    import datetime

    import qsync

    # The model the plan was made for, settled before any rank joins.
    plan = qsync.Plan.load(a.plan) if a.plan else None
    a.model = model_for(plan, a.model)
    # A deadline on every collective (gloo's own and the qsync hook's), so a
    # dead peer or a cut link ends the job with an error instead of a hang.
    timeout = {"timeout": datetime.timedelta(seconds=a.timeout_s)} if a.timeout_s else {}
    dist.init_process_group(backend_for(a.device), **timeout)
    hook_opts = {"last_bucket": a.last_bucket, **({"timeout_s": a.timeout_s} if a.timeout_s else {})}
    rank, world = dist.get_rank(), dist.get_world_size()
    device = local_device(a.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if plan:
        batches = [plan.local_batch(plan.device_for_rank(r)) for r in range(world)]
    else:
        batches = [a.batch] * world
    gbatch = sum(batches)
    start = sum(batches[:rank])
    schemes = a.schemes.split(",") if a.schemes else [a.scheme or (plan.sync_scheme if plan else "ddp")]
    for scheme in schemes:
        model = make_model(a.model, a.seed)
        report = None
        if plan and not a.no_apply:
            report = qsync.apply_plan(model, a.plan, plan.device_for_rank(rank))
            if report.unmapped:
                print(f"rank {rank}: {report}", file=sys.stderr)
        model.to(device)
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
        hook = None
        if plan:
            hook = qsync.comm_hook(a.plan, scheme=scheme, seed=a.seed, kernels=a.kernels, **hook_opts)
        elif scheme != "ddp":
            hook = qsync.comm_hook(scheme, seed=a.seed, kernels=a.kernels, **hook_opts)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9)
        if report is not None:
            # The plan's refreshed copies are rewritten after every step.
            report.attach(opt)
        for step in range(a.steps):
            x, y = global_batch(a.model, gbatch, step, a.seed)
            x, y = x[start:start + batches[rank]].to(device), y[start:start + batches[rank]].to(device)
            if a.fail_rank == rank and a.fail_step == step:
                raise RuntimeError(f"rank {rank}: failing on purpose at step {step} (--fail-rank)")
            loss = F.cross_entropy(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            # The global loss: each rank's mean loss weighted by its batch share.
            t = torch.tensor([loss.item() * batches[rank] / gbatch], dtype=torch.float64)
            dist.all_reduce(t)
            digests = [None] * world
            dist.all_gather_object(digests, digest(model))
            if rank == 0:
                rec = {"scheme": scheme, "step": step, "loss": t.item(), "digests": digests, "batches": batches,
                       "model": a.model}
                if report is not None and step == 0:
                    rec["mapped"] = len(report.mapped)
                    rec["unmapped"] = len(report.unmapped)
                    rec["precisions"] = dict(report.per_precision)
                if report is not None and step == a.steps - 1:
                    rec["unmatched_calls"] = len(report.unmatched_calls())
                print(json.dumps(rec), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # gloo with a communication hook can abort at interpreter exit on small
    # machines ("terminate called without an active exception"): leave now.
    os._exit(0)


def torch_hook(name):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return {"torch-fp16": default_hooks.fp16_compress_hook, "torch-bf16": default_hooks.bf16_compress_hook}[name]


def cmd_bench(a):
    """Times the backward pass of one model under DDP with each hook, in the
    same job and round-robin (so a slower or busier moment of the machine
    hits every hook alike), next to the same backward with DDP's
    synchronization switched off (`no_sync`). Rank 0 prints one JSON line per
    hook: the median backward seconds (of the slowest rank), its ratio to
    the backward with DDP's own all-reduce (`ddp`), and the exposed
    synchronization (backward minus the no-sync backward: what the
    synchronization adds once its overlap with the backward computation is
    taken into account; near zero, or a little below from noise, when it is
    hidden entirely)."""
    import qsync

    dist.init_process_group(backend_for(a.device))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = local_device(a.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    hooks = a.hooks.split(",")
    if "ddp" not in hooks:
        hooks.insert(0, "ddp")
    ddps, qhooks = {}, {}
    for name in hooks + ["no-sync"]:
        model = make_model(a.model, a.seed).to(device)
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
        if name.startswith("torch-"):
            ddp.register_comm_hook(None, torch_hook(name))
        elif name not in ("ddp", "no-sync"):
            hook = qsync.comm_hook(name, seed=a.seed, kernels=a.kernels, last_bucket=a.last_bucket)
            ddp.register_comm_hook(None, hook)
            qhooks[name] = hook.qsync
        ddps[name] = ddp
    x, y = global_batch(a.model, a.batch * world, 0, a.seed)
    x, y = x[rank * a.batch:(rank + 1) * a.batch].to(device), y[rank * a.batch:(rank + 1) * a.batch].to(device)
    times = {name: [] for name in ddps}
    cpu = {name: [] for name in ddps}  # the process's CPU seconds (every thread) per backward
    by_thread = {name: {} for name in ddps}  # CPU seconds per thread name, summed over backwards

    def backward(name):
        ddp = ddps[name]
        ddp.zero_grad(set_to_none=True)
        # DDP decides in the forward pass whether the backward reduces, so
        # `no_sync` must cover the forward too, or the "unsynchronized"
        # backward all-reduces like DDP's own.
        with ddp.no_sync() if name == "no-sync" else contextlib.nullcontext():
            loss = F.cross_entropy(ddp(x), y)
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            k0 = thread_cpu()
            t0, c0 = time.perf_counter(), time.process_time()
            loss.backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            wall, used = time.perf_counter() - t0, time.process_time() - c0
            for tid, (comm, s1) in thread_cpu().items():
                # every thread alive at the end, 0 where it used no tick
                spent = s1 - k0.get(tid, (comm, 0.0))[1]
                by_thread[name][comm] = by_thread[name].get(comm, 0.0) + spent
            return wall, used

    for name in ddps:  # warm-up: buckets are rebuilt after the first step
        for _ in range(2):
            backward(name)
    for counts in by_thread.values():
        counts.clear()
    for h in qhooks.values():
        h.reset_phases()
    for _ in range(a.reps):
        for name in ddps:
            wall, used = backward(name)
            times[name].append(wall)
            cpu[name].append(used)
    # Where a qsync hook's time went, per backward (this rank's mean).
    phases = {name: {k: v / a.reps for k, v in h.phases().items()} for name, h in qhooks.items()}
    # Each rank's time; the slowest rank's median is the job's.
    meds = {name: statistics.median(v) for name, v in times.items()}
    cpu_meds = {name: statistics.median(v) for name, v in cpu.items()}
    gathered = [None] * world
    dist.all_gather_object(gathered, (meds, phases, cpu_meds, times, by_thread))
    all_meds, all_phases, all_cpu, all_times, all_threads = zip(*gathered)
    if rank == 0:
        job = {name: max(m[name] for m in all_meds) for name in ddps}
        # Round by round (every hook once a round), the slowest rank's
        # backward: hooks compared in the same round met the same machine.
        rounds = {name: [max(t[name][i] for t in all_times) for i in range(a.reps)] for name in ddps}
        grad_mb = sum(p.numel() for p in ddps["ddp"].parameters()) * 4 / 2**20
        for name in hooks:
            print(json.dumps({
                "hook": name, "model": a.model, "ranks": world, "device": a.device, "gradient_mib": round(grad_mb, 2),
                "gradient_tensors": len(list(ddps["ddp"].parameters())),
                "reps": a.reps, "backward_s": job[name], "no_sync_backward_s": job["no-sync"],
                "exposed_sync_s": job[name] - job["no-sync"], "backward_vs_ddp": job[name] / job["ddp"],
                "rounds_s": rounds[name],
                # the CPU a rank's process used in the backward (median over
                # backwards, mean over ranks), and the same without synchronization
                "cpu_s": statistics.mean(c[name] for c in all_cpu),
                "no_sync_cpu_s": statistics.mean(c["no-sync"] for c in all_cpu),
                # each rank's median backward and CPU, in rank order (the
                # job's backward is the slowest rank's)
                "ranks_backward_s": [m[name] for m in all_meds],
                "ranks_cpu_s": [c[name] for c in all_cpu],
                "ranks_no_sync_cpu_s": [c["no-sync"] for c in all_cpu],
                # the same per thread name (the training thread, gloo's
                # threads, the hook's worker), mean per backward over the
                # backwards and the ranks; empty without /proc
                "threads_cpu_s": thread_means(all_threads, name, a.reps),
                "no_sync_threads_cpu_s": thread_means(all_threads, "no-sync", a.reps),
                # each phase's largest mean over ranks, seconds per backward
                **({"phases_s": {k: max(p[name][k] for p in all_phases) for k in all_phases[0][name]}}
                   if name in qhooks else {}),
            }), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def thread_cpu():
    """{thread id: (name, CPU seconds)} of this process's threads, from
    /proc (empty where there is none): the scheduler's nanoseconds on a
    core (`schedstat`) where the kernel keeps them, else the clock ticks of
    `stat` (10 ms each). The thread that called this (the one running the
    backward pass) is named `training`; the others carry their OS names."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    me = str(threading.get_native_id())
    tick = os.sysconf("SC_CLK_TCK")
    for tid in tids:
        base = f"/proc/self/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                comm = f.read().strip()
            try:
                with open(f"{base}/schedstat") as f:
                    seconds = int(f.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                with open(f"{base}/stat") as f:
                    stat = f.read()
                fields = stat[stat.rfind(")") + 2:].split()
                seconds = (int(fields[11]) + int(fields[12])) / tick
        except OSError:  # the thread ended meanwhile
            continue
        out[tid] = ("training" if tid == me else comm, seconds)
    return out


def thread_means(all_threads, name, reps):
    """Per thread name, CPU seconds per backward of hook `name`, the mean
    over ranks of each rank's sum over its `reps` backwards."""
    names = sorted({k for t in all_threads for k in t[name]})
    return {k: sum(t[name].get(k, 0.0) for t in all_threads) / len(all_threads) / reps for k in names}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="export the model to ONNX and plan it with qsyncc")
    p.add_argument("--model", default="resnet18", choices=["resnet18", "transformer"])
    p.add_argument("--targets", default="v100:2,t4:2")
    p.add_argument("--batch", type=int, default=8, help="per-device batch the plan starts from")
    p.add_argument("--exporter", default="legacy", choices=["legacy", "dynamo"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", required=True)
    p.add_argument("qsyncc_args", nargs="*", help="more qsyncc options, after `--`")
    t = sub.add_parser("train", help="train under torchrun")
    t.add_argument("--model", default=None, choices=list(MODELS),
                   help="with --plan: the plan's model (the default); without: resnet18 by default")
    t.add_argument("--plan", help="plan directory (omit for plain FP32 DDP)")
    t.add_argument("--scheme", help="synchronization scheme (overrides the plan's; `ddp`: DDP's own all-reduce)")
    t.add_argument("--schemes", help="comma-separated schemes, trained one after another from the same start")
    t.add_argument("--kernels", choices=["host", "device"], default="host",
                   help="where CUDA buckets quantize: the CPU (host) or qsync's PTX on the GPU "
                        "(device; $QSYNC_PTX_DIR holds `qsyncc codegen --all-kernels` output)")
    t.add_argument("--no-apply", action="store_true", help="use the plan's batches and gradient weights only")
    t.add_argument("--batch", type=int, default=8, help="per-rank batch without a plan")
    t.add_argument("--steps", type=int, default=5)
    t.add_argument("--lr", type=float, default=0.05)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--bucket-mb", type=float, default=25.0)
    t.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    t.add_argument("--fail-rank", type=int, default=-1, help="this rank raises at --fail-step (failure tests)")
    t.add_argument("--fail-step", type=int, default=1)
    t.add_argument("--timeout-s", type=float, default=None,
                   help="deadline of every collective, seconds (gloo's and the qsync hook's)")
    t.add_argument("--last-bucket", choices=["auto", "worker", "call"], default="auto",
                   help="where a CPU step's last bucket synchronizes: the hook's worker thread, the hook call, "
                        "or auto (the call where a node's ranks outnumber its cores)")
    b = sub.add_parser("bench", help="time each hook's synchronization against DDP's all-reduce (under torchrun)")
    b.add_argument("--model", default="resnet18", choices=["resnet18", "transformer"])
    b.add_argument("--hooks", default="ddp,torch-fp16,fp16,qgz-int8,qgz-int4,nbit-2",
                   help="comma-separated: ddp (DDP's all-reduce), torch-fp16, torch-bf16 (PyTorch's hooks), "
                        "or any qsync scheme")
    b.add_argument("--batch", type=int, default=2, help="per-rank batch (small: the synchronization is timed)")
    b.add_argument("--reps", type=int, default=7, help="timed backward passes per hook")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--bucket-mb", type=float, default=25.0)
    b.add_argument("--kernels", choices=["host", "device"], default="host")
    b.add_argument("--last-bucket", choices=["auto", "worker", "call"], default="auto")
    b.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    {"plan": cmd_plan, "train": cmd_train, "bench": cmd_bench}[a.cmd](a)


if __name__ == "__main__":
    main()
