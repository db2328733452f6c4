# substrax: the two commands a new user needs.
#   make demo   installs what it needs, builds, and trains Fashion-MNIST on a local cluster
#   make test   installs what the build needs (Debian packages), builds and runs every test
#   make build  installs and builds everything
.PHONY: deps build test demo

deps:
	@tools/install_deps.sh

build: deps
	bazel build //...

test: deps
	@tools/test.sh

demo:
	@tools/demo.sh
