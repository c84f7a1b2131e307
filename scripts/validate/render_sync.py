#!/usr/bin/env python3
"""Render OUT/sync.jsonl (scripts/validate/sync.py) as the markdown table of
docs/validation.md: per rate and size, every scheme's measured and predicted
seconds and the error; then the goals (median |error| <= 10%, worst <= 25%,
the same ranking of schemes as measured in every cell), each checked.

    python3 scripts/validate/render_sync.py target/validate/sync.jsonl
"""
import json
import statistics
import sys
from collections import defaultdict


def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0] * len(values)
    for pos, i in enumerate(order):
        r[i] = pos + 1
    return r


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    cells = defaultdict(list)
    for r in rows:
        cells[(r["rate"], r["size"])].append(r)
    out = []
    out.append("| link | size | scheme | measured s | predicted s | error | rank measured | rank predicted |")
    out.append("|---|---|---|---:|---:|---:|---:|---:|")
    errors, misranked = [], []
    for (rate, size), rs in cells.items():
        rm = ranks([r["measured_s"] for r in rs])
        rp = ranks([r["predicted_s"] for r in rs])
        if rm != rp:
            misranked.append(f"{rate} {size}")
        for r, a, b in zip(rs, rm, rp):
            errors.append(abs(r["error"]))
            out.append(f"| {rate} | {size} | {r['scheme']} | {r['measured_s']:.4f} | {r['predicted_s']:.4f} | "
                       f"{r['error']:+.1%} | {a} | {b}{'' if a == b else ' ✗'} |")
    med, worst = statistics.median(errors), max(errors)
    out.append("")
    out.append(f"Median |error| {med:.1%} (goal ≤ 10%: {'met' if med <= 0.10 else 'NOT met'}); "
               f"worst {worst:.1%} (goal ≤ 25%: {'met' if worst <= 0.25 else 'NOT met'}); "
               f"ranking of schemes as measured in {len(cells) - len(misranked)} of {len(cells)} cells"
               + (f" (differs in: {', '.join(misranked)})" if misranked else "") + ".")
    print("\n".join(out))


if __name__ == "__main__":
    main()
