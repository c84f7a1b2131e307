#!/usr/bin/env bash
# The main job on the bundled example model (see README): plan SqueezeNet for
# a hybrid cluster of 16 V100 (training) and 16 T4 (inference) GPUs.
# Planning needs nothing beyond the Rust toolchain, so this installs nothing
# (no scripts/setup.sh) and runs the bare qsyncc, the one
# `cargo install --path crates/qsyncc` gives: built without features into
# target/bare, in the quick-to-build `bare` profile (the build
# scripts/bare-check.sh checks).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "example: cargo not found: install the Rust toolchain (https://rustup.rs)" >&2; exit 1; }
CARGO_TARGET_DIR=$PWD/target/bare cargo run --quiet --locked --profile bare -p qsyncc --no-default-features -- \
  examples/squeezenet1_1.onnx --targets v100:16,t4:16 -o target/example-plan "$@"
