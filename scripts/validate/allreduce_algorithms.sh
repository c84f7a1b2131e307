#!/usr/bin/env bash
# Open MPI's own f32 all-reduce under each of its algorithms (root).
#
#   scripts/validate/allreduce_algorithms.sh [--rate 10gbit] [--reps 2] [--qsyncc PATH]
#
# Brings up 2 emulated nodes (scripts/netcluster.sh) at --rate and runs
# `qsyncc sync-bench` under mpirun, 2 ranks a node, each node pinned to a
# core of its own (as `scripts/validate.sh sync` runs table 1), at 8 MiB and
# 64 MiB: once with Open MPI's own choice of algorithm, then with each of
# coll/tuned's all-reduce algorithms forced (2 nonoverlapping, 3 recursive
# doubling, 4 ring, 5 segmented ring, 6 Rabenseifner's halving-doubling).
# Prints one line per run: repetition, algorithm, size, the median seconds
# of Open MPI's all-reduce over 7 calls and their range. Takes the nodes
# down at the end, also on failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
rate=10gbit reps=2 qsyncc=target/release/qsyncc
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=${2:?}; shift 2 ;;
    --reps) reps=${2:?}; shift 2 ;;
    --qsyncc) qsyncc=${2:?}; shift 2 ;;
    *) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
[ -x "$qsyncc" ] || { echo "allreduce_algorithms: no $qsyncc (cargo build --release -p qsyncc --features full)" >&2; exit 2; }
nc=scripts/netcluster.sh prefix=qoa
bash "$nc" up --nodes 2 --rate "$rate" --prefix "$prefix" --subnet 10.88.7 >/dev/null
trap 'bash "$nc" down --prefix "$prefix" >/dev/null' EXIT
echo "rep algorithm size seconds range"
for ((rep = 1; rep <= reps; rep++)); do
  for alg in default 6 4 5 3 2; do
    for size in 8M 64M; do
      forced=()
      [ "$alg" = default ] || forced=(OMPI_MCA_coll_tuned_use_dynamic_rules=1 "OMPI_MCA_coll_tuned_allreduce_algorithm=$alg")
      # sync-bench times Open MPI's all-reduce beside the scheme (fp16 here).
      json=$(env "${forced[@]}" bash "$nc" run --prefix "$prefix" --ranks-per-node 2 --cpus-per-node 1 --timeout 300 -- \
        "$qsyncc" sync-bench --scheme fp16 --bytes "$size" --nodes 2 --iterations 7 --json | tail -1)
      python3 -c 'import json, sys
d = json.loads(sys.argv[4])
lo, hi = d["f32_allreduce_seconds_range"]
print(*sys.argv[1:4], "%.4f" % d["f32_allreduce_seconds"], "%.4f-%.4f" % (lo, hi))' "$rep" "$alg" "$size" "$json"
    done
  done
done
