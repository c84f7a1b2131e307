#!/usr/bin/env bash
# The NCCL side of the runtime in one command: qsync-runtime's NCCL communicator
# on the one GPU of a lent machine, checked against the MPI (CPU) engine.
#
#   scripts/gpu-sync-check.sh [all|prepare|run] [DIR]   (defaults: all, target/gpu-sync-check)
#
# prepare (here: cargo, Open MPI; no GPU):
#   - DIR/qsync-sync-check and DIR/qsync-shard-check: qsync-sync-check and
#     the sharded collectives' check built with the `nccl` feature only
#     (they link no MPI: the GPU machines have no Open MPI), release
#     profile unless QSYNC_PROFILE=debug;
#   - DIR/expected-<R>r-<N>n.txt: every scheme's result digests on fixed
#     inputs and seeds, recorded by `mpirun -n R qsync-sync-check --suite
#     digests --write` for (R ranks, N emulated nodes) = (2,1) (4,1) (4,2).
#   - DIR/ptx/sm_XX/kernels.ptx for sm_70 … sm_90: our kernels as PTX
#     (`qsyncc codegen --all-kernels`), for the device-kernel run below.
#   DIR is then all a GPU machine needs (a few MiB: carry it).
# run (a GPU machine: NVIDIA driver, the `nvidia-nccl-cu13` wheel or another
# NCCL ≥ 2.30; no network, no MPI). Without DIR/qsync-sync-check it builds
# one with `cargo build --offline` if cargo is there.
#   1. finds libnccl.so.2 (QSYNC_NCCL_LIB_DIR, the wheel's
#      nvidia.nccl.__path__, the system) and exposes it as DIR/lib/libnccl.so
#      (cudarc opens only unversioned or .so.1/.9–.13 names), prints the GPU
#      and NCCL's version;
#   2. 2 and 4 ranks on the one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1, set by
#      the launcher): the `bounds` suite (every scheme within its documented
#      bound on random, heavy-tailed, zero, tiny and outlier gradients, odd
#      sizes, ranks bitwise identical, NaN/inf propagate);
#   3. the `digests` suite against the recorded MPI digests: every quantized
#      scheme and FP16/BF16 (whose sums are ours, in f32) bit for bit; fp32
#      (NCCL's own f32 sum) within its bound;
#   3b. the same digests with `--kernels device`: every scheme quantizes,
#      packs, casts and accumulates with our PTX kernels on the GPU
#      (QSYNC_PTX_DIR=DIR/ptx), bit for bit against the MPI run on the CPU;
#   4. the `bench` suite (16 MiB of f32, group 512, every scheme) vs NCCL's
#      f32 all-reduce of the same buffer, in a table. All ranks share one
#      GPU, so the times show the cost of quantizing (on the host, with
#      qsync-kernels' reference code, plus the copies), not wire savings;
#   5. a killed rank (`--suite fault --fault exit`): the job must end with
#      an error on the survivor within its deadline, never hang.
#   6. the sharded collectives of ZeRO++ (qwZ all-gather, hpZ, qgZ
#      reduce-scatter) over NCCL with DIR/qsync-shard-check: its `bounds`
#      suite on 2 ranks (1 emulated node) and 4 ranks (2 nodes: hpZ and the
#      hierarchical qgZ) — every result within its bound, bitwise identical
#      on every rank, hpZ's gather equal to the world one; its `wire` suite
#      on 4 ranks (qwZ ≤ 0.52 of the fp16 all-gather, qgZ-int4 ≤ 0.14 of the
#      fp32 reduce-scatter, fractions in summary.txt); and, on 4 ranks, a
#      rank killed in the qwZ all-gather (`--suite fault --fault exit`),
#      which must end the job with an error, never hang. Checked against
#      the bounds and across ranks, not against recorded MPI digests (the
#      suite records none). Skipped, with the reason, when the binary is
#      missing and there is no cargo to build it.
#   Results: summary.txt, bench-<R>r.jsonl and the logs, in $OUT when set
#   (the lent machine's result folder), else DIR/results. Exit status 0 when
#   every step passed.
# all: prepare then run (a machine with cargo, Open MPI and a GPU).
#
# On a lent device machine (prepared here, run there), carry
# ["target/gpu-sync-check"] and run:  scripts/gpu-sync-check.sh run
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
DIR=${2:-target/gpu-sync-check}
PROFILE=${QSYNC_PROFILE:-release}
SHAPES="2:1 4:1 4:2"
# (prepare also records one rank: what a one-GPU machine with NCCL < 2.30 can run)
PREP_SHAPES="1:1 $SHAPES"
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

cargo_profile_flag() { [ "$PROFILE" = release ] && echo --release; }

prepare() {
  set -e
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  # The MPI build records the reference digests.
  cargo build -p qsync-runtime --bin qsync-sync-check
  for shape in $PREP_SHAPES; do
    local r=${shape%:*} n=${shape#*:}
    timeout 600 mpirun -n "$r" --bind-to none target/debug/qsync-sync-check \
      --suite digests --nodes "$n" --write "$DIR/expected-${r}r-${n}n.txt"
  done
  # The NCCL build for the GPU machine: no MPI linked.
  cargo build $(cargo_profile_flag) -p qsync-runtime --no-default-features --features nccl \
    --bin qsync-sync-check --bin qsync-shard-check
  local b
  for b in qsync-sync-check qsync-shard-check; do
    cp "target/$([ "$PROFILE" = release ] && echo release || echo debug)/$b" "$DIR/$b"
    if ldd "$DIR/$b" | grep -q libmpi; then echo "the NCCL build of $b links MPI"; exit 1; fi
    strip "$DIR/$b" 2>/dev/null || true # what travels to the GPU machine is size-limited
  done
  # Our kernels as PTX for every architecture, for `--kernels device`.
  local q=${QSYNCC:-}
  if [ -z "$q" ]; then cargo build -p qsyncc --features full; q=target/debug/qsyncc; fi
  bash scripts/gpu/ptx.sh "$q" "$DIR/ptx"
  set +e
  echo "prepared $DIR ($(du -sh "$DIR" | cut -f1)); run '$0 run' on the GPU machine with it"
}

# One rank on the one GPU: the communicator, the kernels and the schemes'
# bounds and bits against the MPI engine's one-rank digests; nothing crosses
# between ranks, so the fault and sharded steps (several ranks) are skipped.
one_rank() {
  local exp="$DIR/expected-1r-1n.txt"
  if [ -f "$exp" ]; then
    QSYNC_PTX_DIR="$DIR/ptx" step digests-device-1r-1n 0 timeout 600 "$bin" --backend nccl --kernels device \
      --ranks 1 --nodes 1 --suite digests --expect "$exp" --timeout 60
    step digests-1r-1n 0 timeout 600 "$bin" --backend nccl --ranks 1 --nodes 1 --suite digests --expect "$exp" --timeout 60
  else
    log "SKIP digests-1r-1n: $exp missing (recorded by '$0 prepare' under mpirun)"
  fi
  for kernels in host device; do
    if QSYNC_PTX_DIR="$DIR/ptx" step "bench-1r-$kernels" 0 timeout 600 "$bin" --backend nccl --kernels "$kernels" \
        --ranks 1 --nodes 1 --suite bench --bytes $((16 << 20)) --timeout 120; then
      grep '^{' "$res/bench-1r-$kernels.log" > "$res/bench-1r-$kernels.jsonl"
      bench_table "$res/bench-1r-$kernels.jsonl" "$kernels"
    fi
  done
  step bounds-1r 0 timeout 600 "$bin" --backend nccl --ranks 1 --nodes 1 --suite bounds --timeout 60
  log "SKIP bounds/digests on 2 and 4 ranks, fault-exit, shard-*: several ranks on one GPU"
  log "$([ $failed = 0 ] && echo 'gpu-sync-check (one rank): all steps passed' || echo 'gpu-sync-check: FAILED')"
  return $failed
}

bench_table() { # jsonl, kernels
  ${PYTHON:-python3} - "$1" "$2" <<'PY' | tee -a "$summary"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
if rows:
    r0 = rows[0]
    print(f"{r0['ranks']} rank(s) on one GPU ({r0['nodes']} emulated nodes), {r0['bytes']} bytes of f32, group {r0['group']}, "
          f"{sys.argv[2]} kernels:")
    print(f"{'scheme':16} {'wire/ring':>9} {'max err':>9} {'bound':>9} {'scheme s':>10} {'f32 s':>10} {'slower':>7}")
    for r in rows:
        ratio = r['seconds'] / r['f32_allreduce_seconds'] if r['f32_allreduce_seconds'] > 0 else float('nan')
        print(f"{r['scheme']:16} {r['wire_fraction']:9.4f} {r['max_abs_error']:9.2e} {r['error_bound']:9.2e} "
              f"{r['seconds']:10.6f} {r['f32_allreduce_seconds']:10.6f} {ratio:6.1f}x")
PY
}

run() {
  local res=${OUT:-$DIR/results}
  mkdir -p "$res"
  local summary="$res/summary.txt" failed=0
  : > "$summary"
  log() { echo "$*" | tee -a "$summary"; }
  step() { # name, expected status (0 or "fail"), command…
    local name=$1 want=$2; shift 2
    local t0=$SECONDS
    "$@" > "$res/$name.log" 2>&1
    local rc=$?
    local took=$((SECONDS - t0))
    if [ "$want" = 0 ] && [ $rc -eq 0 ]; then
      log "PASS $name (${took}s): $(grep -h 'failures over all ranks\|compared bit for bit' "$res/$name.log" | tr '\n' ' ')"
    elif [ "$want" = fail ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ]; then
      log "PASS $name (${took}s): the job failed as it must (status $rc)"
    else
      log "FAIL $name (${took}s, status $rc; see $name.log):"
      tail -n 25 "$res/$name.log" | tee -a "$summary"
      failed=1
    fi
    return $rc
  }

  local bin=$DIR/qsync-sync-check shard_bin=$DIR/qsync-shard-check
  if [ ! -x "$bin" ] || [ ! -x "$shard_bin" ]; then
    if command -v cargo > /dev/null; then
      log "no prepared binaries: building them (cargo --offline)"
      cargo build --offline $(cargo_profile_flag) -p qsync-runtime --no-default-features --features nccl \
        --bin qsync-sync-check --bin qsync-shard-check > "$res/build.log" 2>&1 || { log "build failed (see build.log)"; tail -n 20 "$res/build.log"; exit 1; }
      cp "target/$([ "$PROFILE" = release ] && echo release || echo debug)/qsync-sync-check" "$bin"
      cp "target/$([ "$PROFILE" = release ] && echo release || echo debug)/qsync-shard-check" "$shard_bin"
    elif [ ! -x "$bin" ]; then
      log "missing $bin and no cargo: run '$0 prepare' on a build machine and carry $DIR"; exit 1
    fi
  fi

  # 1. libnccl.so for cudarc, GPU and NCCL version.
  local paths
  if paths=$(bash scripts/gpu/nccl-lib.sh "$DIR/lib"); then
    export LD_LIBRARY_PATH="$paths${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    log "libnccl: $(readlink "$DIR/lib/libnccl.so") (exposed as $DIR/lib/libnccl.so)"
  else
    log "no libnccl.so* found (set QSYNC_NCCL_LIB_DIR): the next step reports what was searched"
  fi
  command -v nvidia-smi > /dev/null && log "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
  local probe
  probe=$("$bin" --backend nccl --suite probe 2>&1)
  log "$probe"
  case "$probe" in "NCCL "*) ;; *) log "FAIL: NCCL or the CUDA driver cannot be loaded"; exit 1 ;; esac
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  case "$probe" in
  "NCCL 2."[0-9].*|"NCCL 2.1"*|"NCCL 2.2"[0-9].*)
    if [ "${gpus:-0}" -lt 2 ]; then
      # NCCL before 2.30 refuses two ranks on one GPU ("Duplicate GPU
      # detected"): what one rank can show, the rest skipped with the reason.
      log "one GPU and $(echo "$probe" | cut -d' ' -f1-2), which refuses several ranks on one GPU (2.30 allows them): one rank only"
      one_rank
      return $?
    fi ;;
  esac

  # 2. Bounds, 2 and 4 ranks (2 emulated nodes for the hierarchical schemes).
  step bounds-2r-1n 0 timeout 1800 "$bin" --backend nccl --ranks 2 --nodes 1 --suite bounds --timeout 60
  step bounds-4r-2n 0 timeout 1800 "$bin" --backend nccl --ranks 4 --nodes 2 --suite bounds --timeout 60

  # 3. Bit for bit against the MPI engine's digests.
  for shape in $SHAPES; do
    local r=${shape%:*} n=${shape#*:} exp="$DIR/expected-${shape%:*}r-${shape#*:}n.txt"
    if [ -f "$exp" ]; then
      step "digests-${r}r-${n}n" 0 timeout 1800 "$bin" --backend nccl --ranks "$r" --nodes "$n" --suite digests --expect "$exp" --timeout 60
    else
      log "SKIP digests-${r}r-${n}n: $exp missing (recorded by '$0 prepare' under mpirun)"
      step "digests-${r}r-${n}n" 0 timeout 1800 "$bin" --backend nccl --ranks "$r" --nodes "$n" --suite digests --timeout 60
    fi
  done

  # 3b. The same digests with our PTX kernels doing the quantization on the GPU.
  export QSYNC_PTX_DIR="$DIR/ptx"
  for shape in $SHAPES; do
    local r=${shape%:*} n=${shape#*:} exp="$DIR/expected-${shape%:*}r-${shape#*:}n.txt"
    if [ -f "$exp" ]; then
      step "digests-device-${r}r-${n}n" 0 timeout 1800 "$bin" --backend nccl --kernels device \
        --ranks "$r" --nodes "$n" --suite digests --expect "$exp" --timeout 60
    else
      log "SKIP digests-device-${r}r-${n}n: $exp missing"
    fi
  done

  # 4. Timing vs NCCL's f32 all-reduce.
  for shape in 2:1 4:2; do
    local r=${shape%:*} n=${shape#*:}
    if step "bench-${r}r" 0 timeout 1800 "$bin" --backend nccl --ranks "$r" --nodes "$n" --suite bench --bytes $((16 << 20)) --timeout 120; then
      grep '^{' "$res/bench-${r}r.log" > "$res/bench-${r}r.jsonl"
      bench_table "$res/bench-${r}r.jsonl" host
      log "(one GPU: the ranks share its memory, so these times are the quantization and copy cost, not wire savings)"
    fi
  done

  # 5. A killed rank: an error on the survivor within its deadline, no hang.
  step fault-exit fail timeout 300 "$bin" --backend nccl --ranks 2 --nodes 2 --suite fault --fault exit --fault-rank 1 --timeout 10
  if grep -q "rank 0" "$res/fault-exit.log" && grep -q "injected fault: exiting abruptly" "$res/fault-exit.log"; then
    log "fault-exit: survivor's message: $(grep -h 'rank 0' "$res/fault-exit.log" | head -2 | tr '\n' ' ')"
  else
    log "FAIL fault-exit: no message from the surviving rank 0"; failed=1
  fi

  # 6. The sharded collectives (qwZ, hpZ, qgZ) over NCCL.
  if [ -x "$shard_bin" ]; then
    step shard-bounds-2r-1n 0 timeout 600 "$shard_bin" --backend nccl --ranks 2 --nodes 1 --suite bounds --timeout 60
    step shard-bounds-4r-2n 0 timeout 600 "$shard_bin" --backend nccl --ranks 4 --nodes 2 --suite bounds --timeout 60
    if step shard-wire-4r-2n 0 timeout 600 "$shard_bin" --backend nccl --ranks 4 --nodes 2 --suite wire --timeout 60; then
      grep -h '^wire fraction' "$res/shard-wire-4r-2n.log" | tee -a "$summary"
    fi
    step shard-fault-exit fail timeout 300 "$shard_bin" --backend nccl --ranks 4 --nodes 2 --suite fault --fault exit \
      --fault-rank 1 --fault-call 3 --timeout 10
    if ! grep -q "injected fault: exiting abruptly" "$res/shard-fault-exit.log"; then
      log "FAIL shard-fault-exit: the failing rank's message is missing"; failed=1
    fi
  else
    log "SKIP shard-*: $shard_bin missing and no cargo to build it (run '$0 prepare' and carry $DIR)"
  fi

  log "$([ $failed = 0 ] && echo 'gpu-sync-check: all steps passed' || echo 'gpu-sync-check: FAILED')"
  return $failed
}

case "$MODE" in
  prepare) prepare ;;
  run) run ;;
  all) prepare && run ;;
  *) echo "usage: $0 [all|prepare|run] [DIR]"; exit 2 ;;
esac
