#!/usr/bin/env bash
# The synchronization benchmark table: every scheme on 4 and 8
# MPI ranks (2 emulated nodes), one JSON line per run, then a summary table.
# Usage: scripts/sync-bench.sh [BYTES] [QSYNCC]   (defaults: 16M, target/debug/qsyncc)
# SYNC_BENCH_RANKS and SYNC_BENCH_SCHEMES (space-separated) narrow the table
# (tests/syncbench.rs runs one small table that way).
set -euo pipefail
cd "$(dirname "$0")/.."
bytes=${1:-16M}
qsyncc=${2:-target/debug/qsyncc}
[ -x "$qsyncc" ] || cargo build -p qsyncc --features full
# Root in containers; more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
out=target/sync-bench.jsonl
: > "$out"
for ranks in ${SYNC_BENCH_RANKS:-4 8}; do
  for scheme in ${SYNC_BENCH_SCHEMES:-fp16 bf16 qgz-int8 qgz-int4 qgz-int8-hier qgz-int4-hier qgz-int4-sr nbit-1 nbit-2 nbit-4 nbit-8}; do
    timeout 600 mpirun -n "$ranks" --bind-to none "$qsyncc" sync-bench --scheme "$scheme" --bytes "$bytes" \
      --nodes 2 --iterations 5 --warmup 1 --json >> "$out"
  done
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"{'scheme':<16}{'P':>3}{'wire/ring':>10}{'inter MB':>10}{'max err':>11}{'bound':>11}{'ok':>4}{'same':>5}{'s':>9}{'f32 s':>9}")
for r in rows:
    print(f"{r['scheme']:<16}{r['ranks']:>3}{r['wire_fraction']:>10.4f}{r['inter_node_bytes_per_rank']/1e6:>10.3f}"
          f"{r['max_abs_error']:>11.3e}{r['error_bound']:>11.3e}{'y' if r['within_bound'] else 'N':>4}"
          f"{'y' if r['bitwise_identical'] else 'N':>5}{r['seconds']:>9.4f}{r['f32_allreduce_seconds']:>9.4f}")
PY
