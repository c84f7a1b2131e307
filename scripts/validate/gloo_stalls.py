#!/usr/bin/env python3
"""How long a tiny collective takes, call by call: the spread the model's
per-round figures average over (docs/validation.md, table 3).

    torchrun --nnodes 2 ... scripts/validate/gloo_stalls.py [--calls 400]

Under torchrun with the gloo backend (2 ranks or more), times `--calls`
calls, one at a time, of: qsync's TorchTransport all-gather of 8 bytes a
rank (gloo's ring), its all-to-all of 8 bytes a peer (the flat form the
hooks use with one rank a node), gloo's own all-reduce of 2 floats, and,
between ranks 0 and 1, a TCP ping-pong of 8 bytes over a plain socket
(TCP_NODELAY, one thread a side), the same path without gloo's threads.
Rank 0 prints one JSON line: per operation the median, the 90th and 99th
percentiles, the largest and the mean call (µs), and how many calls took
longer than 1 ms.
"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist

from qsync._transport import TorchTransport


def spread(times_s):
    t = sorted(x * 1e6 for x in times_s)
    n = len(t)
    return {"median_us": round(t[n // 2], 1), "p90_us": round(t[int(0.9 * n)], 1), "p99_us": round(t[int(0.99 * n)], 1),
            "max_us": round(t[-1], 1), "mean_us": round(sum(t) / n, 1), "over_1ms": sum(x > 1000 for x in t),
            "calls": n}


def timed(run, calls, warmup=10):
    for _ in range(warmup):
        run()
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        run()
        out.append(time.perf_counter() - t)
    return out


def ping_pong(rank, calls, port):
    """Rank 1 sends 8 bytes to rank 0, which sends them back: the round
    trips as rank 1 times them (other ranks: None). Every rank calls it."""
    addr = os.environ["MASTER_ADDR"]
    srv = None
    if rank == 0:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((addr, port))
        srv.listen(1)
    dist.barrier()  # rank 0 listens
    got = None
    if rank == 0:
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn, srv:
            while conn.recv(8):
                conn.sendall(b"8 bytes!")
    elif rank == 1:
        with socket.create_connection((addr, port)) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def once():
                c.sendall(b"8 bytes!")
                c.recv(8)

            got = timed(once, calls)
    dist.barrier()
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--port", type=int, default=29611, help="the ping-pong's port on rank 0's address")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    tr = TorchTransport()
    tr.flat_gather = False  # the all-gather through gloo's ring
    p, rank = tr.size, tr.rank
    if p < 2:
        raise SystemExit("gloo_stalls: run it on 2 ranks or more (the ping-pong pairs ranks 0 and 1)")
    few, all_few = bytearray(8), bytearray(8 * p)
    send, recv = bytearray(8 * p), bytearray(8 * p)
    x = torch.ones(2)
    out = {"ranks": p}
    out["transport_all_gather"] = spread(timed(lambda: tr.all_gather(few, all_few, [8] * p, 60.0), a.calls))
    out["transport_all_to_all"] = spread(timed(lambda: tr.all_to_all_v(send, [8] * p, recv, [8] * p, 60.0), a.calls))
    out["gloo_all_reduce"] = spread(timed(lambda: dist.all_reduce(x), a.calls))
    got = ping_pong(rank, a.calls, a.port)
    # Rank 1's round trips to rank 0, who prints.
    pp = torch.zeros(a.calls, dtype=torch.float64)
    if rank == 1:
        pp = torch.tensor(got, dtype=torch.float64)
    dist.broadcast(pp, src=1)
    out["socket_ping_pong"] = spread(pp.tolist())
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
