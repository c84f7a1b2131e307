#!/usr/bin/env bash
# Issue-5 numerics on models with weights: for each ONNX file given, in
# onnxruntime (passes/tests/numerics.py, seeded inputs, CPU):
#   campo vs campo,egraph-casts(exact=true)   bitwise (tolerance 0)
#   FP32 original vs campo,egraph-casts       within 5e-2 (FP16 tolerance)
# One line per model and check; the last line counts what passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
cargo build -q --release -p qsyncc --features full
Q=target/release/qsyncc; S=passes/tests/numerics.py
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ok=0; bad=0
for m in "$@"; do
  a="$tmp/campo.onnx"; b="$tmp/exact.onnx"; c="$tmp/default.onnx"
  if ! { $Q opt "$m" --passes campo --target t4 -o "$a" && $Q opt "$m" --passes "campo,egraph-casts(exact=true)" --target t4 -o "$b" \
         && $Q opt "$m" --passes campo,egraph-casts --target t4 -o "$c"; } >/dev/null 2>&1; then
    echo "PLANFAIL $(basename "$m")"; bad=$((bad+1)); continue
  fi
  for check in "bitwise $a $b 0 0" "fp16 $m $c 0.05 0.05"; do
    set -- $check
    if r=$(python3 "$S" "$2" "$3" "$4" "$5" 2>&1); then ok=$((ok+1)); s=ok; else bad=$((bad+1)); s=BAD; fi
    echo "$s $1 $(basename "$m"): $(echo "$r" | grep -a 'max |diff|' | head -1)"
  done
  rm -f "$tmp"/*
done
echo "passed $ok, failed $bad"
