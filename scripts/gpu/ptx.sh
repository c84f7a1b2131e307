#!/usr/bin/env bash
# qsync's kernels as PTX, one directory per GPU architecture:
#   scripts/gpu/ptx.sh QSYNCC OUT_DIR   →  OUT_DIR/sm_XX/kernels.ptx (sm_70 … sm_90)
# (`qsyncc codegen --all-kernels`; needs no GPU). The GPU checks read it:
# the kernel test directly, the runtime's device engine via $QSYNC_PTX_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
qsyncc=$1 out=$2
model=$(ls ../shared/models/squeezenet1_1.onnx 2>/dev/null || ls examples/*.onnx | head -1)
for sm in ${SMS:-sm_70 sm_75 sm_80 sm_86 sm_89 sm_90}; do
  "$qsyncc" codegen "$model" --target "$sm" --emit ptx --all-kernels -o "$out/$sm" >/dev/null
done
