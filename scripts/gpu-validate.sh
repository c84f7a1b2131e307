#!/usr/bin/env bash
# The validation of docs/validation.md on a GPU, as one prepared command:
# the per-op profile and measured-against-predicted training iterations
# (leave-one-out, scripts/gpu-measure.sh), the synchronization paths as they
# execute (the DDP hook with host kernels, "host-staged", against qsync's
# PTX kernels, "device": scripts/gpu-ddp-check.sh and the backward timed by
# examples/train_ddp.py bench), and the NCCL communicator against the MPI
# engine (scripts/gpu-sync-check.sh).
#
#   scripts/gpu-validate.sh prepare              here (cargo, LLVM, Open MPI; no GPU; ~15 min from scratch)
#   scripts/gpu-validate.sh run [PART[:SECS]...] on the GPU machine; PARTs: sync paths ops train
#                                                (default: all four, each capped as below)
#   scripts/gpu-validate.sh analyze              here, with the returned files in target/gpu-validate/out
#                                                (PATHS_DIR=DIR: the paths' .jsonl from DIR instead)
#
# On a lent device machine, with carry=["target/gpu-measure", "target/gpu-ddp-check",
# "target/gpu-sync-check", "target/gpu-validate"]. Each part runs under its cap
# (SECS, default 600), keeps what it measured when cut, and comes back as one
# tarball in $OUT (PART.tgz) beside summary.txt.
#
# What the parts took on one H100 (2026-11-27; a machine started in ~35 s):
#   ops 94 s (159 ops); train 13-22 s a run (3 models x 4 precisions: ~200 s;
#   QSYNC_TRAIN_ARGS="--models vgg16,bert_base --warmup 10 --iters 30" narrows
#   it); paths ~25 s a bench (4 benches), then the plan's hooks trained
#   (gpu-ddp-check, ~20 s a scheme set); sync, one rank (NCCL < 2.30 on one
#   GPU): device digests 22 s, host digests and bounds longer.
# On one H200 (2026-11-28; started in ~30 s): train 141-157 s with
#   QSYNC_TRAIN_ARGS="--warmup 10 --iters 25 --kernel-iters 3" (12 runs, each
#   also profiled for its per-op kernel breakdown), ops 85-97 s (159 ops,
#   host times and both-gradient calls included).
# A 15-minute budget fits two calls, e.g.
#   run train:240 ops:150             (~7 min with the start)
#   run paths:200 sync:120            (~6 min)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/gpu-validate
# The paths part: MODEL:PER-RANK-BATCH pairs and the hooks it times.
PATHS_MODELS="transformer:16 resnet18:32"
PATHS_SCHEMES="fp16 qgz-int8 qgz-int4"
export PATHS_MODELS PATHS_SCHEMES
mode=${1:-}
shift || true

case "$mode" in
prepare)
  # The release qsyncc the wheel step builds serves the other two.
  bash scripts/gpu-ddp-check.sh prepare
  export QSYNCC=target/release/qsyncc
  bash scripts/gpu-measure.sh prepare
  bash scripts/gpu-sync-check.sh prepare
  mkdir -p "$dir"
  cp examples/train_ddp.py "$dir/"
  # The models the paths part times (the example transformer, 0.45 MiB of
  # gradients, and ResNet-18, 43 MiB), as ONNX, and the predictions of both
  # paths for each on one node of two H100s: what `analyze` sets the
  # measured exposed synchronization against.
  # (The ONNX files stay out of $dir: only the predictions travel.)
  venv=${QSYNC_TORCH_VENV:-$HOME/.cache/qsync/torch-venv}
  onnx=$(mktemp -d)
  for mb in $PATHS_MODELS; do
    model=${mb%:*} batch=${mb#*:}
    "$venv/bin/python" - "$onnx/$model.onnx" "$model" "$batch" <<'EOF'
import sys, torch
sys.path.insert(0, "examples")
import train_ddp as t
m = t.make_model(sys.argv[2], 0); m.train()
torch.onnx.export(m, (t.example_input(sys.argv[2], int(sys.argv[3])),), sys.argv[1], dynamo=False,
                  training=torch.onnx.TrainingMode.TRAINING, input_names=["x"], do_constant_folding=False)
EOF
    for path in host-staged device; do
      for scheme in $PATHS_SCHEMES; do
        target/release/qsyncc simulate "$onnx/$model.onnx" --targets h100-sxm:2 --batch "$batch" \
          --sync "$scheme" --sync-path "$path" --json >"$dir/predicted-$model-$path-$scheme.json"
      done
    done
  done
  rm -rf "$onnx"
  echo "prepared: target/gpu-measure target/gpu-ddp-check target/gpu-sync-check $dir"
  ;;
run)
  # PART or PART:SECONDS (a cap on that part; default 600). Each part writes
  # into its own folder and comes back as one tarball, PART.tgz (the device
  # tool returns at most 8 files), plus the shared summary.txt.
  set +e
  parts=("$@")
  [ ${#parts[@]} -gt 0 ] || parts=(sync:120 paths:200 ops:150 train:240)
  out=${OUT:-$dir/out}
  mkdir -p "$out"
  work=$(mktemp -d)
  {
    echo "== $(date -u +%FT%TZ) $(hostname)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None, "gpus", torch.cuda.device_count())' || true
    ldd --version | head -1
    nproc
  } 2>&1 | tee -a "$out/summary.txt"
  for spec in "${parts[@]}"; do
    part=${spec%%:*} cap=600
    [ "$spec" != "$part" ] && cap=${spec#*:}
    res="$work/$part"
    mkdir -p "$res"
    t0=$SECONDS
    case "$part" in
    sync) OUT="$res" timeout -k 10 "$cap" bash scripts/gpu-sync-check.sh run > "$res/run.log" 2>&1 ;;
    paths) timeout -k 10 "$cap" bash scripts/gpu/paths.sh "$res" > "$res/run.log" 2>&1 ;;
    ops) # stop starting new ops 40 s before the cap, so ops.json is written
      OUT="$res" QSYNC_OPS_ARGS="--budget-s $((cap > 80 ? cap - 40 : cap / 2)) ${QSYNC_OPS_ARGS:-}" \
        timeout -k 10 "$cap" bash scripts/gpu-measure.sh run-ops > "$res/run.log" 2>&1 ;;
    train) OUT="$res" timeout -k 10 "$cap" bash scripts/gpu-measure.sh run-train > "$res/run.log" 2>&1 ;;
    *) echo "unknown part '$part' (sync, paths, ops, train)" >&2; exit 2 ;;
    esac
    rc=$?
    # What a part stopped at its cap had written so far.
    for f in target/gpu-measure/ops.json target/gpu-measure/iterations.json target/gpu-measure/ops.log \
      target/gpu-measure/train.log; do
      [ -f "$f" ] && [ ! -f "$res/$(basename "$f")" ] && cp "$f" "$res/"
    done
    echo "== part $part: status $rc after $((SECONDS - t0)) s (cap $cap s)" | tee -a "$out/summary.txt"
    [ -f "$res/summary.txt" ] && sed "s/^/  $part| /" "$res/summary.txt" | tee -a "$out/summary.txt"
    tail -n 5 "$res/run.log" | sed "s/^/  $part> /" | tee -a "$out/summary.txt"
    tar czf "$out/$part.tgz" -C "$work" "$part"
  done
  ;;
analyze)
  out=${OUT:-$dir/out}
  for t in "$out"/*.tgz; do [ -f "$t" ] && tar xzf "$t" -C "$out"; done
  for part in ops train; do
    for f in "$out/$part"/ops.json "$out/$part"/iterations.json; do [ -f "$f" ] && cp "$f" "$out/"; done
  done
  [ -d "$out/paths" ] && cp "$out"/paths/paths-*.jsonl "$out/" 2>/dev/null
  [ -f "$out/ops.json" ] && cp "$out/ops.json" target/gpu-measure/
  [ -f "$out/iterations.json" ] && cp "$out/iterations.json" target/gpu-measure/
  if [ -f target/gpu-measure/ops.json ] && [ -f target/gpu-measure/iterations.json ]; then
    bash scripts/gpu-measure.sh analyze
  fi
  python3 - "$dir" "$out" <<'EOF'
import json, os, sys
d, out = sys.argv[1], sys.argv[2]
models = [m.split(":") for m in os.environ["PATHS_MODELS"].split()]
schemes = os.environ["PATHS_SCHEMES"].split()
paths_dir = os.environ.get("PATHS_DIR") or os.path.join(out, "paths")
print("| model | scheme | path | measured exposed sync ms | phases: quantize / exchange / dequantize / staging ms "
      "| predicted ms | error |")
print("|---|---|---|---:|---|---:|---:|")
rows = 0
for model, batch in models:
    for kernels, path in [("host", "host-staged"), ("device", "device")]:
        f = os.path.join(paths_dir, f"paths-{model}-{kernels}.jsonl")
        if not os.path.exists(f):
            continue
        measured = {}
        for line in open(f):
            if line.startswith("{"):
                r = json.loads(line)
                measured[r["hook"]] = r
        for scheme in ["ddp"] + schemes:
            if scheme not in measured:
                continue
            m = measured[scheme]["exposed_sync_s"] * 1e3
            ph = measured[scheme].get("phases_s")
            ph = " / ".join(f"{ph[k] * 1e3:.1f}" for k in ["quantize_s", "exchange_s", "dequantize_s", "staging_s"]) \
                if ph else ""
            pf = os.path.join(d, f"predicted-{model}-{path}-{scheme}.json")
            if scheme == "ddp" or not os.path.exists(pf):
                print(f"| {model} | {scheme} | NCCL f32 | {m:.3f} | | | |")
                continue
            p = json.load(open(pf))
            pred = max(dev["idle_ms"] for dev in p["devices"].values())
            err = f"{(pred - m) / m * 100:+.0f}%" if m > 0 else "n/a"
            print(f"| {model} | {scheme} | {path} | {m:.3f} | {ph} | {pred:.3f} | {err} |")
            rows += 1
if not rows:
    print("(no measured paths: run `scripts/gpu-validate.sh run paths` on a GPU machine)")
EOF
  ;;
*)
  echo "usage: $0 prepare | run [sync] [paths] [ops] [train] | analyze" >&2
  exit 2
  ;;
esac
