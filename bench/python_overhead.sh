#!/usr/bin/env bash
# The cost of a JAX script as a substrax command job against the same script run by hand
# (bench/python_overhead.py says what and how). Installs what it needs (the pinned JAX venv,
# Fashion-MNIST), builds the binaries -c opt and the package (make python), then runs the
# comparison; arguments go to python_overhead.py (--rounds N, --steps S).
#
#   bench/python_overhead.sh              # 3 rounds of 400 steps, about 5 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
SUBSTRAX_SKIP_K8S_TEST_TOOLS=1 tools/install_deps.sh
tools/build_python.sh >&2
bazel build -c opt --noshow_progress //coordinator:substrax-coordinator //agent:substrax-agent \
  //worker:substrax-job //client:substraxctl >&2
exec /usr/bin/python3 bench/python_overhead.py --bin-dir "$(bazel info -c opt bazel-bin 2>/dev/null)" "$@"
