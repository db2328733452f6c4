#!/usr/bin/env bash
# `substrax-job train --cpu-collectives` and `--cpu-affinity`: documented in the command's
# help, and a value other than those accepted is a bad command line (exit 2, naming the accepted
# values) before the job is even read.
set -euo pipefail
worker="$1"
fail() { echo "train_flags_test: FAIL: $*" >&2; exit 1; }

help="$("$worker" train --help)"
[[ "$help" == *"--cpu-collectives"* ]] || fail "train --help does not list --cpu-collectives"

set +e
out="$("$worker" train --job /nonexistent.yaml --cpu-collectives shm 2>&1)"
rc=$?
set -e
[ "$rc" = 2 ] || fail "--cpu-collectives shm exited $rc, want 2: $out"
[[ "$out" == *"--cpu-collectives: 'shm' is not a CPU collectives choice"*"'auto'"*"'gloo'"* ]] \
  || fail "unclear error for --cpu-collectives shm: $out"
[[ "$help" == *"--cpu-affinity"* ]] || fail "train --help does not list --cpu-affinity"
set +e
out="$("$worker" train --job /nonexistent.yaml --cpu-affinity all 2>&1)"
rc=$?
set -e
[ "$rc" = 2 ] || fail "--cpu-affinity all exited $rc, want 2: $out"
[[ "$out" == *"--cpu-affinity: 'all' is not 'auto'"*"'none'"* ]] \
  || fail "unclear error for --cpu-affinity all: $out"
echo "train_flags_test: PASSED"
