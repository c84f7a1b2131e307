#!/usr/bin/env bash
# The validation of docs/validation.md on a GPU, as one prepared command:
# the per-op profile and measured-against-predicted training iterations
# (leave-one-out, scripts/gpu-measure.sh), the synchronization paths as they
# execute (the DDP hook with host kernels, "host-staged", against qsync's
# PTX kernels, "device": scripts/gpu-ddp-check.sh and the backward timed by
# examples/train_ddp.py bench), and the NCCL communicator against the MPI
# engine (scripts/gpu-sync-check.sh).
#
#   scripts/gpu-validate.sh prepare          here (cargo, LLVM, Open MPI; no GPU)
#   scripts/gpu-validate.sh run [PART...]    on the GPU machine; PARTs: sync paths ops train
#                                            (default: all, in that order, cheapest first)
#   scripts/gpu-validate.sh analyze          here, with the results put back under target/
#
# On a lent device machine, with carry=["target/gpu-measure", "target/gpu-ddp-check",
# "target/gpu-sync-check", "target/gpu-validate"]: `scripts/gpu-validate.sh run`
# (each part writes into $OUT when it is set). The device time of a whole run
# is about 12 minutes (ops 3-5, train 3, paths 2, sync 1-2): run the parts in
# two calls if a call is limited to 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/gpu-validate
mode=${1:-}
shift || true

case "$mode" in
prepare)
  bash scripts/gpu-measure.sh prepare
  bash scripts/gpu-ddp-check.sh prepare
  bash scripts/gpu-sync-check.sh prepare
  mkdir -p "$dir"
  cp examples/train_ddp.py "$dir/"
  # The model the paths part times, as ONNX, and the predictions of both
  # paths for it on one node of two H100s: what `analyze` sets the measured
  # backward times against (as a ratio device / host-staged: two ranks on
  # one GPU share it, which no cluster file describes).
  venv=${QSYNC_TORCH_VENV:-$HOME/.cache/qsync/torch-venv}
  "$venv/bin/python" - "$dir/transformer.onnx" <<'EOF'
import sys, torch
sys.path.insert(0, "examples")
import train_ddp as t
m = t.make_model("transformer", 0); m.train()
torch.onnx.export(m, (t.example_input("transformer", 16),), sys.argv[1], dynamo=False,
                  training=torch.onnx.TrainingMode.TRAINING, input_names=["x"], do_constant_folding=False)
EOF
  for path in host-staged device; do
    for scheme in fp16 qgz-int8 qgz-int4; do
      target/release/qsyncc simulate "$dir/transformer.onnx" --targets h100-sxm:2 --batch 16 \
        --sync "$scheme" --sync-path "$path" --json >"$dir/predicted-$path-$scheme.json"
    done
  done
  echo "prepared: target/gpu-measure target/gpu-ddp-check target/gpu-sync-check $dir"
  ;;
run)
  parts=("$@")
  [ ${#parts[@]} -gt 0 ] || parts=(sync paths ops train)
  out=${OUT:-$dir/out}
  mkdir -p "$out"
  for part in "${parts[@]}"; do
    case "$part" in
    sync) OUT="$out" bash scripts/gpu-sync-check.sh run || echo "sync: FAILED" | tee -a "$out/summary.txt" ;;
    paths)
      OUT="$out" bash scripts/gpu-ddp-check.sh run || echo "paths: ddp-check FAILED" | tee -a "$out/summary.txt"
      py=target/gpu-ddp-check/venv/bin/python
      [ -x "$py" ] || py=python3
      # The backward under each hook, host kernels against device kernels,
      # next to the backward without synchronization, round-robin in one job.
      for kernels in host device; do
        NCCL_MULTI_RANK_GPU_ENABLE=1 QSYNC_PTX_DIR="$PWD/target/gpu-ddp-check/ptx" \
          "$py" -m torch.distributed.run --standalone --nproc-per-node 2 "$dir/train_ddp.py" bench --device cuda \
          --model transformer --batch 16 --reps 10 --hooks fp16,qgz-int8,qgz-int4 --kernels "$kernels" \
          >"$out/paths-$kernels.jsonl" 2>"$out/paths-$kernels.err" ||
          echo "paths: bench with $kernels kernels FAILED (see paths-$kernels.err)" | tee -a "$out/summary.txt"
      done
      ;;
    ops) OUT="$out" bash scripts/gpu-measure.sh run-ops ;;
    train) OUT="$out" bash scripts/gpu-measure.sh run-train ;;
    *) echo "unknown part '$part' (sync, paths, ops, train)" >&2; exit 2 ;;
    esac
  done
  ;;
analyze)
  out=${OUT:-$dir/out}
  [ -f "$out/ops.json" ] && cp "$out/ops.json" target/gpu-measure/
  [ -f "$out/iterations.json" ] && cp "$out/iterations.json" target/gpu-measure/
  if [ -f target/gpu-measure/ops.json ] && [ -f target/gpu-measure/iterations.json ]; then
    bash scripts/gpu-measure.sh analyze
  fi
  python3 - "$dir" "$out" <<'EOF'
import json, os, sys
d, out = sys.argv[1], sys.argv[2]
rows = []
for scheme in ["fp16", "qgz-int8", "qgz-int4"]:
    m = {}
    for k in ["host", "device"]:
        f = os.path.join(out, f"paths-{k}.jsonl")
        if os.path.exists(f):
            for l in open(f):
                if l.startswith("{"):
                    r = json.loads(l)
                    if r["hook"] == scheme:
                        m[k] = r["exposed_sync_s"]
    p = {k: json.load(open(os.path.join(d, f"predicted-{k}-{scheme}.json"))) for k in ["host-staged", "device"]}
    if len(m) == 2:
        rows.append((scheme, m["host"], m["device"], p["host-staged"]["iteration_ms"], p["device"]["iteration_ms"]))
print("| scheme | exposed sync, host kernels s | device kernels s | predicted iteration host-staged ms | device ms |")
print("|---|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r[0]} | {r[1]:.4f} | {r[2]:.4f} | {r[3]:.2f} | {r[4]:.2f} |")
if not rows:
    print("(no measured paths: run `scripts/gpu-validate.sh run paths` on a GPU machine)")
EOF
  ;;
*)
  echo "usage: $0 prepare | run [sync] [paths] [ops] [train] | analyze" >&2
  exit 2
  ;;
esac
