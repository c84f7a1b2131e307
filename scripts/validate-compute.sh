#!/usr/bin/env bash
# Checked against real runs, compute: the calibration pipeline
# prepared for GPUs (scripts/gpu-measure.sh: worklist -> PyTorch measurement
# -> profile -> leave-one-out prediction) run on this machine's CPU as the
# device, and the table of measured against predicted training iterations
# written into docs/validation-compute.md (between its `generated` markers).
#
#   scripts/validate-compute.sh [DIR]      (DIR defaults to target/validate-compute; ~12 min on 2 cores)
#   QSYNC_COMPUTE_REPREDICT=1 scripts/validate-compute.sh [DIR]   (measure nothing: predict DIR's runs again)
#
# Steps, each a script of its own:
#   1. scripts/cpu/device.py     this CPU as a device file (lscpu figures, measured rates): DIR/cpu.json
#   2. scripts/cpu/export.py     ResNet-18 and BERT-tiny as training-mode ONNX with a symbolic batch;
#                                the shared resnet50_train, bert_base_train and squeezenet1_1 (rebatched)
#   3. qsyncc profile worklist   every distinct op of the five models at batch 8, plus batch points 1, 2
#                                and 32 (QSYNC_BATCH_POINTS)
#   4. scripts/gpu/profile.py --device cpu     per-op times (fwd, input and weight gradients) -> DIR/ops.json
#   5. scripts/cpu/train.py      training iterations of ResNet-18 and BERT-tiny at batches 1, 2, 8, 32
#                                (and each phase's CPU time, each ATen operator's under torch.profiler)
#   6. scripts/gpu/analyze.py    per measured model, `qsyncc profile build --exclude FAMILY` (the profile
#                                never measured that model's family) and `qsyncc simulate` with and without it
#   7. scripts/gpu/breakdown.py  per run, each phase measured against the leave-one-out prediction
#
# Environment: PYTHON (default ~/.cache/qsync/torch-venv/bin/python, with torch, torchvision,
# transformers and onnx), QSYNCC (default: build target/debug/qsyncc), QSYNC_MODELS (the shared
# models, default ../shared/models), QSYNC_TRAIN_MODELS (default resnet18,bert_tiny),
# QSYNC_TRAIN_BATCHES (default 1,2,8,32), QSYNC_BATCH_POINTS (the op profile's batches besides 8,
# default 1,2,32), QSYNC_THREADS (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-target/validate-compute}
PY=${PYTHON:-$HOME/.cache/qsync/torch-venv/bin/python}
MODELS=${QSYNC_MODELS:-../shared/models}
TRAIN_MODELS=${QSYNC_TRAIN_MODELS:-resnet18,bert_tiny}
TRAIN_BATCHES=${QSYNC_TRAIN_BATCHES:-1,2,8,32}
BATCH_POINTS=${QSYNC_BATCH_POINTS:-1,2,32}
DOC=docs/validation-compute.md
CMD="scripts/validate-compute.sh${1:+ $1}"

# One thread: on a machine shared with other work, two OpenMP threads that
# wait on each other at every barrier are slowed many times over whenever
# either is descheduled; one thread is timed steadily. The device file
# describes that one core. QSYNC_THREADS overrides.
export OMP_NUM_THREADS=${QSYNC_THREADS:-1} MKL_NUM_THREADS=${QSYNC_THREADS:-1}
# glibc keeps freed memory in the process (no mmap for large blocks, no
# heap trimming), as PyTorch's CPU performance guides have users do with
# jemalloc or tcmalloc: otherwise every large tensor (activations, AdamW's
# temporaries) is page-faulted anew at every step in some processes and not
# in others, by 3 us a page on this machine. Both the per-op profile and
# the measured iterations run so. QSYNC_MALLOC=system leaves glibc as it is.
if [ "${QSYNC_MALLOC:-retain}" = retain ]; then
  export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647
fi
[ -x "$PY" ] || { echo "error: $PY not found (set PYTHON to a python with torch, torchvision, transformers, onnx)" >&2; exit 2; }
if [ -n "${QSYNCC:-}" ]; then Q=$QSYNCC; else cargo build -q -p qsyncc --features full; Q=target/debug/qsyncc; fi
mkdir -p "$DIR/models"
# A private copy: the shared target directory may be rebuilt while this runs.
cp "$Q" "$DIR/qsyncc"
Q=$DIR/qsyncc

if [ -n "${QSYNC_COMPUTE_REPREDICT:-}" ]; then
  # Measure nothing: predict the runs DIR holds again with this qsyncc.
  for f in cpu.json ops.json iterations.json load.txt models/resnet18_train.onnx; do
    [ -e "$DIR/$f" ] || { echo "error: QSYNC_COMPUTE_REPREDICT: $DIR/$f is missing (measure first)" >&2; exit 2; }
  done
  { read -r load_before; read -r load_after; } < "$DIR/load.txt"
else
"$PY" scripts/cpu/device.py "$DIR/cpu.json"
"$PY" scripts/cpu/export.py "$DIR/models"
for m in resnet50_train bert_base_train; do
  [ -f "$MODELS/$m.onnx" ] || { echo "error: $MODELS/$m.onnx not found (set QSYNC_MODELS)" >&2; exit 2; }
  cp "$MODELS/$m.onnx" "$DIR/models/$m.onnx"
done
"$PY" scripts/gpu/rebatch.py "$MODELS/squeezenet1_1.onnx" "$DIR/models/squeezenet1_1.onnx"
"$Q" profile worklist --batch 8 --batch-points "$BATCH_POINTS" --dim seq=128 -o "$DIR/worklist.json" \
  "$DIR/models/resnet18_train.onnx=resnet18" "$DIR/models/resnet50_train.onnx=resnet50" \
  "$DIR/models/squeezenet1_1.onnx=squeezenet" "$DIR/models/bert_tiny_train.onnx=bert_tiny" \
  "$DIR/models/bert_base_train.onnx=bert_base"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
PYTHONUNBUFFERED=1 "$PY" scripts/gpu/profile.py "$DIR/worklist.json" "$DIR/ops.json" --device cpu --precisions fp32 \
  --reps 3 --target-ms 20 > "$DIR/ops.log" 2>&1 || { tail -20 "$DIR/ops.log" >&2; exit 2; }
PYTHONUNBUFFERED=1 "$PY" scripts/cpu/train.py "$DIR/iterations.json" --models "$TRAIN_MODELS" --batches "$TRAIN_BATCHES" \
  --op-iters 2 | tee "$DIR/train.log"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
printf '%s\n%s\n' "$load_before" "$load_after" > "$DIR/load.txt"
fi
"$PY" scripts/gpu/analyze.py --qsyncc "$Q" --ops "$DIR/ops.json" --iterations "$DIR/iterations.json" \
  --models-dir "$DIR/models" --device cpu --device-file "$DIR/cpu.json" --statistic cpu_median \
  --out-dir "$DIR/analysis" --markdown "$DIR/table.md" --json "$DIR/results.json" > /dev/null
# Where each cell's time goes: every phase's CPU time against the leave-one-out prediction's.
# analyze.py wrote one leave-one-out profile per measured family.
profiles=()
for p in "$DIR"/analysis/profile-without-*.json; do
  fam=${p##*/profile-without-}
  profiles+=(--profile "${fam%.json}=$p")
done
"$PY" scripts/gpu/breakdown.py --iterations "$DIR/iterations.json" --models-dir "$DIR/models" "${profiles[@]}" \
  --qsyncc "$Q" --device cpu --device-file "$DIR/cpu.json" --out-dir "$DIR/breakdown" \
  --phases-markdown "$DIR/phases.md" > "$DIR/breakdown.log"

# The generated section of the doc: the command, the conditions, the device, the table.
gen=$(mktemp)
{
  echo "<!-- generated:begin (by $CMD; do not edit by hand) -->"
  echo
  echo "Regenerate with:"
  echo
  echo '```'
  echo "$CMD"
  echo '```'
  echo
  "$PY" - "$DIR" "$load_before" "$load_after" <<'EOF'
import json, sys
d, before, after = sys.argv[1], sys.argv[2], sys.argv[3]
dev = json.load(open(f"{d}/cpu.json"))
res = json.load(open(f"{d}/results.json"))
its = json.load(open(f"{d}/iterations.json"))
print(f"Device file (`{d}/cpu.json`, written by `scripts/cpu/device.py`): {dev['full_name']}; "
      f"FP32 peak {dev['cuda_core_tflops']['fp32'] * 1e3:.1f} GFLOP/s from lscpu, "
      f"efficiency {dev['efficiency']['cuda_core']:.3f} (measured matrix product), "
      f"memory {dev['memory_bandwidth_gb_s']:.1f} GB/s (measured copy), "
      f"{dev['launch_overhead_us']:.2f} us per operator (measured). "
      f"PyTorch {its['meta'].get('torch')}, {its['meta'].get('threads')} threads, measured {its['meta'].get('date')}; "
      f"load average (1, 5, 15 min) {before} before the op profile, {after} after the iterations "
      "(the CPU is shared with other work: every time here is CPU time of the measuring process, "
      "user + system, on one thread: what the run takes alone; the wall clock is shown beside it).\n")
print("| model | batch | measured ms (CPU time, median) | wall ms (min) | device file ms | error | leave-one-out profile ms | error | profile |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
med = {(r["model"], r["batch"]): r["min_ms"] for r in its["runs"]}
for r in res["rows"]:
    shape = f"{r['batch']}" + (f" x {r['seq']}" if r.get("seq") else "")
    print(f"| {r['model']} | {shape} | {r['measured_ms']:.1f} | {med[(r['model'], r['batch'])]:.1f} | "
          f"{r['datasheet_ms']:.1f} | {100 * r['datasheet_err']:+.1f}% | {r['calibrated_ms']:.1f} | "
          f"{100 * r['calibrated_err']:+.1f}% | `{r['profile']}` |")
errs = sorted(abs(r["calibrated_err"]) for r in res["rows"])
n = len(errs)
median = (errs[n // 2] if n % 2 else (errs[n // 2 - 1] + errs[n // 2]) / 2) if n else 0.0
worst = errs[-1] if n else 0.0
miss = [f"{r['model']} at {r['batch']} ({100 * r['calibrated_err']:+.1f}%)" for r in res["rows"]
        if abs(r["calibrated_err"]) > 0.15]
print(f"\nLeave-one-out profile: median |error| {100 * median:.1f}% (goal 5%), worst {100 * worst:.1f}% (goal 15%)."
      + (f" Cells beyond 15%: {', '.join(miss)}." if miss else " No cell beyond 15%."))
EOF
  echo
  echo "Where the time goes: CPU time per phase, measured / predicted with the leave-one-out profile (forward with"
  echo "the loss; the optimizer step with zero_grad; \`$DIR/breakdown.log\` has each kind of operator too):"
  echo
  cat "$DIR/phases.md"
  echo
  echo "<!-- generated:end -->"
} > "$gen"
if [ -f "$DOC" ] && grep -q '<!-- generated:begin' "$DOC"; then
  "$PY" - "$DOC" "$gen" <<'EOF'
import re, sys
doc, gen = open(sys.argv[1]).read(), open(sys.argv[2]).read().rstrip("\n")
out = re.sub(r"<!-- generated:begin.*?<!-- generated:end -->", lambda _: gen, doc, flags=re.S)
open(sys.argv[1], "w").write(out)
EOF
else
  { echo "# Compute: predicted against measured training iterations on this CPU"; echo; cat "$gen"; } > "$DOC"
fi
rm -f "$gen"
echo "wrote $DOC"
