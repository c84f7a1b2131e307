#!/usr/bin/env bash
# The main job on the bundled example model (see README): plan SqueezeNet for
# a hybrid cluster of 16 V100 (training) and 16 T4 (inference) GPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo run --quiet --release -p qsyncc -- examples/squeezenet1_1.onnx --targets v100:16,t4:16 -o target/example-plan "$@"
