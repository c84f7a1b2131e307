#!/usr/bin/env bash
# Paper-shaped experiments (QSync Tables IV-V): ClusterA (16 V100 + 16 T4,
# full memory) and ClusterB (T4s at 30% memory) for ResNet-50, VGG-16,
# VGG-16-BN and BERT-base, and ClusterA again with the paper's T_min (the
# lowest uniform precision that fits, `--t-min lowest`). Prints a Markdown
# table of predicted throughput and indicator sum for UP, DBS and qsync.
# Models from ../shared/models.
set -uo pipefail
cd "$(dirname "$0")/.."
M=${MODELS:-../shared/models}
if [ -z "${QSYNCC:-}" ]; then cargo build --quiet --release -p qsyncc; fi
Q=${QSYNCC:-target/release/qsyncc}
echo "| model | cluster | UP samples/s | DBS samples/s (split) | qsync samples/s | qsync vs UP | qsync vs DBS | UP Ω | qsync Ω | T4 precisions |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"
for m in resnet50_train vgg16 vgg16_bn bert_base_train; do
  for c in A B A/lowest; do
    case $c in
      A) extra=(--batch 32) ;;
      B) extra=(--memory t4=30% --batch 32) ;;
      A/lowest) extra=(--batch 32 --t-min lowest) ;;
    esac
    out=target/experiments/$m-${c//\//-}
    if j=$($Q "$M/$m.onnx" --targets v100:16,t4:16 "${extra[@]}" -o "$out" --json 2>/dev/null); then
      printf "%s" "$j" > "$out/summary.json"
      python3 - "$m" "$c" "$out/manifest.json" "$out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[4])); man = json.load(open(sys.argv[3]))
up, dbs = s["baselines"]["up"], s["baselines"]["dbs"]
split = "/".join(f"{k}:{v}" for k, v in dbs["batch_split"].items())
h = " ".join(f"{k}:{v}" for k, v in s["devices"]["t4"]["precision_histogram"].items())
print(f"| {sys.argv[1]} | {sys.argv[2]} | {up['samples_per_s']:.0f} | {dbs['samples_per_s']:.0f} ({split}) | {s['samples_per_s']:.0f} | "
      f"{(s['samples_per_s']/up['samples_per_s']-1)*100:+.1f}% | {(s['samples_per_s']/dbs['samples_per_s']-1)*100:+.1f}% | "
      f"{man['methods']['up']['indicator_sum']:.3e} | {s['indicator_sum']:.3e} | {h} |")
PY
    else
      err=$($Q "$M/$m.onnx" --targets v100:16,t4:16 "${extra[@]}" -o "$out" 2>&1 | grep '^error' | head -1)
      echo "| $m | $c | – | – | – | – | – | – | – | ${err:0:120} |"
    fi
  done
done
