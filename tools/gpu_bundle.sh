#!/bin/bash
# Collects the GPU binaries and the non-system shared libraries they need into gpu-bundle/
# (bin/ and lib/), for a lent GPU machine that has CUDA's driver but none of our Debian
# libraries (abseil, protobuf, gRPC, ...). Run on the build machine after:
#   bazel build -c opt --config=cuda //worker/compute:cuda_model_test \
#     //worker/data:cuda_prefetch_test //worker/runtime:step_loop_test //bench:gpu_mlp \
#     //worker:substrax-worker
# then carry gpu-bundle/ and run tests/gpu/run.sh there.
#
# Bundled: our Bazel-built .so files and Debian's (abseil, protobuf, gRPC, gloo, libstdc++ ...).
# Left out: glibc and the loader; the driver (libcuda, libnvidia-*); the CUDA 13 toolkit's
# libcudart/libcublas/libcublasLt (about 600 MB, over the 64 MiB a device run may carry): the
# binaries find them through their rpath /usr/local/cuda/lib64, which the GPU machine must
# provide (CUDA 13), or through LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
bins=(
  bazel-bin/worker/compute/cuda_model_test
  bazel-bin/worker/data/cuda_prefetch_test
  bazel-bin/worker/runtime/step_loop_test
  bazel-bin/bench/gpu_mlp
  bazel-bin/worker/substrax-worker
)
for b in "${bins[@]}"; do
  if [[ ! -x $b ]]; then
    echo "gpu_bundle: $b is missing; build it first (see the top of this script)" >&2
    exit 1
  fi
  cp -L "$b" "$out/bin/"
done
# Every resolved library except the C library, the loader and the driver (libcuda, libnvidia-*).
for b in "${bins[@]}"; do ldd "$b"; done |
  awk '/=> \// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libnvidia[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
# Smaller to carry: no debug symbols.
strip --strip-unneeded "$out"/bin/* "$out"/lib/* 2>/dev/null || true
# The GPU machine has no Debian packages: carry Fashion-MNIST for the training check.
mkdir -p "$out/data"
cp /usr/share/datasets/fashion-mnist/*.gz "$out/data/"
du -sh "$out"
ls "$out/lib"
