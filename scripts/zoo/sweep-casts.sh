#!/usr/bin/env bash
# Issue-5 check on unseen models: for every ONNX file under the given
# directories (default: the zoo that export_zoo.py writes), run
#   qsyncc opt MODEL --passes amp --target t4 --json
#   qsyncc opt MODEL --passes campo,egraph-casts --target t4 --json
# and print both cast counts; the last line counts failures (non-zero exit
# or unreadable JSON) and models where campo,egraph-casts is not below amp.
set -uo pipefail
cd "$(dirname "$0")/../.."
cargo build -q --release -p qsyncc
Q=target/release/qsyncc
dirs=("$@"); [ ${#dirs[@]} -gt 0 ] || dirs=(/tmp/zoo/models /tmp/zoo/models_hf)
casts() { python3 -c "import json,sys; print(json.load(sys.stdin)['casts'])" 2>/dev/null; }
fail=0; total=0; notfewer=0
for d in "${dirs[@]}"; do
  for m in "$d"/*.onnx; do
    [ -f "$m" ] || continue
    total=$((total+1))
    a=$($Q opt "$m" --passes amp --target t4 --json 2>/dev/null | casts)
    e=$($Q opt "$m" --passes campo,egraph-casts --target t4 --json 2>/dev/null | casts)
    if [ -z "$a" ] || [ -z "$e" ]; then fail=$((fail+1)); echo "FAIL $(basename "$m")"; continue; fi
    [ "$e" -lt "$a" ] || notfewer=$((notfewer+1))
    echo "$(basename "$m") amp=$a campo+egraph=$e"
  done
done
echo "failures: $fail / $total; not fewer than amp: $notfewer"
