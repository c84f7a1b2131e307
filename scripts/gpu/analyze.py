#!/usr/bin/env python3
"""QSync Table III on a measured GPU: the replayer's error against real
training iterations, from datasheets alone and with a calibration profile
measured on the *other* models (leave-one-family-out: the profile that
predicts ResNet-50 never measured a ResNet-50 operator).

    python3 scripts/gpu/analyze.py --ops OPS.json --iterations ITER.json --models-dir DIR
        [--qsyncc target/debug/qsyncc] [--device NAME] [--device-file F] [--out-dir DIR]
        [--markdown OUT.md] [--json OUT.json] [--full-profile OUT.json]

OPS.json comes from scripts/gpu/profile.py, ITER.json from scripts/gpu/train.py
(scripts/gpu-measure.sh runs both on the GPU and this afterwards). For each
measured run (model, precision) it runs `qsyncc simulate` on the same model,
batch, sequence, optimizer and device:
  fp32 / tf32   `--precision DEV=fp32|tf32`
  amp_fp16/bf16 the model planned by `qsyncc opt --passes autocast(dtype=f16|bf16)`
                (PyTorch autocast's op lists, weights cast per iteration)
once without and once with `--profile`, the profile `qsyncc profile build
--exclude FAMILY` writes from OPS.json (with `--host-model on`, or `auto`
where OPS.json timed the host, also `--iterations ITER.json`: the profile
then prices the host). The error is (predicted - measured) /
measured. `--full-profile` also writes the profile of every measured model
(the one to commit under crates/cost/profiles/). Exits 2 with a message when
an input is missing or malformed or a qsyncc call fails.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

GPU_DEVICES = [  # (substring of the GPU's name, device file) — the mapping scripts/gpu-check.sh uses
    ("H200", "h200"), ("H100", "h100-sxm"), ("A100-SXM4-80GB", "a100-80gb"), ("A100 80GB", "a100-80gb"),
    ("A100", "a100-40gb"), ("A10", "a10"), ("L4", "l4"), ("T4", "t4"), ("V100", "v100"), ("4090", "rtx4090"),
    ("2080", "rtx2080ti"),
]
PLANS = {"amp_fp16": "autocast(dtype=f16)", "amp_bf16": "autocast(dtype=bf16)"}
UNIFORM = {"fp32": "fp32", "tf32": "tf32"}
LABEL = {"fp32": "FP32", "tf32": "TF32", "amp_fp16": "AMP FP16", "amp_bf16": "AMP BF16"}


class Failure(Exception):
    pass


def load(path, schema):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise Failure(f"{path}: {e}")
    if data.get("schema") != schema:
        raise Failure(f"{path}: schema `{data.get('schema')}` is not `{schema}`")
    return data


def qsyncc(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise Failure(f"qsyncc {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def device_for(gpu):
    for sub, dev in GPU_DEVICES:
        if sub in gpu:
            return dev
    raise Failure(f"no device file known for GPU `{gpu}`: pass --device")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", required=True)
    ap.add_argument("--iterations", required=True)
    ap.add_argument("--models-dir", required=True)
    ap.add_argument("--qsyncc", default="target/debug/qsyncc")
    ap.add_argument("--device")
    ap.add_argument("--device-file", action="append", default=[])
    ap.add_argument("--out-dir", default="target/gpu-measure/analysis")
    ap.add_argument("--markdown")
    ap.add_argument("--json")
    ap.add_argument("--full-profile")
    ap.add_argument("--host-model", choices=["auto", "on", "off"], default="off",
                    help="profiles that price the host (`qsyncc profile build --iterations`); auto: where the "
                         "measurements timed the host (off by default: see docs/validation.md, H200)")
    ap.add_argument("--statistic", choices=["median", "min", "cpu_median", "cpu_min"], default="median",
                    help="which measured iteration time to compare with (cpu_*: scripts/cpu/train.py's CPU time)")
    a = ap.parse_args()
    try:
        return analyze(a)
    except Failure as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def analyze(a):
    ops = load(a.ops, "qsync-ops/1")
    its = load(a.iterations, "qsync-iterations/1")
    gpu = its.get("meta", {}).get("gpu", "")
    if ops.get("meta", {}).get("gpu") and gpu and ops["meta"]["gpu"] != gpu:
        raise Failure(f"{a.ops} was measured on `{ops['meta']['gpu']}`, {a.iterations} on `{gpu}`")
    device = a.device or device_for(gpu)
    devfiles = [x for f in a.device_file for x in ("--device-file", f)]
    os.makedirs(a.out_dir, exist_ok=True)
    measured_families = {m["family"] for m in ops["models"]}
    # --host-model: the profiles price the host, the training runs of the
    # families a profile keeps fitting its overheads (those of the family
    # predicted left out with its ops).
    timed_host = "harness_floor_fwd_host_us" in ops.get("meta", {})
    if a.host_model == "on" and not timed_host:
        raise Failure(f"{a.ops}: no host times (measured before profile.py timed the host): --host-model on needs them")
    host = ["--iterations", a.iterations] if a.host_model == "on" or (a.host_model == "auto" and timed_host) else []
    profiles, fits = {}, {}
    for fam in sorted({r["family"] for r in its["runs"]}):
        out = os.path.join(a.out_dir, f"profile-without-{fam}.json")
        exclude = ["--exclude", fam] if fam in measured_families else []
        fits[fam] = json.loads(qsyncc(a.qsyncc, "profile", "build", a.ops, "--device", device, *exclude, *devfiles,
                                      *host, "-o", out, "--json"))
        profiles[fam] = out
    if a.full_profile:
        qsyncc(a.qsyncc, "profile", "build", a.ops, "--device", device, *devfiles, *host, "-o", a.full_profile)
    rows = []
    for r in its["runs"]:
        model = os.path.join(a.models_dir, r["qsync_model"])
        if not os.path.exists(model):
            raise Failure(f"run {r['model']}/{r['precision']}: model file {model} not found")
        target, args = simulate_args(a.qsyncc, r, model, device, a.out_dir, devfiles)
        pred = {}
        for label, cal in (("datasheet", []), ("calibrated", ["--profile", profiles[r["family"]]])):
            out = json.loads(qsyncc(a.qsyncc, "simulate", target, *args, *cal))
            pred[label] = out["iteration_ms"]
        m = r[f"{a.statistic}_ms"]
        rows.append({
            "model": r["model"], "precision": r["precision"], "batch": r["batch"], "seq": r.get("seq"),
            "measured_ms": m, "datasheet_ms": pred["datasheet"], "calibrated_ms": pred["calibrated"],
            "datasheet_err": (pred["datasheet"] - m) / m, "calibrated_err": (pred["calibrated"] - m) / m,
            "profile": os.path.basename(profiles[r["family"]]),
        })
    md = table(rows, device, its.get("meta", {}), ops.get("meta", {}))
    sys.stdout.write(md)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": device, "meta": its.get("meta", {}), "rows": rows, "fits": fits}, f, indent=1,
                      sort_keys=True)
    return 0


def simulate_args(binary, r, model, device, out_dir, devfiles):
    """The model to simulate and `qsyncc simulate`'s arguments (`--json`
    included) that predict measured run `r` on `device`: the ONNX model at
    a uniform precision, or for AMP the model `qsyncc opt` planned with
    autocast's op lists (written into `out_dir`)."""
    common = ["--targets", device, "--batch", str(r["batch"]), "--optimizer", r["optimizer"], "--json", *devfiles]
    if r.get("seq"):
        common += ["--dim", f"seq={r['seq']}"]
    p = r["precision"]
    if p in UNIFORM:
        return model, [*common, "--precision", f"{device}={UNIFORM[p]}"]
    if p in PLANS:
        target = os.path.join(out_dir, f"{r['model']}-{p}.qir")
        qsyncc(binary, "opt", model, "--passes", PLANS[p], "--target", device, "-o", target)
        return target, common
    raise Failure(f"run {r['model']}: unknown precision `{p}`")


def table(rows, device, meta, ops_meta):
    out = [f"Device `{device}` ({meta.get('gpu', '?')}, driver {ops_meta.get('driver', '?')}, "
           f"PyTorch {meta.get('torch', '?')}, measured {meta.get('date', '?')}).\n\n",
           "| model | precision | batch | measured ms | datasheet ms | error | calibrated ms | error |\n",
           "|---|---|---:|---:|---:|---:|---:|---:|\n"]
    for r in rows:
        shape = f"{r['batch']}" + (f" x {r['seq']}" if r["seq"] else "")
        out.append(f"| {r['model']} | {LABEL.get(r['precision'], r['precision'])} | {shape} | {r['measured_ms']:.2f} | "
                   f"{r['datasheet_ms']:.2f} | {100 * r['datasheet_err']:+.1f}% | {r['calibrated_ms']:.2f} | "
                   f"{100 * r['calibrated_err']:+.1f}% |\n")
    if rows:
        mean = lambda k: sum(abs(r[k]) for r in rows) / len(rows)  # noqa: E731
        worst = lambda k: max(abs(r[k]) for r in rows)  # noqa: E731
        median = lambda k: statistics.median(abs(r[k]) for r in rows)  # noqa: E731
        out.append(f"\nMean |error|: datasheet {100 * mean('datasheet_err'):.1f}% (worst {100 * worst('datasheet_err'):.1f}%), "
                   f"calibrated {100 * mean('calibrated_err'):.1f}% (worst {100 * worst('calibrated_err'):.1f}%).\n")
        out.append(f"Median |error|: datasheet {100 * median('datasheet_err'):.1f}%, "
                   f"calibrated {100 * median('calibrated_err'):.1f}%.\n")
    return "".join(out)


if __name__ == "__main__":
    sys.exit(main())
