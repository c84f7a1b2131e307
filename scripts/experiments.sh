#!/usr/bin/env bash
# Paper-shaped experiments (QSync Tables IV-V) and heterogeneous clusters.
#
# Part 1, the paper's clusters: ClusterA (16 V100 + 16 T4, full memory) and
# ClusterB (T4s at 30% memory) for ResNet-50, VGG-16, VGG-16-BN and
# BERT-base, and ClusterA again with the paper's T_min (`--t-min lowest`),
# with QSync's method (`--method qsync`) and the joint plan.
# Part 2, modern mixed clusters (A100/L4/T4, H100/A10): UP, DBS, QSync's
# allocator, the fastest joint plan within UP's indicator
# (`--objective throughput`) and the default joint plan (least indicator at
# max(UP, DBS)).
# Prints Markdown tables of predicted throughput and indicator sums.
# Models from ../shared/models. `qsyncc` is the one on PATH (QSYNCC=path
# overrides), as for scripts/llama-table.sh: planning needs no feature.
set -uo pipefail
cd "$(dirname "$0")/.."
M=${MODELS:-../shared/models}
Q=${QSYNCC:-qsyncc}
command -v "$Q" >/dev/null || { echo "experiments.sh: no $Q (cargo install --path crates/qsyncc, or QSYNCC=path)" >&2; exit 2; }

row() { # model cluster-label targets summary.json manifest.json
  python3 - "$@" <<'PY'
import json, sys
model, label, targets, sfile, mfile = sys.argv[1:6]
s = json.load(open(sfile)); m = s["methods"]
def sps(k): return m[k]["samples_per_s"] if k in m else float("nan")
def ind(k): return m[k]["indicator_sum"] if k in m else float("nan")
def batches(k): return "/".join(f"{d}:{b}" for d, b in m[k]["local_batches"].items()) if k in m else "–"
up = sps("up")
q = "qsync" if "qsync" in m else "qsync-greedy"
al = [(v["samples_per_s"], d) for d, v in s.get("alone", {}).items() if "samples_per_s" in v]
best_alone = f"{max(al)[0]:.0f} ({max(al)[1]})" if al else "–"
print(f"| {model} | {label} | {best_alone} | {sps('up'):.0f} | {sps('dbs'):.0f} ({batches('dbs')}) | {sps(q):.0f} | "
      f"{sps('joint-fastest'):.0f} ({batches('joint-fastest')}) | {s['samples_per_s']:.0f} `{s['chosen']}` | "
      f"{(s['samples_per_s']/up-1)*100:+.1f}% | {ind('up'):.3e} | {ind(q):.3e} | {ind('joint-fastest'):.3e} | {s['indicator_sum']:.3e} |")
PY
}

header() {
  echo "| model | cluster | best type alone | UP samples/s | DBS samples/s (split) | QSync samples/s | fastest joint (split) | chosen | chosen vs UP | UP Ω | QSync Ω | fastest joint Ω | chosen Ω |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
}

run() { # model label targets-or-cluster-file extra...
  local m=$1 label=$2 targets=$3; shift 3
  local out=target/experiments/$m-${label//[\/:, ]/-}
  local where=(--targets "$targets")
  case "$targets" in *.toml) where=(--cluster "$targets") ;; esac
  if j=$($Q "$M/$m.onnx" "${where[@]}" "$@" -o "$out" --json 2>/dev/null); then
    printf "%s" "$j" > "$out.summary.json"
    row "$m" "$label" "$targets" "$out.summary.json" "$out/manifest.json"
  else
    err=$($Q "$M/$m.onnx" "${where[@]}" "$@" -o "$out" 2>&1 | grep '^error' | head -1)
    echo "| $m | $label | – | – | – | – | – | – | – | – | – | – | ${err:0:120} |"
  fi
}

mkdir -p target/experiments
echo "### The paper's clusters (16 V100 + 16 T4, batch 32 per device, training devices in FP32 as in the paper)"
echo
header
for m in resnet50_train vgg16 vgg16_bn bert_base_train; do
  run $m A v100:16,t4:16 --batch 32 --dim seq=128 --train-precision fp32
  run $m B v100:16,t4:16 --memory t4=30% --batch 32 --dim seq=128 --train-precision fp32
  run $m A/lowest/qsync v100:16,t4:16 --batch 32 --dim seq=128 --t-min lowest --method qsync --train-precision fp32
done
echo
echo "### Modern mixed clusters (batch 16 per device before the split, seq 128, training type in AMP)"
echo
header
for m in resnet50_train bert_base_train; do
  for c in a100-80gb:8,l4:8,t4:8 h100-sxm:8,a10:8; do
    run $m "$c" "$c" --batch 16 --dim seq=128
    run $m "$c throughput" "$c" --batch 16 --dim seq=128 --objective throughput
  done
done
echo
echo "### The clusters as described by their files (examples/clusters; batch 16 per device before the split, seq 128, AMP, --sync auto)"
echo
header
for m in resnet50_train bert_base_train; do
  for f in aws-v100-t4 cloud-a100-l4 dgx-h100; do
    run $m "$f" "examples/clusters/$f.toml" --batch 16 --dim seq=128 --sync auto --sync-error-budget 0.05
  done
  run $m "aws-v100-t4 --network 100gbit" examples/clusters/aws-v100-t4.toml --batch 16 --dim seq=128 --network 100gbit --sync auto --sync-error-budget 0.05
done
