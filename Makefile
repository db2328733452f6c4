# substrax: the two commands a new user needs.
#   make demo   installs what it needs, builds, and trains Fashion-MNIST on a local cluster
#   make demo-python  the same with the guide's Python example (JAX, flax.nnx, optax) as a
#               command job (STEP=collective: its shard_map variant)
#   make test   installs what the build and tests need (Debian packages, and the manifest tests'
#               Python venv from PyPI), builds, runs every test and the layering checks
#   make build  installs what the build needs (Debian packages only) and builds everything
#   make sdk    builds the SDK for users' own training programs and installs it into PREFIX
#               (default /usr/local): headers, libsubstrax.so, substrax.pc, a CMake package
#   make python builds the substrax Python package (python/) into dist/ as a wheel, offline, and
#               installs it into the pinned JAX environment /opt/substrax/jax (docs/python.md)
#   make fuzz   builds the libFuzzer targets (tests/fuzz) with clang and runs each for
#               FUZZ_SECONDS seconds (default 60); fails if any crashes
.PHONY: deps build-deps build test demo demo-python fuzz sdk python

FUZZ_SECONDS ?= 60
PREFIX ?= /usr/local

deps:
	@tools/install_deps.sh

build-deps:
	@SUBSTRAX_SKIP_K8S_TEST_TOOLS=1 tools/install_deps.sh

build: build-deps
	bazel build //...

test: deps
	@tools/test.sh

demo:
	@tools/demo.sh

demo-python:
	@tools/demo_python.sh

fuzz: build-deps
	@FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run_fuzzers.sh

sdk:
	@PREFIX="$(PREFIX)" tools/install_sdk.sh

python: deps
	@tools/build_python.sh
