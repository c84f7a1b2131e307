#!/usr/bin/env python3
"""Render OUT/iterations.jsonl (scripts/validate/iterations.py) as markdown:
per link and model, each hook's measured backward (with and without
synchronization), the measured and predicted exposed synchronization, the
predicted backward and its error; then whether `--sync auto` named the
scheme that measured fastest.

    python3 scripts/validate/render_iterations.py target/validate/iterations.jsonl
"""
import json
import statistics
import sys
from collections import OrderedDict


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    print("| link | model | hook | backward s | no-sync backward s | exposed sync s | predicted exposed s | predicted backward s | error |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    cells = OrderedDict()
    for r in rows:
        cells.setdefault((r["rate"], r["model"]), r)
        print(f"| {r['rate']} | {r['model']} | {r['hook']} | {r['backward_s']:.4f} | {r['no_sync_backward_s']:.4f} | "
              f"{r['exposed_s']:.4f} | {r['predicted_exposed_s']:.4f} | {r['predicted_backward_s']:.4f} | {r['error']:+.1%} |")
    errs = [abs(r["error"]) for r in rows]
    print()
    print(f"Backward time: median |error| {statistics.median(errs):.1%}, worst {max(errs):.1%}.")
    print()
    print("| link | model | `--sync auto` chose | fastest measured | agree |")
    print("|---|---|---|---|---|")
    for (rate, model), r in cells.items():
        print(f"| {rate} | {model} | {r['auto']} | {r['measured_fastest']} | {'yes' if r['auto'] == r['measured_fastest'] else 'no'} |")


if __name__ == "__main__":
    main()
