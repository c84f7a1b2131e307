#!/usr/bin/env bash
# Issue-5 check on unseen models: for every ONNX file under the given
# directories (default: the zoo that export_zoo.py writes), run
#   qsyncc opt MODEL --passes amp --target t4 --json
#   qsyncc opt MODEL --passes campo,egraph-casts --target t4 --json
# and onnxconverter-common's convert_float_to_float16(keep_io_types=True)
# with the fixed AMP-like FP32 op list (`AMP_LIKE_BLOCK_LIST`, the one the
# cast table uses). Prints, per model, amp's casts, ours, our activation
# casts (casts_added − weight_casts) and onnxconverter-common's (it converts
# weights offline, so every Cast it adds is an activation cast). The last
# lines count failures (non-zero exit or unreadable JSON), models where
# campo,egraph-casts is not below amp, and models where our activation
# casts are not below onnxconverter-common's.
set -uo pipefail
cd "$(dirname "$0")/../.."
cargo build -q --release -p qsyncc --features full
Q=target/release/qsyncc
dirs=("$@"); [ ${#dirs[@]} -gt 0 ] || dirs=(/tmp/zoo/models /tmp/zoo/models_hf)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -c "import onnxconverter_common" 2>/dev/null \
  || python3 -m pip install -q onnxconverter-common >/dev/null 2>&1 \
  || python3 -m pip install -q --break-system-packages onnxconverter-common >/dev/null
cargo run -q --release -p qsync-tests --example cast_table -- amp-like "$tmp/fixed.json"

field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(d['casts'], d['casts_added'] - d['weight_casts'])" 2>/dev/null; }
: > "$tmp/list"
fail=0; total=0; notfewer=0
for d in "${dirs[@]}"; do
  for m in "$d"/*.onnx; do
    [ -f "$m" ] || continue
    total=$((total+1))
    a=$($Q opt "$m" --passes amp --target t4 --json 2>/dev/null | field)
    e=$($Q opt "$m" --passes campo,egraph-casts --target t4 --json 2>/dev/null | field)
    if [ -z "$a" ] || [ -z "$e" ]; then fail=$((fail+1)); echo "FAIL $(basename "$m")"; continue; fi
    read -r ac _ <<<"$a"
    read -r ec eact <<<"$e"
    [ "$ec" -lt "$ac" ] || notfewer=$((notfewer+1))
    echo "$m $ac $ec $eact" >> "$tmp/list"
  done
done

python3 - "$tmp/fixed.json" "$tmp/list" <<'PY'
import json, sys
import onnx
from onnxconverter_common import float16
fixed = json.load(open(sys.argv[1]))
worse = 0
oc_failed = 0
for line in open(sys.argv[2]):
    path, amp, ours, ours_act = line.split()
    name = path.rsplit("/", 1)[-1]
    m = onnx.load(path, load_external_data=False)
    before = sum(n.op_type == "Cast" for n in m.graph.node)
    try:
        c = float16.convert_float_to_float16(m, keep_io_types=True, op_block_list=fixed)
        oc = sum(n.op_type == "Cast" for n in c.graph.node) - before
    except Exception as e:  # noqa: BLE001
        oc_failed += 1
        print(f"{name} amp={amp} campo+egraph={ours} activation={ours_act} onnxconverter-common=failed ({str(e)[:80]})")
        continue
    if int(ours_act) >= oc:
        worse += 1
    print(f"{name} amp={amp} campo+egraph={ours} activation={ours_act} onnxconverter-common={oc}")
print(f"activation casts not below onnxconverter-common: {worse}; onnxconverter-common failed: {oc_failed}")
PY
echo "failures: $fail / $total; not fewer than amp: $notfewer"
