#!/usr/bin/env bash
# A second, non-C++ client: Python's grpcio (pinned in the test tools' virtual environment that
# tools/install_deps.sh makes) against the real coordinator over mutual TLS. Credentials come
# from `substraxctl certs`. Arguments: --coordinator=, --ctl= (the binaries), then the protos.
set -euo pipefail
VENV=/opt/substrax/venv
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import grpc, grpc_tools" 2>/dev/null; then
  echo "python_client_test: no grpcio/grpcio-tools in $VENV: run tools/install_deps.sh" >&2
  exit 1
fi
exec "$VENV/bin/python" "$(dirname "$0")/python_client_test.py" --root "$PWD" "$@"
