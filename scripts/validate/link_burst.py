#!/usr/bin/env python3
"""What an emulated link lets through after an idle moment (root).

    python3 scripts/validate/link_burst.py [--rate 200mbit] [--reps 7]

Brings up 2 emulated nodes (scripts/netcluster.sh) at `--rate`, then, from
node 1 to node 0 over one TCP connection, sends 16 KiB to 1 MiB after 50
ms of quiet and times each transfer until the receiver's one-byte answer.
Prints, per size, the median time against the link time at the TCP
payload share of the rate: a NIC never sends faster than its rate, so a
ratio well under 1 is a burst the emulation lets through that a real link
would not. Takes the nodes down at the end, also on failure.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from iterations import nodes_up  # noqa: E402
from sync import NETCLUSTER, TCP_PAYLOAD_SHARE, parse_rate  # noqa: E402

SIZES = [16 << 10, 64 << 10, 128 << 10, 256 << 10, 1 << 20]


def serve(host, port):
    """Node 0: receive `n` bytes after an 8-byte length, answer one byte."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(1)
    conn, _ = srv.accept()
    with conn, srv:
        while True:
            head = conn.recv(8, socket.MSG_WAITALL)
            if len(head) < 8:
                return
            left = int.from_bytes(head, "little")
            while left:
                got = conn.recv(min(1 << 20, left))
                if not got:
                    return
                left -= len(got)
            conn.sendall(b"k")


def send(host, port, reps, bits_per_s):
    """Node 1: each size `reps` times after 50 ms of quiet; one line a size."""
    with socket.create_connection((host, port)) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for n in SIZES:
            times = []
            for _ in range(reps):
                time.sleep(0.05)
                t = time.perf_counter()
                c.sendall(n.to_bytes(8, "little") + bytes(n))
                c.recv(1)
                times.append(time.perf_counter() - t)
            link = n * 8 / (bits_per_s * TCP_PAYLOAD_SHARE)
            med = statistics.median(times)
            print(f"{n >> 10:5d} KiB: {med * 1e3:7.2f} ms, link time {link * 1e3:7.2f} ms, ratio {med / link:.2f}",
                  flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--prefix", default="qlb")
    ap.add_argument("--subnet", default="10.88.12")
    ap.add_argument("--role", choices=["serve", "send"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=5701)
    a = ap.parse_args()
    host = f"{a.subnet}.2"
    if a.role == "serve":
        return serve(host, a.port)
    if a.role == "send":
        return send(host, a.port, a.reps, parse_rate(a.rate) * 1e9)
    ns, _ = nodes_up(a, 2, a.rate)
    try:
        me = [sys.executable, os.path.abspath(__file__), "--subnet", a.subnet, "--port", str(a.port),
              "--reps", str(a.reps), "--rate", a.rate]
        server = subprocess.Popen(["ip", "netns", "exec", ns[0], *me, "--role", "serve"])
        time.sleep(0.5)
        print(f"link_burst: {a.rate}, after 50 ms of quiet (median of {a.reps})")
        subprocess.run(["ip", "netns", "exec", ns[1], *me, "--role", "send"], check=True)
        server.wait(timeout=30)
    finally:
        subprocess.run(["bash", NETCLUSTER, "down", "--prefix", a.prefix], check=False)


if __name__ == "__main__":
    main()
