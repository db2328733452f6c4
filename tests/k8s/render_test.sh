#!/usr/bin/env bash
# Runs render_test.py with the validator's virtual environment (tools/install_deps.sh makes it)
# and kubectl from PATH. Arguments go to render_test.py.
set -euo pipefail
VENV=/opt/substrax/venv
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import kubernetes_validate, yaml" 2>/dev/null; then
  echo "render_test: no kubernetes-validate in $VENV: run tools/install_deps.sh" >&2
  exit 1
fi
if ! command -v kubectl >/dev/null 2>&1; then
  echo "render_test: no kubectl on PATH ($PATH): run tools/install_deps.sh (kubernetes-client)" >&2
  exit 1
fi
# kubectl (and the Cloud SDK's dispatcher) may want a writable home; tests get none by default.
export HOME="${TEST_TMPDIR:-$(mktemp -d)}"
exec "$VENV/bin/python" "$(dirname "$0")/render_test.py" --root "$PWD" "$@"
