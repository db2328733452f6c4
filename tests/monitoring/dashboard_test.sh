#!/usr/bin/env bash
# Runs dashboard_test.py (standard library only) with the system's python3. Arguments go to it.
set -euo pipefail
exec python3 "$(dirname "$0")/dashboard_test.py" "$@"
