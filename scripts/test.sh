#!/usr/bin/env bash
# Every test: unit tests, filetests, real-model tests, CLI tests and the
# ONNX checker / onnxruntime interop checks (see README). qsyncc's tests
# build it with every feature (its dev-dependency on itself turns on
# `full`); scripts/bare-check.sh then checks the featureless build users
# install.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ ! -d ../shared/models ]; then
  echo "error: the real models are expected in ../shared/models beside the checkout" >&2
  exit 1
fi

# Disk: a from-scratch run fills target/ with about 6 GB (4.8 GB of test
# binaries in target/debug, measured 2026-11-26, the bare build and the
# wheels beside them); say so up front rather than failing mid-link with
# "No space left on device".
free_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
echo "test.sh: $((free_kb / 1024 / 1024)) GiB free where the build goes" >&2
if [ "$free_kb" -lt $((10 * 1024 * 1024)) ]; then
  echo "test.sh: warning: under 10 GiB free; a fresh build needs about 6 GB" >&2
fi
# A one-off build (CI's fresh clone) gains nothing from incremental
# compilation's caches, which cost time and several GB.
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL=0
fi
# Scratch files of every test (plan directories, wheels' venvs, Open MPI's
# session directories) go in one short-named directory removed at the end,
# pass or fail, so repeated runs do not fill /tmp.
scratch=$(mktemp -d /tmp/qsync-test.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch

cargo test --workspace --locked "$@"
bash scripts/bare-check.sh ../shared/models
