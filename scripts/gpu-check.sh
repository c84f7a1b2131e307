#!/usr/bin/env bash
# The whole GPU check in one command.
#
#   scripts/gpu-check.sh [all|prepare|run] [OUT_DIR]    (defaults: all, target/gpu-check)
#
# prepare (needs cargo, LLVM 22 / MLIR 22 and the crates; no GPU):
#   - OUT_DIR/sm_XX/kernels.ptx for sm_70 … sm_90, every kernel
#     (`qsyncc codegen --all-kernels`);
#   - OUT_DIR/gpu-test: the release build of crates/gpu-check/tests/gpu.rs, which
#     links no LLVM (cudarc with dynamic loading + the pure-Rust reference).
#   OUT_DIR is then all a GPU machine needs (a few MiB: carry it).
# run (needs an NVIDIA driver; ptxas from CUDA 13 and PyTorch optional):
#   1. ptxas assembles each architecture's PTX for its own SM (CUDA 13's ptxas
#      no longer targets sm_70: reported as unsupported, not failed);
#   2. OUT_DIR/gpu-test with QSYNC_GPU_TEST=1: loads this GPU's PTX, runs every
#      kernel against the CPU reference (bitwise, stochastic rounding
#      included: its generator is counter-based), then bandwidth on 256 MiB
#      tensors vs peak (QSYNC_PEAK_GBS, else the device database);
#   3. scripts/torch_bandwidth.py: PyTorch's cast and quantize_per_tensor on
#      the same GPU and size.
#   Summary in OUT_DIR/summary.txt, JSON in OUT_DIR/gpu-report.json.
# all: prepare then run (a machine with both LLVM and a GPU).
#
# On a lent device machine (prepared here, run there), with
# carry=["target/gpu-check"]:
#   scripts/gpu-check.sh run; rc=$?; cp target/gpu-check/{summary.txt,gpu-report.json,gpu-test.log} "$OUT"/; exit $rc
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
OUT=${2:-target/gpu-check}
SMS="sm_70 sm_75 sm_80 sm_86 sm_89 sm_90"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

prepare() {
  cargo build -p qsyncc --features full
  SMS="$SMS" bash scripts/gpu/ptx.sh target/debug/qsyncc "$OUT"
  local bin
  bin=$(cargo test --release -p qsync-gpu-check --test gpu --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])')
  cp "$bin" "$OUT/gpu-test"
  cp scripts/torch_bandwidth.py "$OUT/"
  cp -r crates/cost/devices "$OUT/devices"
  echo "prepared $OUT ($(du -sh "$OUT" | cut -f1))"
}

run() {
  local summary="$OUT/summary.txt"
  : > "$summary"
  log() { echo "$*" | tee -a "$summary"; }
  local ptxas
  ptxas=$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)
  for sm in $SMS; do
    [ -f "$OUT/$sm/kernels.ptx" ] || { log "missing $OUT/$sm/kernels.ptx: run '$0 prepare' first"; exit 1; }
    if [ ! -x "$ptxas" ]; then log "ptxas not found (put CUDA's bin on PATH): assembly skipped"; break; fi
    if "$ptxas" -arch="$sm" "$OUT/$sm/kernels.ptx" -o "$OUT/$sm/kernels.cubin" 2>"$OUT/$sm/ptxas.log"; then
      log "ptxas $sm: ok ($(grep -c '\.entry' "$OUT/$sm/kernels.ptx") entries)"
    elif grep -qiE "not (defined|supported)|unsupported|deprecated" "$OUT/$sm/ptxas.log"; then
      log "ptxas $sm: not supported by this ptxas: $(head -1 "$OUT/$sm/ptxas.log")"
    else
      log "ptxas $sm: FAILED"; tee -a "$summary" < "$OUT/$sm/ptxas.log"; exit 1
    fi
  done
  if [ -z "${QSYNC_PEAK_GBS:-}" ] && command -v nvidia-smi >/dev/null; then
    local name dev=
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    case "$name" in
      *H200*) dev=h200 ;; *H100*) dev=h100-sxm ;; *A100*80GB*) dev=a100-80gb ;; *A100*) dev=a100-40gb ;;
      *A10*) dev=a10 ;; *L4*) dev=l4 ;; *T4*) dev=t4 ;; *V100*) dev=v100 ;; *4090*) dev=rtx4090 ;; *2080*) dev=rtx2080ti ;;
    esac
    if [ -n "$dev" ] && [ -f "$OUT/devices/$dev.json" ]; then
      QSYNC_PEAK_GBS=$(python3 -c "import json;print(json.load(open('$OUT/devices/$dev.json'))['memory_bandwidth_gb_s'])")
      export QSYNC_PEAK_GBS
      log "GPU: $name (device file $dev.json, peak $QSYNC_PEAK_GBS GB/s)"
    else
      log "GPU: $name (no device file: set QSYNC_PEAK_GBS for fractions of peak)"
    fi
  fi
  # The driver library is loaded at run time (dlopen "libcuda.so"); container
  # images often mount it outside the linker's default path.
  local libdir
  for libdir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/compat /usr/lib/wsl/lib; do
    [ -d "$libdir" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$libdir"
  done
  QSYNC_GPU_TEST=1 QSYNC_PTX_DIR="$OUT" QSYNC_GPU_REPORT="$OUT/gpu-report.json" \
    "$OUT/gpu-test" --nocapture 2>&1 | tee "$OUT/gpu-test.log" || true
  grep -qE "^test result: ok" "$OUT/gpu-test.log" || { log "gpu test FAILED (see $OUT/gpu-test.log)"; exit 1; }
  grep -E "gpu check|bandwidth" "$OUT/gpu-test.log" >> "$summary" || true
  if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    python3 "$OUT/torch_bandwidth.py" --peak "${QSYNC_PEAK_GBS:-0}" | tee -a "$summary"
  else
    log "PyTorch with CUDA not available: PyTorch comparison skipped"
  fi
  log "done: $summary"
}

case "$MODE" in
  prepare) prepare ;;
  run) run ;;
  all) prepare; run ;;
  *) echo "usage: $0 [all|prepare|run] [OUT_DIR]" >&2; exit 2 ;;
esac
