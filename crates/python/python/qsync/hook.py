"""A DistributedDataParallel communication hook running qsync's schemes.

    ddp.register_comm_hook(None, qsync.comm_hook("plan/"))      # the plan's scheme and batch weights
    ddp.register_comm_hook(None, qsync.comm_hook("qgz-int4"))   # any DDP job, no plan

Each bucket is synchronized by the runtime's `GradSync` (the same code the
MPI and NCCL jobs run). CPU buckets go through torch.distributed (gloo) as
the transport, on the hook's worker thread, so a bucket synchronizes while
autograd computes the next ones (as DDP's own all-reduce does); where a
node's ranks share cores, the last bucket, ready when nothing is left to
compute, runs on the training thread itself, after the worker's queue,
sparing two thread hand-offs (`last_bucket`). CUDA buckets
go through the runtime's own NCCL communicator, whose unique id rank 0 makes
and shares through a gloo group; that path stages each bucket through host
memory, where the runtime's schemes quantize (the kernels' arithmetic, so
every rank gets the same bits), in the hook call itself.

With a plan, each rank's gradient is weighted by its device type's share of
the global batch (`local_batch / global_batch` in the manifest), so a joint
plan's uneven local batches give the update of one uniform global batch.
Non-finite values survive the reduction, so GradScaler's overflow check
still fires.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from . import _native
from ._manifest import Plan
from ._transport import TorchTransport, new_gloo_group, node_shares_cores


def _name_os_thread(name):
    """Give the calling thread `name` as its OS name as well (what /proc and
    `top -H` show; this Python leaves every thread with the process's), so a
    profile of a rank tells the hook's worker from the training thread.
    Where the C library has no `prctl` (not Linux), the name stays."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


class QSyncHook:
    """The hook object: call it as `hook(state, bucket)` (DDP does)."""

    def __init__(self, scheme, *, weight=None, nodes=1, node_of=None, group=512, seed=0, timeout_s=60.0,
                 gather_f32=False, process_group=None, kernels="host", last_bucket="auto"):
        if not dist.is_initialized():
            raise RuntimeError("qsync.comm_hook needs torch.distributed to be initialized (init_process_group)")
        self.scheme = _native.parse_scheme(scheme)
        self.world = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        # Scale so that the mean over ranks is the batch-weighted sum.
        self.scale = 1.0 if weight is None else float(weight) * self.world
        if node_of is not None:
            node_of = [int(n) for n in node_of]
            if len(node_of) != self.world:
                raise ValueError(f"node_of names the node of {len(node_of)} ranks, this job has {self.world}")
            nodes = 1
        self.node_of = node_of  # the node of every rank (None: `nodes` equal nodes)
        self._opts = dict(nodes=nodes, node_of=node_of, group=group, seed=seed, timeout_s=timeout_s,
                          gather_f32=gather_f32)
        self._pg = process_group
        self._kernels = kernels  # where CUDA buckets quantize: "host" or "device" (our PTX)
        self._cpu = None  # gloo transport, made on first use (collective)
        self._syncs = {}  # (device kind, bucket index) -> GradSync
        self._worker = None  # one thread: CPU buckets synchronize in order, overlapping the backward pass
        if last_bucket not in ("auto", "call", "worker"):
            raise ValueError(f"last_bucket must be 'auto', 'call' or 'worker', not {last_bucket!r}")
        if last_bucket == "auto":
            last_bucket = "call" if node_shares_cores() else "worker"
        self.last_bucket = last_bucket  # where a CPU step's last bucket synchronizes
        self._queued = None  # the worker's last task (its buckets run in order before the last bucket's)
        self._failed = None  # a failed synchronization of this step, if any (read by the last bucket)
        self._base = {}
        self._pinned = {}  # bucket index -> pinned host staging buffer (CUDA buckets)
        self._staging_s = 0.0
        self._call_s = 0.0  # seconds inside the runtime's all_reduce_mean, every bucket

    def _transport(self):
        if self._cpu is None:
            members = None
            if self._pg is not None:
                members = [dist.get_global_rank(self._pg, r) for r in range(self.world)]
            group, loops = new_gloo_group(ranks=members)
            self._cpu = TorchTransport(group, _members=members, _loop_threads=loops)
        return self._cpu

    def _sync_for(self, kind, index, device):
        key = (kind, index)
        if key in self._syncs:
            return self._syncs[key]
        base = self._base.get(kind)
        if base is None:
            if kind == "cpu":
                base = _native.GradSync(self._transport(), self.scheme, **self._opts)
            else:
                ids = [_native.nccl_unique_id() if self.rank == 0 else None]
                dist.broadcast_object_list(ids, group_src=0, group=self._transport().group)
                base = _native.GradSync.nccl(self.rank, self.world, ids[0], device.index or 0, self.scheme,
                                             kernels=self._kernels, **self._opts)
            self._base[kind] = base
            sync = base
        else:
            sync = base.fork()
        self._syncs[key] = sync
        return sync

    def __call__(self, state, bucket):
        buf = bucket.buffer()
        grad = buf if buf.dtype == torch.float32 else buf.float()
        if self.scale != 1.0:
            grad.mul_(self.scale)
        kind = "cpu" if grad.device.type == "cpu" else "cuda"
        index = bucket.index()
        fut = torch.futures.Future()
        if kind == "cpu":
            self._transport()  # a collective over the default group: made here, before any worker call
            # On the hook's worker thread, in bucket order, while autograd
            # computes the next buckets: the runtime releases the GIL while
            # it quantizes and reduces. Everything that talks over the
            # transport's group (a new bucket's group included) runs there,
            # so its collectives keep one order on every rank. DDP waits on
            # the future before it reads the bucket back.
            def run():
                try:
                    sync = self._sync_for(kind, index, grad.device)
                    host = grad if grad.is_contiguous() else grad.contiguous()
                    t = time.perf_counter()
                    sync.all_reduce_mean(host.detach().numpy())
                    self._call_s += time.perf_counter() - t
                    if host is not grad:
                        grad.copy_(host)
                    if grad is not buf:
                        buf.copy_(grad)
                    fut.set_result(buf)
                except BaseException as e:  # handed to DDP, which raises it in the training thread
                    self._failed = e
                    fut.set_exception(e)

            if self.last_bucket == "call" and bucket.is_last():
                # The backward pass has produced every gradient: nothing is
                # left to overlap, so the last bucket runs here, on the
                # training thread, once the worker's queue is done. Handing
                # it to the worker would cost two thread wake-ups (the
                # worker's, then the training thread's on the future), each
                # a wait for a core that the node's other ranks are using.
                if self._queued is not None:
                    self._queued.result()
                    self._queued = None
                failed, self._failed = self._failed, None  # this step's, if any
                if failed is not None:
                    # An earlier bucket's synchronization failed (its future
                    # carries why): the ranks' collectives no longer line
                    # up, so this one would only wait out its own deadline.
                    fut.set_exception(RuntimeError(
                        f"rank {self.rank}: bucket {index} not synchronized: an earlier bucket's synchronization "
                        f"failed ({failed})"))
                    return fut
                run()
                return fut
            self._queued = self._executor().submit(run)
            return fut
        sync = self._sync_for(kind, index, grad.device)
        # Staged through a pinned host buffer per bucket (page-locked copies
        # run at the host link's rate; pageable ones are several times
        # slower), reused every step.
        t0 = time.perf_counter()
        host = self._pinned.get(index)
        if host is None or host.numel() != grad.numel():
            host = torch.empty(grad.numel(), dtype=torch.float32, pin_memory=True)
            self._pinned[index] = host
        grad = grad.contiguous()  # a bucket is already: then this is grad itself
        flat = grad.detach().view(-1)
        host.copy_(flat, non_blocking=True)
        torch.cuda.current_stream(grad.device).synchronize()
        t1 = time.perf_counter()
        sync.all_reduce_mean(host.numpy())
        t2 = time.perf_counter()
        self._call_s += t2 - t1
        flat.copy_(host, non_blocking=False)
        if grad is not buf:
            buf.copy_(grad)
        self._staging_s += (t1 - t0) + (time.perf_counter() - t2)
        fut.set_result(buf)
        return fut

    def phases(self):
        """Seconds per phase summed over this rank's buckets since creation or
        `reset_phases()`: the runtime's `quantize_s`, `exchange_s`, `wait_s`,
        `dequantize_s`; `staging_s`, the copies of CUDA buckets to the host
        and back; and `call_s`, the wall time of the runtime's calls (the
        phases plus the copies and allocations between them)."""
        out = {"quantize_s": 0.0, "exchange_s": 0.0, "wait_s": 0.0, "dequantize_s": 0.0}
        for s in self._syncs.values():
            for k, v in s.phases.items():
                out[k] += v
        out["staging_s"] = self._staging_s
        out["call_s"] = self._call_s
        return out

    def reset_phases(self):
        for s in self._syncs.values():
            s.reset_phases()
        self._staging_s = 0.0
        self._call_s = 0.0

    def _executor(self):
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qsync-hook",
                                              initializer=_name_os_thread, initargs=("qsync-hook",))
        return self._worker

    def wire_bytes(self):
        """Bytes this rank received from others, summed over buckets: (intra, inter)."""
        intra = inter = 0
        for s in self._syncs.values():
            a, b = s.wire_bytes
            intra, inter = intra + a, inter + b
        return intra, inter


def plan_node_map(plan):
    """The node of every rank of `plan`'s cluster: rank order follows the
    manifest's targets, each type on its own nodes of `per_node` ranks (the
    last one possibly smaller), so `a100:4,t4:8` is a node of 4 and a node
    of 8, never two nodes of 6."""
    out, node = [], 0
    for t in plan.targets:
        count = int(t["count"])
        per = max(int(t.get("per_node") or count), 1)
        out.extend(node + i // per for i in range(count))
        node += -(-count // per)
    return out


def launcher_node_map(process_group=None):
    """The node of every rank as the launcher placed them (collective): the
    node index torchrun gives (`GROUP_RANK`), else the host name (mpirun,
    any launcher); nodes numbered in order of their first rank."""
    key = os.environ.get("GROUP_RANK")
    key = f"group {key}" if key is not None else f"host {socket.gethostname()}"
    world = dist.get_world_size(process_group)
    # Over gloo, whatever the job's backend (no CUDA device involved).
    if process_group is None:
        group = dist.new_group(backend="gloo")
    else:
        members = [dist.get_global_rank(process_group, r) for r in range(world)]
        group = dist.new_group(ranks=members, backend="gloo", use_local_synchronization=True)
    keys = [None] * world
    dist.all_gather_object(keys, key, group=group)
    ids = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


def comm_hook(plan_or_scheme="fp32", *, device_type=None, scheme=None, nodes=None, node_of=None, group=None, seed=0,
              timeout_s=60.0, gather_f32=False, process_group=None, kernels="host", last_bucket="auto"):
    """A DDP communication hook for `ddp.register_comm_hook(None, hook)`;
    `hook.qsync` is its `QSyncHook` (scheme, weight scale, wire bytes).

    `plan_or_scheme` is a plan directory written by `qsyncc` (its manifest's
    scheme, group size and cluster shape; this rank's gradient weighted by its
    device type's share of the global batch) or a scheme name (`fp16`,
    `bf16`, `qgz-int8`, `qgz-int4`, `qgz-int8-hier`, `qgz-int4-hier`,
    `nbit-1/2/4/8`, with `-sr` / `-ef` where they apply). `device_type` names
    this rank's type in the plan (default: by rank, in the manifest's target
    order). Hierarchical schemes need the node of every rank, taken from, in
    order: `node_of` (a list, one node id per rank); `nodes` (that many equal
    nodes, node-major); the plan (its types' node counts and `per_node`, so
    nodes may differ in size); `$QSYNC_NODES` (equal nodes); for a
    hierarchical scheme, the launcher (torchrun's `GROUP_RANK`, else the host
    name, gathered from every rank: creating such a hook is a collective);
    else one node. `kernels="device"` quantizes CUDA
    buckets with qsync's PTX kernels on the GPU (`$QSYNC_PTX_DIR` holds the
    `qsyncc codegen --all-kernels` output); CPU buckets always use the host.
    `last_bucket` says where a CPU step's last bucket synchronizes: `"call"`
    in the hook call, on the training thread, once the worker's queue is
    done; `"worker"` on the hook's worker thread like the others; `"auto"`
    (default) in the call where the node's ranks outnumber the cores this
    process may run on, else on the worker. Measured on 2 emulated nodes
    at 10 Gbit/s (docs/validation.md): on an Intel Xeon VM, with 2 ranks
    sharing a node's core, the call ended the transformer's step 0.4–2.7
    ms sooner, and with a core a rank fp16 and qgz-int8 up to 2 ms later
    in 4 of 6 paired runs; on an AMD EPYC VM, 2 ranks a core, the worker
    ended the transformer's backward 0.7–3.6 ms sooner in 14 of 15 paired
    runs, while ResNet-18's was faster in the call in 3 of 4 paired jobs
    (4 of 4 as a ratio to DDP's all-reduce). Neither is faster everywhere.
    """
    if kernels not in ("host", "device"):
        raise ValueError(f"kernels must be 'host' or 'device', not {kernels!r}")
    weight = None
    if isinstance(plan_or_scheme, (str, os.PathLike)) and os.path.isdir(plan_or_scheme):
        plan = Plan.load(plan_or_scheme)
        world = dist.get_world_size(process_group)
        if world != plan.device_count:
            raise ValueError(
                f"{plan.path}: the plan is for {plan.device_count} devices "
                f"({plan.cluster_text()}), this job has {world} ranks"
            )
        dev = device_type or plan.device_for_rank(dist.get_rank(process_group))
        weight = plan.gradient_weight(dev)
        scheme = scheme or plan.sync_scheme
        group = group or plan.sync_group
        if nodes is None and node_of is None:
            node_of = plan_node_map(plan)
    else:
        scheme = scheme or str(plan_or_scheme)
    if nodes is None and node_of is None:
        if "QSYNC_NODES" in os.environ:
            nodes = int(os.environ["QSYNC_NODES"])
        elif "hier" in _native.parse_scheme(scheme):
            node_of = launcher_node_map(process_group)  # a collective: every rank makes its hook
    if nodes is None:
        nodes = 1
    if scheme == "fp32" and weight is None:
        warnings.warn("qsync.comm_hook('fp32') does what DDP does by default", stacklevel=2)
    obj = QSyncHook(scheme, weight=weight, nodes=nodes, node_of=node_of, group=group or 512, seed=seed, timeout_s=timeout_s,
                    gather_f32=gather_f32, process_group=process_group, kernels=kernels, last_bucket=last_bucket)

    # DDP wants a plain function (it logs its name); the state rides along.
    def hook(state, bucket):
        return obj(state, bucket)

    hook.__name__ = hook.__qualname__ = f"qsync_{obj.scheme.replace('-', '_')}_hook"
    hook.qsync = obj
    return hook
