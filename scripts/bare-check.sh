#!/usr/bin/env bash
# The qsyncc that `cargo install --path crates/qsyncc` gives (no features:
# no LLVM, MLIR, MPI or NCCL), checked the way a user meets it:
#   - it builds with the Rust toolchain alone and links none of those libraries;
#   - it plans every shared model (../shared/models);
#   - a command whose feature is off exits 2 and names the feature.
# Built in the `bare` profile (Cargo.toml: quick to build) into target/bare
# (its own target directory, so that target/debug/qsyncc, which the tests
# run with every feature, stays as is).
# scripts/test.sh runs it after `cargo test`; scripts/example.sh builds the
# same binary.
# Usage: scripts/bare-check.sh [MODELS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
models=${1:-../shared/models}
export CARGO_TARGET_DIR=$PWD/target/bare
q=$CARGO_TARGET_DIR/bare/qsyncc
fail=0
bad() { echo "bare-check: FAIL: $*" >&2; fail=1; }

echo "bare-check: building qsyncc without features into target/bare" >&2
cargo build --quiet --locked --profile bare -p qsyncc --no-default-features

linked=$(ldd "$q" | grep -iE 'libLLVM|libMLIR|libmpi|libopen-|libnccl|libcuda' || true)
[ -z "$linked" ] || bad "the bare qsyncc links system libraries it must not: $linked"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
n=0
for m in "$models"/*.onnx "$models"/*.pt; do
  [ -e "$m" ] || continue
  name=$(basename "$m")
  n=$((n + 1))
  # --dim binds the BERT models' sequence length; the others have no `seq`.
  if ! "$q" "$m" --targets v100:16,t4:16 --dim seq=128 -o "$out/$name" >"$out/$name.log" 2>&1; then
    bad "planning $name: $(tail -n 1 "$out/$name.log")"
  elif [ ! -f "$out/$name/manifest.json" ]; then
    bad "planning $name wrote no manifest.json"
  fi
done
[ "$n" -gt 0 ] || bad "no models in $models"

# What the bare build leaves out: exit 2, the feature named, the command to get it.
expect_off() {
  local feature=$1; shift
  local err rc=0
  err=$("$q" "$@" 2>&1 >/dev/null) || rc=$?
  if [ "$rc" -ne 2 ] || ! grep -q "\`$feature\` feature" <<<"$err" \
    || ! grep -q "cargo install --path crates/qsyncc --features $feature" <<<"$err"; then
    bad "qsyncc $*: expected exit 2 naming the $feature feature, got $rc: $err"
  fi
}
ex=examples/squeezenet1_1.onnx
expect_off codegen codegen "$ex" --target t4 -o "$out/cg"
expect_off codegen "$ex" --targets v100:2,t4:2 --emit onnx,ptx -o "$out/emit"
expect_off mpi sync-bench --scheme fp16 --bytes 4K
expect_off nccl sync-bench --scheme fp16 --bytes 4K --backend nccl
[ ! -e "$out/emit" ] || bad "plan --emit ptx wrote a plan directory before failing"

[ "$fail" -eq 0 ] || exit 1
echo "bare-check: ok ($n models planned; links no LLVM, MLIR, MPI or NCCL)" >&2
