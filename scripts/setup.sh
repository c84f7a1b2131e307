#!/usr/bin/env bash
# Installs what qsync's tests need beyond the Rust toolchain (planning needs
# none of it: scripts/example.sh does not call this). Each line it prints
# says what it installs and why: LLVM 22 / MLIR 22 (Debian packages, for
# qsyncc's `codegen` feature; mlir-opt/mlir-translate/lli run the emitted
# MLIR in tests), the Python packages used by the ONNX interop tests, and
# NVIDIA's PTX assembler (ptxas, from the nvidia-cuda-nvcc-cu12 wheel; it
# needs no GPU) for the PTX assembly test.
# Idempotent: a machine that already has everything spends well under a second here.
set -euo pipefail

apt_pkgs=(llvm-22-dev llvm-22-runtime libmlir-22-dev mlir-22-tools libclang-22-dev libpolly-22-dev libzstd-dev)
py_pkgs=(onnx==1.20.1 onnxruntime==1.23.2 numpy==2.3.5)

missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} (LLVM 22 and MLIR 22: qsyncc's codegen feature and its tests)" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if ! "$PY" -c 'import onnx, onnxruntime, numpy' 2>/dev/null; then
  echo "setup: installing ${py_pkgs[*]} (the ONNX checker and onnxruntime interop tests)" >&2
  "$PY" -m pip install -q --disable-pip-version-check "${py_pkgs[@]}"
fi
# ptxas for codegen/tests/ptxas.rs. Best effort: the wheel is x86-64 Linux
# only, and without it that test skips and says why.
ptxas_pkg=nvidia-cuda-nvcc-cu12==12.9.86
if ! "$PY" -c 'import nvidia.cuda_nvcc' 2>/dev/null; then
  echo "setup: installing $ptxas_pkg (ptxas)" >&2
  "$PY" -m pip install -q --disable-pip-version-check "$ptxas_pkg" \
    || echo "setup: could not install $ptxas_pkg; the PTX assembly test will skip" >&2
fi

# --- qsync-runtime: Open MPI, the CPU engine of the runtime's
# multi-process tests (`mpirun`), and its headers for the `mpi` crate
# (mpi-sys finds libclang through llvm-config-22, installed above).
# iproute2 (`ip netns`, veth, `tc`) builds the emulated multi-node cluster
# of scripts/netcluster.sh, which the validation and its CI tests use.
mpi_pkgs=(libopenmpi-dev openmpi-bin iproute2)
missing=()
for p in "${mpi_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} (Open MPI: qsyncc's and the runtime's mpi feature and" \
    "their mpirun tests; iproute2: the emulated cluster)" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# --- end qsync-runtime

# --- qsync Python package: PyTorch for the DDP tests and the
# example, in its own virtual environment (PyPI's torch wheel pulls its CUDA
# libraries: ~5.8 GB and ~3 minutes the first time, nothing after), plus
# maturin to build the `qsync` wheel. Outside the checkout, so fresh clones
# on the same machine share it.
# PyTorch's CPU-only index (download.pytorch.org/whl/cpu, without the CUDA
# libraries) would be far smaller, but it was not reachable from the build
# machine, so the wheels come from PyPI.
torch_venv=${QSYNC_TORCH_VENV:-$HOME/.cache/qsync/torch-venv}
torch_pkgs=(torch==2.15.0 torchvision==0.29.2 transformers==5.23.0 onnx==1.20.1 onnxscript==0.7.2
  numpy==2.3.5 maturin==1.16.0)
if ! "$torch_venv/bin/python" -c 'import torch, torchvision, transformers, onnxscript' 2>/dev/null \
  || [ ! -x "$torch_venv/bin/maturin" ]; then
  echo "setup: installing PyTorch and maturin into $torch_venv (the qsync Python package's DDP tests;" \
    "first time: ~3 min, ~5.8 GB)" >&2
  mkdir -p "$(dirname "$torch_venv")"
  "$PY" -m venv "$torch_venv"
  "$torch_venv/bin/pip" install -q --disable-pip-version-check "${torch_pkgs[@]}"
fi
# scikit-learn: its bundled handwritten digits are the data of
# scripts/accuracy.sh and its CI test (crates/qsyncc/tests/accuracy.rs).
if [ -x "$torch_venv/bin/python" ] && ! "$torch_venv/bin/python" -c 'import sklearn' 2>/dev/null; then
  echo "setup: installing scikit-learn into $torch_venv (the digits data of the accuracy runs)" >&2
  "$torch_venv/bin/pip" install -q --disable-pip-version-check scikit-learn==1.9.1
fi
# --- end qsync Python package
