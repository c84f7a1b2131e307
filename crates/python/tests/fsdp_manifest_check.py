"""`qsync.fsdp.ShardSpec.from_manifest` on plans qsyncc wrote.

    python fsdp_manifest_check.py SHARDED_PLAN_DIR DDP_PLAN_DIR

SHARDED_PLAN_DIR holds a sharded plan of two device types; DDP_PLAN_DIR a
data-parallel one. Checks the spec read from the manifest field by field
against the manifest, that it resolves for the job, that a qwZ / qgZ plan
maps onto the quantized collectives, and that every manifest the spec
cannot honour is a ShardSpecError naming why. Prints `OK fsdp manifest`.
"""
import copy
import json
import os
import sys

from qsync.fsdp import ShardSpec, ShardSpecError


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
    print("OK fsdp manifest")


if __name__ == "__main__":
    main()
