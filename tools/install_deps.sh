#!/usr/bin/env bash
# Installs the Debian packages substrax needs to build and test, and nothing else.
# Idempotent: when everything is present it prints nothing and returns at once.
# Needs root (or sudo) only when something is missing.
set -euo pipefail

# Build: Bazel 4 (Debian's bazel-bootstrap), a C++ compiler, pkg-config for the system libraries.
# Libraries: gRPC and protobuf (with their compilers), Abseil, yaml-cpp, GoogleTest/GoogleMock,
# Eigen (CPU math), zlib (gzip'd IDX files), Gloo (CPU collectives), CLI11 (command lines),
# SQLite (the coordinator's state).
# Benchmarks: Open MPI (libraries and mpirun), the comparison peer of //bench:allreduce.
# Data: Fashion-MNIST in IDX format (examples and the quality run).
PACKAGES=(
  bazel-bootstrap
  g++
  pkg-config
  protobuf-compiler
  protobuf-compiler-grpc
  libprotobuf-dev
  libgrpc++-dev
  libabsl-dev
  libyaml-cpp-dev
  libgtest-dev
  libgmock-dev
  libeigen3-dev
  zlib1g-dev
  libgloo-dev
  libcli11-dev
  prometheus-cpp-dev
  libsqlite3-dev
  libopenmpi-dev
  openmpi-bin
  dataset-fashion-mnist
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "install_deps: missing Debian packages: ${missing[*]}" >&2
    echo "install_deps: run this script as root (or install sudo) to install them" >&2
    exit 1
  fi
fi

echo "install_deps: installing ${missing[*]}" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
if ! { "${SUDO[@]}" apt-get update -qq &&
       "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "install_deps: apt-get failed (output above)" >&2
  exit 1
fi
echo "install_deps: done" >&2
