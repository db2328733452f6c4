#!/usr/bin/env bash
# Debian's PyTorch (python3-torch, installed by tools/install_deps.sh) runs multi-process as a
# command job's `per_device` processes will: 4 processes of /usr/bin/python3 on loopback,
# torch.distributed over Gloo with MASTER_ADDR, MASTER_PORT (a free port), RANK and WORLD_SIZE in
# the environment, all-reduce a tensor to the known sum; and torch's BLAS is OpenBLAS, not the
# reference BLAS it falls back to without libopenblas0-pthread (torch_gloo_test.py). One
# deadline for the whole; no process may outlive the test.
set -euo pipefail
TEST_NAME=torch_gloo_test
PROCESSES=4
source "$(dirname "$0")/multiprocess.sh"

if ! /usr/bin/python3 -c "import torch.distributed" 2>/dev/null; then
  skip_or_fail "no PyTorch for /usr/bin/python3 (Debian's python3-torch)"
fi
if ! dpkg-query -W -f='${Status}' libopenblas0-pthread 2>/dev/null | grep -q "install ok installed"; then
  skip_or_fail "no libopenblas0-pthread"
fi

port=$(free_port)
# The environment of process $1, as the agent will set it for a per_device command job; one
# thread each, as the processes share this host's cores.
torch_env() {
  echo "MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$1 WORLD_SIZE=$PROCESSES LOCAL_RANK=$1" \
    "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1"
}
run_distributed "$PROCESSES" 120 torch_env /usr/bin/python3 "$(dirname "$0")/torch_gloo_test.py"
