# substrax: the two commands a new user needs.
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
	@echo "make demo: not available yet. The demo (a local cluster training Fashion-MNIST) needs" >&2
	@echo "the coordinator and worker daemons, which are not built yet; see README.md for what" >&2
	@echo "works today." >&2
	@exit 2
