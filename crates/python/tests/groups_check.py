"""Process groups of the qsync package under torchrun (CPU, gloo).

    torchrun --standalone --nproc-per-node 3 groups_check.py threads
    torchrun --nnodes 2 --node-rank R --nproc-per-node {2|1} ... groups_check.py uneven

`threads`: a `TorchTransport` split with one color is a new group, and two
Python threads synchronizing forked `GradSync` siblings at the same time
(each its own buffer, in opposite orders on different ranks) get the exact
results, as if each ran alone: the siblings' traffic never meets.

`threads` also checks the transport's all-gather: gloo's ring and the flat
form (an all-to-all, what a group of 2 uses) give every rank the same
blocks in rank order, on the group of every rank and on a pair.

`uneven`: two torchrun agents of 2 and 1 ranks (nodes of different sizes).
`comm_hook` with a hierarchical scheme takes the node of every rank from the
launcher ([0, 0, 1], not `rank / (world / nodes)`), DDP replicas stay
bitwise identical and track plain FP32 DDP (every rank takes the same form
of the transport's all-gather, though its node's size differs); the node map of a plan follows
its device types (`a100:4,t4:8` is a node of 4 and a node of 8).

Prints `OK <mode>` on every rank that passed; any failure raises.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading

import numpy as np
import torch
import torch.distributed as dist

import qsync
from qsync import _native
from qsync._transport import TorchTransport
from qsync.hook import plan_node_map


def digest(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def same_on_every_rank(value, what):
    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, value)
    assert all(g == got[0] for g in got), f"{what} differs across ranks: {got}"


def threads():
    rank, world = dist.get_rank(), dist.get_world_size()
    t = TorchTransport()
    d = t.split(0, rank, 30.0)
    assert d is not t and d.group is not t.group, "split with one color must give a new group"
    assert d.members == t.members and d.size == world and d.rank == rank
    # The event-loop threads of the groups qsync makes take the policy
    # `loop_policy` names (`batch`: no preemption on wake-up); those of the
    # default group (DDP's, made by init_process_group) stay as gloo starts
    # them.
    from qsync._transport import _gloo_loop_tids, loop_policy

    ours = set(t.loop_threads) | set(d.loop_threads)
    assert t.loop_threads and d.loop_threads, (t.loop_threads, d.loop_threads)
    want = {"batch": os.SCHED_BATCH, "default": os.SCHED_OTHER}[loop_policy()]
    assert all(os.sched_getscheduler(tid) == want for tid in ours), (loop_policy(), ours)
    theirs = _gloo_loop_tids() - ours
    assert theirs and all(os.sched_getscheduler(tid) == os.SCHED_OTHER for tid in theirs), theirs
    # `auto` by layout: batch where each of a node's ranks has a core.
    saved = {k: os.environ.get(k) for k in ("QSYNC_GLOO_LOOP", "LOCAL_WORLD_SIZE")}
    try:
        os.environ.pop("QSYNC_GLOO_LOOP", None)
        os.environ["LOCAL_WORLD_SIZE"] = "1"
        assert loop_policy() == "batch"
        os.environ["LOCAL_WORLD_SIZE"] = str(len(os.sched_getaffinity(0)) + 1)
        assert loop_policy() == "default"
        os.environ["QSYNC_GLOO_LOOP"] = "batch"
        assert loop_policy() == "batch"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    for scheme in ["fp32", "qgz-int8"]:
        base = _native.GradSync(TorchTransport(), scheme, group=64, timeout_s=60.0)
        sib = base.fork()
        n, steps = 20_000, 12
        results = {}
        errors = []

        # Thread `which` synchronizes buffers of value (rank + 1) * c: the
        # exact mean is c * (world + 1) / 2.
        def run(which, sync, c):
            try:
                outs = []
                for k in range(steps):
                    x = np.full(n, float((rank + 1) * (c + k)), dtype=np.float32)
                    sync.all_reduce_mean(x)
                    outs.append(x.copy())
                results[which] = outs
            except BaseException as e:  # reported below
                errors.append(f"{which}: {e!r}")

        a = threading.Thread(target=run, args=("a", base, 1))
        b = threading.Thread(target=run, args=("b", sib, 1000))
        # Opposite start orders on alternate ranks: shared traffic would pair
        # one thread's collective with the other's.
        order = [a, b] if rank % 2 == 0 else [b, a]
        for th in order:
            th.start()
        for th in order:
            th.join(120)
        assert not errors, f"{scheme}: {errors}"
        for which, c in [("a", 1), ("b", 1000)]:
            for k, x in enumerate(results[which]):
                exact = (c + k) * (world + 1) / 2
                err = float(np.max(np.abs(x.astype(np.float64) - exact)))
                tol = 0.0 if scheme == "fp32" else 0.02 * abs(exact)
                assert err <= tol, f"{scheme} thread {which} step {k}: error {err} vs exact {exact} (tol {tol})"
            same_on_every_rank(digest(np.stack(results[which])), f"{scheme} thread {which}")
    gathers(t)
    exchanges(t)
    print(f"OK threads rank {rank}", flush=True)


def gathers(t):
    """`TorchTransport.all_gather` in both forms and as measured, on `t` and
    on a pair, with equal blocks and with uneven ones (some empty; gloo's
    ring pads them), into a `bytearray` and into a `memoryview` of part of
    one."""
    rank = dist.get_rank()
    pair = t.split(min(rank, 1), rank, 30.0)  # {0} and {1, 2}: every rank calls split
    # One torchrun agent of 3 ranks: only the pair {1, 2} gathers flat.
    for tr, flat_by_layout in ((t, False), (pair, rank != 0)):
        assert tr._gathers_flat() == flat_by_layout, (tr.members, tr._gathers_flat())
        # Where the layout does not settle it, the form may be measured.
        tr.measure_gather = True
        assert tr._gathers_flat() == (True if flat_by_layout else None), (tr.members, tr._gathers_flat())
        for flat in (None, True, False):
            tr.flat_gather = flat
            for n in (1, 9, 70_001, None):
                # `None`: rank r sends (r * 5003) % 7001 bytes (rank 0 none).
                count = (lambda r: n) if n is not None else (lambda r: (r * 5003) % 7001)
                counts = [count(m) for m in tr.members]
                block = lambda r: bytes((r * 37 + i) % 251 for i in range(count(r)))
                whole = bytearray(sum(counts) + 3)
                recv = memoryview(whole)[1 : 1 + sum(counts)]
                tr.all_gather(bytearray(block(tr.members[tr.rank])), recv, counts, 30.0)
                want = b"".join(block(m) for m in tr.members)
                assert bytes(recv) == want, f"all_gather of {counts} bytes over {tr.members}, flat_gather={flat}"
                assert whole[0] == 0 and whole[-2:] == b"\0\0", "all_gather wrote outside its buffer"
        tr.flat_gather = None
    # `t`'s forms were measured, one a size class (1, 9, 70 001 and up to
    # 7 000 bytes: 1, 4, 17 and 13 bits), and every rank kept the same.
    assert sorted(t.gather_forms) == [1, 4, 13, 17], t.gather_forms
    same_on_every_rank(sorted(t.gather_forms.items()), "the all-gather forms kept")
    for bad, why in ((bytes(3 * t.size), "must be a bytearray or a writable memoryview"),
                     (bytearray(3 * t.size + 1), "a result buffer of")):
        try:
            t.all_gather(bytearray(3), bad, [3] * t.size, 30.0)
        except (TypeError, ValueError) as e:
            assert why in str(e), e
        else:
            raise AssertionError(f"all_gather into {type(bad).__name__} of {len(bad)} bytes went unnoticed")


def exchanges(t):
    """`TorchTransport.all_to_all_v` with blocks of different sizes, some
    empty (neither sent nor received), repeated on the same transport; a
    rank that sends itself a block of another size than it expects is
    refused before anything moves."""
    rank, p = t.rank, t.size

    def size(src, dst, k):  # bytes `src` sends `dst` in round `k`
        return 0 if (src + 2 * dst + k) % 4 == 0 else ((src * 7 + dst * 13 + k * 5) % 9) * 4099 + 1

    def block(src, dst, k):
        return bytes((src * 31 + dst * 7 + k + i) % 251 for i in range(size(src, dst, k)))

    for k in range(4):
        send = bytearray(b"".join(block(rank, j, k) for j in range(p)))
        recv = bytearray(sum(size(j, rank, k) for j in range(p)))
        t.all_to_all_v(send, [size(rank, j, k) for j in range(p)], recv, [size(j, rank, k) for j in range(p)], 30.0)
        want = b"".join(block(j, rank, k) for j in range(p))
        assert bytes(recv) == want, f"all_to_all_v round {k} on rank {rank}"
    wrong = [1] * p
    wrong[rank] = 2  # every rank: refused before any receive is posted
    try:
        t.all_to_all_v(bytearray(p), [1] * p, bytearray(p + 1), wrong, 30.0)
    except ValueError as e:
        assert "sends itself 1 bytes but expects 2" in str(e), e
    else:
        raise AssertionError("a self block of the wrong size went unnoticed")
    dist.barrier()


class _Plan:
    def __init__(self, targets):
        self.targets = targets


def uneven():
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 3, world
    # The plan's types, each on its own nodes.
    assert plan_node_map(_Plan([{"device": "a100", "count": 4}, {"device": "t4", "count": 8}])) == [0] * 4 + [1] * 8
    assert plan_node_map(
        _Plan([{"device": "v100", "count": 16, "per_node": 8}, {"device": "t4", "count": 4}])
    ) == [0] * 8 + [1] * 8 + [2] * 4

    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    model, ref = make(), make()
    ref.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)
    hook = qsync.comm_hook("qgz-int8-hier", group=64)
    assert hook.qsync.node_of == [0, 0, 1], f"node of every rank from the launcher: {hook.qsync.node_of}"
    ddp.register_comm_hook(None, hook)
    plain = torch.nn.parallel.DistributedDataParallel(ref, process_group=dist.new_group(backend="gloo"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    opt_ref = torch.optim.SGD(plain.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(4):
        x, y = torch.randn(16, 64, generator=gen), torch.randn(16, 8, generator=gen)
        for m, o in [(ddp, opt), (plain, opt_ref)]:
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
        same_on_every_rank(digest(flat), f"replica after step {step}")
        flat_ref = torch.cat([p.detach().flatten() for p in ref.parameters()]).numpy()
        diff = float(np.max(np.abs(flat - flat_ref)))
        assert diff < 2e-3, f"step {step}: hierarchical int8 drifted {diff} from FP32 DDP"
    intra, inter = hook.qsync.wire_bytes()
    # Rank 2 is alone on its node: everything it receives crosses nodes.
    if rank == 2:
        assert intra == 0 and inter > 0, (intra, inter)
    else:
        assert intra > 0 and inter > 0, (intra, inter)
    print(f"OK uneven rank {rank}", flush=True)


def main():
    mode = sys.argv[1]
    dist.init_process_group("gloo")
    try:
        {"threads": threads, "uneven": uneven}[mode]()
        dist.barrier()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
