#!/usr/bin/env python3
"""Render OUT/sync.jsonl (scripts/validate/sync.py) as the markdown table of
docs/validation.md: per rate and size, every scheme's measured and predicted
seconds and the error, and for every cell off by more than 10% where the
time went: the measured phases (sync-bench's kernels: quantize and
dequantize; communication: exchange and wait; other) against the
prediction's parts (`simulate`'s per-type breakdown); then the goals
(median |error| <= 10%, worst <= 25%, the same ranking of schemes as
measured in every cell), each checked. The ranking is also checked over
the pairs of schemes this run tells apart (each one's slowest timed
iteration faster than the other's fastest): a pair whose timings overlap
has no measured order to match.

    python3 scripts/validate/render_sync.py target/validate/sync.jsonl
"""
import json
import os
import statistics
import sys
from collections import defaultdict


def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0] * len(values)
    for pos, i in enumerate(order):
        r[i] = pos + 1
    return r


def why(r):
    """Where a cell's error comes from: the part whose measured seconds
    differ most from the predicted ones, with the other part's gap."""
    if abs(r["error"]) <= 0.10:
        return ""
    ph, b = r.get("phases"), r.get("breakdown")
    if not ph or not b:
        return "one engine call: no phases to compare" if r["scheme"] == "fp32" else "no phases recorded"
    # The phases are the mean over the timed synchronizations, the measured
    # time their median: scale the phases to the measured time.
    scale = r["measured_s"] / ph["total_s"] if ph["total_s"] > 0 else 1.0
    kern_m = (ph["quantize_s"] + ph["dequantize_s"]) * scale
    comm_m = (ph["exchange_s"] + ph["wait_s"] + ph["other_s"]) * scale
    kern_p = b["kernel_seconds"]
    comm_p = max(r["predicted_s"] - kern_p, 0.0)
    parts = [("kernels", kern_m, kern_p), ("communication", comm_m, comm_p)]
    parts.sort(key=lambda x: -abs(x[1] - x[2]))

    def show(name, m, p):
        ratio = f" ({m / p:.1f}×)" if p > 0 else ""
        return f"{name} {m:.3f} s vs {p:.3f}{ratio}"

    return "; ".join(show(*x) for x in parts)


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    cells = defaultdict(list)
    for r in rows:
        cells[(r["rate"], r["size"])].append(r)
    out = []
    out.append("| link | size | scheme | measured s | predicted s | error | rank measured | rank predicted "
               "| where the error is (measured vs predicted) |")
    out.append("|---|---|---|---:|---:|---:|---:|---:|---|")
    errors, misranked = [], []
    for (rate, size), rs in cells.items():
        rm = ranks([r["measured_s"] for r in rs])
        rp = ranks([r["predicted_s"] for r in rs])
        if rm != rp:
            misranked.append(f"{rate} {size}")
        for r, a, b in zip(rs, rm, rp):
            errors.append(abs(r["error"]))
            out.append(f"| {rate} | {size} | {r['scheme']} | {r['measured_s']:.4f} | {r['predicted_s']:.4f} | "
                       f"{r['error']:+.1%} | {a} | {b}{'' if a == b else ' ✗'} | {why(r)} |")
    # Pairs told apart by the measurement, and those the prediction orders
    # the other way.
    apart, wrong = 0, []
    for (rate, size), rs in cells.items():
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                ra, rb = a.get("measured_range_s"), b.get("measured_range_s")
                if not ra or not rb:
                    continue
                if ra[1] < rb[0]:
                    fast, slow = a, b
                elif rb[1] < ra[0]:
                    fast, slow = b, a
                else:
                    continue
                apart += 1
                if fast["predicted_s"] >= slow["predicted_s"]:
                    wrong.append(f"{rate} {size}: {fast['scheme']} < {slow['scheme']}")
    med, worst = statistics.median(errors), max(errors)
    out.append("")
    out.append(f"Median |error| {med:.1%} (goal ≤ 10%: {'met' if med <= 0.10 else 'NOT met'}); "
               f"worst {worst:.1%} (goal ≤ 25%: {'met' if worst <= 0.25 else 'NOT met'}); "
               f"ranking of schemes as measured in {len(cells) - len(misranked)} of {len(cells)} cells"
               + (f" (differs in: {', '.join(misranked)})" if misranked else "") + ".")
    if apart:
        out.append("")
        out.append(f"Pairs of schemes the measurement tells apart (timing ranges disjoint): {apart}; "
                   f"ordered as measured by the prediction: {apart - len(wrong)}"
                   + (f"; the other way round (measured faster first): {'; '.join(wrong)}" if wrong else "") + ".")
    jobs = [r["measured_jobs_s"] for r in rows if len(r.get("measured_jobs_s") or []) > 1]
    if jobs:
        spread = sorted(max(j) / min(j) for j in jobs)
        out.append("")
        out.append(f"Each row is the median of {len(jobs[0])} jobs' medians, the schemes taking turns; a row's "
                   f"slowest job over its fastest: median {statistics.median(spread):.2f}x, largest "
                   f"{spread[-1]:.2f}x.")
    nic = nic_costs(os.path.dirname(os.path.abspath(sys.argv[1])))
    if nic:
        out.append("")
        out.append(nic)
    drift = host_drift(os.path.dirname(os.path.abspath(sys.argv[1])))
    if drift:
        out.append("")
        out.append(drift)
    print("\n".join(out))


def nic_costs(folder):
    """A line on what each link cost the nodes' cores beyond the transport
    (the cluster files' `nic_cpu_ns_per_byte`, sync.py), or None."""
    parts = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("cluster-") and name.endswith(".toml"):
            for line in open(os.path.join(folder, name)):
                if line.startswith("[group.sources]"):
                    break
                if line.startswith("nic_cpu_ns_per_byte"):
                    parts.append(f"{name[8:-5]} {float(line.split('=')[1]):.2f} ns")
    if not parts:
        return None
    return ("What each link cost a node's core a byte sent or received beyond the host transport, as measured "
            "beside the cells and given to the model (`nic_cpu_ns_per_byte`): " + ", ".join(parts) + ".")


def host_drift(folder):
    """A line on how this machine's kernels moved over the run: the rates of
    the host measurements `sync.py` spread over it (`host-kernels-1thread-N.json`
    beside the rows), in the order taken, each link's cells predicted from
    the two around them; None where they are not there."""
    runs = []
    for i in range(16):
        path = os.path.join(folder, f"host-kernels-1thread-{i}.json")
        if not os.path.exists(path):
            break
        runs.append(json.load(open(path))["kernels"])
    if len(runs) < 2:
        return None
    shown = [("quantize_r", "qgZ's int8 quantization"), ("cast16_r", "the 16-bit cast"), ("sum_r", "the f32 sum")]
    parts = []
    for key, name in shown:
        v = [r[key] * 1e9 for r in runs if r.get(key)]
        if len(v) == len(runs):
            parts.append(f"{name} {', '.join(f'{x:.2f}' for x in v)} ns an element ({max(v) / min(v):.2f}x apart)")
    if not parts:
        return None
    return (f"The host's kernels, measured {len(runs)} times over the run (one core alone; each link's cells "
            f"are given the mean of the measurements just before and just after them, as is the transport's "
            f"cost): " + "; ".join(parts) + ".")


if __name__ == "__main__":
    main()
