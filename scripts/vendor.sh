#!/usr/bin/env bash
# Vendors every dependency into vendor/ (git-ignored) for offline, air-gapped builds, and writes
# the cargo config that makes `cargo build --release --offline` use it.
#
# It also brings the CUDA compiler: the pinned NVIDIA nvcc wheels (the same pins as
# scripts/check-kernels.sh) are downloaded into vendor/nvcc-wheels and unpacked into vendor/nvcc,
# where build.rs finds nvcc when neither $NVCC nor $SORFT_NVCC_VENV is set. An offline build then
# embeds cubin + PTX, and the binary needs only the NVIDIA driver on the GPU machine (no NVRTC).
#
# Usage: scripts/vendor.sh [--no-nvcc | --nvcc-only]
set -euo pipefail
cd "$(dirname "$0")/.."
crates=1
nvcc=1
case "${1:-}" in
  --no-nvcc) nvcc=0 ;;
  --nvcc-only) crates=0 ;;
  "") ;;
  *) echo "usage: scripts/vendor.sh [--no-nvcc | --nvcc-only]" >&2; exit 2 ;;
esac
CUDA_PIP_VERSION="13.0.*"

if [[ $crates == 1 ]]; then
  mkdir -p .cargo
  cargo vendor --locked vendor > .cargo/config.toml.new
  mv .cargo/config.toml.new .cargo/config.toml
  echo "vendored $(ls vendor | wc -l) crates into vendor/; .cargo/config.toml now reads:" >&2
  cat .cargo/config.toml
fi

if [[ $nvcc == 1 ]]; then
  py=${PYTHON:-python3}
  "$py" -m pip --version >/dev/null 2>&1 || {
    echo "vendor: '$py -m pip' is not available (install python3-pip, or run with --no-nvcc)" >&2
    exit 1
  }
  rm -rf vendor/nvcc-wheels vendor/nvcc.new
  mkdir -p vendor/nvcc-wheels vendor/nvcc.new
  "$py" -m pip download --quiet --only-binary=:all: --dest vendor/nvcc-wheels \
    "nvidia-cuda-nvcc==$CUDA_PIP_VERSION" "nvidia-nvvm==$CUDA_PIP_VERSION" \
    "nvidia-cuda-runtime==$CUDA_PIP_VERSION" "nvidia-cuda-cccl==$CUDA_PIP_VERSION"
  # A wheel is a zip file; unpacking them all into one folder gives the layout of an installed
  # venv's site-packages (nvidia/cu13/{bin,include,lib,nvvm}). Zip files keep no exec bits.
  for w in vendor/nvcc-wheels/*.whl; do
    "$py" -m zipfile -e "$w" vendor/nvcc.new
  done
  chmod +x vendor/nvcc.new/nvidia/cu13/bin/* vendor/nvcc.new/nvidia/cu13/nvvm/bin/*
  rm -rf vendor/nvcc
  mv vendor/nvcc.new vendor/nvcc
  echo "vendored nvcc: $(vendor/nvcc/nvidia/cu13/bin/nvcc --version | tail -2 | head -1)" >&2
fi
echo "copy this folder (with vendor/ and .cargo/) to the offline machine and run: cargo build --release --offline" >&2
