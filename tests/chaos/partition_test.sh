#!/usr/bin/env bash
# Chaos 3, partition: a worker host cut off from the network (packets dropped, not refused) for
# longer than the lease, then healed.
#
#   <run>-c  (coordinator, 10.214.0.2) ─┐
#   <run>-w1 (worker w-1,  10.214.0.3) ─┼─ veth ─ bridge br0 in namespace <run>-br
#   <run>-w2 (worker w-2,  10.214.0.4) ─┘
#
# A 2-device job (max_restarts 2) runs on one worker, the victim. Once it reports steps, every
# packet in and out of the victim's eth0 is dropped (nftables, tests/netns_hosts.sh). Then:
#   1. the victim's daemon stops its runner within the lease (heartbeat_timeout, plus the time
#      SIGTERM takes), counted from the cut;
#   2. the coordinator marks the victim DEAD;
#   3. the job restarts in attempt 2 on the other worker;
#   4. after healing, the victim's stale heartbeat is refused ("declared dead"), so is its
#      runner's stale final status of attempt 1, and it registers again with a new incarnation;
#   5. the job SUCCEEDS in attempt 2;
#   6. a /proc watch (runner_watch.py) saw no two attempts of the job alive at the same instant
#      (a runner that does not exist cannot report steps), and no attempt run twice;
#   7. after SIGTERM to the daemons and the coordinator, nothing of the test is left in /proc.
# Cleans up on every exit (trap). Bounded: an overall deadline, every client call under
# `timeout`. Skips (exit 0, saying so) unless root with `ip netns`; under CI=true that fails.
#
# Arguments: --coordinator=, --agent=, --ctl= (the binaries).
set -euo pipefail
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

readonly OVERALL_S=200        # Bazel's timeout ("moderate", 300 s) is the backstop
readonly HEARTBEAT_TIMEOUT=3  # seconds: the lease
readonly STOP_GRACE=2         # seconds: SIGTERM, then SIGKILL
START=$SECONDS

log() { echo "partition_test: $*"; }
die() { log "FAIL: $*" >&2; exit 1; }
left() { echo $((OVERALL_S - (SECONDS - START))); }

HERE="$(dirname "$0")"
[ -f "$HERE/runner_watch.py" ] || HERE="$(dirname "$(realpath "$0")")"
NETNS_TEST="the partition test"
NETNS_LIB="$HERE/../netns_hosts.sh"
# shellcheck source=tests/netns_hosts.sh
. "$NETNS_LIB"
netns_require nft python3

for arg in "$@"; do
  case "$arg" in
    --coordinator=*) COORDINATOR_BIN="$(realpath "${arg#*=}")" ;;
    --agent=*) AGENT_BIN="$(realpath "${arg#*=}")" ;;
    --ctl=*) CTL="$(realpath "${arg#*=}")" ;;
    *) die "unknown argument $arg" ;;
  esac
done
for v in COORDINATOR_BIN AGENT_BIN CTL; do
  [ -n "${!v:-}" ] || die "missing --${v,,} argument"
done

RUN="sxpt$$"
C_NS="$RUN-c"
C_IP=10.214.0.2
W_NS=("$RUN-w1" "$RUN-w2")
W_IP=(10.214.0.3 10.214.0.4)
ADDRESS="$C_IP:7070"
PIDS=()
WATCH_PID=""
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/partition.XXXXXX")"

# Every process of this test: daemons, runners, coordinator (their command lines name $TMP).
ours() {
  local pid
  for pid in $(pgrep -f -- "$TMP" || true); do
    [ "$pid" = "$$" ] || [ "$pid" = "$WATCH_PID" ] || echo "$pid"
  done
}

cleanup() {
  local rc=$?
  set +e
  trap - EXIT TERM INT HUP
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  # Daemons stop their runners on SIGTERM (--stop-grace before SIGKILL).
  for _ in $(seq 100); do [ -z "$(ours)" ] && break; sleep 0.1; done
  local left_over
  left_over="$(ours | tr '\n' ' ')"
  if [ -n "$left_over" ] && [ "$rc" = 0 ]; then
    log "FAIL: processes outlived the test 10 s after SIGTERM:"
    for pid in $left_over; do ps -o pid=,args= -p "$pid"; done
    rc=1
  fi
  [ -z "$WATCH_PID" ] || kill -TERM "$WATCH_PID" 2>/dev/null
  netns_cleanup || rc=1
  for pid in $(ours); do kill -KILL "$pid" 2>/dev/null; done
  if [ "$rc" != 0 ]; then
    for f in "$TMP"/*.log "$TMP"/w*/*.log; do
      [ -f "$f" ] && { echo "--- $f (last 40 lines)"; tail -n 40 "$f"; }
    done
  fi
  if [ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ]; then
    find "$TMP" -name '*.log' -exec cp --parents {} "$TEST_UNDECLARED_OUTPUTS_DIR" \; 2>/dev/null
  fi
  rm -rf "$TMP"
  if [ -n "$NETNS_SKIPPED" ] && [ "$rc" = 0 ]; then :
  elif [ "$rc" = 0 ]; then log "PASSED"; else log "FAILED (exit $rc); cleaned up"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

# --- The hosts. -----------------------------------------------------------------------------
HOSTS="127.0.0.1 localhost
$C_IP coordinator
${W_IP[0]} ${W_NS[0]}
${W_IP[1]} ${W_NS[1]}"
netns_bridge "$RUN"
netns_host "$C_NS" "$C_IP" "$HOSTS"
netns_host "${W_NS[0]}" "${W_IP[0]}" "$HOSTS"
netns_host "${W_NS[1]}" "${W_IP[1]}" "$HOSTS"

# --- The cluster. ---------------------------------------------------------------------------
mkdir -p "$TMP/state" "$TMP/w1" "$TMP/w2"
# Plaintext: partitions, not credentials, are under test (tests/security has those).
ip netns exec "$C_NS" "$COORDINATOR_BIN" --insecure --listen "$ADDRESS" --state-dir "$TMP/state" \
  --heartbeat-interval 500ms --heartbeat-timeout "${HEARTBEAT_TIMEOUT}s" --restart-backoff 1s \
  >"$TMP/coordinator.log" 2>&1 &
PIDS+=($!)
for i in 0 1; do
  ip netns exec "${W_NS[$i]}" "$AGENT_BIN" --insecure --coordinator "$ADDRESS" --cpu-devices 2 \
    --worker-id "w-$((i + 1))" --host "${W_NS[$i]}" --listen-host "${W_IP[$i]}" \
    --work-dir "$TMP/w$((i + 1))" --stop-grace "${STOP_GRACE}s" --collective-timeout 20s \
    >"$TMP/w$((i + 1)).log" 2>&1 &
  PIDS+=($!)
done
"$HERE/runner_watch.py" watch "$TMP" "$TMP/runners.json" &
WATCH_PID=$!

ctl() {  # ctl ARGS... : substraxctl from the coordinator's host
  ip netns exec "$C_NS" timeout 20 "$CTL" --insecure --coordinator "$ADDRESS" "$@"
}
# poll SECONDS WHAT COMMAND...: run COMMAND every 0.2 s until it succeeds, or fail naming WHAT.
poll() {
  local secs="$1" what="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] && [ "$(left)" -gt 0 ] || die "not within ${secs}s: $what"
    sleep 0.2
  done
}
# worker_field ID FIELD: a field of a worker in `substraxctl workers -o json`.
worker_field() {
  ctl workers -o json 2>/dev/null | python3 -c '
import json, sys
try:
    workers = json.load(sys.stdin).get("workers", [])
except ValueError:  # no answer (yet): the coordinator is not serving
    workers = []
for w in workers:
    if w.get("worker_id") == sys.argv[1]:
        print(w.get(sys.argv[2], ""))' "$1" "$2"
}
# job_field FIELD: "attempt", "state", "step" or "hosts" (of the mesh) of the job.
job_field() {
  ctl get "$JOB" -o json 2>/dev/null | python3 -c '
import json, sys
try:
    job = json.load(sys.stdin)
except ValueError:
    job = {}
field = sys.argv[1]
if field == "step":
    print(int(job.get("progress", {}).get("step", 0)))
elif field == "hosts":
    print(" ".join(sorted({d.get("host", "") for d in job.get("mesh", {}).get("devices", [])})))
else:
    print(job.get(field, ""))' "$1"
}
alive() { [ "$(worker_field "$1" state)" = WORKER_STATE_ALIVE ]; }
both_alive() { alive w-1 && alive w-2; }
poll 60 "both workers registered and alive" both_alive

# A 2-device job that fits on one worker; ~10 s per attempt here.
# Long enough that attempt 1 is still running when the cut comes (the few substraxctl calls
# before it take seconds; 10000 steps of this model once ended first), short enough that attempt
# 2 ends well within OVERALL_S.
cat >"$TMP/job.yaml" <<'EOF'
apiVersion: substrax/v1
kind: TrainJob
metadata: {name: cut}
spec:
  model: {type: mlp, hidden_sizes: [32, 32], num_classes: 4}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 4096, num_test_examples: 512,
                num_features: 16, noise: 0.3}
  optimizer: {type: adam, learning_rate: 0.01}
  mesh: {data_parallel_size: 2}
  batch: {global_batch_size: 64}
  steps: 60000
  report_every_steps: 10
  max_restarts: 2
EOF
JOB="$(ctl submit "$TMP/job.yaml" | head -n 1 | tr -d '[:space:]')"
[ -n "$JOB" ] || die "submit printed no job id"
log "submitted $JOB"
stepping() { [ "$(job_field step)" -gt 0 ]; }
poll 60 "job $JOB reports steps" stepping
HOST="$(job_field hosts)"
case "$HOST" in
  "${W_NS[0]}") VICTIM=0 ;;
  "${W_NS[1]}") VICTIM=1 ;;
  *) die "job $JOB runs on hosts '$HOST', want exactly one of ${W_NS[*]}" ;;
esac
OTHER=$((1 - VICTIM))
V_NS="${W_NS[$VICTIM]}" V_ID="w-$((VICTIM + 1))" O_ID="w-$((OTHER + 1))"
V_INCARNATION="$(worker_field "$V_ID" incarnation)"
[ "$(job_field attempt)" = 1 ] || die "job $JOB is not in attempt 1 before the cut"

# --- The cut. -------------------------------------------------------------------------------
victim_runners() {  # the victim host's job processes alive now (their SUBSTRAX_LAUNCH)
  local pid
  for pid in $(ip netns pids "$V_NS"); do
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q "^SUBSTRAX_LAUNCH=$TMP/" && echo "$pid"
  done
  return 0
}
[ -n "$(victim_runners)" ] || die "no runner on $V_NS before the cut"
netns_partition "$V_NS"
CUT=$SECONDS
log "cut $V_NS ($V_ID, incarnation $V_INCARNATION) off at step $(job_field step)"

# 1. Fenced within the lease (+ a second for SIGTERM and /proc to show it).
no_victim_runners() { [ -z "$(victim_runners)" ]; }
poll $((HEARTBEAT_TIMEOUT + 1)) "the cut-off daemon stops its runner (fencing)" no_victim_runners
log "the cut-off daemon stopped its runner ~$((SECONDS - CUT)) s after the cut"
# The runner's supervisor fences first (its deadline is the lease less a margin); the agent,
# still running, says so too once the lease is over.
fenced_line() {
  grep -q "the agent did not renew the attempt's lease in time" "$TMP/w$((VICTIM + 1)).log" &&
    grep -q "): fencing, since the coordinator may restart" "$TMP/w$((VICTIM + 1)).log"
}
poll 5 "the victim's log says it fenced (its supervisor, then the agent)" fenced_line
# 2. Declared dead.
dead() { [ "$(worker_field "$V_ID" state)" = WORKER_STATE_DEAD ]; }
poll $((2 * HEARTBEAT_TIMEOUT)) "the coordinator marks $V_ID dead" dead
# 3. Restarted on the other worker while the victim is still cut off.
restarted() {
  [ "$(job_field attempt)" -ge 2 ] && [ "$(job_field state)" = JOB_STATE_RUNNING ] \
    && [ "$(job_field hosts)" = "${W_NS[$OTHER]}" ] && stepping
}
poll 60 "job $JOB runs attempt 2 on ${W_NS[$OTHER]}" restarted
log "job $JOB runs attempt $(job_field attempt) on ${W_NS[$OTHER]} ($O_ID)"

# --- The heal. ------------------------------------------------------------------------------
netns_heal "$V_NS"
log "healed $V_NS after $((SECONDS - CUT)) s"
# 4. Stale reports refused; a new incarnation.
rejoined() {
  alive "$V_ID" && [ "$(worker_field "$V_ID" incarnation)" != "$V_INCARNATION" ]
}
poll 60 "$V_ID registers again with a new incarnation" rejoined
VLOG="$TMP/w$((VICTIM + 1)).log"
grep -q "lease lost (.*was declared dead" "$VLOG" \
  || die "the victim's stale heartbeat was not refused as declared dead"
refused() { grep -q "status report of job $JOB attempt 1 process 0 refused" "$VLOG"; }
poll 30 "the victim's stale final status of attempt 1 is refused" refused
log "$V_ID: stale heartbeat and status refused; now incarnation $(worker_field "$V_ID" incarnation)"

# 5. The job succeeds in attempt 2.
ended() { case "$(job_field state)" in JOB_STATE_SUCCEEDED|JOB_STATE_FAILED|JOB_STATE_CANCELLED) ;; *) false ;; esac; }
poll "$(left)" "job $JOB ends" ended
ctl get "$JOB" || true
[ "$(job_field state)" = JOB_STATE_SUCCEEDED ] || die "job $JOB ended $(job_field state)"
[ "$(job_field attempt)" = 2 ] || die "job $JOB succeeded in attempt $(job_field attempt), want 2"

# 6. Never two attempts at once.
kill -TERM "$WATCH_PID"
wait "$WATCH_PID" || die "the runner watch failed"
WATCH_PID=""
python3 "$HERE/runner_watch.py" check "$TMP/runners.json" || die "runners overlapped (above)"
# 7. Nothing left: checked by the cleanup, after SIGTERM to every daemon and the coordinator.
