# Sourced by the framework tests (tests/frameworks): start the processes of one distributed
# program on this host, as command jobs will, and check that all of them succeeded and that none
# outlived the test. The caller sets TEST_NAME first.

log() { echo "$TEST_NAME: $*" >&2; }

# The test cannot run here (`$1` says why): a skip, except under CI=true, where CI has everything
# installed and a missing piece is a failure.
skip_or_fail() {
  log "$1: run tools/install_deps.sh"
  if [ "${CI:-}" = true ]; then
    log "FAIL: CI=true, but the test cannot run"
    exit 1
  fi
  log "SKIPPED (set CI=true to make this a failure)"
  exit 0
}

# Prints a TCP port that was free on 127.0.0.1 a moment ago (bound to port 0, then released),
# for the program's rendezvous, as an agent picks one.
free_port() {
  /usr/bin/python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# run_processes N DEADLINE_S LOGDIR ENV_OF CMD...: starts N copies of CMD, copy i with the
# environment variables that the function named ENV_OF prints for i (NAME=VALUE words) and its
# output in LOGDIR/i.log, each under `timeout` (its own process group, SIGKILL 5 s after the
# deadline's SIGTERM). When one fails, the others are stopped at once rather than left waiting for
# it at a collective. Returns 0 when every copy exited 0; otherwise prints every log. CMD names
# LOGDIR, so that assert_none_outlived LOGDIR finds any copy left behind.
run_processes() {
  local n=$1 deadline_s=$2 logdir=$3 env_of=$4
  shift 4
  local i pids=() failed=0 rc done_pid rest pid
  mkdir -p "$logdir"
  # `timeout` leaves the test's process group, so a test stopped from outside (Bazel's own
  # timeout) passes the signal on rather than leave the copies to their deadline.
  trap 'kill -TERM "${pids[@]}" 2>/dev/null; exit 1' TERM INT
  for ((i = 0; i < n; i++)); do
    # shellcheck disable=SC2046  # NAME=VALUE words, none with spaces
    timeout -k 5 "$deadline_s" env $("$env_of" "$i") "$@" >"$logdir/$i.log" 2>&1 &
    pids+=($!)
  done
  local left=("${pids[@]}")
  while [ ${#left[@]} -gt 0 ]; do
    rc=0
    done_pid=
    wait -n -p done_pid "${left[@]}" || rc=$?
    [ -n "$done_pid" ] || break  # none of them left to wait for
    rest=()
    for pid in "${left[@]}"; do
      [ "$pid" = "$done_pid" ] || rest+=("$pid")
    done
    left=("${rest[@]}")
    if [ "$rc" -ne 0 ] && [ "$failed" = 0 ]; then
      failed=$rc
      kill -TERM "${left[@]}" 2>/dev/null || true
    fi
  done
  trap - TERM INT
  if [ "$failed" != 0 ]; then
    [ "$failed" = 124 ] && log "FAIL: a process ran past its ${deadline_s} s deadline"
    for ((i = 0; i < n; i++)); do
      log "--- process $i (log $logdir/$i.log):"
      cat "$logdir/$i.log" >&2
    done
    log "FAIL: a process exited $failed (logs above); the others were stopped"
    return 1
  fi
}

# Fails unless every process whose command line names `$1` (the test's directory) has exited
# within 10 s (tests/outlived.py).
assert_none_outlived() {
  /usr/bin/python3 -c 'import sys
sys.path.insert(0, sys.argv[1])
import outlived
outlived.assert_none_outlived(sys.argv[2], 10)' "$PWD/tests" "$1"
}

# run_distributed N DEADLINE_S ENV_OF CMD...: the whole test. Runs N copies of CMD with the
# test's new directory as their last argument (run_processes), checks that none outlived it and
# that copy i printed its line "OK process i of N ...", and prints PASS; exits 1 otherwise.
run_distributed() {
  local n=$1 deadline_s=$2 env_of=$3
  shift 3
  local dir status=0 i
  dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/$TEST_NAME.XXXXXX")
  run_processes "$n" "$deadline_s" "$dir" "$env_of" "$@" "$dir" || status=1
  assert_none_outlived "$dir" || status=1
  [ "$status" = 0 ] || exit 1
  for ((i = 0; i < n; i++)); do
    if ! grep -q "^OK process $i of $n" "$dir/$i.log"; then
      log "FAIL: process $i exited 0 without its OK line:"
      cat "$dir/$i.log" >&2
      exit 1
    fi
    grep "^OK" "$dir/$i.log" >&2
  done
  rm -rf "$dir"
  log PASS
}
