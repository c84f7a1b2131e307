#!/usr/bin/env python3
"""Synchronization on real links against the model (docs/validation.md, table 1).

    python3 scripts/validate/sync.py --qsyncc target/release/qsyncc --out target/validate \
        [--rates 1gbit,10gbit] [--sizes 8M,64M] [--ranks-per-node 2] [--iterations 5]

For each link rate: build a 2-node emulated cluster (scripts/netcluster.sh),
each node's ranks pinned to cores of its own (`run --cpus-per-node`, this
machine's cores split evenly), and measure what the model needs and does
not assume —
  - the hosts' synchronization kernels (`qsyncc host-kernels` on one
    core, one thread: a node's core, as a real node's core runs them; the
    model shares a node's cores among its ranks, `host_cores_per_node`)
    and the CPU cost of a byte through the TCP stack;
  - the bandwidth between two ranks of one node (TCP over the namespace's
    loopback: what Open MPI's TCP transport uses inside a node) and the
    one-way latency of a small message across the link and inside a node;
then write a cluster file of that cluster (the NIC at the shaped rate times
the TCP payload share of an Ethernet frame), run `qsyncc sync-bench` under
mpirun for each scheme and size, and `qsyncc simulate --gradient` for the
same scheme, size and cluster file. One JSON line per cell goes to
OUT/sync.jsonl; the caller renders the table.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NETCLUSTER = os.path.join(ROOT, "scripts", "netcluster.sh")

SCHEMES = ["fp32", "fp16", "bf16", "qgz-int8", "qgz-int4", "qgz-int8-hier", "qgz-int4-hier", "nbit-2", "nbit-4"]
# Bytes of TCP payload per Ethernet frame of a 1500-byte MTU with TCP
# timestamps: 1448 of 1514 bytes that tbf counts (14 Ethernet + 20 IP + 32 TCP).
TCP_PAYLOAD_SHARE = 1448 / 1514


def sh(args, **kw):
    r = subprocess.run(args, text=True, capture_output=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"validate: {' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r


def parse_rate(r):
    r = r.lower()
    if r.endswith("gbit"):
        return float(r[:-4])
    if r.endswith("mbit"):
        return float(r[:-4]) / 1000
    raise SystemExit(f"validate: rate `{r}` must end in gbit or mbit")


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


PROBE = r"""
import socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((host, port)); s.listen(1)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        hdr = c.recv(1)
        if not hdr or hdr == b"q": break
        if hdr == b"p": c.sendall(b"p"); continue
        n = int.from_bytes(c.recv(8, socket.MSG_WAITALL), "little"); got = 0
        while got < n: got += len(c.recv(min(1 << 20, n - got)))
        c.sendall(b"k")
else:
    for i in range(100):
        try:
            c = socket.create_connection((host, port)); break
        except OSError:
            time.sleep(0.05)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(200):
        t = time.perf_counter(); c.sendall(b"p"); c.recv(1); rtts.append(time.perf_counter() - t)
    rtts.sort()
    n = int(sys.argv[4]); buf = b"\0" * (1 << 20); rates = []
    for _ in range(3):
        t = time.perf_counter(); c.sendall(b"b" + n.to_bytes(8, "little")); left = n
        while left > 0: k = min(left, len(buf)); c.sendall(buf[:k]); left -= k
        c.recv(1); rates.append(n / (time.perf_counter() - t))
    c.sendall(b"q")
    print(rtts[len(rtts) // 2] / 2 * 1e6, max(rates) / 1e9)
"""


def probe(server_ns, client_ns, host, nbytes):
    """(one-way latency µs, bandwidth GB/s) from client_ns to host in server_ns."""
    port = 47000 + os.getpid() % 1000
    srv = subprocess.Popen(["ip", "netns", "exec", server_ns, sys.executable, "-c", PROBE, "serve", host, str(port)])
    try:
        out = sh(["ip", "netns", "exec", client_ns, sys.executable, "-c", PROBE, "client", host, str(port), str(nbytes)],
                 timeout=300).stdout.split()
        return float(out[0]), float(out[1])
    finally:
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()


BULK = r"""
import socket, sys, time
mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((host, port)); s.listen(1)
    c, _ = s.accept(); got = 0
    while got < n:
        b = c.recv(1 << 20)
        if not b: break
        got += len(b)
    c.sendall(b"k")
else:
    for i in range(200):
        try:
            c = socket.create_connection((host, port)); break
        except OSError:
            time.sleep(0.05)
    buf = b"\0" * (1 << 20); left = n; t = time.perf_counter()
    while left > 0:
        k = min(left, len(buf)); c.sendall(buf[:k]); left -= k
    c.recv(1); print(time.perf_counter() - t)
"""


def bulk_both_ways(ns, addr, flows, nbytes, port0, pin=None):
    """GB/s one way while `flows` TCP streams run each way between two
    nodes at once (as the ranks of an all-reduce do): the slower direction.
    `pin[i]`: the CPU list node i's processes run on (`taskset -c`)."""
    procs, clients = [], []
    cpu = lambda i: ["taskset", "-c", pin[i]] if pin else []
    for i in range(flows):
        for a, b in ((0, 1), (1, 0)):
            port = port0 + 2 * i + a
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns[b]] + cpu(b) + [sys.executable, "-c", BULK,
                                           "serve", addr[b], str(port), str(nbytes)]))
    time.sleep(0.3)
    for i in range(flows):
        for a, b in ((0, 1), (1, 0)):
            port = port0 + 2 * i + a
            clients.append(((a, b), subprocess.Popen(["ip", "netns", "exec", ns[a]] + cpu(a) + [sys.executable, "-c",
                                                      BULK, "client", addr[b], str(port), str(nbytes)],
                                                     stdout=subprocess.PIPE, text=True)))
    worst = {}
    for (a, b), c in clients:
        out, _ = c.communicate(timeout=600)
        worst[(a, b)] = max(worst.get((a, b), 0.0), float(out.split()[0]))
    for p in procs:
        p.wait(timeout=60)
    return min(flows * nbytes / t for t in worst.values()) / 1e9


def measure_links(ns, addr, rate, k, link_cost=True):
    """The emulated links as the model needs them: latencies and bandwidth
    inside a node and between nodes, measured with sockets; with
    `link_cost`, what a byte costs a node's core at this rate
    (`stream_ns_per_byte`, for `cluster_toml`'s `probe_ns`)."""
    gbit = parse_rate(rate)
    intra_lat, intra_gb = probe(ns[0], ns[0], addr[0], 512 << 20)
    inter_lat, inter_gb = probe(ns[0], ns[1], addr[0], min(256 << 20, int(gbit * 1e9 / 8 * 2)))
    # What the links carry with every rank sending at once, both ways: on
    # this machine the kernel's TCP work, not the shaped rate, can be the
    # limit (its two cores also run the ranks).
    both = bulk_both_ways(ns, addr, k, min(128 << 20, int(gbit * 1e9 / 8)), 48000 + os.getpid() % 1000)
    # What the link's bytes cost a node's core at this rate (the NIC's
    # work, as emulated), against the same at PROBE_RATE (`link_tcp_cost`).
    stream = stream_cpu_ns_per_byte(ns, addr) if link_cost else None
    # The NIC is the shaped rate: what the stack's CPU work adds is the
    # model's to price (the host's TCP cost and cores), not the link's.
    return {"gbit": gbit, "nic_gbit": gbit * TCP_PAYLOAD_SHARE, "both": both, "stream_ns_per_byte": stream,
            "intra_lat": intra_lat, "intra_gb": intra_gb, "inter_lat": inter_lat, "inter_gb": inter_gb}


STREAM_SECONDS = 4.0
# Streams a measurement of the link's cost takes the median of: one
# stream's cost at 10 Gbit/s less one at 40 Gbit/s came out 0.19 ns a byte
# in one run and 0.01 in the next (2026-12-02), a fifth of the transport's
# own cost either way.
STREAMS = 3


def stream_cpu_ns_per_byte(ns, addr):
    """Core 0's busy ns per byte node 0 moves (sent and received) while one
    TCP stream runs both ways between node 0's process on core 0 and node
    1's on core 1, for STREAM_SECONDS, the median of STREAMS such streams
    (`link_cpu.stream_cpu`): on a link
    the CPU cannot fill (PROBE_RATE) what the stack costs; on a shaped
    link, what it costs at that rate. Their difference is what the link
    itself costs the node's cores beyond the transport the model measures
    at PROBE_RATE (the cluster file's `nic_cpu_ns_per_byte`): on these
    emulated links the rate limiter's timers and netcluster.sh's small
    segments on slow links (docs/validation.md, table 1b's notes)."""
    from link_cpu import stream_cpu
    return median([stream_cpu(ns, addr, STREAM_SECONDS)["core_ns_per_byte"] for _ in range(STREAMS)])


def exchange_seconds(a, k, cores, nbytes, messages):
    """Median seconds of `sync-bench --collective all-to-all`: `nbytes` from
    every rank in `messages` all-to-alls, the ranks placed and pinned as the
    validation's jobs are; the median of 15 (of 5 until 2026-11-30, whose
    fits of the stack's cost per byte spread 0.61-0.68 ns from run to run,
    and whose one-exchange times spread 15-21 ms within a run)."""
    r = subprocess.run(["bash", NETCLUSTER, "run", "--prefix", a.prefix, "--ranks-per-node", str(k),
                        "--cpus-per-node", str(cores), "--timeout", "300", "--", a.qsyncc, "sync-bench",
                        "--collective", "all-to-all", "--scheme", "fp32", "--bytes", str(nbytes), "--messages",
                        str(messages), "--nodes", "2", "--iterations", "15", "--warmup", "1", "--json"],
                       capture_output=True, text=True)
    line = next((l for l in r.stdout.splitlines() if l.startswith("{")), None)
    if r.returncode != 0 or line is None:
        raise SystemExit(f"validate: sync-bench --collective all-to-all failed:\n{r.stdout}\n{r.stderr}")
    return json.loads(line)


PROBE_RATE = "40gbit"
# Jobs of each size a transport measurement runs (`link_tcp_cost`).
TRANSPORT_JOBS = 5


def probe_cluster_up(a, nodes):
    """Bring up the emulated nodes on a link far faster than the CPU can feed
    (PROBE_RATE, no delay), for measuring what a transport costs the CPU;
    the caller takes it down. Returns the namespaces and their addresses."""
    sh(["bash", NETCLUSTER, "down", "--prefix", a.prefix])
    sh(["bash", NETCLUSTER, "up", "--nodes", str(nodes), "--rate", PROBE_RATE, "--delay-ms", "0",
        "--prefix", a.prefix, "--subnet", a.subnet])
    return [f"{a.prefix}{i}" for i in range(nodes)], [f"{a.subnet}.{i + 2}" for i in range(nodes)]


def link_tcp_cost(a, nodes, k, cores):
    """What the host transport costs a node's CPU, on a link far faster than
    the CPU can feed (40 Gbit/s), each node's processes pinned to its own
    cores, as the ranks are.

    Per byte and per message, with the engine itself: the ranks' all-to-all
    (`sync-bench --collective all-to-all`, the exchange the flat schemes are
    made of) in 32 exchanges of two sizes, 16 MiB a rank (512 KiB an
    exchange, a pipeline piece's size) and 1 MiB (32 KiB an exchange,
    where the messages' own cost shows). A rank's time is
    T = (32·(P−1)·msg + recv·byte)·k/cores (its node's k ranks share the
    cores); the two sizes give `byte` from their difference and `msg` from
    what the small one leaves. (Until 2026-12-01 the two runs were 16 MiB
    in 1 exchange and in 32: their difference, 93 messages against
    run-to-run noise of a few ms in runs of 25-38 ms, fitted `msg` at 0 in
    every measurement of a slower day, and small exchanges went unpriced.)
    One exchange of 16 MiB is still timed, for the record. Each size runs
    in `TRANSPORT_JOBS` jobs, alternating, whose times the run pools
    (`pooled_transport_fit`).

    For the record, raw TCP: `k` streams each way between the two nodes;
    each node's cores send and receive every byte of its streams, so
    seconds per byte = cores / (bytes per second one way)."""
    rate = PROBE_RATE
    ns, addr = probe_cluster_up(a, nodes)
    try:
        pin = [f"{i * cores}-{(i + 1) * cores - 1}" for i in range(nodes)]
        runs = [bulk_both_ways(ns, addr, k, 256 << 20, 49000 + os.getpid() % 1000 + 20 * r, pin) for r in range(3)]
        stream = stream_cpu_ns_per_byte(ns, addr)
        nbytes, small, many = 16 << 20, 1 << 20, 32
        one = exchange_seconds(a, k, cores, nbytes, 1)
        splits, tinies = [], []
        for _ in range(TRANSPORT_JOBS):
            splits.append(exchange_seconds(a, k, cores, nbytes, many))
            tinies.append(exchange_seconds(a, k, cores, small, many))
    finally:
        subprocess.run(["bash", NETCLUSTER, "down", "--prefix", a.prefix])
    best = max(runs)
    split, tiny = splits[0], tinies[0]
    split_jobs, tiny_jobs = [s["seconds"] for s in splits], [t["seconds"] for t in tinies]
    # The fit itself is the caller's, over the jobs of every measurement it
    # pools (`pooled_transport_fit`).
    return {"socket_r": cores / (best * 1e9), "socket_gbyte_s": best, "rate": rate, "one_s": one["seconds"],
            "stream_ns_per_byte": stream,
            "split_s": median(split_jobs), "tiny_s": median(tiny_jobs), "split_jobs_s": split_jobs,
            "tiny_jobs_s": tiny_jobs, "split_received_bytes": split["received_bytes_per_rank"],
            "tiny_received_bytes": tiny["received_bytes_per_rank"], "messages": many * (split["ranks"] - 1),
            "share": k / cores, "split_message_bytes": split["message_bytes"],
            "one_message_bytes": one["message_bytes"], "tiny_message_bytes": tiny["message_bytes"]}


def pooled_transport_fit(tcp):
    """`tcp_r` and `message_s` from every job of the measurements `tcp`
    (`link_tcp_cost`; those around one link's cells), pooled: the median
    of all the large runs and of all the small ones, then one fit. A job's time (itself a median of 15
    exchanges) moves by up to 2x from one job to the next on this VM
    (16 MiB in 32 exchanges at 40 Gbit/s, a rank a node: 5.9-11.9 ms in 8
    jobs in a row; 2 ranks a node: 17-33 ms), so a fit from one job a
    measurement, three a run, swung the 10 Gbit/s rows of a table by 20-30
    points from run to run."""
    t0 = tcp[0]
    split = median([s for t in tcp for s in t["split_jobs_s"]])
    tiny = median([s for t in tcp for s in t["tiny_jobs_s"]])
    msg, byte = fit_messages(split, t0["split_received_bytes"], t0["messages"], tiny, t0["tiny_received_bytes"],
                             t0["messages"])
    return byte / t0["share"], msg / t0["share"], split, tiny


def fit_messages(big_s, big_bytes, big_messages, small_s, small_bytes, small_messages):
    """Seconds per message and per byte from two runs, a rank receiving
    `big_bytes` in `big_messages` messages in `big_s` and `small_bytes` in
    `small_messages` in `small_s`: T = messages·msg + bytes·byte, solved
    for both. Each at least 0: where noise makes one negative, the other
    is the run that holds the most of it alone (no cost per message: the
    big run's rate a byte; none per byte: the small run's cost a
    message)."""
    det = big_messages * small_bytes - big_bytes * small_messages
    msg = (big_s * small_bytes - big_bytes * small_s) / det
    byte = (big_messages * small_s - small_messages * big_s) / det
    if msg < 0:
        return 0.0, max(0.0, big_s / big_bytes)
    if byte < 0:
        return max(0.0, small_s / small_messages), 0.0
    return msg, byte


def measure_host(a, nodes, k, cores, i):
    """One measurement of what the model is given about the host: the
    runtime's kernels (16 Mi elements, 64 MiB of f32, and the ladder below
    it) on one thread pinned to one core, and the TCP stack's cost per byte
    across the emulated link (`link_tcp_cost`).

    One thread, not one a node at once: this VM's two cores slow each other
    when both compute (on one piece's buffers, in the caches, qgZ's
    quantization took 0.35 ns an element alone and 0.75-0.77 with a thread
    on the other core, the 16-bit cast 0.10 and 0.17-0.23), while the
    jobs' ranks interleave their kernels with their exchanges: with two
    threads at once the MPI path's kernels measured 0.5-0.8 of the model's
    in every 10 Gbit/s cell (docs/validation.md, table 1). Beside it,
    the same kernels on every core at once (`corun_kernels`), which the
    model gives the kernels that run in lockstep on every node."""
    path = os.path.join(a.out, f"host-kernels-1thread-{i}.json")
    sh(["taskset", "-c", "0", a.qsyncc, "host-kernels", "--threads", "1", "--elements", str(16 << 20), "-o", path])
    hk = json.load(open(path))
    hk["kernels"]["corun_by_size"] = corun_kernels(a, nodes * cores, i)
    hk["link"] = link_tcp_cost(a, nodes, k, cores)
    return hk


def corun_kernels(a, n, i):
    """The kernels' size ladder timed on every one of the emulated nodes'
    `n` cores at once, one process pinned to each (as the nodes' ranks
    are), every repetition of every kernel started in all of them together
    (`qsyncc host-kernels --corun N`), the medians over the processes:
    what a synchronization that runs its kernels in lockstep on every node
    meets (`SyncKernels::corun_by_size`). On this VM n-bit's
    unpack-accumulate ran 1.7-1.8x its rate alone so, its pack 1.17x,
    qgZ's quantization 1.0x, at some moments, and no slower at others
    (hence the median over the run's measurements); n-bit's decoding at 64
    MiB and 10 Gbit/s, a rank a node, measured 14.75 ms against 14.8
    predicted with the slower rates and 8.75 with the rates alone
    (docs/validation.md)."""
    path = os.path.join(a.out, f"host-kernels-corun-{i}.json")
    sh([a.qsyncc, "host-kernels", "--threads", "1", "--elements", str(16 << 20), "--corun", str(n), "-o", path])
    return json.load(open(path))["kernels"]["corun_by_size"]


def median(v):
    """The median of `v` (the mean of the middle two of an even count)."""
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def merged_median(values):
    """The median of several measurements of one structure, field by field
    through its objects and lists (the n-bit widths, the size ladder's
    rungs, whose sizes are the same in every measurement)."""
    first = values[0]
    if isinstance(first, dict):
        return {f: merged_median([v[f] for v in values]) for f in first}
    if isinstance(first, list):
        return [merged_median([v[i] for v in values]) for i in range(len(first))]
    return median(values)


def host_kernels(a, nodes, k, cores, measured, name="host-kernels-link.json",
                 when="spread over the validation run"):
    """The host-kernels file the model is given: the median, field by field,
    of `measured` (`measure_host`), taken at moments `when` — this
    machine's single-core rates drift by up to 2x over minutes, so one
    measurement taken before the runs does not describe them."""
    hk = json.loads(json.dumps(measured[0]))
    hk["kernels"] = merged_median([m["kernels"] for m in measured])
    loopback = hk["kernels"]["tcp_r"]
    tcp = [m["link"] for m in measured]
    tcp_r, msg_s, split_s, tiny_s = pooled_transport_fit(tcp)
    hk["kernels"]["tcp_r"] = tcp_r
    hk["kernels"]["message_s"] = msg_s
    del hk["link"]
    t0 = tcp[0]
    ms = lambda key: ", ".join(f"{t[key] * 1e3:.1f}" for t in tcp)
    socket_gbit = ", ".join(f"{t['socket_gbyte_s'] * 8:.3f}" for t in tcp)
    hk.setdefault("sources", {})["tcp_r"] = (
        f"scripts/validate/sync.py: the engine's all-to-all (sync-bench --collective all-to-all) of 16 MiB a rank "
        f"between 2 emulated nodes on a {t0['rate']} link, {k} ranks a node pinned to {cores} core(s), in 32 "
        f"exchanges ({t0['split_message_bytes']} B a peer), and 1 MiB a rank in 32 ({t0['tiny_message_bytes']} B "
        f"a peer), {len(tcp[0]['split_jobs_s'])} jobs of each at each of {len(tcp)} moments of the run: "
        f"{ms('split_s')} ms and {ms('tiny_s')} ms (the medians of each moment's jobs; of all "
        f"{sum(len(t['split_jobs_s']) for t in tcp)}: {split_s * 1e3:.1f} and {tiny_s * 1e3:.2f} ms; 16 MiB in 1 "
        f"exchange, for the record: {ms('one_s')} ms); fitted from the medians of all jobs, per byte "
        f"{tcp_r * 1e9:.3f} ns and per message {msg_s * 1e6:.1f} us (message_s), each as CPU time with "
        f"the node's {k} ranks sharing {cores} core(s). For the record: raw TCP, {k} streams each way, carried "
        f"{socket_gbit} Gbit/s a direction ({median([t['socket_r'] for t in tcp]) * 1e9:.3f} ns a byte); over "
        f"loopback host-kernels measured {loopback * 1e9:.3f}")
    hk["sources"]["message_s"] = "as tcp_r"
    hk["sources"]["kernels"] = (f"median of {len(measured)} `taskset -c 0 qsyncc host-kernels --threads 1 --elements "
                                f"16777216` runs (the fits, the rates at 1, 2, 4, 8 and 16 Mi elements and piece by piece; "
                                f"one core, one thread) {when}")
    hk["sources"]["corun_by_size"] = (f"median of {len(measured)} `qsyncc host-kernels --threads 1 --elements "
                                      f"16777216 --corun {nodes * cores}` runs {when}: one "
                                      f"process pinned to each of the emulated nodes' cores, every repetition of "
                                      f"every kernel started in all of them together, the median over the processes")
    host_file = os.path.join(a.out, name)
    json.dump(hk, open(host_file, "w"), indent=1)
    print(f"validate: the host transport costs {tcp_r * 1e9:.3f} ns a byte and {msg_s * 1e6:.1f} us a message "
          f"(loopback TCP: {loopback * 1e9:.3f} ns a byte); kernels: median of {len(measured)} measurements",
          file=sys.stderr, flush=True)
    return host_file


def cluster_toml(name, gpu, nodes, k, rate, m, cores, probe_ns=None):
    """A cluster file of the emulated cluster, every figure with its source;
    `probe_ns` the stream's core ns a byte at PROBE_RATE, measured around
    the link's cells (`link_tcp_cost`), the median (None: the link's own
    cost is left out, `nic_cpu_ns_per_byte` at its default 0)."""
    nic = ""
    if probe_ns is not None:
        nic_ns = max(0.0, m["stream_ns_per_byte"] - probe_ns)
        nic = f"nic_cpu_ns_per_byte = {nic_ns:.4f}\n"
        nic_source = (f"nic_cpu_ns_per_byte = \"measured: core 0's busy ns a byte node 0 moved while a TCP stream ran "
                      f"both ways between the nodes (node 0's end on core 0, node 1's on core 1; /proc/stat, less the "
                      f"span idle), {STREAM_SECONDS:.0f} s, the median of {STREAMS}: {m['stream_ns_per_byte']:.3f} at {rate}, less "
                      f"{probe_ns:.3f} at {PROBE_RATE} (the median around the cells), where the host transport is "
                      f"measured; at least 0\"\n")
    return f"""# The emulated cluster of scripts/netcluster.sh at {rate}, as measured by scripts/validate/sync.py.
name = "{name}"
[[group]]
gpu = "{gpu}"
nodes = {nodes}
gpus_per_node = {k}
nics_per_node = 1
nic_gbit_s = {m['nic_gbit']:.6f}
nic_latency_us = {m['inter_lat']:.1f}
intra_node = "loopback"
intra_node_gb_s = {m['intra_gb']:.4f}
intra_node_latency_us = {m['intra_lat']:.1f}
host_cores_per_node = {cores}
{nic}[group.sources]
nic_gbit_s = "tc tbf rate {rate} times the TCP payload share of a 1514-byte frame (1448/1514); for the record, {k} TCP streams each way at once between the unpinned nodes carried {m['both'] * 8:.3f} Gbit/s a direction"
host_cores_per_node = "netcluster.sh run --cpus-per-node {cores}: the node's ranks are pinned to {cores} core(s) of their own"
{nic_source if nic else ''}nic_latency_us = "measured: half the median round trip of a 1-byte TCP ping-pong between the nodes ({m['inter_gb']:.3f} GB/s bulk measured)"
intra_node_gb_s = "measured: best of 3 bulk TCP transfers of 512 MiB between two processes of one node (loopback)"
intra_node_latency_us = "measured: half the median round trip of a 1-byte TCP ping-pong inside one node"
"""


def predict(a, rows, device_file, host_files, out):
    """Each measured row next to `qsyncc simulate`'s prediction for the
    cluster file of its link (`--out`'s `cluster-RATE.toml`) and the host
    as measured around its link's cells (`host_files[rate]`), written to
    `out` as a line of JSON."""
    for row in rows:
        cluster = os.path.join(a.out, f"cluster-{row['rate']}.toml")
        host_file = host_files[row["rate"]]
        p = json.loads(sh([a.qsyncc, "simulate", "--cluster", cluster, "--device-file", device_file,
                           "--host-kernels", host_file, "--gradient", str(row["bytes"]), "--sync", row["scheme"],
                           "--sync-path", "mpi", "--json"]).stdout)
        row["predicted_s"] = p["seconds"]
        # One device type: its parts of the prediction (null for fp32).
        parts = p.get("per_type_breakdown") or {}
        row["breakdown"] = next(iter(parts.values()), None)
        row["error"] = row["predicted_s"] / row["measured_s"] - 1.0
        print(json.dumps(row), file=out, flush=True)
        print(f"{row['rate']:>7} {row['size']:>4} {row['scheme']:<14} measured {row['measured_s']:8.4f} s  "
              f"predicted {row['predicted_s']:8.4f} s ({row['error']:+.1%})", file=sys.stderr, flush=True)


def repredict(a):
    """Predict the rows `--out` holds again with this `qsyncc` (the model
    changed, the measurements stand): the same cluster files and host
    description as the run that measured them."""
    path = os.path.join(a.out, "sync.jsonl")
    try:
        rows = [json.loads(l) for l in open(path) if l.strip()]
    except (OSError, ValueError) as e:
        raise SystemExit(f"validate: --repredict: cannot read {path}: {e}")
    rates = sorted({x["rate"] for x in rows})
    for f in ["cpu-device.json"] + [f"cluster-{r}.toml" for r in rates] + [f"host-kernels-link-{r}.json" for r in rates]:
        if not os.path.exists(os.path.join(a.out, f)):
            raise SystemExit(f"validate: --repredict: {os.path.join(a.out, f)} is missing (measure first)")
    host_files = {r: os.path.join(a.out, f"host-kernels-link-{r}.json") for r in rates}
    with open(path + ".tmp", "w") as out:
        predict(a, rows, os.path.join(a.out, "cpu-device.json"), host_files, out)
    os.replace(path + ".tmp", path)


def bench_job(a, rate, size, scheme, k, cores, nodes):
    """One `sync-bench` job of `scheme` on the emulated cluster (fp32: the
    engine's own f32 all-reduce, timed in an fp16 job; the other schemes'
    jobs skip it): its median, its fastest and slowest iteration, its
    phases."""
    bench_scheme = "fp16" if scheme == "fp32" else scheme
    r = subprocess.run(["bash", NETCLUSTER, "run", "--prefix", a.prefix, "--ranks-per-node", str(k),
                        "--cpus-per-node", str(cores), "--timeout", "900", "--", a.qsyncc, "sync-bench", "--scheme",
                        bench_scheme, "--bytes", size, "--nodes", str(nodes), "--iterations", str(a.iterations),
                        "--warmup", "1", "--json"] + ([] if scheme == "fp32" else ["--skip-f32"]),
                       capture_output=True, text=True)
    line = next((l for l in r.stdout.splitlines() if l.startswith("{")), None)
    if r.returncode != 0 or line is None:
        raise SystemExit(f"validate: sync-bench {scheme} {size} at {rate} failed:\n{r.stdout}\n{r.stderr}")
    m = json.loads(line)
    fp32 = scheme == "fp32"
    return {"s": m["f32_allreduce_seconds"] if fp32 else m["seconds"],
            "range": m.get("f32_allreduce_seconds_range" if fp32 else "seconds_range"),
            "phases": m.get("phases"), "wire_fraction": m.get("wire_fraction")}


def measure_cell(a, rate, size, k, cores, nodes):
    """Every scheme of one cell (`rate`, `size`), in `--rounds` rounds of
    one job a scheme, the schemes in the same order in every round: a row
    a scheme, its time the median of its jobs' medians, its range the
    fastest and the slowest iteration of all its jobs, its phases those of
    its median job. One job a scheme (until 2026-12-02) left a row to the
    moment it ran: n-bit 4-bit at 8 MiB and 10 Gbit/s, one rank a node,
    measured 16.5 ms in a validation run and 4.9 ms in each of 3 jobs
    right after it, on the same links (docs/validation.md, table 1b)."""
    schemes = a.schemes.split(",")
    jobs = {s: [] for s in schemes}
    t0 = time.time()
    for rnd in range(a.rounds):
        for scheme in schemes:
            job = bench_job(a, rate, size, scheme, k, cores, nodes)
            jobs[scheme].append(job)
            print(f"{rate:>7} {size:>4} {scheme:<14} round {rnd + 1}/{a.rounds}: {job['s']:8.4f} s",
                  file=sys.stderr, flush=True)
    rows = []
    for scheme in schemes:
        js = sorted(jobs[scheme], key=lambda j: j["s"])
        mid = js[(len(js) - 1) // 2]
        ranges = [j["range"] for j in js if j["range"]]
        rows.append({"rate": rate, "size": size, "bytes": parse_size(size), "scheme": scheme, "ranks": nodes * k,
                     "measured_s": median([j["s"] for j in js]), "measured_jobs_s": [j["s"] for j in jobs[scheme]],
                     "measured_range_s": [min(r[0] for r in ranges), max(r[1] for r in ranges)] if ranges else None,
                     "phases": mid["phases"], "wire_fraction": mid["wire_fraction"],
                     "cell_wall_s": round(time.time() - t0, 1)})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qsyncc", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rates", default="1gbit,10gbit")
    ap.add_argument("--sizes", default="8M,64M")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--ranks-per-node", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3,
                    help="jobs a scheme in every cell, the schemes taking turns (a row is the median job)")
    ap.add_argument("--delay-ms", default="0")
    ap.add_argument("--prefix", default="qsv")
    ap.add_argument("--subnet", default="10.88.7")
    ap.add_argument("--repredict", action="store_true",
                    help="measure nothing: predict the rows --out holds again with this qsyncc")
    a = ap.parse_args()
    if a.repredict:
        return repredict(a)
    if a.rounds < 1 or a.iterations < 1:
        raise SystemExit(f"validate: --rounds and --iterations must be at least 1 (got {a.rounds}, {a.iterations})")
    os.makedirs(a.out, exist_ok=True)
    nodes, k = 2, a.ranks_per_node
    out = open(os.path.join(a.out, "sync.jsonl"), "w")
    cores = max(1, (os.cpu_count() or 1) // nodes)
    hosts = [measure_host(a, nodes, k, cores, 0)]
    device_file = os.path.join(a.out, "cpu-device.json")
    # The emulated nodes' device: this CPU, described as a qsync device
    # (only its network and kernels matter to a synchronization).
    dev = {
        "name": "cpu-host", "full_name": "this machine's CPU (emulated nodes)", "arch": "cpu",
        "memory_bytes": 1 << 34, "memory_bandwidth_gb_s": 10, "cuda_core_tflops": {"fp32": 0.1},
        "supported_precisions": ["fp32"], "intra_node": {"kind": "pcie", "bandwidth_gb_s": 10},
        "network_gbit_s": 1, "launch_overhead_us": 5, "workspace_bytes": 0,
        "efficiency": {"tensor_core": 1, "cuda_core": 1, "memory": 1},
    }
    why = "not used: a synchronization is priced from the cluster file's links and --host-kernels alone"
    dev["sources"] = {k: why for k in ["arch", "memory_bytes", "memory_bandwidth_gb_s", "cuda_core_tflops.fp32",
                                       "intra_node", "network_gbit_s", "launch_overhead_us", "workspace_bytes",
                                       "efficiency"]}
    json.dump(dev, open(device_file, "w"), indent=1)
    rows, links = [], {}
    for i, rate in enumerate(a.rates.split(",")):
        if i > 0:
            hosts.append(measure_host(a, nodes, k, cores, len(hosts)))
        sh(["bash", NETCLUSTER, "down", "--prefix", a.prefix])
        sh(["bash", NETCLUSTER, "up", "--nodes", str(nodes), "--rate", rate, "--delay-ms", a.delay_ms,
            "--prefix", a.prefix, "--subnet", a.subnet])
        try:
            ns0, ns1 = f"{a.prefix}0", f"{a.prefix}1"
            addr0 = f"{a.subnet}.2"  # node 0 (netcluster.sh: node i is SUBNET.(i+2))
            links[rate] = measure_links([ns0, ns1], [addr0, f"{a.subnet}.3"], rate, k)
            for size in a.sizes.split(","):
                rows += measure_cell(a, rate, size, k, cores, nodes)
        finally:
            subprocess.run(["bash", NETCLUSTER, "down", "--prefix", a.prefix])
    hosts.append(measure_host(a, nodes, k, cores, len(hosts)))
    # Each link's cells ran between two host measurements, the one just
    # before them and the one just after (hosts[i], hosts[i + 1]), and are
    # predicted from those two: over a run this machine's transport drifted
    # by up to 1.7x between moments (16 MiB in 32 exchanges at 40 Gbit/s,
    # the median of 5 jobs a moment: 20.3, 33.4 and 30.3 ms, 2 ranks a
    # node), so the medians over the whole run, which every cell was given
    # until 2026-12-02, priced the 10 Gbit/s cells with the fast start of
    # a run whose 10 Gbit/s cells ran slow.
    for i, rate in enumerate(a.rates.split(",")):
        probe_ns = median([h["link"]["stream_ns_per_byte"] for h in hosts[i:i + 2]])
        with open(os.path.join(a.out, f"cluster-{rate}.toml"), "w") as f:
            f.write(cluster_toml(f"netcluster-{rate}", "cpu-host", nodes, k, rate, links[rate], cores, probe_ns))
    host_files = {rate: host_kernels(a, nodes, k, cores, hosts[i:i + 2], name=f"host-kernels-link-{rate}.json",
                                     when=f"taken just before and just after the {rate} cells")
                  for i, rate in enumerate(a.rates.split(","))}
    predict(a, rows, device_file, host_files, out)
    out.close()


if __name__ == "__main__":
    main()
