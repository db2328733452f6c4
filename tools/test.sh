#!/usr/bin/env bash
# Runs every check of the workspace and ends with one summary line, "N passed, M failed":
#   1. the source checks, one test each: tools/check_duplicates.py (no block of 15 or more
#      meaningful lines stands twice in any C++ folder), tools/check_sizes.py (no C++ file over
#      800 lines, no function outside tests over 120), tools/check_include_cycles.py (no two
#      packages include each other, directly or around a cycle);
#   2. bazel test //... (each test counted from Bazel's per-test results);
#   3. the visibility probes: each target in VISIBILITY_PROBES depends across a forbidden edge
#      (tools/visibility/BUILD.bazel) and must fail to build with a visibility error (one test
#      each).
#   4. the Python package's tests: make python's build and install (tools/build_python.sh, into
#      the JAX environment /opt/substrax/jax), then its pytest over python/tests, each test
#      counted from pytest's closing line ("N passed, M failed, K skipped in ..."; errors count
#      as failed; a pytest that crashes or runs no test counts as one failed). Without that
#      environment the package's tests are skipped, and under CI=true counted as one failed.
# Extra arguments go to `bazel test`.
set -uo pipefail
cd "$(dirname "$0")/.."

VISIBILITY_PROBES=(
  //core/visibility_probe:core_to_worker
  //core/visibility_probe:core_to_rpc
  //coordinator/visibility_probe:coordinator_to_worker
  //coordinator/visibility_probe:coordinator_to_client
  //worker/collectives/visibility_probe:collectives_to_compute
  //worker/collectives/visibility_probe:collectives_to_data
  //agent/visibility_probe:agent_to_runtime
  //agent/visibility_probe:agent_to_compute
  //agent/visibility_probe:agent_to_collectives
  //agent/visibility_probe:agent_to_data
  //agent/visibility_probe:agent_to_sdk
  //worker/visibility_probe:job_to_agent
  //worker/visibility_probe:job_to_agent_launch
)

log=$(mktemp)
probe_log=$(mktemp)
trap 'rm -f "$log" "$probe_log"' EXIT
passed=0
failed=0
exit_status=0

# source_check NAME WHAT-TO-DO-ON-FAILURE: runs tools/NAME.py, counted as one test.
source_check() {
  echo "== tools/$1.py"
  if "tools/$1.py"; then
    echo "//tools:$1 PASSED"
    passed=$((passed + 1))
  else
    echo "//tools:$1 FAILED: $2"
    failed=$((failed + 1))
    exit_status=1
  fi
}
source_check check_duplicates "the blocks above stand twice; extract the shared code"
source_check check_sizes "split the files and functions above by concern"
source_check check_include_cycles "the packages above include each other; move what both need"

# The build runs with a strict action environment: CI (set by .ci/run's caller) reaches the tests
# only when passed on, so that tests which may skip elsewhere must run there.
bazel test //... --test_summary=short --test_env=CI "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
bazel_passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
bazel_failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|INCOMPLETE|NO STATUS|FAILED TO BUILD)' "$log")
if [ "$status" -ne 0 ] && [ "$bazel_failed" -eq 0 ]; then
  bazel_failed=1  # the build itself failed before any test ran
fi
passed=$((passed + bazel_passed))
failed=$((failed + bazel_failed))
if [ "$status" -ne 0 ]; then exit_status=$status; fi

echo "== visibility probes (each must fail to build with a visibility error)"
bazel build --keep_going "${VISIBILITY_PROBES[@]}" >"$probe_log" 2>&1
for probe in "${VISIBILITY_PROBES[@]}"; do
  if grep -qF "is not visible from target '$probe'" "$probe_log"; then
    echo "$probe PASSED (refused: not visible)"
    passed=$((passed + 1))
  else
    echo "$probe FAILED: this forbidden dependency is allowed by the visibility rules, or the" \
      "probe failed for another reason; see tools/visibility/BUILD.bazel"
    grep -F "$probe" "$probe_log" | head -5
    failed=$((failed + 1))
    exit_status=1
  fi
done

echo "== pytest python/tests (the substrax Python package)"
JAX_PYTHON=/opt/substrax/jax/bin/python
python_log=$(mktemp)
trap 'rm -f "$log" "$probe_log" "$python_log"' EXIT
if [ ! -x "$JAX_PYTHON" ]; then
  if [ "${CI:-}" = true ]; then
    echo "//python:tests FAILED: no JAX environment at /opt/substrax/jax (tools/install_deps.sh)"
    failed=$((failed + 1))
    exit_status=1
  else
    echo "//python:tests SKIPPED: no JAX environment at /opt/substrax/jax (tools/install_deps.sh)"
  fi
elif ! tools/build_python.sh; then
  echo "//python:tests FAILED: make python's build or install failed (above)"
  failed=$((failed + 1))
  exit_status=1
else
  "$JAX_PYTHON" -m pytest python/tests -q 2>&1 | tee "$python_log"
  status=${PIPESTATUS[0]}
  # pytest's closing line, e.g. "3 failed, 40 passed, 2 skipped in 31.02s".
  summary=$(grep -E '^=*[ ]*(no tests ran|[0-9]+ [a-z]+.* in [0-9.]+s)' "$python_log" | tail -1)
  count() { echo "$summary" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
  py_passed=$(count passed)
  py_failed=$(( $(count failed) + $(count 'errors?') ))
  if [ "$status" -ne 0 ] && [ "$py_failed" -eq 0 ]; then
    py_failed=1  # pytest crashed, was interrupted, or collected no test (exit 5)
    echo "//python:tests FAILED: pytest exited with status $status"
  fi
  if [ "$py_passed" -eq 0 ] && [ "$py_failed" -eq 0 ]; then
    py_failed=1
    echo "//python:tests FAILED: pytest ran no test"
  fi
  passed=$((passed + py_passed))
  failed=$((failed + py_failed))
  if [ "$py_failed" -ne 0 ]; then exit_status=1; fi
fi

echo
echo "$passed passed, $failed failed"
exit "$exit_status"
