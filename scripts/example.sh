#!/usr/bin/env bash
# The main job on the bundled example model (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo run --quiet --release -p qsyncc -- inspect examples/squeezenet1_1.onnx "$@"
