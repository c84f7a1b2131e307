#!/usr/bin/env bash
# The precision comparison table: for every shared model, casts
# added, low-precision FLOP fraction and predicted iteration time (cost model,
# training mode; batch 32 and other symbolic dims 128 unless the model fixes
# them) on V100 and T4 under fp32 / amp / autocast / campo / comp, and
# campo followed by egraph-casts (the pipeline campo prices its weights
# for: refreshed copies instead of per-iteration weight casts).
#
# Usage: scripts/precision-table.sh [MODELS_DIR]   (default ../shared/models)
# Prints a Markdown table on stdout; where V100 and T4 plans differ, casts
# and FLOP fraction read `V100 / T4`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
models="${1:-$root/../shared/models}"
[ -d "$models" ] || models="$root/../../shared/models"
cargo build -q --release -p qsyncc --features full --manifest-path "$root/Cargo.toml"
q="$root/target/release/qsyncc"
echo "| model | plan | casts added | low-prec FLOPs | V100 ms | T4 ms |"
echo "| --- | --- | ---: | ---: | ---: | ---: |"
for m in "$models"/*.onnx; do
  name="$(basename "$m")"
  for plan in fp32 amp autocast campo comp campo+egraph-casts; do
    pass="${plan/+/,}"; [ "$plan" = fp32 ] && pass="uniform=f32"
    row=""; c2=""; f2=""
    for t in v100 t4; do
      j="$("$q" opt "$m" --passes "infer-shapes,$pass" --target "$t" --json 2>/dev/null)"
      read -r casts frac ms < <(python3 -c 'import json,sys; d=json.load(sys.stdin); p=d["predicted_ms"] or {}; print(d["casts_added"], "%.3f" % d["low_precision_flop_fraction"], "%.2f" % p.get("total", float("nan")))' <<<"$j")
      row="$row|$ms"
      if [ "$t" = v100 ]; then c2="$casts"; f2="$frac"; else
        [ "$casts" != "$c2" ] && c2="$c2 / $casts"
        [ "$frac" != "$f2" ] && f2="$f2 / $frac"
      fi
    done
    echo "| $name | $plan | $c2 | $f2 $row|"
  done
done
