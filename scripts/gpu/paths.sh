#!/usr/bin/env bash
# The synchronization paths as they execute on a GPU (the `paths` part of
# scripts/gpu-validate.sh): the plan's hooks trained with torchrun
# (scripts/gpu-ddp-check.sh run), then the backward under each hook with
# host kernels ("host-staged") against qsync's PTX kernels ("device"), next
# to the backward without synchronization, round-robin in one job.
#   scripts/gpu/paths.sh RESULT_DIR     (after `scripts/gpu-validate.sh prepare`)
set -uo pipefail
cd "$(dirname "$0")/../.."
res=$1
mkdir -p "$res"
py=python3
# The wheel beside the machine's PyTorch (as scripts/gpu-ddp-check.sh run does).
rm -rf target/gpu-ddp-check/site
"$py" -m pip install -q --no-deps --no-index --no-compile --target target/gpu-ddp-check/site \
  target/gpu-ddp-check/qsync-*.whl || echo "paths: installing the wheel FAILED"
export PYTHONPATH="$PWD/target/gpu-ddp-check/site${PYTHONPATH:+:$PYTHONPATH}"
if paths=$(PYTHON="$py" bash scripts/gpu/nccl-lib.sh target/gpu-ddp-check/lib); then
  export LD_LIBRARY_PATH="$paths${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# Two ranks share the one GPU only where NCCL allows it (2.30 and later).
ranks=$("$py" -c 'import torch; print(2 if torch.cuda.device_count() > 1 or torch.cuda.nccl.version() >= (2, 30) else 1)' 2>/dev/null || echo 1)
echo "paths: $ranks rank(s)"
for mb in ${PATHS_MODELS:-transformer:16 resnet18:32}; do
  model=${mb%:*} batch=${mb#*:}
  for kernels in host device; do
    NCCL_MULTI_RANK_GPU_ENABLE=1 QSYNC_PTX_DIR="$PWD/target/gpu-ddp-check/ptx" \
      "$py" -m torch.distributed.run --standalone --nproc-per-node "$ranks" target/gpu-validate/train_ddp.py bench \
      --device cuda --model "$model" --batch "$batch" --reps 8 \
      --hooks "$(echo ${PATHS_SCHEMES:-fp16 qgz-int8 qgz-int4} | tr ' ' ,)" --kernels "$kernels" \
      >"$res/paths-$model-$kernels.jsonl" 2>"$res/paths-$model-$kernels.err" ||
      echo "paths: bench of $model with $kernels kernels FAILED (see paths-$model-$kernels.err)"
  done
done
# Last (the part's cap may cut it): the plan applied and trained with the hooks.
OUT="$res" bash scripts/gpu-ddp-check.sh run || echo "paths: ddp-check FAILED"
