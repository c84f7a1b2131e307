"""Sharded data parallelism: PyTorch's FSDP2 (`fully_shard`) with qsync's
quantized collectives where FSDP2 lets them in.

    spec = qsync.fsdp.ShardSpec(stage="FULL_SHARD", allgather="qwz",
                                reduce_scatter="qgz-int8", local_batches=[6, 6, 10, 10])
    sharded = qsync.fsdp.shard_model(model, spec)   # after init_process_group
    loss = model(x_local).mean()                     # each rank's own local-batch mean
    loss.backward()                                  # gradients: the global-batch mean
    opt.step()

What the installed FSDP2 offers (torch 2.15,
`torch/distributed/fsdp/_fully_shard/`): `FSDPModule.set_custom_all_gather
(AllGather)` and `set_custom_reduce_scatter(ReduceScatter)` replace the
collective of one FSDP unit's parameter group. An `AllGather` is called as
`comm(output_tensor, input_tensor, group, async_op)` on one flat buffer
(this rank's padded shards of every parameter of the unit, concatenated, at
`param_dtype`; `input_tensor` is this rank's slice of `output_tensor`); a
`ReduceScatter` as `comm(output_tensor, input_tensor, group, op, async_op)`
with the unit's flat gradients in rank-chunk order at `reduce_dtype`. Both
also `allocate` their buffers. So qwZ and qgZ both fit:

- **qwZ** (`allgather="qwz"`): this rank's flat shard is block-quantized to
  int8 (symmetric, one f32 scale per group of `group` = 512 values from the
  shard's first element, round-to-nearest-even, the runtime's block layout
  `[scales f32 × ⌈m/G⌉][codes]`), the blocks are all-gathered and every
  rank dequantizes every block, its own included, into the unsharded
  parameters (16-bit `param_dtype`: the dequantized f32 rounded once). The
  all-gather of hpZ's intra-node secondary shards (`hpz`, FSDP2's
  `reshard_after_forward=int`) moves the forward's dequantized values raw,
  so backward sees the forward's weights bit for bit.
- **qgZ** (`reduce_scatter="qgz-int8"|"qgz-int4"`): each rank chunk of the
  flat gradient is quantized from the chunk's start (int8, or int4 packed
  low nibble first) and sent to its owner by one all-to-all; the owner sums
  the `P` dequantized blocks in f32 in rank order, each term one fused
  multiply-add rounded once (the runtime's `dequant_accumulate`).

Rank weighting: each rank's gradient is multiplied by its `local_batch /
global_batch` before the reduction, which is a sum, so ranks training on
different local batches, each on its own mean loss, produce the gradient of
the global-batch mean. With native HSDP the replicate all-reduce is a sum
as well. The weight is applied in qsync's reduce-scatter comm, which is
installed on every unit whenever weights or qgZ are asked for.

Everything here runs inside torch.distributed (gloo on CPU): the bytes are
the runtime's blocks, the arithmetic is torch's, so every rank decodes the
same bytes with the same operations and ends bitwise identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import torch
import torch.distributed as dist
import torch.nn as nn

STAGES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD")
ALLGATHERS = (None, "qwz")
REDUCE_SCATTERS = (None, "qgz-int8", "qgz-int4")
_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


class ShardSpecError(ValueError):
    """A sharding spec that cannot be applied: names the field and why."""


def _dtype(name, value):
    if value is None or isinstance(value, torch.dtype):
        if isinstance(value, torch.dtype) and value not in _DTYPES.values():
            raise ShardSpecError(f"{name}: {value} is not a floating training dtype (fp32, bf16, fp16)")
        return value
    if isinstance(value, str) and value.lower() in _DTYPES:
        return _DTYPES[value.lower()]
    raise ShardSpecError(f"{name}: {value!r} is not one of fp32, bf16, fp16 (or a torch dtype)")


@dataclass(frozen=True)
class ShardSpec:
    """How to shard a model (the fields a plan manifest's sharding entry maps
    onto; see docs/python.md).

    - `stage`: FULL_SHARD (ZeRO-3: parameters resharded after forward),
      SHARD_GRAD_OP (ZeRO-2: kept unsharded from forward to backward),
      HYBRID_SHARD (FULL_SHARD inside each of `nodes` nodes, replicas across
      them: a 2-D mesh `(replicate=nodes, shard=world/nodes)`).
    - `reshard_after_forward`: None takes the stage's; a contradiction of the
      stage is an error.
    - `param_dtype` / `reduce_dtype`: FSDP2's MixedPrecisionPolicy (the
      unsharded parameters' and the gradient reduction's dtypes; None keeps
      the parameters').
    - `allgather`: "qwz" or None; `reduce_scatter`: "qgz-int8", "qgz-int4"
      or None.
    - `hpz`: ZeRO++'s secondary shard inside a node: after forward the
      parameters are resharded over the node's ranks only, so backward's
      all-gather stays inside the node (True: `world / nodes` ranks per
      node; an int names the ranks per node).
    - `local_batches`: every rank's local batch, in rank order (None: equal).
    - `nodes`: how many nodes the ranks make (rank-major, equal sizes).
    - `group`: elements per quantization block (one f32 scale each).
    - `units`: the qualified names of the submodules to wrap, in order (a
      plan's units, `from_manifest`; an entry None is a planned unit no
      module carries). None: every element of every `nn.ModuleList`.
    """

    stage: str = "FULL_SHARD"
    reshard_after_forward: bool | None = None
    param_dtype: object = None
    reduce_dtype: object = None
    allgather: str | None = None
    reduce_scatter: str | None = None
    hpz: bool | int = False
    local_batches: tuple[int, ...] | None = None
    nodes: int = 1
    group: int = 512
    units: tuple[str | None, ...] | None = None

    @classmethod
    def from_dict(cls, d):
        """A spec from a dict (a manifest entry); unknown keys are errors."""
        if not isinstance(d, dict):
            raise ShardSpecError(f"a sharding spec is a dict, not {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ShardSpecError(f"unknown sharding field(s) {', '.join(unknown)} (known: {', '.join(sorted(names))})")
        d = dict(d)
        for k in ("local_batches", "units"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        return cls(**d)

    @classmethod
    def from_manifest(cls, manifest, rank_types, nodes=1, group=512):
        """The spec a `qsync-plan/4` manifest's `sharding` entry describes,
        for a job whose rank r runs device type `rank_types[r]` (the plan's
        `device_for_rank` order); `nodes`: how many nodes the ranks make.

        `fsdp_strategy` → `stage`; `hpz`; per device type
        `all_gather.precision` (`qwz-int8` → `allgather="qwz"`, a float →
        `param_dtype`) and `reduce_scatter_precision` (`qgz-int8`/`qgz-int4`
        → `reduce_scatter`, a float → `reduce_dtype`), which must agree
        across the job's types, since every rank of a collective moves the
        same format; each rank's `local_batch`; `units`: the `module` of
        every planned unit with parameters that is not a root unit (the
        root's parameters are the root FSDP module's), in plan order — a
        manifest whose units name no modules (written before they did)
        leaves `units` None. `uneven_shares` has no FSDP2 counterpart (it
        shards evenly): it is an error, not ignored."""
        if not isinstance(manifest, dict):
            raise ShardSpecError(f"manifest: a dict (manifest.json), not {type(manifest).__name__}")
        sh = manifest.get("sharding")
        if not isinstance(sh, dict):
            raise ShardSpecError("manifest: no `sharding` entry: the plan is data-parallel (train it with the DDP hook)")
        strategy = sh.get("fsdp_strategy")
        if strategy == "NO_SHARD":
            raise ShardSpecError("manifest: sharding.fsdp_strategy is NO_SHARD: the plan is data-parallel (train it "
                                 "with the DDP hook)")
        if strategy not in STAGES:
            raise ShardSpecError(f"sharding.fsdp_strategy: {strategy!r} is not one of {', '.join(STAGES)}")
        if sh.get("uneven_shares"):
            raise ShardSpecError("sharding.uneven_shares: FSDP2 shards every parameter evenly; re-plan without "
                                 "uneven shares")
        per, devices = sh.get("devices"), manifest.get("devices")
        if not isinstance(per, dict) or not isinstance(devices, dict):
            raise ShardSpecError("manifest: `devices` and `sharding.devices` must both be objects")
        if not isinstance(rank_types, (list, tuple)) or not rank_types:
            raise ShardSpecError("rank_types: every rank's device type, in rank order (a non-empty list)")
        for t in rank_types:
            if t not in per or t not in devices:
                raise ShardSpecError(f"rank_types: {t!r} is not a device type of the plan ({', '.join(sorted(per))})")
        try:
            gathers = {per[t]["all_gather"]["precision"] for t in rank_types}
            reduces = {per[t]["reduce_scatter_precision"] for t in rank_types}
            local = tuple(int(devices[t]["local_batch"]) for t in rank_types)
        except (KeyError, TypeError, ValueError) as e:
            raise ShardSpecError(f"manifest: a device type's sharding entry lacks {e}") from None
        if len(gathers) != 1 or len(reduces) != 1:
            raise ShardSpecError(f"sharding.devices: the job's device types gather {sorted(map(str, gathers))} and "
                                 f"reduce-scatter {sorted(map(str, reduces))}; one FSDP2 collective needs one format")
        g, r = gathers.pop(), reduces.pop()
        planned = sh.get("units")
        if not isinstance(planned, list) or not all(isinstance(u, dict) for u in planned):
            raise ShardSpecError("sharding.units: a list of unit objects")
        units = None
        if any("kind" in u for u in planned):
            try:
                units = tuple(u.get("module") for u in planned if u["kind"] != "root" and int(u["parameters"]) > 0)
            except (KeyError, TypeError, ValueError) as e:
                raise ShardSpecError(f"sharding.units: a unit lacks {e}") from None
        return cls(stage=strategy,
                   param_dtype=None if g == "qwz-int8" else g,
                   allgather="qwz" if g == "qwz-int8" else None,
                   reduce_dtype=None if r in ("qgz-int8", "qgz-int4") else r,
                   reduce_scatter=r if r in ("qgz-int8", "qgz-int4") else None,
                   hpz=bool(sh.get("hpz")), local_batches=local, nodes=nodes, group=group, units=units)

    def resolved(self, world: int) -> "_Resolved":
        """Checks the spec against a world of `world` ranks."""
        stage = self.stage.upper() if isinstance(self.stage, str) else self.stage
        if stage not in STAGES:
            raise ShardSpecError(f"stage: {self.stage!r} is not one of {', '.join(STAGES)}")
        if self.allgather not in ALLGATHERS:
            raise ShardSpecError(f"allgather: {self.allgather!r} is not \"qwz\" or None")
        if self.reduce_scatter not in REDUCE_SCATTERS:
            raise ShardSpecError(f"reduce_scatter: {self.reduce_scatter!r} is not \"qgz-int8\", \"qgz-int4\" or None")
        param_dtype = _dtype("param_dtype", self.param_dtype)
        reduce_dtype = _dtype("reduce_dtype", self.reduce_dtype)
        if not isinstance(self.group, int) or isinstance(self.group, bool) or self.group < 1:
            raise ShardSpecError(f"group: {self.group!r} is not a positive number of elements")
        if not isinstance(self.nodes, int) or isinstance(self.nodes, bool) or self.nodes < 1:
            raise ShardSpecError(f"nodes: {self.nodes!r} is not a positive count")
        if world % self.nodes:
            raise ShardSpecError(f"nodes: {self.nodes} nodes of equal size cannot hold {world} ranks")
        per_node = world // self.nodes
        if stage == "HYBRID_SHARD":
            if self.nodes < 2:
                raise ShardSpecError(f"stage HYBRID_SHARD replicates across nodes: nodes is {self.nodes}, needs at least 2")
            if per_node < 2:
                raise ShardSpecError(f"stage HYBRID_SHARD shards inside a node: {self.nodes} nodes of {world} ranks "
                                     "leave 1 rank per node (use FULL_SHARD)")
        shard_size = per_node if stage == "HYBRID_SHARD" else world
        if world < 2:
            raise ShardSpecError(f"sharding needs at least 2 ranks, this job has {world}")
        default_raf = stage != "SHARD_GRAD_OP"
        raf = default_raf if self.reshard_after_forward is None else self.reshard_after_forward
        if not isinstance(raf, bool):
            raise ShardSpecError(f"reshard_after_forward: {raf!r} is not a bool (use hpz for a node-sized reshard)")
        if stage == "SHARD_GRAD_OP" and raf:
            raise ShardSpecError("reshard_after_forward: True contradicts stage SHARD_GRAD_OP (parameters kept "
                                 "unsharded from forward to backward; use FULL_SHARD)")
        hpz = self.hpz
        if hpz is not False and hpz is not None:
            if not raf:
                raise ShardSpecError(f"hpz: a secondary shard replaces the reshard after forward, which stage {stage} "
                                     "without reshard_after_forward does not do")
            if hpz is True:
                if stage == "HYBRID_SHARD" or self.nodes < 2:
                    raise ShardSpecError(f"hpz: True shards over a node's {per_node} ranks, which is the whole shard "
                                         f"group of {shard_size} ranks here (name nodes ≥ 2 with FULL_SHARD)")
                hpz = per_node
            if not isinstance(hpz, int) or hpz < 2 or hpz >= shard_size or shard_size % hpz:
                raise ShardSpecError(f"hpz: {self.hpz!r} ranks per secondary shard must be a divisor of the shard "
                                     f"group's {shard_size} ranks, between 2 and {shard_size - 1}")
            raf = hpz
        lb = self.local_batches
        if lb is not None:
            lb = tuple(lb)
            if len(lb) != world:
                raise ShardSpecError(f"local_batches: names {len(lb)} ranks, this job has {world}")
            for r, b in enumerate(lb):
                if not isinstance(b, int) or isinstance(b, bool) or b < 1:
                    raise ShardSpecError(f"local_batches: rank {r} has local batch {b!r}, needs a positive integer")
        return _Resolved(stage, raf, param_dtype, reduce_dtype, self.allgather, self.reduce_scatter, lb,
                         self.nodes, per_node, shard_size, self.group)


@dataclass(frozen=True)
class _Resolved:
    stage: str
    reshard_after_forward: bool | int
    param_dtype: torch.dtype | None
    reduce_dtype: torch.dtype | None
    allgather: str | None
    reduce_scatter: str | None
    local_batches: tuple[int, ...] | None
    nodes: int
    per_node: int
    shard_size: int
    group: int


# ---- the runtime's block format, in torch ---------------------------------

_QMAX = {8: 127, 4: 7}


def block_len(m: int, bits: int, group: int) -> int:
    """Bytes of the block of `m` elements: `4·⌈m/G⌉` scale bytes, then `m`
    int8 codes or `⌈m/2⌉` int4 bytes (the runtime's `block_len`)."""
    return 4 * math.ceil(m / group) + (m if bits == 8 else (m + 1) // 2)


def encode(x: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """The runtime's quantized block of the 1-D f32 tensor `x` (uint8).

    Per group of `group` values from `x[0]`: scale `s = absmax / qmax` in
    f32 (1 where that is 0 or not finite), codes `clamp(round_half_even(x ·
    (1/s)), −qmax, qmax)`; a group holding a NaN or an infinity carries a
    NaN scale (its codes do not matter).
    """
    qmax = _QMAX[bits]
    x = x.reshape(-1).to(torch.float32)
    m = x.numel()
    ng = math.ceil(m / group)
    xp = torch.nn.functional.pad(x, (0, ng * group - m)).view(ng, group)
    finite = torch.isfinite(xp).all(dim=1)
    amax = torch.where(torch.isfinite(xp), xp, torch.zeros_like(xp)).abs().amax(dim=1)
    s = amax / qmax
    s = torch.where((s > 0) & (s < math.inf), s, torch.ones_like(s))
    inv = 1.0 / s
    t = torch.round(xp * inv[:, None])
    t = torch.nan_to_num(t, nan=0.0).clamp(-qmax, qmax).to(torch.int8).reshape(-1)[:m]
    scales = torch.where(finite, s, torch.full_like(s, math.nan))
    if bits == 8:
        codes = t.view(torch.uint8)
    else:
        n = t.to(torch.int16) & 0xF
        if m % 2:
            n = torch.nn.functional.pad(n, (0, 1))
        n = n.view(-1, 2)
        codes = (n[:, 0] | (n[:, 1] << 4)).to(torch.uint8)
    # The scales' bytes in memory order: little-endian, the runtime's
    # `to_le_bytes`, on every platform torch runs on.
    return torch.cat([scales.view(torch.uint8), codes])


def _decode_parts(block: torch.Tensor, m: int, bits: int, group: int):
    """(codes as f32, the scale of each element) of one block of `m` elements."""
    ng = math.ceil(m / group)
    if block.numel() != block_len(m, bits, group):
        raise ValueError(f"a block of {m} elements has {block_len(m, bits, group)} bytes, got {block.numel()}")
    scales = block[: 4 * ng].clone().view(torch.float32)
    raw = block[4 * ng:]
    if bits == 8:
        codes = raw.view(torch.int8).to(torch.float32)
    else:
        lo = (raw & 0xF).to(torch.int16)
        hi = (raw >> 4).to(torch.int16)
        both = torch.stack([lo, hi], dim=1).reshape(-1)[:m]
        codes = torch.where(both >= 8, both - 16, both).to(torch.float32)
    per_elem = scales.repeat_interleave(group)[:m]
    return codes, per_elem


def decode(block: torch.Tensor, m: int, bits: int, group: int) -> torch.Tensor:
    """The `m` f32 values a block stands for (`code · scale`, one rounding)."""
    codes, s = _decode_parts(block, m, bits, group)
    return codes * s


def fma_f32(c: torch.Tensor, s: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """`c·s + acc` rounded once to f32 (the runtime's `mul_add`), element-wise.

    `c·s` is exact in f64 (an 8-bit integer times a 24-bit significand); the
    f64 sum's own rounding error comes from TwoSum, and a sum that is not
    exact is moved to the neighbour with an odd last bit ("round to odd"),
    after which rounding to f32 (29 bits fewer) is the single correct
    rounding of the exact value.
    """
    p = c.to(torch.float64) * s.to(torch.float64)
    a = acc.to(torch.float64)
    v = a + p
    bv = v - a
    err = (a - (v - bv)) + (p - bv)
    even = (v.view(torch.int64) & 1) == 0
    fix = (err != 0) & even & torch.isfinite(v)
    toward = torch.where(err > 0, torch.full_like(v, math.inf), torch.full_like(v, -math.inf))
    v = torch.where(fix, torch.nextafter(v, toward), v)
    return v.to(torch.float32)


# ---- the comms FSDP2 calls -------------------------------------------------

try:  # the interfaces `set_custom_all_gather` / `set_custom_reduce_scatter` take
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGather
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatter
except ImportError:  # an older torch: `shard_model` says so when asked for them
    _AllGather = _ReduceScatter = object


class _Stats:
    def __init__(self):
        self.calls = 0
        self.sent = 0       # bytes this rank sent
        self.baseline = 0   # bytes the unquantized collective would send
        self.raw_calls = 0  # calls that moved the unquantized bytes


class QwzAllGather(_AllGather):
    """qwZ: the all-gather of int8 blocks of every rank's flat shard,
    dequantized on arrival (FSDP2's `AllGather`)."""

    def __init__(self, *, shard_size: int, group: int = 512):
        self.shard_size = shard_size
        self.group = group
        self.stats = _Stats()

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        world = dist.get_world_size(group)
        m = input_tensor.numel()
        st = self.stats
        st.calls += 1
        st.baseline += (world - 1) * m * input_tensor.element_size()
        # Mixed-dtype units gather raw bytes (uint8), and hpZ's intra-node
        # gather moves the forward's already-dequantized values: both raw.
        if output_tensor.dtype == torch.uint8 or world != self.shard_size:
            st.raw_calls += 1
            st.sent += (world - 1) * m * input_tensor.element_size()
            return dist.all_gather_into_tensor(output_tensor, input_tensor.clone(), group=group, async_op=async_op)
        block = encode(input_tensor, 8, self.group)
        blocks = torch.empty(world * block.numel(), dtype=torch.uint8, device=block.device)
        dist.all_gather_into_tensor(blocks, block, group=group)
        st.sent += (world - 1) * block.numel()
        out = output_tensor.view(world, m)
        for r, b in enumerate(blocks.view(world, -1)):
            out[r].copy_(decode(b, m, 8, self.group))  # 16-bit: one round to nearest even
        return None


class QsyncReduceScatter(_ReduceScatter):
    """The reduce-scatter of one FSDP unit: this rank's gradient weighted by
    `weight`, then summed — exactly by gloo (`bits=None`), or as qgZ int8 /
    int4 blocks by one all-to-all, summed by the owner in f32 in rank order."""

    def __init__(self, *, weight: float, bits: int | None = None, group: int = 512):
        self.weight = float(weight)
        self.bits = bits
        self.group = group
        self.stats = _Stats()

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        world = dist.get_world_size(group)
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            raise RuntimeError(f"qsync's reduce-scatter sums (or averages); FSDP asked for {op}")
        n = output_tensor.numel()
        st = self.stats
        st.calls += 1
        st.baseline += (world - 1) * n * input_tensor.element_size()
        x = input_tensor.to(torch.float32)
        if self.weight != 1.0:
            x = x * self.weight
        if self.bits is None:
            st.sent += (world - 1) * n * input_tensor.element_size()
            out = torch.empty(n, dtype=input_tensor.dtype, device=input_tensor.device)
            dist.reduce_scatter_tensor(out, x.to(input_tensor.dtype), op=dist.ReduceOp.SUM, group=group)
            acc = out.to(torch.float32)
        else:
            chunks = x.view(world, n)
            send = torch.stack([encode(chunks[j], self.bits, self.group) for j in range(world)])
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send, group=group)
            st.sent += (world - 1) * send.shape[1]
            acc = torch.zeros(n, dtype=torch.float32, device=x.device)
            for j in range(world):
                c, s = _decode_parts(recv[j], n, self.bits, self.group)
                acc = fma_f32(c, s, acc)
        if op == dist.ReduceOp.AVG:
            acc = acc / world
        output_tensor.copy_(acc)
        return None


# ---- applying a spec -------------------------------------------------------


@dataclass
class ShardedModel:
    """What `shard_model` did: the mesh, the FSDP units (root last), this
    rank's gradient weight and the comms it installed."""

    module: nn.Module
    spec: ShardSpec
    mesh: object
    units: list = field(default_factory=list)
    weight: float = 1.0
    allgathers: list = field(default_factory=list)
    reduce_scatters: list = field(default_factory=list)

    def wire_bytes(self):
        """(bytes this rank sent, bytes the unquantized collectives would
        have sent) over every call so far, all-gather and reduce-scatter."""
        comms = self.allgathers + self.reduce_scatters
        return sum(c.stats.sent for c in comms), sum(c.stats.baseline for c in comms)


def plan_units(model: nn.Module, spec) -> list:
    """The submodules of `model` that `shard_model(model, spec)` wraps
    before the root: the spec's `units` by qualified name (a plan's), else
    every element of every `nn.ModuleList`. A planned unit the model lacks
    is a `ShardSpecError` naming the first missing and how many are: a
    partial wrap would shard differently from the plan."""
    if isinstance(spec, dict):
        spec = ShardSpec.from_dict(spec)
    if spec.units is None:
        return [m for m in model.modules() if isinstance(m, nn.ModuleList) for m in m]
    if isinstance(spec.units, str) or not all(u is None or isinstance(u, str) for u in spec.units):
        raise ShardSpecError(f"units: {spec.units!r} is not a list of qualified module names")
    unnamed = [i for i, u in enumerate(spec.units) if u is None]
    if unnamed:
        raise ShardSpecError(f"units: {len(unnamed)} of the plan's {len(spec.units)} units (the first: unit "
                             f"{unnamed[0]}) name no module (a graph without repeated blocks is cut by parameter "
                             "count); pass units= to shard_model")
    named = dict(model.named_modules())
    missing = [u for u in spec.units if u not in named or u == ""]
    if missing:
        raise ShardSpecError(f"units: the model has no submodule {missing[0]!r}, a unit of the plan; "
                             f"{len(missing)} of the plan's {len(spec.units)} units are missing (is it the "
                             "model the plan was made from?)")
    return [named[u] for u in spec.units]


def _units(model: nn.Module, spec, units):
    if units is None:
        return plan_units(model, spec)
    named = dict(model.named_modules())
    out = []
    for u in units:
        if isinstance(u, nn.Module):
            if not any(u is m for m in named.values()):
                raise ShardSpecError(f"units: a {type(u).__name__} that is not a submodule of the model")
            out.append(u)
        elif isinstance(u, str):
            if u not in named or u == "":
                raise ShardSpecError(f"units: the model has no submodule {u!r}")
            out.append(named[u])
        else:
            raise ShardSpecError(f"units: {u!r} is neither a submodule nor its qualified name")
    return out


def shard_model(model: nn.Module, spec, *, units=None, device_type: str | None = None) -> ShardedModel:
    """Applies FSDP2 to `model` per `spec` (a `ShardSpec` or its dict):
    `fully_shard` on each unit, then on the root. `units` (submodules or
    their qualified names) overrides the spec's; None takes `spec.units`
    (a plan's: exactly its units, a missing one an error, see
    `plan_units`), or, where the spec names none, every element of every
    `nn.ModuleList` (a transformer's blocks). Needs torch.distributed initialized; every rank calls
    it with the same spec. Raises `ShardSpecError` for a bad spec."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        raise RuntimeError("qsync.fsdp.shard_model needs torch.distributed to be initialized (init_process_group)")
    if isinstance(spec, dict):
        spec = ShardSpec.from_dict(spec)
    if not isinstance(spec, ShardSpec):
        raise ShardSpecError(f"spec: a ShardSpec or a dict, not {type(spec).__name__}")
    world, rank = dist.get_world_size(), dist.get_rank()
    rs = spec.resolved(world)
    unit_modules = _units(model, spec, units)
    if device_type is None:
        p = next(model.parameters(), None)
        device_type = p.device.type if p is not None else "cpu"
    if rs.stage == "HYBRID_SHARD":
        mesh = init_device_mesh(device_type, (rs.nodes, rs.per_node), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    mp = MixedPrecisionPolicy(param_dtype=rs.param_dtype, reduce_dtype=rs.reduce_dtype)
    if rs.local_batches is not None:
        weight = rs.local_batches[rank] / sum(rs.local_batches)
    else:
        weight = 1.0 / world
    out = ShardedModel(module=model, spec=spec, mesh=mesh, weight=weight)
    bits = {None: None, "qgz-int8": 8, "qgz-int4": 4}[rs.reduce_scatter]
    custom_rs = rs.local_batches is not None or bits is not None
    for i, m in enumerate(unit_modules + [model]):
        # The root keeps its parameters after forward (FSDP2's own default
        # for the root: backward starts with them).
        raf = rs.reshard_after_forward if m is not model else False
        fully_shard(m, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
        if rs.allgather == "qwz" and (_AllGather is object or not hasattr(m, "set_custom_all_gather")):
            raise ShardSpecError(f"allgather: qwz needs FSDP2's set_custom_all_gather, which torch {torch.__version__} lacks")
        if custom_rs and (_ReduceScatter is object or not hasattr(m, "set_custom_reduce_scatter")):
            raise ShardSpecError("reduce_scatter / local_batches: need FSDP2's set_custom_reduce_scatter, which "
                                 f"torch {torch.__version__} lacks")
        # Sums: qsync's comms sum, and a divide factor other than the group
        # size makes FSDP ask for PREMUL_SUM, which gloo refuses.
        m.set_force_sum_reduction_for_comms(True)
        if rs.allgather == "qwz":
            ag = QwzAllGather(shard_size=rs.shard_size, group=rs.group)
            m.set_custom_all_gather(ag)
            out.allgathers.append(ag)
        if custom_rs:
            # The weights already make the sum the global mean.
            m.set_gradient_divide_factor(1.0)
            comm = QsyncReduceScatter(weight=weight, bits=bits, group=rs.group)
            m.set_custom_reduce_scatter(comm)
            out.reduce_scatters.append(comm)
        out.units.append(m)
    return out
