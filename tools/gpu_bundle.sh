#!/bin/bash
# Collects what tests/gpu/run.sh needs on a lent GPU machine into gpu-bundle/ (bin/, lib/,
# MANIFEST), under 48 MB so that it travels with the working tree (about 6 MB; a device run
# carries 64 MiB in all). Refuses binaries that are not an optimized CUDA build (bazel-bin must be a -c opt output,
# and every binary must link cudart). MANIFEST says what was bundled: the commit (and whether the
# tree had changes), the date, nvcc's and NCCL's versions. Build first:
#
#   bazel build -c opt --config=cuda //worker/compute:cuda_model_test \
#     //worker/data:cuda_prefetch_test //worker/collectives:nccl_communicator_test \
#     //worker/runtime:step_loop_test //tests/gpu:tensor_parallel_test \
#     //tests/gpu:cpu_gpu_equivalence //bench:gpu_mlp //coordinator:substrax-coordinator \
#     //agent:substrax-agent //client:substraxctl //worker:substrax-job
#   tools/gpu_bundle.sh
#
# then run tests/gpu/run.sh --dry-run here, and tests/gpu/run.sh there (docs/gpu.md, "The GPU
# check"). The GPU machine has CUDA, NCCL (PyTorch's wheels carry it) and a C++ runtime, but none
# of our Debian libraries:
#   carried:   the binaries (stripped), our Bazel-built .so files and Debian's (abseil, protobuf,
#              gRPC, gloo, yaml-cpp, ...), stripped;
#   not carried (taken from the GPU machine): glibc and the loader; the driver (libcuda,
#              libnvidia-*); CUDA (libcudart, libcublas, libcublasLt); NCCL (libnccl, 218 MB);
#              the C++ runtime (libstdc++, libgcc_s).
# No data: the jobs of the check use synthetic data generated from their seed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-bundle
limit_bytes=$((48 * 1000 * 1000))
bins=(
  bazel-bin/worker/compute/cuda_model_test
  bazel-bin/worker/data/cuda_prefetch_test
  bazel-bin/worker/collectives/nccl_communicator_test
  bazel-bin/worker/runtime/step_loop_test
  bazel-bin/tests/gpu/tensor_parallel_test
  bazel-bin/tests/gpu/cpu_gpu_equivalence
  bazel-bin/bench/gpu_mlp
)
# The local cluster of the command-job step (tests/gpu/run.sh, 8): the agent and the job binary
# link CUDA; the coordinator and substraxctl do not.
cluster_bins=(
  bazel-bin/coordinator/substrax-coordinator
  bazel-bin/agent/substrax-agent
  bazel-bin/client/substraxctl
  bazel-bin/worker/substrax-job
)
# Timings from a fastbuild would mean nothing: refuse anything but -c opt.
bazel_bin=$(readlink -f bazel-bin)
if [[ $bazel_bin != *-opt/bin ]]; then
  echo "gpu_bundle: bazel-bin is $bazel_bin, not an optimized build: build with -c opt --config=cuda (see the top)" >&2
  exit 1
fi
for b in "${bins[@]}"; do
  if [[ ! -x $b ]]; then
    echo "gpu_bundle: $b is missing; build it first (see the top of this script)" >&2
    exit 1
  fi
  # A default build's binary would skip every GPU test there: refuse it.
  if ! ldd "$b" | grep 'libcudart' >/dev/null; then  # not -q: ldd's SIGPIPE under pipefail
    echo "gpu_bundle: $b does not link CUDA: build it with -c opt --config=cuda (see the top)" >&2
    exit 1
  fi
done
for b in "${cluster_bins[@]}"; do
  if [[ ! -x $b ]]; then
    echo "gpu_bundle: $b is missing; build it first (see the top of this script)" >&2
    exit 1
  fi
  # The agent offers GPUs (--devices cuda) only from a CUDA build.
  if [[ $b == */substrax-agent ]] && ! ldd "$b" | grep 'libcudart' >/dev/null; then
    echo "gpu_bundle: $b does not link CUDA: build it with -c opt --config=cuda (see the top)" >&2
    exit 1
  fi
done
bins+=("${cluster_bins[@]}")
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for b in "${bins[@]}"; do cp -L "$b" "$out/bin/"; done
# Every library the binaries resolve here, except what the GPU machine provides (above).
missing=$(for b in "${bins[@]}"; do ldd "$b"; done | awk '/not found/ {print $1}' | sort -u)
if [[ -n $missing ]]; then
  echo "gpu_bundle: libraries the binaries do not find here: $missing" >&2
  exit 1
fi
for b in "${bins[@]}"; do ldd "$b"; done |
  awk '/=> \// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|libutil|libresolv|ld-linux[^/]*|libcuda|libnvidia[^/]*|libcudart|libcublas|libcublasLt|libnccl|libstdc\+\+|libgcc_s)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
chmod u+w "$out"/bin/* "$out"/lib/*
strip --strip-unneeded "$out"/bin/* "$out"/lib/*
chmod 755 "$out"/bin/*
chmod 644 "$out"/lib/*
nvcc=${CUDA_PATH:-/usr/local/cuda}/bin/nvcc
nccl_h=${CUDA_PATH:-/usr/local/cuda}/include/nccl.h
{
  echo "commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "build=$(basename "$(dirname "$bazel_bin")") (bazel -c opt --config=cuda)"
  echo "nvcc=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\).*/\1 (\2)/p')"
  echo "nccl=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) / {v[$2] = $3} END {print v["NCCL_MAJOR"] "." v["NCCL_MINOR"] "." v["NCCL_PATCH"]}' "$nccl_h" 2>/dev/null) (headers built against; the GPU machine's libnccl is used)"
} >"$out/MANIFEST"
size=$(du -sb "$out" | cut -f1)
echo "gpu_bundle: $(tr '\n' ' ' <"$out/MANIFEST")"
echo "gpu_bundle: $out is $size bytes ($(du -sh "$out" | cut -f1)): $(ls "$out/bin" | wc -l) binaries, $(ls "$out/lib" | wc -l) libraries"
if ((size > limit_bytes)); then
  echo "gpu_bundle: FAIL: $out is $size bytes, over the limit of $limit_bytes (48 MB); the largest:" >&2
  du -b "$out"/bin/* "$out"/lib/* | sort -rn | head -n 10 >&2
  exit 1
fi
