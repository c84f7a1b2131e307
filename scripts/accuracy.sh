#!/usr/bin/env bash
# Plans and synchronization schemes trained to the end on real data
# (scikit-learn's handwritten digits), final test accuracy over seeds next
# to each plan's indicator Ω; writes docs/accuracy.md. CPU only: 4 ranks
# under torchrun (gloo) as qsyncc's `v100:2,t4:2`. About 15 minutes on 2 cores.
#
#   scripts/accuracy.sh                      # the full run: 10 epochs, seeds 0,1,2
#   EPOCHS=2 SEEDS=0 scripts/accuracy.sh     # a reduced run (the doc says so)
#
# Environment: EPOCHS, SEEDS, MODELS (cnn,transformer), CONFIGS, OUT
# (docs/accuracy.md), WORK (target/accuracy), QSYNC_TORCH_VENV
# (~/.cache/qsync/torch-venv), QSYNCC (target/release/qsyncc, built if absent).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
EPOCHS=${EPOCHS:-10}
SEEDS=${SEEDS:-0,1,2}
MODELS=${MODELS:-cnn,transformer}
ALL_CONFIGS=fp32,fp32-hook,up,qsync,joint,fp16,qgz-int8,qgz-int8-ef,qgz-int4,qgz-int4-ef,nbit-2,nbit-2-sr,nbit-4,nbit-4-sr
CONFIGS=${CONFIGS:-$ALL_CONFIGS}
OUT=${OUT:-docs/accuracy.md}
WORK=${WORK:-target/accuracy}
VENV=${QSYNC_TORCH_VENV:-$HOME/.cache/qsync/torch-venv}
PY=$VENV/bin/python
[ -x "$PY" ] || { echo "accuracy: no PyTorch environment at $VENV: run scripts/setup.sh" >&2; exit 1; }
if [ -z "${QSYNCC:-}" ]; then
  [ -x target/release/qsyncc ] || cargo build --release -q -p qsyncc
  QSYNCC=$PWD/target/release/qsyncc
fi
export QSYNCC OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore
"$PY" -c 'import sklearn' 2>/dev/null || "$VENV/bin/pip" install -q --disable-pip-version-check scikit-learn
if ! "$PY" -c 'import qsync' 2>/dev/null; then
  rm -rf "$WORK/wheel"
  (cd crates/python && "$VENV/bin/maturin" build -q -o "../../$WORK/wheel")
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$WORK"/wheel/*.whl
fi
mkdir -p "$WORK"
results=()
for m in ${MODELS//,/ }; do
  echo "accuracy: planning $m" >&2
  "$PY" scripts/accuracy/digits.py prepare --model "$m" -o "$WORK/$m" >/dev/null
  echo "accuracy: training $m ($CONFIGS; seeds $SEEDS; $EPOCHS epochs)" >&2
  "$VENV/bin/torchrun" --standalone --nproc-per-node 4 scripts/accuracy/digits.py train --model "$m" \
    --plans "$WORK/$m" --configs "$CONFIGS" --seeds "$SEEDS" --epochs "$EPOCHS" >"$WORK/$m.jsonl"
  results+=("$WORK/$m.jsonl")
done
took=$(( $(date +%s) - start ))
note=""
if [ "$EPOCHS" != 10 ] || [ "$SEEDS" != 0,1,2 ] || [ "$MODELS" != cnn,transformer ] \
  || [ "$CONFIGS" != "$ALL_CONFIGS" ]; then
  note="Reduced run (EPOCHS=$EPOCHS SEEDS=$SEEDS MODELS=$MODELS CONFIGS=$CONFIGS), not the full one: rerun scripts/accuracy.sh without overrides."
fi
cmd="scripts/accuracy.sh"
[ -n "$note" ] && cmd="EPOCHS=$EPOCHS SEEDS=$SEEDS MODELS=$MODELS CONFIGS=$CONFIGS scripts/accuracy.sh"
"$PY" scripts/accuracy/digits.py report "${results[@]}" --plans-root "$WORK" -o "$OUT" --command "$cmd" \
  --date "$(date -u '+%Y-%m-%d %H:%M UTC')" \
  --machine "$(uname -m), $(nproc) of $(nproc --all) cores usable, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), torch $("$PY" -c 'import torch; print(torch.__version__)')" \
  --took "$((took / 60)) min $((took % 60)) s" --note "$note" >/dev/null
echo "accuracy: wrote $OUT in $((took / 60)) min $((took % 60)) s" >&2
