#!/usr/bin/env python3
"""One bucket's synchronization through the DDP hook's machinery, apart from
DDP (every rank starting together after a barrier), timed on every rank;
`last_bucket.py` times the same inside DDP.

For each scheme of `--schemes`, a gradient of `--elements` f32 elements:

- `direct_s`: the hook's `GradSync` (the native runtime over qsync's
  TorchTransport, gloo) called on the training thread;
- `phases`: the runtime's phases per call (quantize, exchange, wait,
  dequantize); `direct_faults`: rank 0's process's minor page faults per
  call (the median);
- `direct_ring_s`, `direct_flat_s`: the same with the transport's
  all-gather forced to gloo's ring and to the all-to-all
  (`TorchTransport.flat_gather`); `forms`: the form `direct_s`'s transport
  measured per size class (`true`: the all-to-all; only with
  `QSYNC_ALL_GATHER=measured`, `TorchTransport._tuned`);
- `direct_skew_s`: the same with each node's second rank computing
  `--skew-ms` before it calls, as in DDP where a node's ranks share a
  core (the slowest rank's time from the barrier, less the skew);
- bare collectives through the same transport: an all-gather of 8 bytes a
  rank, gloo's ring and as an all-to-all, and an all-to-all of 8 bytes a
  peer (`gather8_s`, `gather8_flat_s`, `a2a8_s`).

Rank 0 prints one JSON line per scheme: the slowest rank's median of
`--reps` calls of each.

    torchrun ... scripts/validate/hook_probe.py [--schemes fp16,qgz-int8] [--elements 118000] [--reps 30]
"""
import argparse
import json
import os
import resource
import statistics
import time

import numpy
import torch
import torch.distributed as dist

import qsync
from qsync._transport import TorchTransport


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", default="fp16,qgz-int8,nbit-2")
    ap.add_argument("--elements", type=int, default=118000)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--skew-ms", type=float, default=1.4,
                    help="`direct_skew_s`: each node's second rank computes this long before it calls")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tr = TorchTransport()
    rng = numpy.random.default_rng(rank)
    grad = rng.standard_normal(a.elements).astype(numpy.float32)

    def slowest_median(times):
        mine = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        return mine.item()

    def timed(call, reps):
        """The slowest rank's median seconds of `reps` calls (after 3 more),
        and this rank's median minor page faults a call."""
        times, flt = [], []
        for i in range(reps + 3):
            tr.barrier(60.0)
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t = time.perf_counter()
            call()
            if i >= 3:
                times.append(time.perf_counter() - t)
                flt.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        return slowest_median(times), statistics.median(flt)

    def gather8(flat):
        tr.flat_gather = flat
        return timed(lambda: tr.all_gather(bytearray(8), bytearray(8 * tr.size), [8] * tr.size, 60.0), a.reps)[0]

    bare = {
        "gather8_s": gather8(False),
        "gather8_flat_s": gather8(True),
        "a2a8_s": timed(
            lambda: tr.all_to_all_v(bytearray(8 * tr.size), [8] * tr.size, bytearray(8 * tr.size), [8] * tr.size, 60.0),
            a.reps,
        )[0],
    }
    # As in DDP with a node's ranks on one core (`direct_skew_s`): each
    # node's second rank still computes while the first waits.
    late = int(os.environ.get("LOCAL_RANK", "0")) % 2 == 1
    for name in a.schemes.split(","):
        hook = qsync.comm_hook(name).qsync
        sync = hook._sync_for("cpu", 0, torch.device("cpu"))
        work = grad.copy()
        hook.reset_phases()
        direct, direct_faults = timed(lambda: sync.all_reduce_mean(work), a.reps)
        phases = {k: v / (a.reps + 3) for k, v in hook.phases().items()}
        transport = hook._transport()
        more = {"forms": {str(k): v for k, v in sorted(transport.gather_forms.items())}}
        # Each all-gather form forced: gloo's ring and the all-to-all.
        for key, flat in (("direct_ring_s", False), ("direct_flat_s", True)):
            transport.flat_gather = flat
            more[key] = timed(lambda: sync.all_reduce_mean(work), a.reps)[0]
        transport.flat_gather = None
        # As in DDP with a node's ranks on one core: the ranks leave the
        # barrier together, but each node's second rank still computes
        # (here: spins) `--skew-ms` before it calls, while the first waits
        # in the exchange. The slowest rank's time from the barrier to the
        # call's end, less the skew: what the call takes after the last
        # rank joins it.
        def skewed():
            if late:
                until = time.perf_counter() + a.skew_ms / 1e3
                while time.perf_counter() < until:
                    pass
            sync.all_reduce_mean(work)

        more["direct_skew_s"] = timed(skewed, a.reps)[0] - a.skew_ms / 1e3
        more["skew_ms"] = a.skew_ms
        if rank == 0:
            print(json.dumps({"scheme": name, "ranks": tr.size, "elements": a.elements, "reps": a.reps,
                              "direct_s": direct, "direct_faults": direct_faults, **more, "phases": phases,
                              **bare}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
