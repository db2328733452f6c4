#!/bin/bash
# The GPU check, for a lent GPU machine (one H100 or H200; CUDA 13, NCCL in PyTorch's wheels, a
# C++ runtime and Python with PyTorch there; none of our Debian libraries). Runs in a copy of the
# repository with gpu-bundle/ carried along; the whole script stays under 4 minutes, and a rerun
# of one step (--only) under 2.
#
# On the build machine (no GPU needed):
#   bazel build -c opt --config=cuda <the targets named at the top of tools/gpu_bundle.sh>
#   tools/gpu_bundle.sh                 # -> gpu-bundle/ (bin/, lib/, MANIFEST), under 48 MB
#   tests/gpu/run.sh --dry-run          # or GPU_CHECK_DRY_RUN=1: everything up to the first GPU call
# Then through the device tool:
#   run(command="tests/gpu/run.sh", carry=["gpu-bundle"], timeout_s=300)
#   run(command="tests/gpu/run.sh --only mlp", carry=["gpu-bundle"], timeout_s=180)
#
# Preflight (stops within seconds, with one line, when it fails): the driver must support CUDA
# 13.0 or later (nvidia-smi; CUDA 13 needs the 580 series); the bundle's MANIFEST (commit, date,
# nvcc and NCCL versions) is shown; every library of every bundled binary must resolve (ldd)
# under the bundle's LD_LIBRARY_PATH, and the cudart, cuBLAS and NCCL it resolves to are named.
# That LD_LIBRARY_PATH is given to our binaries only, never to Python (PyTorch keeps its own
# CUDA libraries). NCCL_DEBUG=WARN. Then, each step bounded by `timeout` and by what is left of
# the 4 minutes, a failing step never stopping the next (STEP names for --only in brackets):
#   1. [unit] the CUDA unit tests (cuda_model_test, cuda_prefetch_test, nccl_communicator_test):
#      none may skip, except the tests of the build without CUDA (*SaysHowTo*, *SayHowTo*,
#      WithoutCuda*) and optimizer rows of the core table that have no CUDA kernel
#      (tests/gpu/gtest_report.py);
#   2. [unit] NCCL with single-rank communicators (create, split, all-reduce on device memory,
#      grouped collectives on the caller's stream, abort on a dead peer, the watchdog's timeout
#      of a stalled collective, queued work not counted against it);
#   7. [steploop] the step loop's CUDA variant (step_loop_test's StepLoopCudaTest);
#   4. [equivalence] the same synthetic job trained on CPU and GPU from one seed: losses and
#      final parameters agree (tests/gpu/cpu_gpu_equivalence) at fp32, within wider bounds at
#      tf32 and bf16, and again with
#      --force-collectives (the fast step's gradient collectives over a 1-rank NCCL group);
#   5. [tp] tensor parallelism on one GPU (tests/gpu:tensor_parallel_test);
#   6. [mlp] our training step (bench/gpu_mlp: CUDA graphs on, 3 repeats of the small MLP, the
#      graph replays printed; once with its collectives forced over a 1-rank NCCL group; once
#      with graphs off; the wide MLP) against PyTorch eager and
#      PyTorch tuned (fused Adam, the whole step captured as a CUDA graph), same model, batch and
#      optimizer, FP32 without TF32: ratio_vs_torch_eager_small=, ratio_vs_torch_eager_wide=,
#      ratio_vs_torch_tuned_small=, ratio_vs_torch_tuned_wide= (ours / theirs, samples per
#      second; ours is the median of the repeats);
#   8. [command] a one-process PyTorch CUDA program (tests/gpu/torch_command_job.py) as a command
#      job on a local cluster started here from the bundle (`substraxctl local up --gpus`): the
#      agent must hand it its GPU (CUDA_VISIBLE_DEVICES) and the job must SUCCEED;
#   3. [sanitizer] compute-sanitizer memcheck and racecheck over the CUDA test binaries, each on
#      a fixed time slice, judged by the sanitizer's own summary ("ERROR SUMMARY: 0 errors"): a
#      run the slice cut short is INCONCLUSIVE, not a failure; a machine that refuses the
#      sanitizer gives SKIPPED with its message.
# A step the 4 minutes left no time for is NOTRUN (listed, not counted as a failure).
# Writes $OUT/gpu-check-summary.txt after every step (a run cut off still leaves it) and, at the
# end, $OUT/gpu-check-logs.tar.gz (every log); prints the summary last. Exit status 0 when no
# step failed.
#
# --dry-run (no GPU; run on the build machine): checks the bundle's size, resolves the libraries
# against this machine's CUDA toolkit and NCCL (and checks that nothing else comes from outside the
# bundle but glibc and the C++ runtime), and runs every step up to its first GPU call: the
# tests must skip saying there is no CUDA device, the programs must stop with "no CUDA device".
# --only STEP (unit, steploop, equivalence, tp, mlp, command, sanitizer): the preflight, then
# that step. GPU_CHECK_COMMAND_DEVICES=cpu runs step 8 on CPU devices (its self-test here).
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
dry=0
only=""
[[ ${GPU_CHECK_DRY_RUN:-0} == 1 ]] && dry=1
while (($#)); do
  case $1 in
    --dry-run) dry=1 ;;
    --only)
      only=${2:-}
      shift
      case $only in
        unit | steploop | equivalence | tp | mlp | command | sanitizer) ;;
        *) echo "run.sh: --only takes unit, steploop, equivalence, tp, mlp, command or sanitizer" >&2; exit 2 ;;
      esac ;;
    *) echo "run.sh: unknown argument $1 (--dry-run, --only STEP)" >&2; exit 2 ;;
  esac
  shift
done
# want STEP: whether this run does STEP.
want() { [[ -z $only || $only == "$1" ]]; }
export NCCL_DEBUG=WARN
# The Python that runs PyTorch (GPU_CHECK_PYTHON: another one, e.g. /usr/bin/python3 for
# Debian's torch in a dry run).
python=${GPU_CHECK_PYTHON:-python3}
bundle=${GPU_BUNDLE:-gpu-bundle}
bin=$repo/$bundle/bin
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
logs=$(mktemp -d /tmp/gpu-check-logs.XXXXXX)
export TEST_TMPDIR=$logs/tmp
mkdir -p "$TEST_TMPDIR"
summary=$out/gpu-check-summary.txt
budget=${GPU_CHECK_BUDGET_S:-225}  # seconds for everything; the limit is 240
# A rerun of one step (--only) gets under 2 minutes, so that it fits beside a machine's start.
[[ -n $only && -z ${GPU_CHECK_BUDGET_S:-} ]] && budget=110
limit_bytes=$((48 * 1000 * 1000))
SECONDS=0
failures=0
notrun=0
inconclusive=0
lines=()
gpu_line="no nvidia-smi"
metrics=""

say() { echo "$*" | tee -a "$logs/run.log"; }
# write_summary: the summary so far, at $summary (after every step: a run cut off keeps it).
write_summary() {
  {
    echo "GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ) mode=$([[ $dry == 1 ]] && echo dry-run || echo gpu)${only:+ only=$only} elapsed=${SECONDS}s"
    echo "machine: $(uname -n) $(uname -r); $gpu_line"
    printf '%s\n' "${lines[@]}"
    [[ -n $metrics ]] && printf '%s\n' "${metrics%$'\n'}"
    echo "result: $failures step(s) failed, $inconclusive inconclusive (cut by their time slice), $notrun not run for lack of time"
  } >"$summary"
}
# record STEP STATUS DETAIL: one line of the summary.
record() {
  local line
  line=$(printf '%-34s %-12s %s' "$1" "$2" "$3")
  lines+=("$line")
  say "$line"
  [[ $2 == FAIL || $2 == TIMEOUT ]] && failures=$((failures + 1))
  [[ $2 == NOTRUN ]] && notrun=$((notrun + 1))
  [[ $2 == INCONCLUSIVE ]] && inconclusive=$((inconclusive + 1))
  write_summary
  return 0
}
# bounded SECS CMD...: CMD under `timeout`, at most SECS and never past the budget.
bounded() {
  local want=$1 left
  shift
  left=$((budget - SECONDS))
  ((left < want)) && want=$left
  if ((want < 3)); then
    echo "gpu-check: out of time (budget ${budget}s) before: $*"
    return 200  # not run: record it as NOTRUN, not as a failure of the code
  fi
  timeout -k 5 "$want" "$@"
}
finish() {
  write_summary
  cp "$summary" "$logs/"
  tar -C "$logs" -czf "$out/gpu-check-logs.tar.gz" . 2>/dev/null
  echo "=================== summary ($summary) ==================="
  cat "$summary"
  rm -rf "$logs"
  ((failures == 0))
  exit $?
}

if command -v nvidia-smi >/dev/null; then
  gpu_line=$(timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 2 | tr '\n' ' ')
fi
say "gpu: $gpu_line"

# --- preflight: the driver, the bundle and its libraries ---------------------------------------
if ((!dry)); then
  # "CUDA Version: 13.0" in nvidia-smi's header: the newest CUDA the driver supports.
  driver_cuda=$(timeout 10 nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1)
  if [[ -z $driver_cuda ]]; then
    record "preflight: driver" FAIL "nvidia-smi does not answer with a CUDA version: no usable NVIDIA driver"
    finish
  fi
  if ! awk -v v="$driver_cuda" 'BEGIN { split(v, p, "."); exit !(p[1] > 13 || (p[1] == 13 && p[2] >= 0)) }'; then
    record "preflight: driver" FAIL "the driver supports CUDA $driver_cuda; this build needs 13.0 or later (the 580 driver series)"
    finish
  fi
  record "preflight: driver" PASS "supports CUDA $driver_cuda (>= 13.0)"
fi
if [[ -f $bundle/MANIFEST ]]; then
  record "preflight: bundle manifest" PASS "$(tr '\n' ' ' <"$bundle/MANIFEST" | cut -c1-300)"
elif [[ -d $bin ]]; then
  record "preflight: bundle manifest" FAIL "$bundle/MANIFEST is missing: make the bundle with tools/gpu_bundle.sh"
fi

# --- the bundle and its libraries -------------------------------------------------------------
if [[ ! -d $bin ]]; then
  record "bundle" FAIL "$bundle/bin is missing: build, run tools/gpu_bundle.sh, carry gpu-bundle"
  finish
fi
size=$(du -sb "$bundle" | cut -f1)
if ((size > limit_bytes)); then
  record "bundle size" FAIL "$size bytes > $limit_bytes (48 MB)"
else
  record "bundle size" PASS "$size bytes <= $limit_bytes (48 MB)"
fi

libdirs=("$repo/$bundle/lib")
if ((dry)); then
  # This machine's CUDA toolkit, and NCCL wherever it is installed here.
  libdirs+=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
  nccl=$( (ldconfig -p | awk '/libnccl\.so\.2 / {print $NF}'; find /usr/local/cuda* /usr/lib -name 'libnccl.so.2' 2>/dev/null) | head -n 1)
  [[ -n $nccl ]] && libdirs+=("$(dirname "$(readlink -f "$nccl")")")
else
  # The GPU machine's CUDA, system libraries, and the libraries of PyTorch's nvidia-* wheels
  # (NCCL, cuBLAS, the CUDA runtime).
  libdirs+=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu)
  while read -r d; do libdirs+=("$d"); done < <(
    timeout 20 "$python" -c 'import nvidia, os; print("\n".join(os.path.realpath(p) for p in nvidia.__path__))' 2>/dev/null |
      while read -r root; do find "$root" -name 'lib*.so*' -printf '%h\n' 2>/dev/null; done | sort -u)
fi
# Our binaries' library path, never exported: Python and PyTorch keep their own.
ourlib=$(IFS=:; echo "${libdirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
say "LD_LIBRARY_PATH of our binaries: $ourlib"
# "${ourenv[@]}" CMD...: CMD with our binaries' library path (an env prefix: `timeout` runs it).
ourenv=(env "LD_LIBRARY_PATH=$ourlib")
missing=""
for b in "$bin"/*; do
  "${ourenv[@]}" timeout 10 ldd "$b" >"$logs/ldd.$(basename "$b").log" 2>&1
  m=$(grep -E 'not found' "$logs/ldd.$(basename "$b").log" | sed 's/^[[:space:]]*//' | sort -u | tr '\n' ';')
  [[ -n $m ]] && missing+="$(basename "$b"): $m "
done
if ((dry)); then
  # Here Debian's libraries are installed, so ldd finds them even when the bundle lacks them:
  # every library must come from the bundle, the CUDA/NCCL folders above, or be one the GPU
  # machine has (glibc, the C++ runtime), as tools/gpu_bundle.sh assumes.
  for b in "$bin"/*; do
    m=$(awk '/=> \// {print $3}' "$logs/ldd.$(basename "$b").log" |
      grep -v -e "^$repo/$bundle/lib/" -e '^/usr/local/cuda' |
      grep -Ev '/(libc|libm|libdl|libpthread|librt|libutil|libresolv|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
      tr '\n' ' ')
    [[ -n $m ]] && missing+="$(basename "$b"): not in the bundle, found here only: $m "
  done
fi
if [[ -n $missing ]]; then
  record "libraries (ldd)" FAIL "missing: $missing"
  finish
fi
record "libraries (ldd)" PASS "every library of $(ls "$bin" | wc -l) binaries resolves ($(cat "$logs"/ldd.*.log | awk '/=>/ {print $1}' | sort -u | wc -l) distinct)$( ((dry)) && echo ', each from the bundle, CUDA/NCCL or glibc/C++ runtime')"
resolved=$(cat "$logs"/ldd.*.log | awk '/(libcudart|libcublas|libcublasLt|libnccl)\.so/ && /=> \// {print $1 " -> " $3}' | sort -u | tr '\n' ' ')
record "preflight: CUDA libraries" PASS "${resolved:-none resolved}"

# run_gtest NAME STEP SECS [REQUIRED...]: runs a bundled test binary and judges its XML report.
run_gtest() {
  local name=$1 step=$2 secs=$3 rc verdict
  shift 3
  bounded "$secs" "${ourenv[@]}" "$bin/$name" --gtest_output="xml:$logs/$name.xml" >"$logs/$name.log" 2>&1
  rc=$?
  if ((dry)); then
    verdict=$(python3 tests/gpu/gtest_report.py "$logs/$name.xml" --mode dry)
  else
    verdict=$(python3 tests/gpu/gtest_report.py "$logs/$name.xml" --mode gpu --require "$@")
  fi
  local ok=$?
  if ((rc == 200)); then
    record "$step $name" NOTRUN "no time left in the ${budget}s budget"
  elif ((rc == 124 || rc == 137)); then
    record "$step $name" TIMEOUT "after ${secs}s or the budget; $verdict"
  elif ((rc != 0 || ok != 0)); then
    record "$step $name" FAIL "rc=$rc; $verdict"
  else
    record "$step $name" PASS "$verdict$( ((dry)) && echo '; dry run: stopped at the first GPU call')"
  fi
}

# run_program NAME STEP SECS ARGS...: a bundled program; in a dry run it must exit 2 saying why
# there is no GPU. Its output is in $logs/NAME.log.
run_program() {
  local name=$1 step=$2 secs=$3 log rc
  shift 3
  log=$logs/$name${label:+.$label}.log
  bounded "$secs" "${ourenv[@]}" "$bin/$name" "$@" >"$log" 2>&1
  rc=$?
  if ((rc == 200)); then
    record "$step $name${label:+ $label}" NOTRUN "no time left in the ${budget}s budget"
    return 1
  fi
  if ((dry)); then
    if ((rc == 2)) && grep -qE 'no CUDA device|--config=cuda' "$log"; then
      record "$step $name${label:+ $label}" PASS "dry run: stopped at the first GPU call: $(grep -E 'no CUDA device|--config=cuda' "$log" | head -n 1 | cut -c1-120)"
    else
      record "$step $name${label:+ $label}" FAIL "rc=$rc, expected 2 with 'no CUDA device': $(tail -n 1 "$log" | cut -c1-160)"
    fi
    return 1
  fi
  if ((rc == 124 || rc == 137)); then
    record "$step $name${label:+ $label}" TIMEOUT "after ${secs}s or the budget"
    return 1
  fi
  if ((rc != 0)); then
    record "$step $name${label:+ $label}" FAIL "rc=$rc: $(grep -E 'FAIL|rror' "$log" | head -n 2 | tr '\n' ' ' | cut -c1-200)"
    return 1
  fi
  return 0
}

if want unit; then
  say "== 1./2. CUDA unit tests; NCCL single-rank communicators"
  run_gtest cuda_model_test "1." 40
  run_gtest cuda_prefetch_test "1." 30
  run_gtest nccl_communicator_test "1./2." 40 \
    NcclCommunicatorTest.SingleRankHostCollectives \
    NcclCommunicatorTest.SingleRankDevicePointersAndSplit \
    NcclCommunicatorTest.SingleRankGroupsOrderedOnTheCallersStream \
    NcclCommunicatorTest.DeadPeerAbortsAndLaterCallsFailFast \
    NcclCommunicatorTest.TimeoutAbortsTheCommunicator \
    NcclCommunicatorTest.WorkBeforeTheCollectiveDoesNotCountAgainstItsTimeout
fi

if want steploop; then
  say "== 7. the step loop's CUDA variant"
  run_gtest step_loop_test "7." 40 StepLoopCudaTest.RunsOnGpuMemoryWithNccl
fi

if want equivalence; then
  say "== 4. the same synthetic job on CPU and GPU"
  label=""
  if run_program cpu_gpu_equivalence "4." 40; then
    record "4. cpu_gpu_equivalence" PASS "$(grep -E '^params|^worst' "$logs/cpu_gpu_equivalence.log" | tr '\n' ' ')"
  fi
  # The other precisions of the matrix products, against the CPU's fp32.
  for precision in tf32 bf16; do
    label=$precision
    if run_program cpu_gpu_equivalence "4." 40 --precision "$precision"; then
      record "4. cpu_gpu_equivalence $precision" PASS "$(grep -E '^params|^worst' "$logs/cpu_gpu_equivalence.$precision.log" | tr '\n' ' ')"
    fi
  done
  # The whole fast step, its collectives included (a 1-rank NCCL group over the data axis).
  label="forced"
  if run_program cpu_gpu_equivalence "4." 40 --force-collectives; then
    record "4. cpu_gpu_equivalence forced" PASS "$(grep -E '^params|^worst' "$logs/cpu_gpu_equivalence.forced.log" | tr '\n' ' ')"
  fi
  label=""
fi

if want tp; then
  say "== 5. tensor parallelism on one GPU (two shards, host-staged all-reduce)"
  run_gtest tensor_parallel_test "5." 30 TensorParallelOnOneGpuTest.TwoShardsMatchTheFullCpuModel
fi

# torch_run LABEL MODE STEPS HIDDEN: bench/torch_mlp.py (eager, or --tuned), without our library
# path; its samples per second in $torch_sps (empty when it did not run). Not in a subshell: its
# records must reach the summary.
torch_run() {
  local label=$1 mode=$2 steps=$3 hidden=$4 tlog rc
  torch_sps=""
  tlog=$logs/torch_mlp.$mode.$label.log
  if ! "$python" -c 'import torch' >/dev/null 2>&1; then
    record "6. torch $mode $label" SKIPPED "no PyTorch for $python on this machine"
    return
  fi
  PYTHONUNBUFFERED=1 bounded 60 "$python" bench/torch_mlp.py --steps "$steps" --hidden "$hidden" \
    $([[ $mode == tuned ]] && echo --tuned) >"$tlog" 2>&1
  rc=$?
  if ((rc == 200)); then
    record "6. torch $mode $label" NOTRUN "no time left in the ${budget}s budget"
  elif ((dry)); then
    if grep -q 'no CUDA device' "$tlog"; then
      record "6. torch $mode $label" PASS "dry run: stopped at the first GPU call"
    else
      record "6. torch $mode $label" FAIL "rc=$rc: $(tail -n 1 "$tlog")"
    fi
  elif ((rc != 0)); then
    record "6. torch $mode $label" FAIL "rc=$rc: $(tail -n 1 "$tlog" | cut -c1-160)"
  else
    torch_sps=$(sed -n 's/^samples_per_second=//p' "$tlog")
  fi
}

if want mlp; then
  say "== 6. our training step vs PyTorch eager and tuned (FP32, TF32 off)"
  for cfg in "small 2000 512,256 3" "wide 200 8192,8192 1"; do
    read -r size steps hidden repeats <<<"$cfg"
    runs=()
    for ((r = 1; r <= repeats; ++r)); do
      label="$size.$r"
      if run_program gpu_mlp "6." 30 --steps "$steps" --hidden "$hidden" --graphs on; then
        runs+=("$(sed -n 's/^samples_per_second=//p' "$logs/gpu_mlp.$label.log")")
        record "6. gpu_mlp $size run $r" PASS "$(grep -E '^samples_per_second|^graph_replays' "$logs/gpu_mlp.$label.log" | tr '\n' ' ')"
      fi
    done
    if [[ $size == small ]]; then
      # The real fast step with its collectives: a 1-rank NCCL group on the communicator's stream.
      label="$size.collectives"
      if run_program gpu_mlp "6." 30 --steps "$steps" --hidden "$hidden" --force-collectives on; then
        record "6. gpu_mlp $size with collectives" PASS "$(grep -E '^samples_per_second|^graph_replays|^collectives_per_step' "$logs/gpu_mlp.$label.log" | tr '\n' ' ')"
      fi
      label="$size.eager"
      if run_program gpu_mlp "6." 30 --steps "$steps" --hidden "$hidden" --graphs off; then
        record "6. gpu_mlp $size graphs off" PASS "$(grep -E '^samples_per_second|^graph_replays' "$logs/gpu_mlp.$label.log" | tr '\n' ' ')"
      fi
    fi
    label=""
    ours=""
    ((${#runs[@]})) && ours=$(printf '%s\n' "${runs[@]}" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
    for mode in eager tuned; do
      torch_run "$size" "$mode" "$steps" "$hidden"
      theirs=$torch_sps
      if [[ -n $ours && -n $theirs ]]; then
        ratio=$(python3 -c "print(f'{$ours / $theirs:.3f}')")
        metrics+="ratio_vs_torch_${mode}_$size=$ratio"$'\n'
        record "6. vs torch $mode $size" PASS "ratio_vs_torch_${mode}_$size=$ratio ours=$ours theirs=$theirs samples/s (hidden $hidden)"
      fi
    done
  done
  label=""
fi

if want command; then
  say "== 8. a PyTorch CUDA program as a command job on a local cluster"
  # GPU_CHECK_COMMAND_DEVICES=cpu: the same on CPU devices (the step's self-test without a GPU).
  command_devices=${GPU_CHECK_COMMAND_DEVICES:-gpu}
  cdir=$logs/command
  mkdir -p "$cdir"
  ctl=("${ourenv[@]}" "$bin/substraxctl")
  if [[ ! -x $bin/substraxctl || ! -x $bin/substrax-agent ]]; then
    record "8. command job" FAIL "the bundle has no substraxctl or agent: make it with tools/gpu_bundle.sh"
  else
    pyprefix=$("$python" -c 'import sys; print(sys.prefix)' 2>/dev/null)
    devflag=(--gpus)
    device=cuda
    if [[ $command_devices == cpu ]]; then
      devflag=(--cpu-devices 1)
      device=cpu
    fi
    (cd "$cdir" && bounded 60 "${ctl[@]}" local up --workers 1 "${devflag[@]}" \
      --python-env "check=$pyprefix" --start-timeout 45s) >"$cdir/up.log" 2>&1
    rc=$?
    daemon_logs=$(cat "$cdir"/.substrax-local/logs/* 2>/dev/null)
    if ((rc == 200)); then
      record "8. command job" NOTRUN "no time left in the ${budget}s budget"
    elif ((rc != 0)); then
      why=$(printf '%s\n%s\n' "$(cat "$cdir/up.log")" "$daemon_logs" | grep -m1 -E 'no usable CUDA GPU|no CUDA GPU|without --config=cuda|built without CUDA' | cut -c1-160)
      if ((dry)) && [[ -n $why ]]; then
        record "8. command job" PASS "dry run: stopped at the first GPU call: $why"
      else
        record "8. command job" FAIL "local up rc=$rc: $(tail -n 2 "$cdir/up.log" | tr '\n' ' ' | cut -c1-200)"
      fi
    else
      cat >"$cdir/job.yaml" <<EOF_JOB
apiVersion: substrax/v1
kind: TrainJob
metadata: {name: gpu-check-command}
spec:
  command:
    python_env: check
    argv: [python3, $repo/tests/gpu/torch_command_job.py, --device, $device]
  mesh: {data_parallel_size: 1}
  backend: $device
  max_duration_seconds: 90
EOF_JOB
      (cd "$cdir" && bounded 100 "${ctl[@]}" submit job.yaml --watch) >"$cdir/submit.log" 2>&1
      rc=$?
      job=$(head -n 1 "$cdir/submit.log" | tr -d '[:space:]')
      (cd "$cdir" && bounded 20 "${ctl[@]}" logs "$job") >"$cdir/job.log" 2>&1
      line=$(grep -m1 'torch_command_job: .* ok' "$cdir/job.log" | sed 's/.*torch_command_job: //')
      if ((rc == 200)); then
        record "8. command job" NOTRUN "no time left in the ${budget}s budget"
      elif ((rc == 0)) && [[ -n $line ]]; then
        record "8. command job" PASS "$job SUCCEEDED: $line"
      else
        record "8. command job" FAIL "rc=$rc: $(tail -n 3 "$cdir/submit.log" "$cdir/job.log" | tr '\n' ' ' | cut -c1-240)"
      fi
      (cd "$cdir" && bounded 30 "${ctl[@]}" local down) >"$cdir/down.log" 2>&1
    fi
  fi
fi

if want sanitizer; then
  say "== 3. compute-sanitizer memcheck and racecheck"
  slice=20  # seconds per tool and binary: judged by the sanitizer's summary, not the exit code
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
  if [[ -z $sanitizer ]]; then
    record "3. compute-sanitizer" SKIPPED "compute-sanitizer not found (PATH, /usr/local/cuda*/bin)"
  else
    for tool in memcheck racecheck; do
      for t in cuda_model_test cuda_prefetch_test tensor_parallel_test nccl_communicator_test; do
        log=$logs/sanitizer.$tool.$t.log
        bounded "$slice" "${ourenv[@]}" "$sanitizer" --tool "$tool" "$bin/$t" >"$log" 2>&1
        rc=$?
        summary_line=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1 | sed 's/^=* *//')
        errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9][0-9]*\) error.*/\1/p' "$log" | tail -n 1)
        if ((rc == 200)); then
          record "3. $tool $t" NOTRUN "no time left in the ${budget}s budget"
        elif grep -qE 'Device not supported|Unable to find injection|not supported on this platform|Error: .*(initialize|permission)' "$log"; then
          record "3. $tool $t" SKIPPED "refused here: $(grep -m1 -E 'not supported|Unable|Error' "$log" | cut -c1-120)"
        elif [[ -n $errors ]] && ((errors > 0)); then
          record "3. $tool $t" FAIL "$summary_line"
        elif [[ -n $errors ]]; then
          record "3. $tool $t" PASS "$summary_line$( ((dry)) && echo '; dry run: the tests skipped before any kernel')"
        elif ((rc == 124 || rc == 137)); then
          record "3. $tool $t" INCONCLUSIVE "its ${slice}s slice ended before the sanitizer's summary"
        elif ((dry)); then
          record "3. $tool $t" SKIPPED "dry run: no summary without a GPU (rc=$rc): $(tail -n 1 "$log" | cut -c1-120)"
        else
          record "3. $tool $t" FAIL "no summary, rc=$rc: $(tail -n 1 "$log" | cut -c1-120)"
        fi
      done
    done
  fi
fi
finish
