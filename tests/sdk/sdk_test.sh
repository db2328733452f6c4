#!/usr/bin/env bash
# The SDK as a user meets it, outside Bazel:
#  1. installs the SDK's install tree into a temporary prefix (as `make sdk PREFIX=...` does);
#  2. builds examples/sdk with CMake (Release) and the guide example again with plain
#     g++ $(pkg-config --cflags --libs substrax);
#  3. runs the CNN's gradient check, then the guide example on 1 and on 4 standalone devices for
#     20 steps: the parameters must agree within 1e-5 (relative);
#  4. runs the CNN standalone on 2 local devices for a few steps;
#  5. builds the guide example against headers that claim SDK 2.0: Init refuses it, naming both
#     versions;
#  6. starts a local cluster of 2 workers x 2 CPU devices whose workers allow a temporary
#     programs directory, and submits the CNN as a program job for one epoch: it must SUCCEED,
#     its loss and accuracy must be in `substraxctl metrics` (reduced as the spec declares), and
#     its test accuracy must be >= 0.85;
#  7. submits the version-2 build (refused by Init in the job: FAILED naming the versions) and the
#     CNN with a data directory that does not exist (FAILED after Init, naming the file);
#  8. on the same workers (they kept serving), a CNN job that checkpoints every 30 of its 60
#     steps SUCCEEDS with both checkpoints listed, and a job on another mesh (2 devices) with
#     resume_from goes on from its step 60;
#  9. stops the cluster and checks that no process it started is left.
# Bounded: every wait has a deadline; Bazel's timeout is the backstop.
#
# Arguments: --sdk= (the install tree tarball), --examples= (examples/sdk/CMakeLists.txt), --ctl=,
# --coordinator=, --agent= (the binaries).
set -euo pipefail
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
START=$SECONDS

log() { echo "sdk_test: $* ($((SECONDS - START)) s)"; }
die() { echo "sdk_test: FAIL: $*" >&2; exit 1; }

for arg in "$@"; do
  case "$arg" in
    --sdk=*) SDK_TAR="$(realpath "${arg#*=}")" ;;
    --examples=*) EXAMPLES="$(cd "$(dirname "${arg#*=}")" && pwd)" ;;
    --ctl=*) CTL="$(realpath "${arg#*=}")" ;;
    --coordinator=*) COORDINATOR_BIN="$(realpath "${arg#*=}")" ;;
    --agent=*) AGENT_BIN="$(realpath "${arg#*=}")" ;;
    *) die "unknown argument $arg" ;;
  esac
done
for tool in cmake pkg-config g++; do
  command -v "$tool" >/dev/null || die "$tool is not installed (tools/install_deps.sh installs it)"
done

WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/sdk.XXXXXX")"
STATE="$WORK/cluster"
cleanup() {
  "$CTL" local down --state-dir "$STATE" >/dev/null 2>&1 || true
  if [ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ] && [ -d "$STATE" ]; then
    find "$STATE" -name '*.log' -exec cp {} "$TEST_UNDECLARED_OUTPUTS_DIR/" \; 2>/dev/null || true
  fi
}
trap cleanup EXIT

# --- 1. install --------------------------------------------------------------------------
PREFIX="$WORK/prefix"
mkdir -p "$PREFIX"
tar -C "$PREFIX" --no-same-owner -xf "$SDK_TAR"
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
[ "$(pkg-config --modversion substrax)" = "$(sed -n 's/^#define SUBSTRAX_VERSION_STRING "\(.*\)"$/\1/p' "$PREFIX/include/substrax/version.h")" ] ||
  die "pkg-config's version differs from the headers'"
log "installed the SDK $(pkg-config --modversion substrax) into $PREFIX"

# --- 2. build, as a user would: a copy of the examples outside any Bazel workspace ----------
SRC="$WORK/src"
cp -rL "$EXAMPLES" "$SRC"
chmod -R u+w "$SRC"
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  >"$WORK/cmake.log" 2>&1 || { cat "$WORK/cmake.log"; die "cmake configure failed"; }
cmake --build "$WORK/build" -j 2 >>"$WORK/cmake.log" 2>&1 ||
  { tail -50 "$WORK/cmake.log"; die "cmake build failed"; }
BUILD="$WORK/build"
for exe in guide_example fashion_mnist_cnn cnn_gradient_check; do
  [ -x "$BUILD/$exe" ] || die "cmake did not build $exe"
done
# shellcheck disable=SC2046
g++ -std=c++17 -O2 "$SRC/guide_example.cc" $(pkg-config --cflags --libs substrax) \
  -o "$WORK/guide_pkgconfig" || die "the pkg-config build of guide_example failed"
log "built the examples with CMake and with pkg-config"

# --- 3. gradient check and the guide example's equivalence -------------------------------
"$BUILD/cnn_gradient_check" >"$WORK/gradcheck.log" 2>&1 ||
  { cat "$WORK/gradcheck.log"; die "the CNN's gradient check failed"; }
timeout 120 "$WORK/guide_pkgconfig" --devices 1 --steps 20 --dump "$WORK/one.txt" \
  >"$WORK/guide1.log" 2>&1 || { cat "$WORK/guide1.log"; die "guide example on 1 device failed"; }
timeout 120 "$BUILD/guide_example" --devices 4 --steps 20 --dump "$WORK/four.txt" \
  >"$WORK/guide4.log" 2>&1 || { cat "$WORK/guide4.log"; die "guide example on 4 devices failed"; }
python3 - "$WORK/one.txt" "$WORK/four.txt" <<'EOF' || die "1 and 4 devices differ"
import sys
def load(path):
    params = {}
    for line in open(path):
        name, *values = line.split()
        params[name] = [float(v) for v in values]
    return params
one, four = load(sys.argv[1]), load(sys.argv[2])
assert one and one.keys() == four.keys(), (sorted(one), sorted(four))
worst = 0.0
for name in one:
    assert len(one[name]) == len(four[name]), name
    scale = max(max(abs(v) for v in one[name]), 1e-6)
    worst = max(worst, max(abs(a - b) for a, b in zip(one[name], four[name])) / scale)
print(f"sdk_test: guide example, 4 devices vs 1 after 20 steps: max relative difference {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
EOF

# --- 4. the CNN standalone on 2 devices ---------------------------------------------------
timeout 120 "$BUILD/fashion_mnist_cnn" --devices 2 --steps 40 >"$WORK/cnn_standalone.log" 2>&1 ||
  { cat "$WORK/cnn_standalone.log"; die "the CNN standalone on 2 devices failed"; }
grep -q "step 40" "$WORK/cnn_standalone.log" ||
  { cat "$WORK/cnn_standalone.log"; die "the standalone CNN printed no report of step 40"; }
log "the CNN ran standalone on 2 devices"

# --- 5. a program built against another major version --------------------------------------
mkdir -p "$WORK/v2/include"
cp -r "$PREFIX/include/substrax" "$WORK/v2/include/"
chmod -R u+w "$WORK/v2"
sed -i 's/^#define SUBSTRAX_VERSION_MAJOR .*/#define SUBSTRAX_VERSION_MAJOR 2/' \
  "$WORK/v2/include/substrax/version.h"
# shellcheck disable=SC2046
g++ -std=c++17 -O1 -I"$WORK/v2/include" "$SRC/guide_example.cc" \
  $(pkg-config --libs substrax) $(pkg-config --cflags absl_status) -o "$WORK/guide_v2" ||
  die "building against the version-2 headers failed"
if "$WORK/guide_v2" --steps 1 >"$WORK/v2.log" 2>&1; then die "a version-2 program ran"; fi
grep -q "built against the substrax SDK 2.0 but runs with the SDK library 1" "$WORK/v2.log" ||
  { cat "$WORK/v2.log"; die "the version refusal does not name both versions"; }
log "Init refused a program built against SDK 2.0"

# --- 6. a local cluster that allows the programs directory ----------------------------------
PROGRAMS="$WORK/programs"
mkdir -p "$PROGRAMS"
cp "$BUILD/fashion_mnist_cnn" "$WORK/guide_v2" "$PROGRAMS/"
eval "$("$CTL" local up --workers 2 --cpu-devices 2 --state-dir "$STATE" \
  --programs-dir "$PROGRAMS" --coordinator-binary "$COORDINATOR_BIN" --agent-binary "$AGENT_BIN")"

spec() {  # name program "extra spec lines" args...
  local name="$1" program="$2" length="$3"
  shift 3
  local args=""
  for a in "$@"; do args="$args, \"$a\""; done
  cat >"$WORK/$name.yaml" <<EOF
apiVersion: substrax/v1
kind: TrainJob
metadata: {name: $name}
spec:
  program:
    path: $PROGRAMS/$program
    args: [${args#, }]
  mesh: {data_parallel_size: ${MESH:-4}}
  batch: {global_batch_size: 64}
$(printf '%b' "  $length")
  seed: 7
  metrics: {loss: mean, accuracy: mean}
  report_every_steps: 50
  backend: cpu
EOF
  echo "$WORK/$name.yaml"
}
wait_done() {  # job seconds -> prints the final state
  local job="$1" deadline=$((SECONDS + $2)) state
  while [ $SECONDS -lt $deadline ]; do
    state="$("$CTL" get "$job" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')"
    case "$state" in *SUCCEEDED|*FAILED|*CANCELLED) echo "$state"; return 0 ;; esac
    sleep 1
  done
  echo "TIMEOUT"
}

JOB=$("$CTL" submit "$(spec cnn fashion_mnist_cnn 'epochs: 1')")
log "submitted $JOB: the CNN, one epoch on 2 workers x 2 devices"
state=$(wait_done "$JOB" 200)
"$CTL" get "$JOB" -o json >"$WORK/cnn.json"
[[ "$state" == *SUCCEEDED ]] || { "$CTL" get "$JOB"; die "$JOB ended $state"; }
"$CTL" metrics "$JOB" >"$WORK/metrics.txt"
grep -q "loss" "$WORK/metrics.txt" && grep -q "accuracy" "$WORK/metrics.txt" ||
  { cat "$WORK/metrics.txt"; die "substraxctl metrics lacks loss or accuracy"; }
python3 - "$WORK/cnn.json" "$WORK/metrics.txt" <<'EOF' || die "the CNN's job did not reach its accuracy"
import json, re, sys
job = json.load(open(sys.argv[1]))
text = json.dumps(job)
found = re.search(r'"test_accuracy": *([0-9.eE+-]+)', text)
assert found, "no test_accuracy in the job's final metrics"
accuracy = float(found.group(1))
print(f"sdk_test: the CNN's test accuracy after one epoch on 4 devices: {accuracy:.4f}")
table = open(sys.argv[2]).read()
print("sdk_test: substraxctl metrics (declared reductions):\n" + "\n".join(table.splitlines()[:4]))
sys.exit(0 if accuracy >= 0.85 else 1)
EOF

# --- 7. failures name their cause; the workers keep serving ---------------------------------
JOB=$("$CTL" submit "$(spec v2 guide_v2 'steps: 5')")
state=$(wait_done "$JOB" 60)
"$CTL" get "$JOB" >"$WORK/v2-job.txt"
[[ "$state" == *FAILED ]] && grep -q "built against the substrax SDK 2.0" "$WORK/v2-job.txt" ||
  { cat "$WORK/v2-job.txt"; die "the version-2 program's job did not fail naming the versions"; }
log "the version-2 program's job FAILED naming the versions"

JOB=$("$CTL" submit "$(spec nodata fashion_mnist_cnn 'steps: 5' --data-dir "$WORK/no-such-dir")")
state=$(wait_done "$JOB" 60)
"$CTL" get "$JOB" >"$WORK/nodata-job.txt"
[[ "$state" == *FAILED ]] && grep -q "no-such-dir" "$WORK/nodata-job.txt" ||
  { cat "$WORK/nodata-job.txt"; die "a failing program's job did not fail naming the file"; }
log "a program failing after Init FAILED naming the missing file"

# --- 8. checkpoints: saved by the program, resumed on another mesh ---------------------------
CKPT="$STATE/checkpoints"   # the local cluster's checkpoint root
JOB=$("$CTL" submit "$(spec saved fashion_mnist_cnn \
  "steps: 60\n  checkpoint: {directory: $CKPT/cnn, every_steps: 30}")")
state=$(wait_done "$JOB" 90)
[[ "$state" == *SUCCEEDED ]] || { "$CTL" get "$JOB"; die "the checkpointing program job ended $state"; }
"$CTL" checkpoints "$JOB" >"$WORK/checkpoints.txt"
grep -q "step-000000000060" "$WORK/checkpoints.txt" && grep -q "step-000000000030" "$WORK/checkpoints.txt" ||
  { cat "$WORK/checkpoints.txt"; die "substraxctl checkpoints does not list steps 30 and 60"; }
log "a program job SUCCEEDED (the workers kept serving) and saved checkpoints at steps 30 and 60"
JOB=$("$CTL" submit "$(MESH=2 spec resumed fashion_mnist_cnn \
  "steps: 90\n  resume_from: $CKPT/cnn\n  checkpoint: {directory: $CKPT/cnn-resumed, every_steps: 30}")")
state=$(wait_done "$JOB" 90)
"$CTL" get "$JOB" >"$WORK/resumed.txt"
[[ "$state" == *SUCCEEDED ]] && grep -q "Resumed:.*60" "$WORK/resumed.txt" ||
  { cat "$WORK/resumed.txt"; die "the resumed program job did not go on from step 60"; }
log "a program job on 2 devices resumed from the 4-device job's step 60"

# --- 9. nothing left behind ------------------------------------------------------------------
"$CTL" local down --state-dir "$STATE" >/dev/null
deadline=$((SECONDS + 30))
while pgrep -f "$WORK" >/dev/null; do
  [ $SECONDS -lt $deadline ] || { pgrep -af "$WORK"; die "processes outlived the cluster"; }
  sleep 0.2
done
log "PASS"
