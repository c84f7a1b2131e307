#!/usr/bin/env bash
# Planner check on unseen models: for every ONNX file under the given
# directories (default: the zoo that export_zoo.py writes), run
#   qsyncc MODEL --targets v100:16,t4:16 --batch 16 -o DIR --json
# then, for each device, `qsyncc simulate DIR/<device>/model.onnx` (the
# graph the planner wrote, precisions read from its dtypes) and compare its
# compute time with the manifest's prediction. Prints one line per model
# (exit status, T4 casts, planned vs written-graph compute ms on each
# device) and, last, the failures and the largest disagreement.
set -uo pipefail
cd "$(dirname "$0")/../.."
cargo build -q --release -p qsyncc --features full
Q=target/release/qsyncc
dirs=("$@"); [ ${#dirs[@]} -gt 0 ] || dirs=(/tmp/zoo/models /tmp/zoo/models_hf)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > "$tmp/gaps"
fail=0; total=0
for d in "${dirs[@]}"; do
  for m in "$d"/*.onnx; do
    [ -f "$m" ] || continue
    total=$((total+1))
    out="$tmp/plan"; rm -rf "$out"
    if ! $Q "$m" --targets v100:16,t4:16 --batch 16 -o "$out" --json > /dev/null 2> "$tmp/err"; then
      fail=$((fail+1)); echo "FAIL plan $(basename "$m"): $(grep -m1 '^error' "$tmp/err")"; continue
    fi
    line="$(basename "$m")"
    for dev in v100 t4; do
      if ! $Q simulate "$out/$dev/model.onnx" --targets "$dev:16" --batch 16 --json > "$tmp/sim.json" 2> "$tmp/err"; then
        fail=$((fail+1)); echo "FAIL simulate $(basename "$m") $dev: $(grep -m1 '^error' "$tmp/err")"; continue 2
      fi
      line="$line $(python3 - "$out/manifest.json" "$tmp/sim.json" "$dev" "$(basename "$m")" "$tmp/gaps" <<'PY'
import json, sys
man, sim, dev, name, gaps = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3], sys.argv[4], sys.argv[5]
p = man["devices"][dev]["compute_ms"]; w = sim["devices"][dev]["compute_ms"]
gap = (w - p) / p
open(gaps, "a").write(f"{gap:+.4f} {name} {dev}\n")
print(f"{dev}: casts {man['devices'][dev]['casts']} planned {p:.3f} written {w:.3f} ({gap*100:+.1f}%)")
PY
)"
    done
    echo "$line"
  done
done
echo "models: $total, failures: $fail"
sort -g "$tmp/gaps" | awk '{a=$1<0?-$1:$1; if (a>m) {m=a; l=$0}} {n++; if (a<0.05) k++} END {printf "written graph within 5%% of the prediction: %d of %d device graphs; largest gap %s\n", k, n, l}'
