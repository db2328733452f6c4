#!/usr/bin/env bash
# Training throughput on CPU devices, substrax against PyTorch DDP, one run each, same job:
# Fashion-MNIST MLP 784-512-256-10, Adam 1e-3, global batch 128, STEPS steps (default 300),
# on 1, 2 and 4 devices.
#  - substrax: `substrax-job train --local-devices N` (built -c opt); samples/s is the median of
#    its reports after the first (the first holds the start-up);
#  - PyTorch: bench/torch_ddp_mlp.py with Debian's python3-torch run by /usr/bin/python3 (the
#    python3 first on PATH may be another interpreter without torch), N processes over gloo, one
#    thread each, with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset for that command only (they are
#    set in this environment for old OpenBLAS builds and would pin Debian's to a slow kernel).
#  - substrax again with --cpu-collectives=gloo (every device through Gloo over TCP, as before
#    the shared-memory collectives): what those are worth, in the same run.
#  - substrax again with spec.gradients.shard_update (the optimizer update sharded between the
#    devices of the process): sharded_vs_unsharded_2dev= says what it is worth at 2 devices.
#  - substrax again with its collective counters and phases off (run without --activity-file;
#    every other substrax run publishes them, as a job's processes do for hang attribution,
#    docs/diagnosis.md): counters_on_vs_off_<N>dev= says what they cost, in alternating runs
#    (ROUNDS=3 or more for a median).
#  - two 1-device substrax runs at once, pinned to CPU 0 and CPU 1 (taskset): what two cores give
#    when nothing is shared between them, in the same minutes. On a VM whose neighbours slow one
#    vCPU at times, a 1-device run moves to the faster vCPU while 2 devices wait for the slower
#    one; this column shows it (2 devices against the pair's sum: scaling_2dev_vs_pair=).
# Each run must have trained (final loss < 1.0, from about 2.3) or the script fails.
# ROUNDS rounds (default 1), each running every configuration once, in turn; every figure is the
# median over the rounds. Prints a table, then the ratios last: scaling_2dev= (ours at 2 devices /
# ours at 1), sharded_vs_unsharded_2dev=, scaling_2dev_vs_pair=, ratio_vs_torch_1dev=, ratio_vs_torch_2dev=,
# ratio_vs_torch_4dev=, counters_on_vs_off_{1,2,4}dev=. Measures; asserts nothing.
#
#   bench/train_throughput.sh            # ROUNDS=3 STEPS=600 bench/train_throughput.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-300}"
ROUNDS="${ROUNDS:-1}"
[ "$STEPS" -ge 150 ] || { echo "train_throughput: STEPS must be >= 150" >&2; exit 2; }
[ "$ROUNDS" -ge 1 ] || { echo "train_throughput: ROUNDS must be >= 1" >&2; exit 2; }

SUBSTRAX_SKIP_K8S_TEST_TOOLS=1 tools/install_deps.sh
if ! /usr/bin/python3 -c "import torch" 2>/dev/null || ! dpkg -s libopenblas0-pthread >/dev/null 2>&1; then
  echo "train_throughput: installing Debian's python3-torch and OpenBLAS (the comparison peer)..." >&2
  SUDO=(); [ "$(id -u)" -eq 0 ] || SUDO=(sudo)
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends python3-torch libopenblas0-pthread >/dev/null
fi
bazel build -c opt --noshow_progress //worker:substrax-job //bench:cross_cpu >&2
WORKER="$(bazel info -c opt bazel-bin 2>/dev/null)/worker/substrax-job"
CROSS_CPU="$(bazel info -c opt bazel-bin 2>/dev/null)/bench/cross_cpu"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/train-throughput.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
DATA=/usr/share/datasets/fashion-mnist
cat >"$WORK/job.yaml" <<YAML
apiVersion: substrax/v1
kind: TrainJob
metadata: {name: throughput}
spec:
  model: {type: mlp, hidden_sizes: [512, 256], num_classes: 10}
  data:
    format: idx
    train: {images: $DATA/train-images-idx3-ubyte.gz, labels: $DATA/train-labels-idx1-ubyte.gz}
  optimizer: {type: adam, learning_rate: 0.001}
  mesh: {data_parallel_size: 1}
  batch: {global_batch_size: 128}
  steps: $STEPS
  seed: 0
  report_every_steps: 25
YAML

# Each run must have trained: its final loss below 1.0 (it starts near ln(10) = 2.3).
check_trained() {  # what loss
  awk -v l="$2" 'BEGIN {exit !(l != "" && l < 1.0)}' ||
    { echo "train_throughput: $1 did not train (final loss '$2')" >&2; exit 1; }
}
median() { sort -n | awk '{v[NR]=$1} END {if (NR == 0) exit 1; print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
ours() {  # devices collectives [log name] [a line for the job's spec] -> samples/s
  local log="$WORK/${3:-ours-$1-$2}.log" job="$WORK/job-${3:-ours-$1-$2}.yaml"
  sed "s/data_parallel_size: 1/data_parallel_size: $1/" "$WORK/job.yaml" >"$job"
  [ -z "${4:-}" ] || echo "  $4" >>"$job"
  # The activity file (collective counts, phases) as a job's processes publish it; NO_COUNTERS=1
  # runs without it.
  local activity=(--activity-file "$WORK/${3:-ours-$1-$2}.activity")
  [ -z "${NO_COUNTERS:-}" ] || activity=()
  "$WORKER" train --job "$job" --local-devices "$1" --cpu-collectives "$2" "${activity[@]}" \
    >"$log" 2>&1
  check_trained "substrax on $1 device(s) ($2)" "$(sed -n 's/^train_loss=//p' "$log")"
  sed -n 's/.*samples\/s=\([0-9.]*\).*/\1/p' "$log" | tail -n +2 | median
}
pair() {  # -> the sum of two 1-device runs at once, one pinned to CPU 0 and one to CPU 1
  taskset -c 0 bash -c "set -euo pipefail; $(declare -f ours check_trained median); WORKER='$WORKER' WORK='$WORK'; \
    ours 1 auto pair-0" >"$WORK/pair-0" &
  local first=$!
  taskset -c 1 bash -c "set -euo pipefail; $(declare -f ours check_trained median); WORKER='$WORKER' WORK='$WORK'; \
    ours 1 auto pair-1" >"$WORK/pair-1"
  wait "$first"
  awk '{s += $1} END {print s}' "$WORK/pair-0" "$WORK/pair-1"
}
CPUS=$(nproc)
torch_ddp() {  # processes -> samples/s
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=1 \
    /usr/bin/python3 bench/torch_ddp_mlp.py --procs "$1" --steps "$STEPS" --port $((29500 + $1)) \
    >"$WORK/torch-$1.log"
  check_trained "PyTorch on $1 process(es)" "$(sed -n 's/^final_loss=//p' "$WORK/torch-$1.log")"
  sed -n 's/^samples_per_second=//p' "$WORK/torch-$1.log"
}

declare -A OURS GLOO TORCH SHARDED NOCOUNT
PAIR=""
ROUND_TRIPS=""  # the cache-line round trip between CPU 0 and 1 before each round's 2 devices
for round in $(seq "$ROUNDS"); do
  echo "train_throughput: round $round of $ROUNDS..." >&2
  for n in 1 2 4; do
    [ "$n" -ne 2 ] || ROUND_TRIPS+="$("$CROSS_CPU") "
    # With and without the counters back to back, the order swapped every round.
    if [ $((round % 2)) -eq 0 ]; then NOCOUNT[$n]+="$(NO_COUNTERS=1 ours "$n" auto "no-counters-$n") "; fi
    OURS[$n]+="$(ours "$n" auto) "
    if [ $((round % 2)) -eq 1 ]; then NOCOUNT[$n]+="$(NO_COUNTERS=1 ours "$n" auto "no-counters-$n") "; fi
    [ "$n" -eq 1 ] || GLOO[$n]+="$(ours "$n" gloo) "
    [ "$n" -eq 1 ] || SHARDED[$n]+="$(ours "$n" auto "sharded-$n" "gradients: {shard_update: true}") "
    TORCH[$n]+="$(torch_ddp "$n") "
    [ "$n" -ne 2 ] || [ "$CPUS" -lt 2 ] || PAIR+="$(pair) "
  done
done
PAIR=$(tr ' ' '\n' <<<"$PAIR" | grep . | median || true)
PER_ROUND_1DEV="${OURS[1]}"
PER_ROUND_2DEV="${OURS[2]}"
PER_ROUND_2DEV_SHARDED="${SHARDED[2]}"
declare -A PER_ROUND_ON PER_ROUND_OFF
for n in 1 2 4; do PER_ROUND_ON[$n]="${OURS[$n]}"; PER_ROUND_OFF[$n]="${NOCOUNT[$n]}"; done
for n in 1 2 4; do
  OURS[$n]=$(tr ' ' '\n' <<<"${OURS[$n]}" | grep . | median)
  TORCH[$n]=$(tr ' ' '\n' <<<"${TORCH[$n]}" | grep . | median)
  NOCOUNT[$n]=$(tr ' ' '\n' <<<"${NOCOUNT[$n]}" | grep . | median)
  if [ "$n" -eq 1 ]; then
    GLOO[$n]=${OURS[$n]}
    SHARDED[$n]=${OURS[$n]}
  else
    GLOO[$n]=$(tr ' ' '\n' <<<"${GLOO[$n]}" | grep . | median)
    SHARDED[$n]=$(tr ' ' '\n' <<<"${SHARDED[$n]}" | grep . | median)
  fi
done

echo "machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "job: MLP 784-512-256-10, adam 1e-3, global batch 128, $STEPS steps; medians of $ROUNDS round(s)"
printf '%-8s %18s %18s %18s %18s %10s\n' devices substrax_samples/s substrax_gloo substrax_sharded \
  torch_samples/s ratio
for n in 1 2 4; do
  printf '%-8s %18.0f %18.0f %18.0f %18.0f %10.2f\n' "$n" "${OURS[$n]}" "${GLOO[$n]}" \
    "${SHARDED[$n]}" "${TORCH[$n]}" \
    "$(awk -v a="${OURS[$n]}" -v b="${TORCH[$n]}" 'BEGIN {print a / b}')"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
# Each round's 1- and 2-device figures beside where the VM's two vCPUs sat just before: two
# devices meet at every step, so a farther pair (a longer round trip) slows them.
paste -d' ' <(tr ' ' '\n' <<<"$PER_ROUND_1DEV" | grep .) <(tr ' ' '\n' <<<"$PER_ROUND_2DEV" | grep .) \
  <(tr ' ' '\n' <<<"$PER_ROUND_2DEV_SHARDED" | grep .) <(tr ' ' '\n' <<<"$ROUND_TRIPS" | grep .) |
  awk '{printf "round %d: 1 device %.0f, 2 devices %.0f samples/s (scaling %.2f), sharded update %.0f; cache line CPU 0 -> 1 -> 0 before it: %s ns\n", NR, $1, $2, $2 / $1, $3, $4}'
if [ -n "$PAIR" ]; then
  printf 'two 1-device runs at once, pinned to CPU 0 and 1: %.0f samples/s together\n' "$PAIR"
fi
echo "scaling_2dev=$(ratio "${OURS[2]}" "${OURS[1]}")"
echo "sharded_vs_unsharded_2dev=$(ratio "${SHARDED[2]}" "${OURS[2]}")"
[ -z "$PAIR" ] || echo "scaling_2dev_vs_pair=$(ratio "${OURS[2]}" "$PAIR")"
echo "ratio_vs_torch_1dev=$(ratio "${OURS[1]}" "${TORCH[1]}")"
echo "ratio_vs_torch_2dev=$(ratio "${OURS[2]}" "${TORCH[2]}")"
echo "ratio_vs_torch_4dev=$(ratio "${OURS[4]}" "${TORCH[4]}")"
for n in 1 2 4; do
  echo "counters on/off at $n device(s), round by round: $(paste -d/ <(tr ' ' '\n' <<<"${PER_ROUND_ON[$n]}" | grep .) <(tr ' ' '\n' <<<"${PER_ROUND_OFF[$n]}" | grep .) | tr '\n' ' ')"
done
for n in 1 2 4; do
  echo "counters_on_vs_off_${n}dev=$(ratio "${OURS[$n]}" "${NOCOUNT[$n]}")"
done
