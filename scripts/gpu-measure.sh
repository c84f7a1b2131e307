#!/usr/bin/env bash
# Measure qsync's predictions against a real GPU: the calibration
# profile of the device and QSync's Table III (replayer error against
# measured training iterations), in three steps.
#
#   scripts/gpu-measure.sh prepare [DIR]   here (no GPU): qsyncc, the models at a symbolic batch,
#                                          DIR/worklist.json (every distinct op of the models)
#   scripts/gpu-measure.sh run [DIR]       on the GPU machine: run-ops then run-train
#   scripts/gpu-measure.sh run-ops [DIR]   scripts/gpu/profile.py  -> DIR/ops.json (~3-5 min)
#   scripts/gpu-measure.sh run-train [DIR] scripts/gpu/train.py    -> DIR/iterations.json (~3 min)
#   scripts/gpu-measure.sh analyze [DIR]   here: leave-one-out profiles, `qsyncc simulate`, the table
#                                          -> DIR/table.md, DIR/results.json, DIR/profile-full.json
#
# DIR defaults to target/gpu-measure. `run` needs only python3 with torch,
# torchvision and transformers (the lent GPU machines have them; no network)
# and DIR from `prepare`; it exits 3 with the reason when no GPU is visible.
# When $OUT is set (the device tool), results and logs are copied there.
#
# On a lent device machine (prepared here, run there), with carry=["target/gpu-measure"]:
#   scripts/gpu-measure.sh run
# then here, with the returned ops.json and iterations.json put back into target/gpu-measure:
#   scripts/gpu-measure.sh analyze
#   cp target/gpu-measure/profile-full.json crates/cost/profiles/<device>.json
#
# Models (families for leave-one-out in parentheses): resnet50_train (resnet50), vgg16 and
# vgg16_bn (vgg16), bert_base_train (bert_base) — the three trained and predicted — plus
# squeezenet1_1 (squeezenet), measured only as further calibration data. (bert_tiny's dynamo
# export reshapes with constants that mix the batch into other entries: rebatch.py cannot
# give it a symbolic batch, so it is left out.)
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-}
DIR=${2:-target/gpu-measure}
MODELS=${QSYNC_MODELS:-../shared/models}
BATCH=${QSYNC_BATCH:-32}
SEQ=${QSYNC_SEQ:-128}

usage() { echo "usage: $0 prepare|run|run-ops|run-train|analyze [DIR]" >&2; exit 2; }

qsyncc_bin() {
  if [ -n "${QSYNCC:-}" ]; then echo "$QSYNCC"; return; fi
  cargo build -q -p qsyncc --features full >&2
  echo target/debug/qsyncc
}

copy_out() {
  [ -n "${OUT:-}" ] || return 0
  local f
  for f in "$@"; do [ -f "$f" ] && cp "$f" "$OUT"/; done
}

has_gpu() {
  python3 - <<'EOF' 2>/dev/null
import sys
try:
    import torch
except ImportError:
    print("PyTorch is not installed"); sys.exit(1)
if not torch.cuda.is_available():
    print("PyTorch sees no CUDA GPU"); sys.exit(1)
print(torch.cuda.get_device_name())
EOF
}

prepare() {
  local q
  q=$(qsyncc_bin)
  mkdir -p "$DIR/models"
  for m in resnet50_train bert_base_train; do
    [ -f "$MODELS/$m.onnx" ] || { echo "error: $MODELS/$m.onnx not found (set QSYNC_MODELS)" >&2; exit 2; }
    cp "$MODELS/$m.onnx" "$DIR/models/$m.onnx"
  done
  for m in vgg16 vgg16_bn squeezenet1_1; do
    [ -f "$MODELS/$m.onnx" ] || { echo "error: $MODELS/$m.onnx not found (set QSYNC_MODELS)" >&2; exit 2; }
    python3 scripts/gpu/rebatch.py "$MODELS/$m.onnx" "$DIR/models/$m.onnx"
  done
  "$q" profile worklist --batch "$BATCH" --dim "seq=$SEQ" -o "$DIR/worklist.json" \
    "$DIR/models/resnet50_train.onnx=resnet50" \
    "$DIR/models/vgg16.onnx=vgg16" "$DIR/models/vgg16_bn.onnx=vgg16" \
    "$DIR/models/bert_base_train.onnx=bert_base" \
    "$DIR/models/squeezenet1_1.onnx=squeezenet"
  echo "prepared $DIR ($(du -sh "$DIR" | cut -f1)); on the GPU machine: $0 run $DIR"
}

run_ops() {
  local gpu
  if ! gpu=$(has_gpu); then echo "skipped: no GPU to measure on ($gpu)"; exit 3; fi
  [ -f "$DIR/worklist.json" ] || { echo "error: $DIR/worklist.json missing: run '$0 prepare' first" >&2; exit 2; }
  echo "GPU: $gpu"
  # QSYNC_OPS_ARGS: more profile.py options (--budget-s, --precisions, --reps).
  PYTHONUNBUFFERED=1 python3 scripts/gpu/profile.py "$DIR/worklist.json" "$DIR/ops.json" ${QSYNC_OPS_ARGS:-} 2>&1 | tee "$DIR/ops.log"
  copy_out "$DIR/ops.json" "$DIR/ops.log"
}

run_train() {
  local gpu
  if ! gpu=$(has_gpu); then echo "skipped: no GPU to measure on ($gpu)"; exit 3; fi
  mkdir -p "$DIR"
  echo "GPU: $gpu"
  # QSYNC_TRAIN_ARGS: more train.py options (--models, --precisions, --warmup, --iters).
  PYTHONUNBUFFERED=1 python3 scripts/gpu/train.py "$DIR/iterations.json" --batch "$BATCH" --seq "$SEQ" \
    ${QSYNC_TRAIN_ARGS:-} 2>&1 \
    | tee "$DIR/train.log"
  copy_out "$DIR/iterations.json" "$DIR/train.log"
}

analyze() {
  local q
  q=$(qsyncc_bin)
  for f in ops.json iterations.json; do
    [ -f "$DIR/$f" ] || { echo "error: $DIR/$f missing: run '$0 run' on a GPU machine first" >&2; exit 2; }
  done
  python3 scripts/gpu/analyze.py --qsyncc "$q" --ops "$DIR/ops.json" --iterations "$DIR/iterations.json" \
    --models-dir "$DIR/models" --out-dir "$DIR/analysis" --markdown "$DIR/table.md" --json "$DIR/results.json" \
    --full-profile "$DIR/profile-full.json"
}

case "$MODE" in
  prepare) prepare ;;
  run) run_ops; run_train ;;
  run-ops) run_ops ;;
  run-train) run_train ;;
  analyze) analyze ;;
  *) usage ;;
esac
