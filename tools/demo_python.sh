#!/usr/bin/env bash
# make demo-python: the distributed-training guide's data-parallel example in Python
# (examples/python/fashion_mnist.py: flax.nnx, optax and the substrax package) as a command job
# on a local cluster of 2 worker daemons x 2 CPU devices, from a fresh machine. Installs what it
# needs (Debian packages, the pinned JAX venv /opt/substrax/jax), builds the binaries and the
# package (`make python` installs it into the venv), starts the cluster with the venv registered
# as the Python environment `jax`, submits examples/python/fashion_mnist.yaml (or, with
# STEP=collective, its shard_map variant), shows its progress and loss, ends with
# "test_accuracy=<value>", and stops the cluster (also when interrupted).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
SPEC_IN=examples/python/fashion_mnist.yaml
[ "${STEP:-spmd}" = collective ] && SPEC_IN=examples/python/fashion_mnist_collective.yaml

SUBSTRAX_SKIP_K8S_TEST_TOOLS=1 tools/install_deps.sh
tools/build_python.sh >&2
echo "demo-python: building (optimised)..." >&2
bazel build -c opt --noshow_progress //coordinator:substrax-coordinator //agent:substrax-agent \
  //worker:substrax-job //client:substraxctl 2>&1 |
  grep -vE '^(INFO|Loading|Analyzing|Target|  bazel-bin)' >&2 || true
BIN=$(bazel info -c opt bazel-bin 2>/dev/null)
CTL="$BIN/client/substraxctl"
[ -x "$CTL" ] || { echo "demo-python: the build failed (see above)" >&2; exit 1; }

STATE=$(realpath "$(mktemp -d "${TMPDIR:-/tmp}/substrax-demo-python.XXXXXX")")
stop_cluster() {
  "$CTL" local down --state-dir "$STATE" >/dev/null 2>&1 || true
}
trap stop_cluster EXIT
trap 'echo "demo-python: interrupted; stopping the cluster" >&2; exit 130' INT TERM

eval "$("$CTL" local up --workers 2 --cpu-devices 2 --state-dir "$STATE" \
  --data-root /usr/share/datasets --python-env jax=/opt/substrax/jax \
  --coordinator-binary "$BIN/coordinator/substrax-coordinator" \
  --agent-binary "$BIN/agent/substrax-agent" --job-binary "$BIN/worker/substrax-job")"
"$CTL" workers

# The example from this checkout, checkpointing into the cluster's checkpoint root.
SPEC="$STATE/fashion_mnist.yaml"
sed "s|/opt/substrax/examples/python/|$REPO/examples/python/|" "$SPEC_IN" > "$SPEC"
echo "  checkpoint: {directory: $STATE/checkpoints/fashion-mnist-jax}" >> "$SPEC"
JOB=$("$CTL" submit "$SPEC")
echo "demo-python: submitted $JOB; 2 JAX processes x 2 CPU devices, data-parallel" >&2
status=0
"$CTL" watch "$JOB" || status=$?
echo
echo "Loss per report, mean over the 4 devices:"
"$CTL" metrics "$JOB" --name loss
echo
if [ "$status" -ne 0 ]; then
  "$CTL" get "$JOB" >&2 || true
  "$CTL" logs "$JOB" --tail 20 >&2 || true
  echo "demo-python: the job did not succeed" >&2
  exit 1
fi
"$CTL" checkpoints "$JOB"
accuracy=$("$CTL" get "$JOB" -o json | grep -o '"test_accuracy": *[0-9.eE+-]*' | head -1 | sed 's/.*: *//')
echo "test_accuracy=$accuracy"
