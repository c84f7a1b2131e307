#!/usr/bin/env bash
# Every test: unit tests, filetests, real-model tests, CLI tests and the
# ONNX checker / onnxruntime interop checks (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ ! -d ../shared/models ]; then
  echo "error: the real models are expected in ../shared/models beside the checkout" >&2
  exit 1
fi
cargo test --workspace --locked "$@"
