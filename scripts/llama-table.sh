#!/usr/bin/env bash
# The Llama figures of the README and docs/planner.md, from the planner
# itself (predictions of the cost model; no GPU, no weights).
#
#   scripts/llama-table.sh --summary PLAN_DIR
#       the README's lines of one plan: the verdict, then per device type
#       its stage, shard fraction, local batch and memory.
#   scripts/llama-table.sh [QSYNCC_FLAGS…]
#       docs/planner.md's table: the 1.3B, 2.7B and 7B (scripts/gen_llama.py,
#       batch 1, seq 2048) planned on each README cluster (v100:16,t4:16 and
#       examples/clusters/*.toml), the chosen plan's predicted samples/s
#       against the FSDP FULL_SHARD baseline's, with and without
#       `--shard-collectives auto`. Extra flags go to every plan.
#
# `qsyncc` is the one on PATH (QSYNCC=path overrides); work files go under
# target/llama-table/.
set -euo pipefail
cd "$(dirname "$0")/.."
QSYNCC=${QSYNCC:-qsyncc}

summary() {
    python3 - "$1" <<'PY'
import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
print(m["verdict"].replace("**", ""))
sh = m["sharding"]
for name, d in m["devices"].items():
    s = sh["devices"][name]
    gib = 1 << 30
    gather = (s.get("all_gather") or {}).get("precision") or "-"
    reduce = s.get("reduce_scatter_precision") or "-"
    print(f"{name} x{d['count']}: {s['stage']}, shard {s['shard_fraction']:.4f}, batch {d['local_batch']}, "
          f"{d['peak_memory_bytes'] / gib:.2f} of {d['memory_capacity_bytes'] / gib:.2f} GiB, "
          f"gather {gather}, reduce-scatter {reduce}, checkpoint {'on' if s['checkpoint'] else 'off'}")
PY
}

if [[ "${1:-}" == "--summary" ]]; then
    summary "${2:?--summary PLAN_DIR}"
    exit 0
fi

work=target/llama-table
mkdir -p "$work"
clusters=("--targets v100:16,t4:16")
for f in examples/clusters/*.toml; do
    clusters+=("--cluster $f")
done

# One plan's samples/s (chosen, fsdp) as "CHOSEN_KEY SPS FSDP_SPS", or
# "refused" when the model does not fit.
plan_row() {
    local model=$1 out=$2
    shift 2
    if "$QSYNCC" "$model" --batch 1 --dim seq=2048 -o "$out" --json "$@" >"$out.json" 2>"$out.log"; then
        python3 - "$out.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
f = s["methods"].get("fsdp")
fsdp = f["samples_per_s"] if f and f["fits"] else None
print(s["chosen"], s["samples_per_s"], fsdp if fsdp is not None else "none")
PY
    else
        echo "refused"
    fi
}

echo "| cluster | model | chosen | samples/s | FSDP FULL_SHARD | vs FSDP | with \`--shard-collectives auto\` | vs FSDP |"
echo "|---|---|---|---:|---:|---:|---:|---:|"
for c in "${clusters[@]}"; do
    cname=${c#--targets }
    cname=${cname#--cluster examples/clusters/}
    cname=${cname%.toml}
    dir=${cname//[:,]/-}
    for size in 1.3b 2.7b 7b; do
        model=$work/llama-$size.onnx
        [[ -f $model ]] || python3 scripts/gen_llama.py --size "$size" -o "$model" >/dev/null
        # shellcheck disable=SC2086
        read -r key sps fsdp <<<"$(plan_row "$model" "$work/plan-$dir-$size" $c "$@")"
        # shellcheck disable=SC2086
        read -r _ qsps _ <<<"$(plan_row "$model" "$work/plan-$dir-$size-auto" $c --shard-collectives auto "$@")"
        python3 - "$cname" "$size" "$key" "${sps:-}" "${fsdp:-}" "${qsps:-}" <<'PY'
import sys
cluster, size, key, sps, fsdp, qsps = sys.argv[1:]
if key == "refused":
    print(f"| {cluster} | {size.upper()} | does not fit | – | – | – | – | – |")
    sys.exit()
sps, qsps = float(sps), float(qsps)
vs = lambda x: "–" if fsdp == "none" else f"{(x / float(fsdp) - 1) * 100:+.1f}%"
base = "does not fit" if fsdp == "none" else f"{float(fsdp):.3f}"
print(f"| {cluster} | {size.upper()} | {key} | {sps:.3f} | {base} | {vs(sps)} | {qsps:.3f} | {vs(qsps)} |")
PY
    done
done
