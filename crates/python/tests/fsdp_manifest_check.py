"""`qsync.fsdp.ShardSpec.from_manifest` on plans qsyncc wrote.

    python fsdp_manifest_check.py SHARDED_PLAN_DIR DDP_PLAN_DIR

SHARDED_PLAN_DIR holds a sharded plan of two device types, of
`gen_llama.py --layers 2`; DDP_PLAN_DIR a data-parallel one. Checks the
spec read from the manifest field by field against the manifest, that it
resolves for the job, that a qwZ / qgZ plan maps onto the quantized
collectives, and that every manifest the spec cannot honour is a
ShardSpecError naming why. Then the plan's units: a small PyTorch model
with the Llama's module names (`model.layers.N`) is sharded by
`shard_model(model, spec)` with no `units=` in two gloo processes, which
wrap exactly the plan's blocks and then the root; a model lacking a
planned block is an error naming the first missing and the count; `units=`
overrides the plan. Prints `OK fsdp manifest`.
"""
import copy
import dataclasses
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from qsync.fsdp import ShardSpec, ShardSpecError, plan_units, shard_model


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(8, 8, bias=False)
        self.mlp = nn.Linear(8, 8, bias=False)

    def forward(self, x):
        return x + self.mlp(self.q_proj(x))


class Inner(nn.Module):
    def __init__(self, layers, name="layers"):
        super().__init__()
        self.embed_tokens = nn.Embedding(16, 8)
        setattr(self, name, nn.ModuleList(Layer() for _ in range(layers)))
        self.norm = nn.LayerNorm(8)


class Llama(nn.Module):
    """Hugging Face's Llama module names, at toy widths."""

    def __init__(self, layers=2, name="layers"):
        super().__init__()
        self.model = Inner(layers, name)
        self.lm_head = nn.Linear(8, 16, bias=False)
        self.name = name

    def forward(self, idx):
        x = self.model.embed_tokens(idx)
        for layer in getattr(self.model, self.name):
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def shard_rank(rank, world, store, spec):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = Llama()
        out = shard_model(model, spec)
        names = {id(m): n for n, m in model.named_modules()}
        wrapped = [names[id(m)] for m in out.units]
        assert wrapped == list(spec.units) + [""], wrapped
        model(torch.arange(4).view(1, 4)).float().sum().backward()
        # `units=` overrides the plan's.
        other = Llama()
        out = shard_model(other, spec, units=["model.layers.1"])
        assert out.units[0] is other.model.layers[1] and len(out.units) == 2, out.units
    finally:
        dist.destroy_process_group()


def expect_error(what, fn, needle):
    try:
        fn()
    except ShardSpecError as e:
        assert needle in str(e), f"{what}: {e}"
        return
    raise AssertionError(f"{what}: no ShardSpecError")


def main():
    sharded = json.load(open(os.path.join(sys.argv[1], "manifest.json")))
    ddp = json.load(open(os.path.join(sys.argv[2], "manifest.json")))
    sh = sharded["sharding"]
    types = sorted(sh["devices"])
    assert len(types) == 2, types
    ranks = [types[0], types[0], types[1], types[1]]
    spec = ShardSpec.from_manifest(sharded, ranks, nodes=2)
    assert spec.stage == sh["fsdp_strategy"], (spec, sh["fsdp_strategy"])
    dev = sh["devices"][types[0]]
    assert spec.param_dtype == dev["all_gather"]["precision"] and spec.allgather is None, spec
    assert spec.reduce_dtype == dev["reduce_scatter_precision"] and spec.reduce_scatter is None, spec
    assert spec.local_batches == tuple(sharded["devices"][t]["local_batch"] for t in ranks), spec
    assert spec.hpz == sh["hpz"] and spec.nodes == 2, spec
    spec.resolved(4)

    # The quantized collectives, as the search writes them.
    q = copy.deepcopy(sharded)
    for t in types:
        q["sharding"]["devices"][t]["all_gather"]["precision"] = "qwz-int8"
        q["sharding"]["devices"][t]["reduce_scatter_precision"] = "qgz-int4"
    spec = ShardSpec.from_manifest(q, ranks, nodes=2)
    assert (spec.allgather, spec.param_dtype, spec.reduce_scatter, spec.reduce_dtype) == ("qwz", None, "qgz-int4", None)

    expect_error("a data-parallel plan", lambda: ShardSpec.from_manifest(ddp, ranks), "data-parallel")
    expect_error("a type the plan lacks", lambda: ShardSpec.from_manifest(sharded, ["v99"] * 4), "'v99'")
    mixed = copy.deepcopy(sharded)
    mixed["sharding"]["devices"][types[1]]["all_gather"]["precision"] = "qwz-int8"
    expect_error("formats that differ", lambda: ShardSpec.from_manifest(mixed, ranks), "one format")
    uneven = copy.deepcopy(sharded)
    uneven["sharding"]["uneven_shares"] = True
    expect_error("uneven shares", lambda: ShardSpec.from_manifest(uneven, ranks), "evenly")

    # The plan's units: the blocks by their PyTorch names, the roots left
    # to the root module.
    units = sh["units"]
    blocks = [u["module"] for u in units if u["kind"] == "block" and u["parameters"] > 0]
    assert blocks == ["model.layers.0", "model.layers.1"], units
    assert all(u["module"] is None for u in units if u["kind"] == "root"), units
    assert all(set(u["checkpoint"]) == set(types) for u in units), units
    spec = ShardSpec.from_manifest(sharded, ranks, nodes=2)
    assert spec.units == tuple(blocks), spec.units
    model = Llama()
    assert plan_units(model, spec) == list(model.model.layers), plan_units(model, spec)
    expect_error("a model lacking a planned block", lambda: plan_units(Llama(layers=1), spec),
                 "no submodule 'model.layers.1', a unit of the plan; 1 of the plan's 2 units are missing")
    expect_error("a model of other names", lambda: plan_units(Llama(name="blocks"), spec),
                 "no submodule 'model.layers.0', a unit of the plan; 2 of the plan's 2 units are missing")
    unnamed = copy.deepcopy(sharded)
    unnamed["sharding"]["units"][1]["module"] = None
    expect_error("a planned unit without a module",
                 lambda: plan_units(model, ShardSpec.from_manifest(unnamed, ranks, nodes=2)), "name no module")
    expect_error("units as one string", lambda: plan_units(model, dataclasses.replace(spec, units="model")),
                 "not a list of qualified module names")
    # A manifest without the units' modules leaves the choice to the model.
    old = copy.deepcopy(sharded)
    for u in old["sharding"]["units"]:
        for k in ("module", "kind", "checkpoint"):
            u.pop(k, None)
    assert ShardSpec.from_manifest(old, ranks, nodes=2).units is None

    # shard_model with no units= wraps the plan's, in two gloo processes.
    two = dataclasses.replace(spec, local_batches=None, nodes=1, hpz=False)
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(shard_rank, args=(2, os.path.join(d, "store"), two), nprocs=2, join=True)
    print("OK fsdp manifest")


if __name__ == "__main__":
    main()
