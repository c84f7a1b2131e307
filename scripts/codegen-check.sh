#!/usr/bin/env bash
# Issue-7 check on every shared model (or the models given): for targets t4
# and v100 and pipelines `amp` and `campo,egraph-casts`, run
#   qsyncc codegen MODEL --target T --passes P --emit mlir,ptx -o DIR
# then check that kernels.ptx targets the device's SM and holds .entry
# kernels, that model.mlir verifies with `mlir-opt-22` and no flag, and that
# NVIDIA's ptxas (installed by setup.sh; no GPU needed) assembles kernels.ptx.
# One line per run; the last line counts failures (exit 1 if any).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build -q --release -p qsyncc --features full
Q=target/release/qsyncc
ptxas=$(command -v ptxas || python3 -c "import nvidia.cuda_nvcc as m; print(list(m.__path__)[0] + '/bin/ptxas')" 2>/dev/null || true)
models=("$@"); [ ${#models[@]} -gt 0 ] || models=(../shared/models/*.onnx ../shared/models/*.pt)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
declare -A want=([t4]=sm_75 [v100]=sm_70)
fail=0; runs=0
for m in "${models[@]}"; do
  for t in t4 v100; do
    for p in amp campo,egraph-casts; do
      runs=$((runs+1))
      d="$out/$(basename "$m")/$t/$p"
      mkdir -p "$d"
      if ! $Q codegen "$m" --target "$t" --passes "$p" --emit mlir,ptx -o "$d" >"$d/log" 2>&1; then
        echo "FAIL $(basename "$m") $t $p: qsyncc codegen exited non-zero: $(tail -1 "$d/log")"; fail=$((fail+1)); continue
      fi
      sm=$(grep -o '^\.target sm_[0-9]*' "$d/kernels.ptx" | cut -d' ' -f2)
      entries=$(grep -c '\.entry' "$d/kernels.ptx")
      mlir=ok; mlir-opt-22 "$d/model.mlir" >/dev/null 2>"$d/mlir.err" || mlir=FAILED
      asm=skipped
      if [ -n "$ptxas" ] && [ -x "$ptxas" ]; then
        asm=ok; "$ptxas" -arch="$sm" "$d/kernels.ptx" -o "$d/k.cubin" 2>"$d/ptxas.err" || asm=FAILED
      fi
      status=ok
      { [ "$sm" = "${want[$t]}" ] && [ "$entries" -gt 0 ] && [ "$mlir" = ok ] && [ "$asm" != FAILED ]; } || { status=FAIL; fail=$((fail+1)); }
      echo "$status $(basename "$m") $t $p: $sm, $entries entries, mlir-opt-22 (no flag) $mlir, ptxas $asm"
    done
  done
done
echo "failures: $fail / $runs"
[ "$fail" -eq 0 ]
