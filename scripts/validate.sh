#!/usr/bin/env bash
# Predictions checked against real runs on this machine (docs/validation.md).
#
#   scripts/validate.sh [sync] [sync-dedicated] [compute] [iterations] [iterations-dedicated]
#                       (default: every table)
#
# sync:    a 2-node cluster of network namespaces joined by tc-shaped links
#          (scripts/netcluster.sh, root), `qsyncc sync-bench` under mpirun for
#          every scheme at two link rates and two sizes, next to
#          `qsyncc simulate --gradient` on a cluster file of the same links.
# sync-dedicated: the same with one rank a node, each node on its own core.
# compute: this CPU as a device: per-op profiles measured with PyTorch, then
#          training iterations predicted leave-one-out (scripts/validate-compute.sh).
# iterations: torchrun DDP across the emulated nodes (DDP's all-reduce and the
#          qsync hooks) against the predicted exposed synchronization, and
#          `--sync auto`'s choice against the fastest measured.
# iterations-dedicated: the same with one rank a node, each node on its own core.
# Each table is written into docs/validation.md between its markers, with
# the date, the machine and the command that regenerates it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
parts=("$@"); [ ${#parts[@]} -gt 0 ] || parts=(sync sync-dedicated compute iterations iterations-dedicated)
out=target/validate
mkdir -p "$out"
cargo build --release --locked -p qsyncc --features full
qsyncc=target/release/qsyncc

replace_section() { # replace_section NAME FILE: docs/validation.md's <!-- NAME --> ... <!-- /NAME --> := FILE
  python3 - "$1" "$2" <<'PY'
import re, sys
name, body = sys.argv[1], open(sys.argv[2]).read().rstrip("\n")
path = "docs/validation.md"
text = open(path).read()
pat = re.compile(rf"(<!-- {name} -->\n).*?(<!-- /{name} -->)", re.S)
if not pat.search(text):
    sys.exit(f"validate: {path} has no <!-- {name} --> section")
open(path, "w").write(pat.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text))
PY
}

sync_table() { # sync_table SECTION DIR LAYOUT: DIR/sync.jsonl rendered into docs/validation.md's SECTION
  {
    echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores of $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $3:"
    echo
    python3 scripts/validate/render_sync.py "$2/sync.jsonl"
  } > "$out/$1.md"
  replace_section "$1" "$out/$1.md"
}

wheel_installed=
iterations_table() { # iterations_table SECTION DIR RANKS_PER_NODE LAYOUT: torchrun DDP into docs/validation.md's SECTION
  venv=${QSYNC_TORCH_VENV:-$HOME/.cache/qsync/torch-venv}
  if [ -z "$wheel_installed" ]; then
    (cd crates/python && "$venv/bin/maturin" build --release -q -o ../../target/wheels-validate)
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall target/wheels-validate/qsync-*.whl
    wheel_installed=1
  fi
  mkdir -p "$2"
  python3 scripts/validate/iterations.py --qsyncc "$qsyncc" --out "$2" --python "$venv/bin/python" \
    --ranks-per-node "$3" ${VALIDATE_ITER_ARGS:-}
  {
    echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores, $4, batch 2 per rank:"
    echo
    python3 scripts/validate/render_iterations.py "$2/iterations.jsonl"
  } > "$2/$1.md"
  replace_section "$1" "$2/$1.md"
}

for part in "${parts[@]}"; do
  case "$part" in
    sync)
      python3 scripts/validate/sync.py --qsyncc "$qsyncc" --out "$out" ${VALIDATE_SYNC_ARGS:-}
      sync_table sync "$out" "2 nodes × 2 ranks"
      ;;
    sync-dedicated)
      # One rank a node, each node on a core of its own: no rank shares a
      # core, as on a real cluster (the hierarchical schemes are the flat
      # ones with one rank a node, so they are left out).
      python3 scripts/validate/sync.py --qsyncc "$qsyncc" --out "$out/dedicated" --ranks-per-node 1 \
        --schemes fp32,fp16,bf16,qgz-int8,qgz-int4,nbit-2,nbit-4 ${VALIDATE_SYNC_ARGS:-}
      sync_table sync-dedicated "$out/dedicated" "2 nodes × 1 rank, each node on a core of its own"
      ;;
    compute)
      if [ -x scripts/validate-compute.sh ] || [ -f scripts/validate-compute.sh ]; then
        bash scripts/validate-compute.sh
      else
        echo "validate: scripts/validate-compute.sh is missing" >&2; exit 1
      fi
      ;;
    iterations)
      iterations_table iterations "$out" 2 "2 nodes × 2 ranks (gloo)"
      ;;
    iterations-dedicated)
      # One rank a node, each node on a core of its own, as on a real
      # cluster: no rank waits for a core another rank computes on.
      iterations_table iterations-dedicated "$out/dedicated-iterations" 1 \
        "2 nodes × 1 rank (gloo), each node on a core of its own"
      ;;
    *) echo "validate: unknown part '$part' (sync, sync-dedicated, compute, iterations, iterations-dedicated)" >&2; exit 2 ;;
  esac
done
echo "validate: tables written to docs/validation.md"
