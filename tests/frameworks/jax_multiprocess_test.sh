#!/usr/bin/env bash
# JAX from the environment tools/install_deps.sh makes (/opt/substrax/jax) runs multi-process on
# CPU as a command job's processes will: 2 processes on loopback, 2 CPU devices each
# (JAX_NUM_CPU_DEVICES), jax.distributed.initialize with an explicit coordinator on a free port,
# and a psum over the 4 devices that both processes must read right (jax_multiprocess_test.py).
# One deadline for the whole; no process may outlive the test.
set -euo pipefail
TEST_NAME=jax_multiprocess_test
VENV=/opt/substrax/jax
PROCESSES=2
source "$(dirname "$0")/multiprocess.sh"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import jax, jaxlib, flax, optax" 2>/dev/null; then
  skip_or_fail "no jax, jaxlib, flax and optax in $VENV"
fi

address=127.0.0.1:$(free_port)
# The environment of process $1, as the agent will set it for a JAX command job on CPU workers;
# JAX_PLATFORMS=cpu spares the search for accelerators.
jax_env() {
  echo "JAX_COORDINATOR_ADDRESS=$address JAX_NUM_PROCESSES=$PROCESSES JAX_PROCESS_ID=$1" \
    "JAX_NUM_CPU_DEVICES=2 JAX_PLATFORMS=cpu PYTHONUNBUFFERED=1"
}
run_distributed "$PROCESSES" 120 jax_env "$VENV/bin/python" "$(dirname "$0")/jax_multiprocess_test.py"
