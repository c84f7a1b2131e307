#!/usr/bin/env bash
# Issue-7 MLIR check on unseen models: for every ONNX file under the given
# directories (default: the zoo that export_zoo.py writes) and both
# pipelines `amp` and `campo,egraph-casts`, run
#   qsyncc codegen MODEL --target t4 --passes P --emit mlir -o DIR
# then verify DIR/model.mlir with `mlir-opt-22`: with no flag when the
# module has no generic qsync.* op, else with --allow-unregistered-dialect.
# One line per run (the generic op types when there are any); the last line
# counts runs, runs verified without a flag, and failures (exit 1 if any).
set -uo pipefail
cd "$(dirname "$0")/../.."
cargo build -q --release -p qsyncc --features full
Q=target/release/qsyncc
dirs=("$@"); [ ${#dirs[@]} -gt 0 ] || dirs=(/tmp/zoo/models /tmp/zoo/models_hf)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
runs=0; noflag=0; fail=0
for p in amp campo,egraph-casts; do
  for d in "${dirs[@]}"; do
    for m in "$d"/*.onnx; do
      [ -f "$m" ] || continue
      runs=$((runs+1))
      n=$(basename "$m" .onnx)
      o="$out/$p/$n"
      mkdir -p "$o"
      if ! $Q codegen "$m" --target t4 --passes "$p" --emit mlir -o "$o" >"$o.log" 2>&1; then
        echo "FAIL $p $n: qsyncc codegen: $(tail -1 "$o.log")"; fail=$((fail+1)); continue
      fi
      if grep -q "(0 generic" "$o.log"; then
        if mlir-opt-22 "$o/model.mlir" >/dev/null 2>"$o.err"; then
          noflag=$((noflag+1)); echo "ok $p $n: no generic op, verifies with no flag"
        else
          fail=$((fail+1)); echo "FAIL $p $n: $(head -1 "$o.err")"
        fi
      elif mlir-opt-22 --allow-unregistered-dialect "$o/model.mlir" >/dev/null 2>"$o.err"; then
        echo "ok $p $n: verifies with --allow-unregistered-dialect; $(grep -o 'operations: .*' "$o.log")"
      else
        fail=$((fail+1)); echo "FAIL $p $n: $(head -1 "$o.err")"
      fi
    done
  done
done
echo "runs: $runs; verified with no flag: $noflag; failures: $fail"
[ "$fail" -eq 0 ]
