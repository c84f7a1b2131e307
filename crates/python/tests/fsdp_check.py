"""Sharded training with `qsync.fsdp` under torchrun (CPU, gloo, 4 ranks).

    torchrun --standalone --nproc-per-node 4 crates/python/tests/fsdp_check.py

A small decoder-only transformer (2 blocks, width 32, vocabulary 64,
sequences of 16 tokens; fixed seed, tokens from a seeded generator) trains
4 steps on local batches 2/2/4/4 of one global batch of 12, once as FP32
DDP (each rank's mean loss scaled by `4 · b_r / 12`, so DDP's mean is the
global-batch mean) and once per sharding:

- FULL_SHARD, FP32 collectives: losses and gathered parameters equal DDP's
  to float tolerance (1e-5);
- FULL_SHARD with qwZ and qgZ-int8; HYBRID_SHARD over a 2-D mesh of 2
  emulated nodes × 2 ranks with qwZ + qgZ-int8; FULL_SHARD with hpZ
  (secondary shards over a node's 2 ranks) and qwZ + qgZ-int4;
  SHARD_GRAD_OP with BF16 parameters and qwZ: every step's loss within
  the stated tolerance (relative) of DDP's, and
  every rank's gathered full parameters (`full_tensor()`) bitwise identical
  after every step; the quantized collectives ran and sent fewer bytes.

Before training, the qgZ reduce-scatter (int8 and int4) is compared with
the runtime's own qgZ (`GradSync` from the wheel) bit for bit; rank 0 also
checks the block format (byte counts, the per-element error bound of
`runtime/src/shard.rs`), `fma_f32` against exact rational arithmetic, and
that bad specs raise `ShardSpecError` naming the field.

Prints `OK fsdp rank R` on every rank that passed, and one `MEASURED` line
per run on rank 0; any failure raises.
"""

from __future__ import annotations

import math
import random
import struct
import sys
import time
from fractions import Fraction

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from qsync import fsdp

VOCAB, WIDTH, HEADS, BLOCKS, SEQ = 64, 32, 2, 2, 16
LOCAL = [2, 2, 4, 4]
STEPS = 4
LR = 0.5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, WIDTH))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def model():
    torch.manual_seed(0)
    return Decoder()


def batch(step, rank):
    """This rank's slice of step `step`'s global batch: sequences that count
    up by a per-sequence stride (learnable), with seeded noise tokens."""
    g = torch.Generator().manual_seed(1000 + step)
    n = sum(LOCAL)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    noise = torch.randint(0, VOCAB, seq.shape, generator=g)
    seq = torch.where(torch.rand(seq.shape, generator=g) < 0.1, noise, seq)
    lo = sum(LOCAL[:rank])
    s = seq[lo: lo + LOCAL[rank]]
    return s[:, :-1], s[:, 1:]


def local_loss(net, step, rank):
    x, y = batch(step, rank)
    return F.cross_entropy(net(x).reshape(-1, VOCAB), y.reshape(-1))


def global_loss(loss, rank):
    """The global-batch mean loss: Σ_r (b_r / B) · loss_r."""
    t = (loss.detach() * LOCAL[rank] / sum(LOCAL)).reshape(1)
    dist.all_reduce(t)
    return t.item()


def flat_params(net):
    ps = []
    for _, p in sorted(net.named_parameters()):
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        ps.append(p.detach().to(torch.float32).reshape(-1))
    return torch.cat(ps)


def identical_on_every_rank(flat, what):
    world = dist.get_world_size()
    bits = flat.view(torch.int32)
    got = torch.empty(world * bits.numel(), dtype=torch.int32)
    dist.all_gather_into_tensor(got, bits)
    for r, other in enumerate(got.view(world, -1)):
        if not torch.equal(other, bits):
            diff = (other != bits).sum().item()
            raise AssertionError(f"{what}: rank {r}'s gathered parameters differ from rank {dist.get_rank()}'s "
                                 f"in {diff} of {bits.numel()} elements")


def train_ddp(rank):
    net = nn.parallel.DistributedDataParallel(model())
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    losses, params = [], []
    for step in range(STEPS):
        opt.zero_grad()
        loss = local_loss(net, step, rank)
        # DDP averages over the 4 ranks: 4 · b_r / B makes that Σ_r b_r/B · g_r.
        (loss * len(LOCAL) * LOCAL[rank] / sum(LOCAL)).backward()
        opt.step()
        losses.append(global_loss(loss, rank))
        params.append(flat_params(net.module))
    return losses, params


def train_sharded(rank, spec):
    net = model()
    sharded = fsdp.shard_model(net, spec)
    assert len(sharded.units) == BLOCKS + 1, f"expected {BLOCKS} blocks and the root as FSDP units"
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    losses, params = [], []
    for step in range(STEPS):
        opt.zero_grad()
        loss = local_loss(net, step, rank)
        loss.backward()
        opt.step()
        losses.append(global_loss(loss, rank))
        flat = flat_params(net)
        identical_on_every_rank(flat, f"{spec_name(spec)} step {step}")
        params.append(flat)
    return losses, params, sharded


def spec_name(spec):
    parts = [spec.stage]
    for k in ("allgather", "reduce_scatter", "param_dtype"):
        if getattr(spec, k):
            parts.append(str(getattr(spec, k)))
    if spec.hpz:
        parts.append("hpz")
    return "+".join(parts)


# ---- rank 0: the block format, fma, spec errors ---------------------------


def f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def f32_from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


def round_f32(exact: Fraction) -> float:
    """The f32 nearest `exact`, ties to the even significand (finite only)."""
    f = struct.unpack("<f", struct.pack("<f", float(exact)))[0]
    cands = [f]
    b = f32_bits(f)
    for nb in (b - 1, b + 1):
        if 0 <= nb < 2**32:
            c = f32_from_bits(nb)
            if math.isfinite(c):
                cands.append(c)
    if f == 0.0:
        cands += [f32_from_bits(1), f32_from_bits(0x80000001)]
    best = min(cands, key=lambda c: (abs(Fraction(c) - exact), f32_bits(c) & 1))
    return best


def check_fma():
    rng = random.Random(7)
    cs, ss, accs = [], [], []
    for _ in range(3000):
        c = float(rng.randint(-127, 127))
        s = f32_from_bits(rng.randrange(0x30000000, 0x42000000))
        a = f32_from_bits(rng.randrange(0, 0x42000000) | (rng.getrandbits(1) << 31))
        cs.append(c), ss.append(s), accs.append(a)
    # Double rounding's trap: c·s exactly halfway between two f32 and a tiny
    # acc that decides the direction (f64 sum alone loses it).
    half = f32_from_bits(0x3F800000)  # 1.0
    for sign in (1.0, -1.0):
        cs.append(3.0), ss.append(f32_from_bits(0x3F800001)), accs.append(sign * 1e-30)
        cs.append(1.0), ss.append(half), accs.append(sign * 2.0**-24 * (1 + 2.0**-20))
    c, s, a = (torch.tensor(v, dtype=torch.float32) for v in (cs, ss, accs))
    got = fsdp.fma_f32(c, s, a)
    for i in range(len(cs)):
        want = round_f32(Fraction(cs[i]) * Fraction(float(s[i])) + Fraction(float(a[i])))
        g = got[i].item()
        assert f32_bits(g) == f32_bits(want), f"fma_f32({cs[i]}, {float(s[i])!r}, {float(a[i])!r}) = {g!r}, exact rounding {want!r}"
    # The plain f32 expression differs on the midpoint cases: the check can fail.
    plain = (c * s + a)
    assert not torch.equal(plain.view(torch.int32), got.view(torch.int32)), "the midpoint cases must separate mul+add from fma"


def check_blocks():
    g = torch.Generator().manual_seed(3)
    G = 512
    for bits, qmax in ((8, 127), (4, 7)):
        for m in (1, 511, 512, 1000, 1537):
            x = torch.randn(m, generator=g) * torch.linspace(0.01, 3.0, m)
            block = fsdp.encode(x, bits, G)
            # Runtime's block_len: 4·⌈m/G⌉ + (m or ⌈m/2⌉).
            want = 4 * math.ceil(m / G) + (m if bits == 8 else (m + 1) // 2)
            assert block.numel() == want, f"int{bits} block of {m}: {block.numel()} bytes, runtime's {want}"
            y = fsdp.decode(block, m, bits, G).double()
            xd = x.double()
            eps = 2.0**-24
            for k in range(math.ceil(m / G)):
                sl = slice(k * G, min(m, (k + 1) * G))
                A = xd[sl].abs().max().item()
                # shard.rs, f32 out: E = q(A/qmax) + 2ε(A + A/qmax), q_b(s) = s(1/2 + 2^-10).
                bound = (A / qmax) * (0.5 + 2.0**-10) + 2 * eps * (A + A / qmax)
                err = (y[sl] - xd[sl]).abs().max().item()
                assert err <= bound, f"int{bits} m={m} group {k}: error {err} over the bound {bound}"
    # Non-finite: the whole group is NaN after decoding, the others exact-ish.
    x = torch.ones(1030)
    x[600] = math.inf
    y = fsdp.decode(fsdp.encode(x, 8, G), 1030, 8, G)
    assert torch.isnan(y[512:1024]).all() and (y[:512] == 1).all() and (y[1024:] == 1).all()


def check_against_runtime(rank, world):
    """qsync.fsdp's qgZ reduce-scatter (mean) equals the runtime's own qgZ
    (`GradSync`, one-shot, f32 gather) bit for bit: same blocks, same
    rank-order fused sums, same division by P. Gradients with a wide range
    of magnitudes, a zero group, and a shard length that is not a multiple
    of the group."""
    import numpy as np

    from qsync import _native
    from qsync._transport import TorchTransport

    n = world * 1300
    g = torch.Generator().manual_seed(11 + rank)
    x = torch.randn(n, generator=g) * torch.logspace(-6, 2, n)
    x[2000:2600] = 0.0
    for bits in (8, 4):
        comm = fsdp.QsyncReduceScatter(weight=1.0, bits=bits, group=512)
        shard = torch.empty(n // world)
        comm(shard, x.clone(), None, dist.ReduceOp.AVG)
        ours = torch.empty(n)
        dist.all_gather_into_tensor(ours, shard)
        sync = _native.GradSync(TorchTransport(), f"qgz-int{bits}", group=512, gather_f32=True)
        theirs = x.numpy().astype(np.float32).copy()
        sync.all_reduce_mean(theirs)
        theirs = torch.from_numpy(theirs)
        diff = (ours.view(torch.int32) != theirs.view(torch.int32)).sum().item()
        assert diff == 0, (f"int{bits}: qsync.fsdp's reduce-scatter differs from the runtime's qgZ in {diff} of {n} "
                           f"elements (max |d| {(ours - theirs).abs().max().item()})")


def check_errors(world):
    bad = [
        (dict(stage="ZERO3"), "stage"),
        (dict(allgather="qwz-int4"), "allgather"),
        (dict(reduce_scatter="qgz-int2"), "reduce_scatter"),
        (dict(param_dtype="int8"), "param_dtype"),
        (dict(local_batches=[2, 2, 4]), "local_batches: names 3 ranks, this job has 4"),
        (dict(local_batches=[2, 0, 4, 4]), "rank 1"),
        (dict(stage="HYBRID_SHARD"), "nodes is 1"),
        (dict(stage="HYBRID_SHARD", nodes=4), "1 rank per node"),
        (dict(nodes=3), "cannot hold 4 ranks"),
        (dict(stage="SHARD_GRAD_OP", reshard_after_forward=True), "contradicts stage SHARD_GRAD_OP"),
        (dict(stage="SHARD_GRAD_OP", hpz=True), "hpz"),
        (dict(hpz=True), "hpz: True"),
        (dict(hpz=3), "divisor"),
        (dict(group=0), "group"),
    ]
    for d, words in bad:
        try:
            fsdp.ShardSpec(**d).resolved(world)
        except fsdp.ShardSpecError as e:
            assert words in str(e), f"{d}: the error {str(e)!r} does not say {words!r}"
        else:
            raise AssertionError(f"{d} was accepted")
    try:
        fsdp.ShardSpec.from_dict({"stage": "FULL_SHARD", "qwz": True})
    except fsdp.ShardSpecError as e:
        assert "qwz" in str(e)
    else:
        raise AssertionError("an unknown field was accepted")


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == len(LOCAL), f"run with --nproc-per-node {len(LOCAL)}"
    t0 = time.perf_counter()
    if rank == 0:
        check_fma()
        check_blocks()
        check_errors(world)
        print(f"MEASURED format, fma and spec checks: {time.perf_counter() - t0:.1f} s", flush=True)
    check_against_runtime(rank, world)
    t0 = time.perf_counter()
    ref_losses, ref_params = train_ddp(rank)
    if rank == 0:
        print(f"MEASURED DDP reference: {time.perf_counter() - t0:.1f} s", flush=True)
    runs = [
        # (spec, loss tolerance relative to DDP's, parameter tolerance or None).
        # The FP32-parameter quantized runs' tolerances sit below 2.5e-3, what
        # dropping the rank weights (each rank 1/4) costs, so they catch that too.
        (fsdp.ShardSpec(stage="FULL_SHARD", local_batches=LOCAL), 1e-5, 1e-5),
        (fsdp.ShardSpec(stage="FULL_SHARD", allgather="qwz", reduce_scatter="qgz-int8", local_batches=LOCAL), 1e-3, None),
        (fsdp.ShardSpec(stage="HYBRID_SHARD", nodes=2, allgather="qwz", reduce_scatter="qgz-int8",
                        local_batches=LOCAL), 1e-3, None),
        (fsdp.ShardSpec(stage="FULL_SHARD", nodes=2, hpz=True, allgather="qwz", reduce_scatter="qgz-int4",
                        local_batches=LOCAL), 1e-3, None),
        (fsdp.ShardSpec(stage="SHARD_GRAD_OP", param_dtype="bf16", reduce_dtype="fp32", allgather="qwz",
                        local_batches=LOCAL), 5e-3, None),
    ]
    for spec, tol, ptol in runs:
        t0 = time.perf_counter()
        losses, params, sharded = train_sharded(rank, spec)
        secs = time.perf_counter() - t0
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        name = spec_name(spec)
        assert worst <= tol, f"{name}: losses {losses} vs DDP's {ref_losses}: {worst:.3g} relative, over {tol}"
        if ptol is not None:
            for step, (p, q) in enumerate(zip(params, ref_params)):
                d = (p - q).abs().max().item()
                assert d <= ptol, f"{name} step {step}: parameters differ from DDP's by {d}"
        sent, base = sharded.wire_bytes()
        quantized = spec.allgather or spec.reduce_scatter
        if quantized:
            assert 0 < sent < base, f"{name}: sent {sent} bytes against the unquantized {base}"
            for c in sharded.allgathers:
                assert c.stats.calls > 0 and c.stats.calls > c.stats.raw_calls, f"{name}: qwZ never quantized"
        if rank == 0:
            print(f"MEASURED {name}: worst loss difference {worst:.2e} relative (tolerance {tol:g}); "
                  f"bytes sent {sent} / unquantized {base} = {sent / base:.3f}; "
                  f"losses {losses[0]:.5f} -> {losses[-1]:.5f} vs DDP {ref_losses[0]:.5f} -> {ref_losses[-1]:.5f}; "
                  f"{secs:.1f} s", flush=True)
    dist.barrier()
    print(f"OK fsdp rank {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
