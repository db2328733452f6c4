#!/usr/bin/env bash
# safetensors files between C++ and Python: runs python_interop_test.py with the test tools'
# virtual environment (tools/install_deps.sh pins numpy and safetensors there). Arguments: the
# safetensors_tool binary, the substrax-job binary.
set -euo pipefail
VENV=/opt/substrax/venv
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import numpy, safetensors" 2>/dev/null; then
  echo "python_interop_test: no numpy/safetensors in $VENV: run tools/install_deps.sh" >&2
  exit 1
fi
exec "$VENV/bin/python" "$(dirname "$0")/python_interop_test.py" "$(realpath "$1")" "$(realpath "$2")"
