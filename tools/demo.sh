#!/usr/bin/env bash
# make demo: a data-parallel Fashion-MNIST job on a local cluster of 2 worker daemons x 2 CPU
# devices, from a fresh machine. Installs what it needs, builds, starts the cluster, submits
# examples/fashion_mnist_mlp.yaml (checkpointing every 1000 steps), shows its progress, a
# metrics table and its checkpoints, exports the parameters to one safetensors file, ends with
# "samples_per_second=<value>" (the training speed) and "test_accuracy=<value>", and stops the
# cluster (also when interrupted).
set -euo pipefail
cd "$(dirname "$0")/.."

# The build and the demo need Debian packages only (not the manifest tests' tools).
SUBSTRAX_SKIP_K8S_TEST_TOOLS=1 tools/install_deps.sh
echo "demo: building (optimised)..." >&2
bazel build -c opt --noshow_progress //coordinator:substrax-coordinator //agent:substrax-agent //worker:substrax-job \
  //client:substraxctl 2>&1 | grep -vE '^(INFO|Loading|Analyzing|Target|  bazel-bin)' >&2 || true
BIN=$(bazel info -c opt bazel-bin 2>/dev/null)
CTL="$BIN/client/substraxctl"
[ -x "$CTL" ] || { echo "demo: the build failed (see above)" >&2; exit 1; }

STATE=$(realpath "$(mktemp -d "${TMPDIR:-/tmp}/substrax-demo.XXXXXX")")
stop_cluster() {
  "$CTL" local down --state-dir "$STATE" >/dev/null 2>&1 || true
}
trap stop_cluster EXIT
trap 'echo "demo: interrupted; stopping the cluster" >&2; exit 130' INT TERM

# `local up` prints the address and the admin's credentials (mutual TLS, as on a real cluster)
# as one `export` line.
eval "$("$CTL" local up --workers 2 --cpu-devices 2 --state-dir "$STATE" \
  --data-root /usr/share/datasets \
  --coordinator-binary "$BIN/coordinator/substrax-coordinator" \
  --agent-binary "$BIN/agent/substrax-agent" --job-binary "$BIN/worker/substrax-job")"
"$CTL" workers

# The example, checkpointing into the cluster's checkpoint root (local up's default).
SPEC="$STATE/fashion_mnist_mlp.yaml"
cat examples/fashion_mnist_mlp.yaml > "$SPEC"
echo "  checkpoint: {directory: $STATE/checkpoints/fashion-mnist, every_steps: 1000, keep_last: 2}" \
  >> "$SPEC"
JOB=$("$CTL" submit "$SPEC")
echo "demo: submitted $JOB; training data-parallel over 4 devices on 2 workers" >&2
status=0
"$CTL" watch "$JOB" || status=$?
echo
echo "Loss and accuracy per report, mean over the 4 devices:"
"$CTL" metrics "$JOB" --name loss --name accuracy --reduce mean
echo
if [ "$status" -ne 0 ]; then
  "$CTL" get "$JOB" >&2 || true
  echo "demo: the job did not succeed" >&2
  exit 1
fi
echo "Checkpoints (every 1000 steps and at the end, the newest 2 kept):"
"$CTL" checkpoints "$JOB"
"$BIN/worker/substrax-job" export-checkpoint "$STATE/checkpoints/fashion-mnist" \
  --out "$STATE/fashion-mnist.safetensors" >&2
echo
# How fast it trained: the median over the reports after the first (which holds the start-up) of
# the samples per second, summed over the devices.
rate=$("$CTL" metrics "$JOB" --name samples_per_second |
  awk '$1 ~ /^[0-9]+$/ && ++n > 1 {print $2 + 0}' | sort -g |
  awk '{v[NR] = $1} END {if (NR) printf "%.0f", v[int((NR + 1) / 2)]}')
echo "samples_per_second=$rate"
accuracy=$("$CTL" get "$JOB" -o json | grep -o '"test_accuracy": *[0-9.eE+-]*' | head -1 | sed 's/.*: *//')
echo "test_accuracy=$accuracy"
