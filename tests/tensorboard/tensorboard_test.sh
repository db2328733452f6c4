#!/usr/bin/env bash
# TensorBoard reads what `substraxctl metrics --tensorboard` writes: the tensorboard package
# (pinned in the test tools' virtual environment that tools/install_deps.sh makes) loads the
# event files of a job that ran on a real local cluster. Arguments: --ctl=, --coordinator=,
# --worker= (the binaries).
set -euo pipefail
VENV=/opt/substrax/venv
if [ ! -x "$VENV/bin/python" ] ||
   ! "$VENV/bin/python" -c "import tensorboard.backend.event_processing.event_accumulator" 2>/dev/null; then
  echo "tensorboard_test: no tensorboard package in $VENV: run tools/install_deps.sh" >&2
  # CI has the tools installed: there a missing package is a failure, not a skip.
  [ "${CI:-}" = "true" ] && exit 1
  echo "tensorboard_test: SKIPPED (set CI=true to make this a failure)" >&2
  exit 0
fi
exec "$VENV/bin/python" "$(dirname "$0")/tensorboard_test.py" "$@"
