"""Byte collectives over a torch.distributed process group.

`TorchTransport` is what the native `GradSync` calls to move bytes when the
gradients live on the CPU: gloo carries them, and every quantized reduction
happens in qsync's own code. Each method takes the seconds left before its
deadline as its last argument; it raises `TimeoutError` when they run out and
`ConnectionError` when the engine reports a lost peer, so the native side can
tell a stalled job from a dead one.

Bytes cross between the native side and torch without copies: every
collective takes writable buffers (a `bytearray`, or a `memoryview` the
native side made of its own memory) that torch views, reads and fills in
place; the collectives return nothing. Where the native side runs an
exchange on its own buffers (every synchronization scheme's), no byte is
copied on either side. The buffers must not be read or kept after a call:
a `memoryview` of native memory is valid only until the call returns.
"""

from __future__ import annotations

import datetime
import itertools
import os
import sys
import time

import torch
import torch.distributed as dist

_LOST_PEER = ("connection closed", "connection reset", "broken pipe", "peer", "socket")

_LOOP_POLICIES = ("auto", "batch", "default")
_loop_policy_refused = False  # said once a process (`new_gloo_group`)


def node_shares_cores() -> bool:
    """Whether this node's ranks outnumber the cores this process may run
    on (the launcher's `LOCAL_WORLD_SIZE` against the process's CPU
    affinity): then a thread hand-off waits for a core another rank is
    using."""
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        cores = len(os.sched_getaffinity(0))
    except (ValueError, AttributeError, OSError):
        return False
    return local > cores


def loop_policy() -> str:
    """The policy `new_gloo_group` gives its groups' event-loop threads:
    the environment's `QSYNC_GLOO_LOOP` (`batch`, `default`, or `auto`,
    the default): `auto` is `batch` where each of the node's ranks has a
    core of its own and `default` where they share cores
    (`node_shares_cores`)."""
    policy = os.environ.get("QSYNC_GLOO_LOOP", "auto") or "auto"
    if policy not in _LOOP_POLICIES:
        raise ValueError(f"QSYNC_GLOO_LOOP={policy!r}: expected one of {', '.join(_LOOP_POLICIES)}")
    if policy == "auto":
        return "default" if node_shares_cores() else "batch"
    return policy


def _gloo_loop_tids() -> set[int]:
    """This process's gloo event-loop threads (torch names them
    `gloo_tcp_loop`), by thread id; none where /proc cannot tell."""
    found = set()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "gloo_tcp_loop":
                    found.add(int(tid))
        except OSError:  # the thread has exited
            pass
    return found


def new_gloo_group(**kwargs):
    """`dist.new_group(backend="gloo", **kwargs)`, its event-loop threads
    (the ones the new group started) set not to preempt the thread that
    wakes them: `SCHED_BATCH`, the same share of the CPU as before, no
    preemption on wake-up. Returns the group and those threads' ids.

    gloo's event loop handles a socket's events only under its pair's
    lock, taken with a try-lock; when the lock is held it returns to
    `epoll_wait`, which answers at once while the data is unread. A
    rank's thread that sends or posts a receive holds that lock while its
    write wakes the loop thread; on the same core the loop thread preempts
    it and spins until the scheduler's next tick (4 ms at 250 Hz) lets
    the lock's holder finish. Two emulated nodes, one rank a core, 32 KiB
    all-to-alls: 84 and 88 of 192 calls over 1 ms, medians up to 3.0 ms;
    with the loop threads in `SCHED_BATCH`, 1 and 4 calls over 1 ms,
    medians up to 0.52 ms (docs/validation.md, `gloo_core_stalls.py`).

    Where a node's ranks share cores, the loop threads keep gloo's policy
    (`loop_policy`): there the exchanges of large buckets run beside
    another rank's backward pass, and a batch thread, which waits for the
    running one's turn to end, moved them slower. ResNet-18 at 10 Gbit/s,
    2 ranks a core: the hooks' backward took 1.3-1.9x as long
    (docs/validation.md, table 3's notes). `QSYNC_GLOO_LOOP=batch` or
    `default` chooses. Groups qsync does not create (DDP's own) are left
    alone. Where the policy cannot be set, one line says so on stderr."""
    global _loop_policy_refused
    policy = loop_policy()
    before = _gloo_loop_tids()
    group = dist.new_group(backend="gloo", **kwargs)
    started = sorted(_gloo_loop_tids() - before)
    if policy == "batch" and started and hasattr(os, "sched_setscheduler"):
        for tid in started:
            try:
                os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
            except OSError as e:
                if not _loop_policy_refused:
                    _loop_policy_refused = True
                    print(f"qsync: rank {dist.get_rank()}: gloo's event-loop thread {tid} left in its policy "
                          f"(SCHED_BATCH refused: {e}); exchanges may stall on busy cores", file=sys.stderr)
    return group, started


class TorchTransport:
    """Collectives on `group` (a gloo process group; `None`: a new gloo group
    over every rank, so qsync's traffic never interleaves with DDP's own)."""

    def __init__(self, group=None, *, _members=None, _loop_threads=()):
        if group is None:
            group, _loop_threads = new_gloo_group()
        self.group = group
        # The event-loop threads this group started, where qsync made the
        # group (`new_gloo_group`).
        self.loop_threads = list(_loop_threads)
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        # World ranks of this group, in group-rank order.
        self.members = list(_members) if _members is not None else list(range(dist.get_world_size()))
        self._splits = {}
        self._held = []  # the last exchange's works (`_exchange`)
        self._pad = torch.empty(0, dtype=torch.uint8)  # kept (`all_gather` of uneven blocks)
        # `all_gather` as an all-to-all (True), gloo's ring (False), or by
        # layout (None, `_gathers_flat`), and elsewhere measured where
        # `measure_gather`; the environment's QSYNC_ALL_GATHER (`ring`,
        # `all-to-all`, `measured`) sets them.
        forced = os.environ.get("QSYNC_ALL_GATHER", "")
        forms = {"": None, "ring": False, "all-to-all": True, "measured": None}
        if forced not in forms:
            raise ValueError(f"QSYNC_ALL_GATHER={forced!r}: expected `ring`, `all-to-all` or `measured`")
        self.flat_gather = forms[forced]
        self.measure_gather = forced == "measured"
        self.gather_forms = {}  # size class -> all-to-all (True) or ring, as tuned (`_tuned`)
        nodes, world = os.environ.get("GROUP_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
        self._flat_by_layout = self.size == 2 or (nodes is not None and nodes == world)

    # ---- plumbing -------------------------------------------------------

    def _wait(self, work, op, timeout_s):
        # Block in the engine until the work completes or the deadline
        # passes (torch releases the GIL while it waits). Polling instead
        # (`is_completed()` and a sleep) answers only at the next poll: a
        # collective that ends between two polls is seen up to a sleep
        # later, and every poll takes the core from the backward pass the
        # hook runs beside.
        if timeout_s <= 0:
            raise TimeoutError(f"rank {dist.get_rank()}: {op} did not complete within 0.0 s")
        try:
            work.wait(datetime.timedelta(seconds=timeout_s))
        except RuntimeError as e:
            text = str(e)
            if not work.is_completed() and "timed out" in text.lower():
                raise TimeoutError(f"rank {dist.get_rank()}: {op} did not complete within {timeout_s:.1f} s") from e
            if any(k in text.lower() for k in _LOST_PEER):
                raise ConnectionError(f"rank {dist.get_rank()}: {op}: {text.splitlines()[0]}") from e
            raise

    @staticmethod
    def _view(data, dtype=torch.uint8) -> torch.Tensor:
        """A tensor over `data`: a view of a `bytearray` or of a writable
        `memoryview`, a copy of anything else (torch views writable buffers
        only)."""
        if not data:
            return torch.empty(0, dtype=dtype)
        writable = isinstance(data, bytearray) or (isinstance(data, memoryview) and not data.readonly)
        return torch.frombuffer(data if writable else bytearray(data), dtype=dtype)

    @staticmethod
    def _target(data, op, n, dtype=torch.uint8) -> torch.Tensor:
        """A view of the writable buffer `data` of `n` bytes, which a
        collective fills."""
        writable = isinstance(data, bytearray) or (isinstance(data, memoryview) and not data.readonly)
        if not writable:
            raise TypeError(f"rank {dist.get_rank()}: {op}: the result buffer must be a bytearray or a writable memoryview")
        if len(data) != n:
            raise ValueError(f"rank {dist.get_rank()}: {op}: a result buffer of {len(data)} bytes for {n}")
        return torch.frombuffer(data, dtype=dtype) if n else torch.empty(0, dtype=dtype)

    # ---- collectives ----------------------------------------------------

    def all_gather(self, send, recv, counts, timeout_s: float) -> None:
        """Rank `r`'s block of `counts[r]` bytes (this rank's: `send`) into
        `recv`, the blocks end to end in rank order: as an all-to-all or
        through gloo's ring (`_gathers_flat`, `_tuned`)."""
        counts = list(counts)
        x = self._view(send)
        if len(counts) != self.size or x.numel() != counts[self.rank]:
            raise ValueError(f"rank {dist.get_rank()}: all_gather: {x.numel()} bytes sent, counts say {counts}")
        out = self._target(recv, "all_gather", sum(counts))
        if out.numel() == 0:
            return
        deadline = time.monotonic() + timeout_s
        forms = (self._gather_ring, self._gather_flat)
        flat = self._gathers_flat()
        if flat is None:
            key = max(counts).bit_length()  # the size class
            if key not in self.gather_forms:
                # Gathered while tuning.
                self.gather_forms[key] = self._tuned(lambda form: forms[form](x, out, counts, deadline), deadline)
                return
            flat = self.gather_forms[key]
        forms[flat](x, out, counts, deadline)

    def _gather_flat(self, x, out, counts, deadline):
        # The block straight to every peer: an all-to-all whose every send
        # is the same block.
        self._exchange(lambda j: x, out, counts, "all_gather", deadline - time.monotonic())

    def _gather_ring(self, x, out, counts, deadline):
        width = max(counts)
        if min(counts) == width:
            work = dist.all_gather_into_tensor(out, x, group=self.group, async_op=True)
            self._wait(work, "all_gather", deadline - time.monotonic())
            return
        # gloo's ring takes equal blocks: each padded to the longest (this
        # rank's in the kept scratch's first `width` bytes), then unpadded.
        if self._pad.numel() < width * (self.size + 1):
            self._pad = torch.empty(width * (self.size + 1), dtype=torch.uint8)
        mine, gathered = self._pad[:width], self._pad[width : width * (self.size + 1)]
        mine[: x.numel()].copy_(x)
        mine[x.numel() :].zero_()
        work = dist.all_gather_into_tensor(gathered, mine, group=self.group, async_op=True)
        self._wait(work, "all_gather", deadline - time.monotonic())
        at = 0
        for r, c in enumerate(counts):
            out[at : at + c].copy_(gathered[r * width : r * width + c])
            at += c

    def _tuned(self, gather, deadline):
        """Whether the all-to-all is the faster form (`gather(form)`: 0 the
        ring, 1 the all-to-all, each filling the result), timed ring,
        all-to-all, ring, all-to-all at the first all-gather of a size class
        (blocks of the same power of two, `gather_forms`): the slowest
        rank's best time of each, agreed through an all-reduce, so every
        rank of the group keeps the same form.

        Where gloo's ring crosses a node's link with fewer bytes than the
        all-to-all (several ranks a node), neither is faster everywhere:
        on a slow link the ring is, by its bytes; where the link outruns
        the ranks' cores the all-to-all is. Across two emulated nodes at 10
        Gbit/s, 2 ranks a node, ResNet-18's gradient through fp16: 75.7 ms
        with the ring, 65.0 with the all-to-all (docs/validation.md)."""
        best = [float("inf"), float("inf")]
        for form in (0, 1, 0, 1):
            t = time.perf_counter()
            gather(form)
            best[form] = min(best[form], time.perf_counter() - t)
        times = torch.tensor(best, dtype=torch.float64)
        self._wait(dist.all_reduce(times, op=dist.ReduceOp.MAX, group=self.group, async_op=True), "all_gather",
                   deadline - time.monotonic())
        ring, flat = times.tolist()
        return flat < ring

    def _gathers_flat(self):
        """Whether `all_gather` runs as an all-to-all: `flat_gather` where
        set; `True` where that moves no more bytes across nodes than gloo's
        ring (a group of 2, or every rank of the job alone on its node, as
        torchrun says with as many agents as ranks, `GROUP_WORLD_SIZE` =
        `WORLD_SIZE`); else the ring, or `None` where `measure_gather`: by
        measurement, per size class (`_tuned`). Every rank of the group must
        decide alike, or one would wait in an all-gather its peers never
        join: hence the job-wide variables, not the node's own
        `LOCAL_WORLD_SIZE`, which differs between nodes of different sizes,
        and the slowest rank's times.

        gloo's all-gather is a ring of `P−1` steps, each a round trip
        through its pair of ranks; its all-to-all sends every block at once.
        Measured through this transport across two emulated nodes, 8 bytes
        a rank: 1.4–1.9 ms against 0.3–0.5 ms with a core a rank, 4.7–5.5 ms
        against 3.0–4.6 ms with a node's two ranks on one core
        (docs/validation.md). With several ranks a node the ring crosses a
        node's link fewer times than the flat exchange (`(P−1)` blocks
        against `L·(P−L)`)."""
        if self.flat_gather is not None:
            return self.flat_gather
        if self._flat_by_layout:
            return True
        # Measured only when asked: in DDP at 200 Mbit/s the transformer's
        # small bucket synchronized slower with the form measured at its
        # first step (nbit-1: 9.8-9.9 ms a backward, 5.8 ms with the ring;
        # docs/validation.md, the twentieth run).
        return None if self.measure_gather else False

    def all_to_all_v(self, send, send_counts, recv, recv_counts, timeout_s: float) -> None:
        """`send_counts[j]` bytes of `send` (end to end in rank order) to
        rank `j`, and rank `j`'s `recv_counts[j]` bytes into `recv`."""
        x = self._view(send)
        if len(send_counts) != self.size or sum(send_counts) != x.numel():
            raise ValueError(f"rank {dist.get_rank()}: all_to_all: {x.numel()} bytes do not split as {list(send_counts)}")
        out = self._target(recv, "all_to_all", sum(recv_counts))
        at = list(itertools.accumulate(send_counts, initial=0))
        self._exchange(lambda j: x[at[j] : at[j + 1]], out, list(recv_counts), "all_to_all", timeout_s)

    def _exchange(self, block, out, recv_counts, op, timeout_s):
        """`block(j)` to rank `j` and rank `j`'s block into `out` (at its
        offset in `recv_counts`), every receive posted before any send.

        gloo's own all-to-all posts a send and a receive a peer, in turn,
        and its TCP pairs send only into a receive the peer has announced.
        A rank that meets an announced receive starts writing that block at
        once, and its own announcement to the same peer queues behind the
        block: the peer's data towards this rank waits until the block has
        crossed. Across two emulated nodes at 200 Mbit/s (8 MiB a rank, 4
        ranks) a node's link then stood idle for 60-260 ms of an exchange
        that takes 351 ms at the rate, and the exchange took 1.12-1.33x
        the link time; with every receive announced first it takes 0.98-1.0x
        (docs/validation.md, `transport_flows.py`)."""
        deadline = time.monotonic() + timeout_s
        me, p = self.rank, self.size
        at = list(itertools.accumulate(recv_counts, initial=0))
        mine = block(me)
        if mine.numel() != recv_counts[me]:
            raise ValueError(f"rank {dist.get_rank()}: {op}: sends itself {mine.numel()} bytes but expects {recv_counts[me]}")
        # Peers in the order gloo's all-to-all visits them: receive from
        # rank - i while rank + i receives from this one. A peer's empty
        # block is neither sent nor received (both ends know its size).
        works = []
        for i in range(1, p):
            j = (me - i) % p
            if recv_counts[j]:
                works.append(dist.irecv(out[at[j] : at[j + 1]], group_src=j, group=self.group))
        for i in range(1, p):
            j = (me + i) % p
            b = block(j)
            if b.numel():
                works.append(dist.isend(b, group_dst=j, group=self.group))
        out[at[me] : at[me + 1]].copy_(mine)
        for w in works:
            self._wait(w, op, deadline - time.monotonic())
        # The works live until the next exchange: freeing a gloo send or
        # receive just after it completes waits for its pair's event loop
        # to let go of the buffer, a thread wake-up on a core the node's
        # other rank is using (1.7 ms of a 16 KiB exchange between 2 ranks
        # on one core; 0.1 ms with the works kept).
        self._held = works

    def all_reduce_f32(self, buf, timeout_s: float) -> None:
        """The sum of every rank's float32 values, into `buf` in place."""
        x = self._target(buf, "all_reduce", len(buf), torch.float32)
        if x.numel():
            self._wait(dist.all_reduce(x, op=dist.ReduceOp.SUM, group=self.group, async_op=True), "all_reduce", timeout_s)

    def broadcast(self, buf, root: int, timeout_s: float) -> None:
        """Rank `root`'s `buf` into every rank's, in place."""
        x = self._target(buf, "broadcast", len(buf))
        if x.numel():
            self._wait(dist.broadcast(x, group_src=root, group=self.group, async_op=True), "broadcast", timeout_s)

    def barrier(self, timeout_s: float) -> None:
        x = torch.zeros(1)
        self._wait(dist.all_reduce(x, group=self.group, async_op=True), "barrier", timeout_s)

    def split(self, color: int, key: int, timeout_s: float) -> "TorchTransport":
        """The ranks with the same `color`, ordered by `key` (collective): a
        new process group, never this one, even when every rank passes the
        same color (then a duplicate of this group).

        torch creates groups collectively over the whole job, so a group of
        every rank may split into any partition, a sub-group only into a
        duplicate of itself."""
        mine = torch.tensor([color, key], dtype=torch.int64)
        both = torch.empty(2 * self.size, dtype=torch.int64)
        self._wait(dist.all_gather_into_tensor(both, mine, group=self.group, async_op=True), "split", timeout_s)
        pairs = both.view(self.size, 2).tolist()
        colors = sorted({c for c, _ in pairs})
        parts = {}
        for c in colors:
            ranks = sorted((k, r) for r, (cc, k) in enumerate(pairs) if cc == c)
            order = [r for _, r in ranks]
            if order != sorted(order):
                raise ValueError("torch.distributed orders a group by rank: split keys must follow rank order")
            parts[c] = tuple(self.members[r] for r in order)
        if len(colors) == 1:
            # A duplicate: a new process group over the same ranks, so its
            # traffic never interleaves with this group's (another bucket's
            # synchronization may run on another thread at the same time).
            members = parts[colors[0]]
            if self.size == dist.get_world_size():
                group, loops = new_gloo_group(ranks=list(members))
            else:
                # Only this group's ranks call split: they alone synchronize.
                group, loops = new_gloo_group(ranks=list(members), use_local_synchronization=True)
            return TorchTransport(group, _members=members, _loop_threads=loops)
        if self.size != dist.get_world_size():
            raise ValueError("only the group of every rank can be split into several groups")
        key_all = tuple(parts[c] for c in colors)
        if key_all not in self._splits:
            # Every rank creates every group, in the same order (a rank's
            # event-loop threads are those of the groups it belongs to).
            made = {members: new_gloo_group(ranks=list(members)) for members in key_all}
            self._splits[key_all] = made
        members = parts[color]
        group, loops = self._splits[key_all][members]
        return TorchTransport(group, _members=members, _loop_threads=loops)

    def abort(self, code: int) -> None:
        sys.stderr.flush()
        os._exit(code if code else 1)
