#!/usr/bin/env bash
# Launch and relaunch of a command job, substrax against torchrun (bench/command_relaunch.py says
# what and how). Builds the binaries -c opt, installs Debian's python3-torch when missing, then
# runs the comparison; arguments go to command_relaunch.py (--rounds N, --restart-backoff D).
#
#   bench/command_relaunch.sh              # 3 rounds, about 2 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
if ! /usr/bin/python3 -c "import torch" 2>/dev/null || ! dpkg -s libopenblas0-pthread >/dev/null 2>&1; then
  echo "command_relaunch: installing Debian's python3-torch and OpenBLAS (the comparison peer)..." >&2
  SUDO=(); [ "$(id -u)" -eq 0 ] || SUDO=(sudo)
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends python3-torch libopenblas0-pthread >/dev/null
fi
bazel build -c opt --noshow_progress //coordinator:substrax-coordinator //agent:substrax-agent \
  //worker:substrax-job //client:substraxctl >&2
exec /usr/bin/python3 bench/command_relaunch.py --bin-dir "$(bazel info -c opt bazel-bin 2>/dev/null)" "$@"
