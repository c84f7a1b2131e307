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
cargo test --workspace --locked "$@"
bash scripts/bare-check.sh ../shared/models
