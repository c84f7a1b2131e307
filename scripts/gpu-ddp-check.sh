#!/usr/bin/env bash
# The qsync Python package on a GPU, as one prepared command.
#
#   scripts/gpu-ddp-check.sh prepare   # here: build the wheel and a plan into target/gpu-ddp-check
#   scripts/gpu-ddp-check.sh run       # on the GPU machine (carry target/gpu-ddp-check)
#
# `run` installs the wheel (no dependencies: the machine's PyTorch is used)
# into a folder put on PYTHONPATH, then trains the
# example transformer with torchrun on the GPU: plain DDP (NCCL) against the
# plan applied with the qsync hook over the runtime's NCCL communicator, for
# fp16, qgz-int8 and qgz-int4, 2 ranks on the one GPU when NCCL allows it
# (NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL >= 2.30), else 1 rank, then the same
# hooks quantizing with qsync's PTX kernels on the GPU (`--kernels device`;
# the same kernels' bits as the host run, so the same losses). Step times and
# losses land in $OUT (or target/gpu-ddp-check/out): summary.txt, *.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/gpu-ddp-check
case "${1:-}" in
prepare)
  bash scripts/setup.sh
  venv=${QSYNC_TORCH_VENV:-$HOME/.cache/qsync/torch-venv}
  rm -rf "$dir" && mkdir -p "$dir"
  (cd crates/python && "$venv/bin/maturin" build --release -q -o "../../$dir")
  cargo build --release -q -p qsyncc --features full
  QSYNCC=target/release/qsyncc "$venv/bin/python" examples/train_ddp.py plan --model transformer \
    --targets h100-sxm:1,t4:1 --batch 16 -o "$dir/plan" -- --method qsync
  cp examples/train_ddp.py "$dir/"
  # qsync's kernels as PTX per architecture, for the `--kernels device` run.
  bash scripts/gpu/ptx.sh target/release/qsyncc "$dir/ptx"
  ls -la "$dir"
  ;;
run)
  out=${OUT:-$dir/out}
  mkdir -p "$out"
  # The wheel into a folder of its own on PYTHONPATH, beside the machine's
  # PyTorch (a venv made from the machine's python, itself a venv, would not
  # see PyTorch).
  rm -rf "$dir/site"
  python3 -m pip install -q --no-deps --no-index --no-compile --target "$dir/site" "$dir"/qsync-*.whl
  export PYTHONPATH="$PWD/$dir/site${PYTHONPATH:+:$PYTHONPATH}"
  py=python3
  # The runtime's NCCL communicator opens libnccl.so: the wheel's, linked.
  if paths=$(PYTHON="$py" bash scripts/gpu/nccl-lib.sh "$dir/lib"); then
    export LD_LIBRARY_PATH="$paths${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  {
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
  } | tee "$out/summary.txt"
  ranks=2
  export NCCL_MULTI_RANK_GPU_ENABLE=1
  export QSYNC_PTX_DIR="$PWD/$dir/ptx"
  if [ "$("$py" -c 'import torch; print(int(torch.cuda.device_count() < 2 and torch.cuda.nccl.version() < (2, 30)))' 2>/dev/null)" = 1 ]; then
    echo "one GPU and NCCL before 2.30, which refuses two ranks on one GPU: 1 rank" | tee -a "$out/summary.txt"
    ranks=1
  elif ! "$py" -m torch.distributed.run --standalone --nproc-per-node 2 "$dir/train_ddp.py" train --device cuda \
      --model transformer --batch 16 --steps 3 --schemes ddp >"$out/probe.jsonl" 2>"$out/probe.err"; then
    echo "2 ranks on one GPU refused (see probe.err): 1 rank" | tee -a "$out/summary.txt"
    ranks=1
  fi
  run() { # name, args...
    local name=$1; shift
    local t0=$(date +%s.%N)
    "$py" -m torch.distributed.run --standalone --nproc-per-node "$ranks" "$dir/train_ddp.py" train --device cuda \
      --model transformer --steps 20 "$@" >"$out/$name.jsonl" 2>"$out/$name.err" \
      && echo "$name: ok, $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s for 20 steps, last: $(tail -1 "$out/$name.jsonl" | cut -c1-120)" \
      || echo "$name: FAILED (see $name.err)"
  } 
  {
    run ddp --batch 16 --schemes ddp
    if [ "$ranks" = 2 ]; then
      # rank 0 applies the h100-sxm plan, rank 1 the t4 plan
      run plan-hooks --plan "$dir/plan" --schemes fp16,qgz-int8,qgz-int4
      # the same with the quantization on the GPU, by qsync's PTX kernels
      run plan-hooks-device --plan "$dir/plan" --schemes fp16,qgz-int8,qgz-int4 --kernels device
    else
      # the plan is for two devices: one rank runs the hook alone
      run hooks --batch 16 --schemes fp16,qgz-int8,qgz-int4
      run hooks-device --batch 16 --schemes fp16,qgz-int8,qgz-int4 --kernels device
    fi
  } | tee -a "$out/summary.txt"
  ;;
*)
  echo "usage: $0 prepare|run" >&2
  exit 2
  ;;
esac
