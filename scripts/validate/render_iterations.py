#!/usr/bin/env python3
"""Render OUT/iterations.jsonl (scripts/validate/iterations.py) as markdown:
per link and model, each hook's measured backward (with and without
synchronization; the range of its rounds beside the median, and whether
the prediction falls in it), the measured and predicted exposed
synchronization, the predicted backward and its error; then whether
`--sync auto` named the scheme that measured fastest.

    python3 scripts/validate/render_iterations.py target/validate/iterations.jsonl
"""
import json
import statistics
import sys
from collections import OrderedDict


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    print("| link | model | hook | backward s | rounds s | no-sync backward s | exposed sync s | predicted exposed s "
          "| predicted backward s | error |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    cells = OrderedDict()
    inside = 0  # rows whose prediction falls in their rounds' range
    for r in rows:
        cells.setdefault((r["rate"], r["model"]), r)
        spread, mark = "—", ""
        if r.get("rounds_s"):
            lo, hi = min(r["rounds_s"]), max(r["rounds_s"])
            spread = f"{lo:.4f}–{hi:.4f}"
            if lo <= r["predicted_backward_s"] <= hi:
                inside += 1
                mark = " ◦"
        print(f"| {r['rate']} | {r['model']} | {r['hook']} | {r['backward_s']:.4f} | {spread} | "
              f"{r['no_sync_backward_s']:.4f} | {r['exposed_s']:.4f} | {r['predicted_exposed_s']:.4f} | "
              f"{r['predicted_backward_s']:.4f}{mark} | {r['error']:+.1%} |")
    errs = [abs(r["error"]) for r in rows]
    print()
    print(f"Backward time: median |error| {statistics.median(errs):.1%}, worst {max(errs):.1%}. "
          f"The prediction lies within the backward's range over its rounds (`rounds s`: each round's slowest rank; "
          f"marked ◦) in {inside} of {len(rows)} rows.")
    print()
    print("| link | model | `--sync auto` chose | fastest measured | agree | rounds the choice was at least as fast |")
    print("|---|---|---|---|---|---:|")
    hook = {(r["rate"], r["model"], "fp32" if r["hook"] == "ddp" else r["hook"]): r for r in rows}
    agree = within = 0
    for (rate, model), r in cells.items():
        chose, fastest = hook.get((rate, model, r["auto"])), hook.get((rate, model, r["measured_fastest"]))
        same = r["auto"] == r["measured_fastest"]
        agree += same
        rounds = "—"
        if not same and chose and fastest and "rounds_s" in chose and "rounds_s" in fastest:
            # Hooks of different jobs (`ddp_rounds_s` beside each): compared
            # by the ratio to DDP's all-reduce in the same round.
            c_r, f_r = per_round(chose), per_round(fastest)
            won = sum(c <= f for c, f in zip(c_r, f_r))
            rounds = f"{won} of {min(len(c_r), len(f_r))}"
            within += won > 0
        print(f"| {rate} | {model} | {r['auto']} | {r['measured_fastest']} | {'yes' if same else 'no'} | {rounds} |")
    print()
    print(f"`--sync auto` names the scheme that measured fastest in {agree} of {len(cells)} cells"
          + (f"; of the {len(cells) - agree} where it does not, {within} named a scheme that was at least as fast "
             "as the fastest in some rounds (as a ratio to DDP's all-reduce in the same round of its job): there "
             "the measurement does not tell the two apart" if within else "") + ".")
    where(rows)
    account(rows)


def per_round(row):
    """A row's backward in each round, as a ratio to DDP's all-reduce in the
    same round where the row carries it (`ddp_rounds_s`), else in seconds."""
    if "ddp_rounds_s" in row:
        return [t / d for t, d in zip(row["rounds_s"], row["ddp_rounds_s"])]
    return row["rounds_s"]


def where(rows):
    """Where a hook's time goes, measured (per backward, the slowest rank's
    phases summed over its buckets) against the model's parts of one
    synchronization of the whole gradient: kernels; exchanges (the
    runtime's exchange and wait phases); the runtime calls' wall time
    (phases plus copies and allocations); the CPU the synchronization adds
    to a rank's process (its CPU seconds in the backward minus those of
    the backward without synchronization) against the model's CPU work
    per rank (kernels and transport, divided by the ranks sharing a core,
    and DDP's bucket copies and work per parameter tensor)."""
    rows = [r for r in rows if "phases_s" in r and "predicted_breakdown" in r]
    if not rows:
        return
    print()
    print("Where the hooks' time goes (seconds per backward; measured / predicted):")
    print()
    print("| link | model | hook | kernels | exchanges | runtime calls | exposed | sync CPU per rank |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        ph, b, share = r["phases_s"], r["predicted_breakdown"], r.get("host_share", 1.0)
        kern = ph["quantize_s"] + ph["dequantize_s"]
        comm = ph["exchange_s"] + ph["wait_s"]
        comm_p = b["total_seconds"] - b["kernel_seconds"]
        cpu_m = r["cpu_s"] - r["no_sync_cpu_s"] if "cpu_s" in r else float("nan")
        cpu_p = sum(predicted_cpu(r))
        calls = ph.get("call_s", float("nan"))
        print(f"| {r['rate']} | {r['model']} | {r['hook']} | {kern:.4f} / {b['kernel_seconds']:.4f} | "
              f"{comm:.4f} / {comm_p:.4f} | {calls:.4f} / {b['total_seconds']:.4f} | "
              f"{r['exposed_s']:.4f} / {r['predicted_exposed_s']:.4f} | {cpu_m:.4f} / {cpu_p:.4f} |")


def predicted_cpu(r):
    """The model's CPU per rank for row `r`'s synchronization of the whole
    gradient: on the training thread (DDP's copies and its work for each
    of the row's `gradient_tensors`), and on the other threads (kernels and
    transport), each divided by the ranks sharing a core."""
    b, share = r["predicted_breakdown"], r.get("host_share", 1.0)
    tensors = r.get("gradient_tensors", 0) * b.get("bucket_tensor_seconds", 0.0)
    return ((b["bucket_copy_seconds"] + tensors) / share,
            (b["kernel_seconds"] + b["transport_cpu_seconds"]) / share)


def account(rows):
    """Each hook row's error on the exposed synchronization, split three
    ways (seconds per backward, measured / predicted), each from the rank's
    threads' CPU with synchronization less without (`threads_cpu_s`, the
    mean over ranks):
    - the training thread (the one running the backward pass): DDP's copies
      of the gradients into their buckets and back, its work per parameter
      tensor, and the hook's calls, against the model's bucket copies and
      work per tensor (the row's `gradient_tensors` of them);
    - every other thread (the hook's worker: kernels and transport; gloo's
      threads), against the model's kernels and transport work;
    - waiting: the exposed synchronization less both (times the ranks
      sharing a core: each rank's CPU holds the core from all of them),
      the time the rank's cores did not work for it (the link, the peers,
      the scheduler), against the model's exposed synchronization less its
      CPU work.
    The three differences (the CPU ones times the ranks sharing a core)
    add up to the row's error in seconds."""
    rows = [r for r in rows if "predicted_breakdown" in r and "training" in r.get("threads_cpu_s", {})]
    if not rows:
        return
    print()
    print("Where each row's error lies (seconds per backward; measured / predicted; the last column names the "
          "part that differs most, and by how much):")
    print()
    print("| link | model | hook | training thread CPU | other threads CPU | waiting | exposed | most of the error |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    totals = {"training thread": 0.0, "other threads": 0.0, "waiting": 0.0}
    for r in rows:
        share = r.get("host_share", 1.0)
        on, off = r["threads_cpu_s"], r.get("no_sync_threads_cpu_s", {})
        added = {n: t - off.get(n, 0.0) for n, t in on.items()}
        train_m = added.pop("training")
        other_m = sum(added.values())
        wait_m = r["exposed_s"] - (train_m + other_m) * share
        train_p, other_p = predicted_cpu(r)
        wait_p = r["predicted_exposed_s"] - (train_p + other_p) * share
        miss = {"training thread": (train_p - train_m) * share, "other threads": (other_p - other_m) * share,
                "waiting": wait_p - wait_m}
        for k, v in miss.items():
            totals[k] += abs(v)
        worst = max(miss, key=lambda k: abs(miss[k]))
        print(f"| {r['rate']} | {r['model']} | {r['hook']} | {train_m:.4f} / {train_p:.4f} | "
              f"{other_m:.4f} / {other_p:.4f} | {wait_m:.4f} / {wait_p:.4f} | "
              f"{r['exposed_s']:.4f} / {r['predicted_exposed_s']:.4f} | {worst}, {miss[worst] * 1e3:+.1f} ms |")
    whole = sum(totals.values())
    if whole > 0:
        print()
        print("Of the rows' differences (the sum of their sizes over these rows): "
              + ", ".join(f"{k} {v / whole:.0%}" for k, v in totals.items()) + ".")


if __name__ == "__main__":
    main()
