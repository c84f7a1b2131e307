#!/usr/bin/env python3
"""What an emulated node's shaped link costs its core (docs/validation.md, table 1's notes).

    python3 scripts/validate/link_cpu.py --qsyncc target/release/qsyncc [--rates 200mbit,1gbit,10gbit]
        [--seconds 6] [--out target/validate/link-cpu.jsonl]

For each rate, a 2-node emulated cluster (scripts/netcluster.sh), and a
TCP stream both ways between node 0's process, pinned to core 0, and
node 1's, pinned to core 1, for `--seconds`: the core-0 time the stream
took (user, system and softirq from /proc/stat, less the same span idle)
per byte the node sent and received, next to the stream process's own CPU
(getrusage). Then `qsyncc host-kernels` on core 0, 5 times alone, 5
times beside the stream (the kernels' rates as a synchronization meets
them when its rank's own sockets move bytes on that core at that rate),
and 5 times with both ends of the stream on core 1 (what the bytes cost
a core whose sockets do not move them).

The cost a byte is the link's as emulated (tc's rate limit, and the
veth's GSO size, which netcluster.sh lowers on slow links), not
necessarily a NIC's, which paces and segments in hardware. Run as root;
it builds and removes its own namespaces (`--prefix qlc`, `--subnet
10.88.11`).
"""
import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from iterations import NETCLUSTER, nodes_up  # noqa: E402
from sync import sh  # noqa: E402

PORT = 29611
KERNELS = ["quantize_r", "cast16_r", "sum_r", "nbit_pack_r"]


def stream(role, me, peer, secs):
    """One end of the stream: send and receive 1 MiB writes for `secs`,
    then print a JSON line of the bytes each way and this process's CPU."""
    buf = b"\0" * (1 << 20)
    if role == "server":
        lis = socket.socket()
        lis.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lis.bind((me, PORT))
        lis.listen(1)
        lis.settimeout(30)
        s, _ = lis.accept()
    else:
        for _ in range(600):
            try:
                s = socket.create_connection((peer, PORT), timeout=30)
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise SystemExit(f"link_cpu: cannot reach {peer}:{PORT}")
    got = [0]

    def recv():
        while True:
            d = s.recv(1 << 20)
            if not d:
                return
            got[0] += len(d)

    t = threading.Thread(target=recv)
    t.start()
    sent, end = 0, time.monotonic() + secs
    while time.monotonic() < end:
        s.sendall(buf)
        sent += len(buf)
    s.shutdown(socket.SHUT_WR)
    t.join()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"role": role, "sent": sent, "received": got[0], "user_s": ru.ru_utime, "sys_s": ru.ru_stime}),
          flush=True)


def core_ticks(core):
    """Core `core`'s busy and total ticks from /proc/stat (busy: user,
    nice, system, irq, softirq, steal), and its softirq ticks."""
    for line in open("/proc/stat"):
        f = line.split()
        if f[0] == f"cpu{core}":
            v = [int(x) for x in f[1:]]
            busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
            return busy, sum(v[:8]), v[6]
    raise SystemExit(f"link_cpu: no cpu{core} in /proc/stat")


def start_stream(ns, addr, secs, cores=(0, 1)):
    """Both ends of the stream (`ns`, `addr`: `nodes_up`'s), node 0's on
    core `cores[0]` and node 1's on core `cores[1]`; the processes and the
    moment the stream ends (time.monotonic)."""
    me = os.path.abspath(__file__)
    ends = [("server", addr[0], addr[1]), ("client", addr[1], addr[0])]
    procs = [subprocess.Popen(["ip", "netns", "exec", ns[i], "taskset", "-c", str(cores[i]), sys.executable, me,
                               "--stream", role, mine, peer, str(secs)], stdout=subprocess.PIPE, text=True)
             for i, (role, mine, peer) in enumerate(ends)]
    return procs, time.monotonic() + secs


def finish(procs):
    """The stream's two JSON lines (server first), once both ends exit."""
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise SystemExit("link_cpu: the stream did not end within 120 s")
    if any(p.returncode != 0 for p in procs):
        raise SystemExit("link_cpu: the stream failed")
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def kernels_beside(a, ns, addr, cores, alone_s, tag, tmp):
    """`kernels` while the stream runs with its ends on `cores`, the stream
    lasting 4 times the `alone_s` the same kernels took alone, and 2 s;
    refused if the kernels outlasted it."""
    secs = 2.0 + 4.0 * alone_s
    procs, stream_end = start_stream(ns, addr, secs, cores)
    time.sleep(1.0)
    rates = kernels(a, 5, tag, tmp)
    late = time.monotonic() > stream_end
    finish(procs)
    if late:
        raise SystemExit(f"link_cpu: {tag}: the kernels took over 4 times as long as alone, "
                         f"and outlasted the stream ({secs:.0f} s)")
    return rates


def kernels(a, n, tag, tmp):
    """`qsyncc host-kernels` on core 0, `n` times: each kernel's median
    rate (ns an element)."""
    runs = []
    for i in range(n):
        path = os.path.join(tmp, f"{tag}-{i}.json")
        sh(["taskset", "-c", "0", a.qsyncc, "host-kernels", "--threads", "1", "--elements", str(2 << 20), "-o", path])
        runs.append(json.load(open(path))["kernels"])
    rate = lambda k: k if isinstance(k, (int, float)) else statistics.median(k)
    return {k: statistics.median(rate(r[k]) for r in runs) * 1e9 for k in KERNELS}


def stream_cpu(ns, addr, secs):
    """What the stream costs core 0 on the emulated nodes `ns` (`addr`
    their addresses) over `secs`: core 0's busy time (/proc/stat, less
    what the same span measured idle just before), its softirq time, the
    bytes node 0 moved (sent and received) and the busy ns a byte moved;
    the stream's two ends pinned to cores 0 and 1 (`start_stream`)."""
    b0, t0, _ = core_ticks(0)
    time.sleep(secs)
    b1, t1, _ = core_ticks(0)
    idle_share = (b1 - b0) / max(1, t1 - t0)
    b0, t0, s0 = core_ticks(0)
    ends = finish(start_stream(ns, addr, secs)[0])
    b1, t1, s1 = core_ticks(0)
    tick = os.sysconf("SC_CLK_TCK")
    busy = ((b1 - b0) - idle_share * (t1 - t0)) / tick
    moved = ends[0]["sent"] + ends[0]["received"]
    return {"server": ends[0], "core_busy_s": busy, "core_softirq_s": (s1 - s0) / tick, "moved_bytes": moved,
            "core_ns_per_byte": busy / max(1, moved) * 1e9}


def one_rate(a, rate, tmp):
    ns, addr = nodes_up(a, 2, rate)
    try:
        gso = sh(["ip", "netns", "exec", ns[0], "ip", "-d", "-j", "link", "show"]).stdout
        gso = max((l.get("gso_max_size", 0) for l in json.loads(gso) if l.get("ifname") != "lo"), default=0)
        m = stream_cpu(ns, addr, a.seconds)
        srv = m["server"]
        t = time.monotonic()
        alone = kernels(a, 5, f"alone-{rate}", tmp)
        alone_s = time.monotonic() - t
        beside = kernels_beside(a, ns, addr, (0, 1), alone_s, f"beside-{rate}", tmp)
        # Both ends on core 1: what the bytes cost a core whose sockets
        # do not move them (interrupts, softirqs landing elsewhere).
        elsewhere = kernels_beside(a, ns, addr, (1, 1), alone_s, f"elsewhere-{rate}", tmp)
    finally:
        subprocess.run(["bash", NETCLUSTER, "down", "--prefix", a.prefix], capture_output=True)
    return {"rate": rate, "seconds": a.seconds, "gso_max_size": gso,
            "gbit_s_each_way": [srv["sent"] * 8 / a.seconds / 1e9, srv["received"] * 8 / a.seconds / 1e9],
            "core_busy_s": m["core_busy_s"], "core_softirq_s": m["core_softirq_s"],
            "process_cpu_s": srv["user_s"] + srv["sys_s"], "core_ns_per_byte": m["core_ns_per_byte"],
            "process_ns_per_byte": (srv["user_s"] + srv["sys_s"]) / m["moved_bytes"] * 1e9,
            "kernels_alone_ns": alone, "kernels_beside_ns": beside, "kernels_elsewhere_ns": elsewhere,
            "slowdown": {k: beside[k] / alone[k] for k in KERNELS},
            "slowdown_elsewhere": {k: elsewhere[k] / alone[k] for k in KERNELS}}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--stream":
        return stream(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--qsyncc", required=True)
    ap.add_argument("--rates", default="200mbit,1gbit,10gbit")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--out", default="target/validate/link-cpu.jsonl")
    ap.add_argument("--prefix", default="qlc")
    ap.add_argument("--subnet", default="10.88.11")
    a = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("link_cpu: needs 2 cores (one a node)")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, open(a.out, "w") as out:
        for rate in a.rates.split(","):
            r = one_rate(a, rate, tmp)
            print(json.dumps(r), file=out, flush=True)
            print(f"{rate:>8}: {r['gbit_s_each_way'][0]:.2f}/{r['gbit_s_each_way'][1]:.2f} Gbit/s each way, "
                  f"GSO {r['gso_max_size']} B; core 0 busy {r['core_busy_s']:.2f} s of {a.seconds:.0f} "
                  f"({r['core_ns_per_byte']:.2f} ns a byte moved; the process itself {r['process_ns_per_byte']:.2f}); "
                  "kernels beside it / alone: "
                  + ", ".join(f"{k} {r['slowdown'][k]:.2f}x" for k in KERNELS)
                  + "; with the stream on core 1 only: "
                  + ", ".join(f"{k} {r['slowdown_elsewhere'][k]:.2f}x" for k in KERNELS), flush=True)


if __name__ == "__main__":
    main()
