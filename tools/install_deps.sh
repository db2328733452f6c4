#!/usr/bin/env bash
# Installs what substrax needs to build and test: Debian packages (all the build needs), and for
# the tests two Python virtual environments with pinned packages from PyPI (the section at the
# end; SUBSTRAX_SKIP_K8S_TEST_TOOLS=1 leaves them and the test-only Debian packages out).
# Idempotent: when everything is present it prints nothing and returns at once.
# Needs root (or sudo) only when something is missing.
set -euo pipefail

# Build: Bazel 4 (Debian's bazel-bootstrap), a C++ compiler, pkg-config for the system libraries.
# Libraries: gRPC and protobuf (with their compilers), Abseil, yaml-cpp, GoogleTest/GoogleMock,
# Eigen (CPU math), zlib (gzip'd IDX files), Gloo (CPU collectives), CLI11 (command lines),
# SQLite (the coordinator's state), OpenSSL (certificates and keys for mutual TLS), Boost
# (header-only: Boost.CRC's CRC32C for TensorBoard event files).
# Benchmarks: Open MPI (libraries and mpirun), the comparison peer of //bench:allreduce.
# Data: Fashion-MNIST in IDX format (examples and the quality run).
# The SDK's test (tests/sdk) builds examples/sdk outside Bazel as a user would: CMake.
# Kubernetes manifests (tests/k8s): kubectl for its kustomize, python3-venv for the validator's
# virtual environment (the section at the end); iproute2 for the multi-host test's namespaces,
# nftables for the partition test (tests/chaos) to drop packets in them.
# Fuzzing (make fuzz, tests/fuzz): clang-14 and its runtime libraries (libFuzzer, the
# sanitizers), named both since the install skips recommended packages.
# Training frameworks (tests/frameworks): Debian's PyTorch, and OpenBLAS for it: Debian's torch
# calls BLAS through libblas.so.3, which without libopenblas0-pthread is the reference BLAS, many
# times slower.
# The Python package (make python, tools/build_python.sh): Debian's setuptools, wheel and pip
# build its wheel offline, without build isolation; left out with the test tools, as the JAX
# environment it is installed into is.
# `substraxctl doctor`'s test (tests/chaos/doctor_test): faketime (libfaketime) puts one agent's
# clock off.
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
  libssl-dev
  libxxhash-dev
  libboost-dev
  libopenmpi-dev
  cmake
  openmpi-bin
  dataset-fashion-mnist
  kubernetes-client
  python3-venv
  iproute2
  nftables
  clang-14
  libclang-rt-14-dev
  python3-torch
  libopenblas0-pthread
  python3-setuptools
  python3-wheel
  python3-pip
  faketime
)

# SUBSTRAX_SKIP_K8S_TEST_TOOLS=1 (make build, the image builds in deploy/docker) leaves out what
# only the tests need (the name is older than the framework tests). Any kubectl >= 1.20 renders the manifests: one already installed (e.g.
# the Google Cloud SDK's `kubectl` package, which cannot be installed beside Debian's) is kept.
K8S_TEST_TOOLS=1
[ -n "${SUBSTRAX_SKIP_K8S_TEST_TOOLS:-}" ] && K8S_TEST_TOOLS=0
keep=()
for pkg in "${PACKAGES[@]}"; do
  case "$pkg" in
    kubernetes-client)
      [ "$K8S_TEST_TOOLS" = 1 ] && ! command -v kubectl >/dev/null 2>&1 && keep+=("$pkg") ;;
    python3-venv|python3-torch|libopenblas0-pthread|python3-setuptools|python3-wheel|python3-pip|faketime)
      [ "$K8S_TEST_TOOLS" = 1 ] && keep+=("$pkg") ;;
    *) keep+=("$pkg") ;;
  esac
done
PACKAGES=("${keep[@]}")

SUDO=()
need_root() {
  [ "$(id -u)" -eq 0 ] && return 0
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
    return 0
  fi
  echo "install_deps: $1" >&2
  echo "install_deps: run this script as root (or install sudo)" >&2
  exit 1
}

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if [ ${#missing[@]} -gt 0 ]; then
  need_root "missing Debian packages: ${missing[*]}"
  echo "install_deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! { "${SUDO[@]}" apt-get update -qq &&
         "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "install_deps: apt-get failed (output above)" >&2
    exit 1
  fi
  echo "install_deps: done" >&2
fi

# Installs the pinned packages given after `venv` (every dependency pinned too) in the virtual
# environment `venv` of Debian's python3. A stamp with the pins makes this a no-op when they are
# installed; changing a pin reinstalls.
install_venv() {
  local venv=$1
  shift
  local stamp="$venv/.substrax-requirements"
  [ "$(cat "$stamp" 2>/dev/null)" = "$*" ] && return 0
  [ -w "$(dirname "$venv")" ] || [ -w / ] || need_root "cannot write $venv"
  echo "install_deps: installing $* in $venv" >&2
  if ! { "${SUDO[@]}" mkdir -p "$venv" &&
         { [ -x "$venv/bin/python" ] || "${SUDO[@]}" /usr/bin/python3 -m venv "$venv"; } &&
         "${SUDO[@]}" "$venv/bin/pip" install -q --disable-pip-version-check "$@" &&
         echo "$*" | "${SUDO[@]}" tee "$stamp" >/dev/null; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "install_deps: pip install in $venv failed (output above)" >&2
    exit 1
  fi
  echo "install_deps: done" >&2
}

# The requirements of a pip requirements file of pins, one a line: `#` comments, blank lines and
# whitespace dropped (tests/k8s/render_test.py reads the same file as pip does and compares).
read_requirements() {
  local line
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%%#*}
    line=${line//[[:space:]]/}
    [ -n "$line" ] && printf '%s\n' "$line"
  done <"$1"
}

# The test tools from PyPI: the manifest test's validator, kubernetes-validate (offline
# Kubernetes API schemas) and PyYAML, and the Python gRPC client of the security tests; pinned
# with their dependencies, in a virtual environment of Debian's python3 at a fixed path
# (tests/k8s/render_test.sh and tests/security/python_client_test.sh run it).
[ "$K8S_TEST_TOOLS" = 1 ] || exit 0
PY_REQUIREMENTS=(
  kubernetes-validate==1.31.0
  PyYAML==6.0.2
  jsonschema==4.26.0
  jsonschema-specifications==2025.9.1
  referencing==0.37.0
  rpds-py==2026.9.1
  attrs==26.1.0
  importlib_resources==7.1.0
  packaging==26.4
  typing_extensions==4.16.0
  # tests/security/python_client_test: a second, non-C++ gRPC client (Debian's python3-grpcio
  # and python3-grpc-tools do not match each other).
  grpcio==1.68.1
  grpcio-tools==1.68.1
  protobuf==5.29.6
  setuptools==66.1.1
  # worker/checkpoint/python_interop_test: checkpoint shards (safetensors) read from Python.
  numpy==2.2.1
  safetensors==0.4.5
  # tests/tensorboard_test: TensorBoard event files read back by TensorBoard itself.
  tensorboard==2.20.0
  tensorboard-data-server==0.7.2
  absl-py==2.5.1
  Markdown==3.11.3
  MarkupSafe==3.0.4
  pillow==13.0.0
  Werkzeug==3.1.9
)
install_venv /opt/substrax/venv "${PY_REQUIREMENTS[@]}"

# JAX for tests/frameworks (a JAX program as command jobs will run it) and the substrax Python
# package (make python installs it here; python/tests): jax, jaxlib (CPU), flax and optax with
# every dependency pinned, in a virtual environment of their own (its numpy and protobuf differ
# from the test tools'). The pins are tools/jax_requirements.txt's, which
# deploy/docker/Dockerfile.worker-python installs in the Python worker image too, and the test
# tools' (pytest) of tools/jax_test_requirements.txt, which the image does not need.
JAX_REQUIREMENTS=()
JAX_TEST_REQUIREMENTS=()
jax_requirements="$(dirname "${BASH_SOURCE[0]}")/jax_requirements.txt"
jax_test_requirements="$(dirname "${BASH_SOURCE[0]}")/jax_test_requirements.txt"
for file in "$jax_requirements" "$jax_test_requirements"; do
  if [ ! -r "$file" ]; then
    echo "install_deps: cannot read $file (the JAX pins): run this script from a" \
      "checkout of the repository" >&2
    exit 1
  fi
done
mapfile -t JAX_REQUIREMENTS < <(read_requirements "$jax_requirements")
mapfile -t JAX_TEST_REQUIREMENTS < <(read_requirements "$jax_test_requirements")
install_venv /opt/substrax/jax "${JAX_REQUIREMENTS[@]}" "${JAX_TEST_REQUIREMENTS[@]}"
