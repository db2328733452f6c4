# substrax: the two commands a new user needs.
#   make demo   installs what it needs, builds, and trains Fashion-MNIST on a local cluster
#   make test   installs what the build and tests need (Debian packages, and the manifest tests'
#               Python venv from PyPI), builds, runs every test and the layering checks
#   make build  installs what the build needs (Debian packages only) and builds everything
.PHONY: deps build-deps build test demo

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
