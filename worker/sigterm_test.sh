#!/usr/bin/env bash
# SIGTERM to `substrax-job train` (a built-in job on 2 CPU devices, standalone) stops both
# devices after the same step, writes a checkpoint of that step and exits 1 saying so; resumed,
# the job goes on from that step. Polls the process's log with a deadline (no blind sleeps).
set -euo pipefail
worker="$1"
fail() { echo "sigterm_test: FAIL: $*" >&2; [ -f "$dir/log" ] && cat "$dir/log" >&2; exit 1; }
dir="$(mktemp -d "${TEST_TMPDIR:-/tmp}/sigterm.XXXXXX")"
cat >"$dir/job.yaml" <<YAML
apiVersion: substrax/v1
kind: TrainJob
metadata: {name: sigterm}
spec:
  model: {type: mlp, hidden_sizes: [32, 32], num_classes: 4}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 4096, num_test_examples: 512,
                num_features: 16, noise: 0.3}
  optimizer: {type: adam, learning_rate: 0.01}
  mesh: {data_parallel_size: 2}
  batch: {global_batch_size: 64}
  steps: 10000000
  report_every_steps: 10
  checkpoint: {directory: $dir/ckpt}
YAML

# Waits up to $2 seconds for the log to match the pattern $1.
await_log() {
  local deadline=$((SECONDS + $2))
  until grep -q -- "$1" "$dir/log" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || fail "no '$1' in the log within $2 s"
    sleep 0.1
  done
}

"$worker" train --job "$dir/job.yaml" --local-devices 2 --cpu-affinity none 2>"$dir/log" &
pid=$!
await_log "^step 20/" 60
kill -TERM "$pid"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" = 1 ] || fail "exited $rc after SIGTERM, want 1"
line="$(grep "stopped after step" "$dir/log")" || fail "no 'stopped after step' line"
step="$(sed -E 's/.*stopped after step ([0-9]+) by SIGTERM.*/\1/' <<<"$line")"
[[ "$line" == "substrax-job: stopped after step $step by SIGTERM (preempted); checkpoint of step $step written" ]] \
  || fail "unexpected line: $line"
[ $((step % 10)) = 0 ] || fail "stopped after step $step, not at a report (every 10 steps)"
ls -d "$dir"/ckpt/step-*"$step"* >/dev/null 2>&1 || fail "no checkpoint of step $step in $dir/ckpt: $(ls "$dir/ckpt")"
grep -q "checkpoint of step $step committed" "$dir/log" || fail "the checkpoint of step $step was not committed"

# Resumed, it goes on from that step.
"$worker" train --job "$dir/job.yaml" --local-devices 2 --cpu-affinity none 2>"$dir/log" &
pid=$!
await_log "resuming from the checkpoint of step $step" 60
kill -TERM "$pid"
wait "$pid" || true
# Nothing the runs started outlived them (their command lines name $dir).
deadline=$((SECONDS + 10))
while pgrep -f -- "$dir" >/dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || fail "left running: $(pgrep -af -- "$dir")"
  sleep 0.1
done
echo "sigterm_test: PASSED (stopped after step $step)"
