#!/usr/bin/env bash
# The whole GPU check in one command, for a machine with CUDA 13 (ptxas),
# an NVIDIA driver and, optionally, PyTorch:
#
#   scripts/gpu-check.sh [OUT_DIR]      (default target/gpu-check)
#
# 1. emits kernels.ptx for sm_70 … sm_90 (`qsyncc codegen --target sm_XX`)
#    and assembles each with ptxas for its own SM (CUDA 13 no longer targets
#    sm_70: that one is reported as unsupported by this ptxas, not failed);
# 2. runs the env-gated cudarc test (codegen/tests/gpu.rs): loads this GPU's
#    PTX, runs every kernel against the CPU reference, measures bandwidth on
#    256 MiB tensors (peak from QSYNC_PEAK_GBS, else the device database);
# 3. runs scripts/torch_bandwidth.py: PyTorch's own cast and
#    quantize_per_tensor on the same GPU and tensor size.
# Everything lands in OUT_DIR; the summary is OUT_DIR/summary.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/gpu-check}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
log() { echo "$*" | tee -a "$SUMMARY"; }

cargo build -p qsyncc
QSYNCC=target/debug/qsyncc
MODEL=../shared/models/squeezenet1_1.onnx
[ -f "$MODEL" ] || MODEL=$(ls ../shared/models/*.onnx | head -1)

PTXAS=$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)
for sm in sm_70 sm_75 sm_80 sm_86 sm_89 sm_90; do
  mkdir -p "$OUT/$sm"
  "$QSYNCC" codegen "$MODEL" --target "$sm" --emit ptx --all-kernels -o "$OUT/$sm" 2>>"$OUT/codegen.log"
  # Every kernel, not only the model's selection.
  if [ -x "$PTXAS" ]; then
    if "$PTXAS" -arch="$sm" "$OUT/$sm/kernels.ptx" -o "$OUT/$sm/kernels.cubin" 2>"$OUT/$sm/ptxas.log"; then
      log "ptxas $sm: ok ($(grep -c '^\.visible \.entry' "$OUT/$sm/kernels.ptx") entries)"
    elif grep -qiE "not (defined|supported)|unsupported|deprecated" "$OUT/$sm/ptxas.log"; then
      log "ptxas $sm: not supported by this ptxas ($(head -1 "$OUT/$sm/ptxas.log"))"
    else
      log "ptxas $sm: FAILED"; cat "$OUT/$sm/ptxas.log" | tee -a "$SUMMARY"; exit 1
    fi
  else
    log "ptxas: not found (set PATH to CUDA's bin); skipping assembly"
  fi
done

# Peak bandwidth of this GPU from the device database, unless given.
if [ -z "${QSYNC_PEAK_GBS:-}" ] && command -v nvidia-smi >/dev/null; then
  NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  case "$NAME" in
    *H200*) DEV=h200 ;; *H100*) DEV=h100-sxm ;; *A100*80GB*) DEV=a100-80gb ;; *A100*) DEV=a100-40gb ;;
    *A10*) DEV=a10 ;; *L4*) DEV=l4 ;; *T4*) DEV=t4 ;; *V100*) DEV=v100 ;; *4090*) DEV=rtx4090 ;; *2080*) DEV=rtx2080ti ;;
    *) DEV= ;;
  esac
  if [ -n "$DEV" ]; then
    QSYNC_PEAK_GBS=$(python3 -c "import json;print(json.load(open('crates/cost/devices/$DEV.json'))['memory_bandwidth_gb_s'])")
    export QSYNC_PEAK_GBS
    log "GPU: $NAME (device file $DEV, peak $QSYNC_PEAK_GBS GB/s)"
  fi
fi

export QSYNC_GPU_TEST=1 QSYNC_GPU_REPORT="$PWD/$OUT/gpu-report.json"
cargo test --release -p qsync-codegen --test gpu -- --nocapture 2>&1 | tee "$OUT/gpu-test.log"
grep -E "gpu check|bandwidth" "$OUT/gpu-test.log" >> "$SUMMARY" || true

if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  python3 scripts/torch_bandwidth.py --peak "${QSYNC_PEAK_GBS:-0}" | tee -a "$SUMMARY"
else
  log "PyTorch with CUDA not available: skipped the PyTorch comparison"
fi
log "done: $SUMMARY"
