#!/bin/bash
# The GPU check, for a lent GPU machine (one H200; CUDA 13, NCCL in PyTorch's wheels, a C++
# runtime and Python with PyTorch there; none of our Debian libraries). Runs in a copy of the
# repository with gpu-bundle/ carried along; the whole script stays under 4 minutes.
#
# On the build machine (no GPU needed):
#   bazel build -c opt --config=cuda <the targets named at the top of tools/gpu_bundle.sh>
#   tools/gpu_bundle.sh                 # -> gpu-bundle/ (bin/, lib/), under 40 MB
#   tests/gpu/run.sh --dry-run          # or GPU_CHECK_DRY_RUN=1: everything up to the first GPU call
# Then through the device tool:
#   run(command="tests/gpu/run.sh", carry=["gpu-bundle"], timeout_s=300)
#
# First every library of every bundled binary must resolve (ldd) under the LD_LIBRARY_PATH set
# here; if one does not, the script stops within seconds and names it. Then, each step bounded by
# `timeout` and by what is left of the 4 minutes, a failing step never stopping the next:
#   1. the CUDA unit tests (cuda_model_test, cuda_prefetch_test, nccl_communicator_test): none may
#      skip, except the tests of the build without CUDA (*SaysHowTo*, *SayHowTo*, WithoutCuda*)
#      and optimizer rows of the core table that have no CUDA kernel (tests/gpu/gtest_report.py);
#   2. NCCL with single-rank communicators (create, split, all-reduce on device memory, abort on a
#      dead peer, the watchdog's timeout): nccl_communicator_test's tests must have passed;
#   7. the step loop's CUDA variant (step_loop_test's StepLoopCudaTest must not skip);
#   4. the same synthetic job trained on CPU and GPU from one seed: losses and final parameters
#      agree (tests/gpu/cpu_gpu_equivalence; its tolerances are stated in its source);
#   5. tensor parallelism on one GPU: two shards of the MLP on two streams with a host-staged
#      all-reduce vs the full CPU model (tests/gpu:tensor_parallel_test);
#   6. our training step vs PyTorch, same model, batch and optimizer, FP32 without TF32, for the
#      example MLP and a wide one: ratio_vs_torch_small=, ratio_vs_torch_wide= (ours / theirs,
#      samples per second; bench/gpu_mlp and bench/torch_mlp.py);
#   3. compute-sanitizer memcheck and racecheck over the CUDA test binaries (last: the slowest;
#      SKIPPED with the reason where it is missing or the sandbox refuses it).
# A step the 4 minutes left no time for is NOTRUN (listed, not counted as a failure).
# Writes $OUT/gpu-check-summary.txt and $OUT/gpu-check-logs.tar.gz (every log); prints the
# summary last. Exit status 0 when no step failed.
#
# --dry-run (no GPU; run on the build machine): checks the bundle's size, resolves the libraries
# against this machine's CUDA toolkit and NCCL (and checks that nothing else comes from outside the
# bundle but glibc and the C++ runtime), and runs every step up to its first GPU call: the
# tests must skip saying there is no CUDA device, the programs must stop with "no CUDA device".
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
dry=0
[[ ${1:-} == --dry-run || ${GPU_CHECK_DRY_RUN:-0} == 1 ]] && dry=1
bundle=${GPU_BUNDLE:-gpu-bundle}
bin=$repo/$bundle/bin
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
logs=$(mktemp -d /tmp/gpu-check-logs.XXXXXX)
export TEST_TMPDIR=$logs/tmp
mkdir -p "$TEST_TMPDIR"
summary=$out/gpu-check-summary.txt
budget=${GPU_CHECK_BUDGET_S:-225}  # seconds for everything; the limit is 240
limit_bytes=$((40 * 1000 * 1000))
SECONDS=0
failures=0
notrun=0
lines=()

say() { echo "$*" | tee -a "$logs/run.log"; }
# record STEP STATUS DETAIL: one line of the summary.
record() {
  local line
  line=$(printf '%-34s %-8s %s' "$1" "$2" "$3")
  lines+=("$line")
  say "$line"
  [[ $2 == FAIL || $2 == TIMEOUT ]] && failures=$((failures + 1))
  [[ $2 == NOTRUN ]] && notrun=$((notrun + 1))
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
  {
    echo "GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ) mode=$([[ $dry == 1 ]] && echo dry-run || echo gpu) elapsed=${SECONDS}s"
    echo "machine: $(uname -n) $(uname -r); $gpu_line"
    printf '%s\n' "${lines[@]}"
    [[ -n ${metrics:-} ]] && printf '%s\n' "$metrics"
    echo "result: $failures step(s) failed, $notrun not run for lack of time"
  } >"$summary"
  cp "$summary" "$logs/"
  tar -C "$logs" -czf "$out/gpu-check-logs.tar.gz" . 2>/dev/null
  echo "=================== summary ($summary) ==================="
  cat "$summary"
  rm -rf "$logs"
  ((failures == 0))
  exit $?
}

gpu_line="no nvidia-smi"
if command -v nvidia-smi >/dev/null; then
  gpu_line=$(timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 2 | tr '\n' ' ')
fi
say "gpu: $gpu_line"

# --- the bundle and its libraries -------------------------------------------------------------
if [[ ! -d $bin ]]; then
  record "bundle" FAIL "$bundle/bin is missing: build, run tools/gpu_bundle.sh, carry gpu-bundle"
  finish
fi
size=$(du -sb "$bundle" | cut -f1)
if ((size > limit_bytes)); then
  record "bundle size" FAIL "$size bytes > $limit_bytes (40 MB)"
else
  record "bundle size" PASS "$size bytes <= $limit_bytes (40 MB)"
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
    timeout 20 python3 -c 'import nvidia, os; print("\n".join(os.path.realpath(p) for p in nvidia.__path__))' 2>/dev/null |
      while read -r root; do find "$root" -name 'lib*.so*' -printf '%h\n' 2>/dev/null; done | sort -u)
fi
LD_LIBRARY_PATH=$(IFS=:; echo "${libdirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
missing=""
for b in "$bin"/*; do
  timeout 10 ldd "$b" >"$logs/ldd.$(basename "$b").log" 2>&1
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

# run_gtest NAME STEP SECS [REQUIRED...]: runs a bundled test binary and judges its XML report.
run_gtest() {
  local name=$1 step=$2 secs=$3 rc verdict
  shift 3
  bounded "$secs" "$bin/$name" --gtest_output="xml:$logs/$name.xml" >"$logs/$name.log" 2>&1
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
  bounded "$secs" "$bin/$name" "$@" >"$log" 2>&1
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

say "== 1./2. CUDA unit tests; NCCL single-rank communicators"
run_gtest cuda_model_test "1." 40
run_gtest cuda_prefetch_test "1." 30
run_gtest nccl_communicator_test "1./2." 40 \
  NcclCommunicatorTest.SingleRankHostCollectives \
  NcclCommunicatorTest.SingleRankDevicePointersAndSplit \
  NcclCommunicatorTest.DeadPeerAbortsAndLaterCallsFailFast \
  NcclCommunicatorTest.TimeoutAbortsTheCommunicator

say "== 7. the step loop's CUDA variant"
run_gtest step_loop_test "7." 40 StepLoopCudaTest.RunsOnGpuMemoryWithNccl

say "== 4. the same synthetic job on CPU and GPU"
label=""
if run_program cpu_gpu_equivalence "4." 40; then
  record "4. cpu_gpu_equivalence" PASS "$(grep -E '^params|^worst' "$logs/cpu_gpu_equivalence.log" | tr '\n' ' ')"
fi

say "== 5. tensor parallelism on one GPU (two shards, host-staged all-reduce)"
run_gtest tensor_parallel_test "5." 30 TensorParallelOnOneGpuTest.TwoShardsMatchTheFullCpuModel

say "== 6. our training step vs PyTorch (FP32, TF32 off)"
metrics=""
for cfg in "small 2000 512,256" "wide 200 8192,8192"; do
  read -r label steps hidden <<<"$cfg"
  ours=""
  theirs=""
  if run_program gpu_mlp "6." 30 --steps "$steps" --hidden "$hidden"; then
    ours=$(sed -n 's/^samples_per_second=//p' "$logs/gpu_mlp.$label.log")
  fi
  tlog=$logs/torch_mlp.$label.log
  if ! python3 -c 'import torch' >/dev/null 2>&1; then
    record "6. torch_mlp.py $label" SKIPPED "no PyTorch for python3 on this machine"
  else
    PYTHONUNBUFFERED=1 bounded 60 python3 bench/torch_mlp.py --steps "$steps" --hidden "$hidden" >"$tlog" 2>&1
    rc=$?
    if ((rc == 200)); then
      record "6. torch_mlp.py $label" NOTRUN "no time left in the ${budget}s budget"
    elif ((dry)); then
      if grep -q 'no CUDA device' "$tlog"; then
        record "6. torch_mlp.py $label" PASS "dry run: stopped at the first GPU call"
      else
        record "6. torch_mlp.py $label" FAIL "rc=$rc: $(tail -n 1 "$tlog")"
      fi
    elif ((rc != 0)); then
      record "6. torch_mlp.py $label" FAIL "rc=$rc: $(tail -n 1 "$tlog" | cut -c1-160)"
    else
      theirs=$(sed -n 's/^samples_per_second=//p' "$tlog")
    fi
  fi
  if [[ -n $ours && -n $theirs ]]; then
    ratio=$(python3 -c "print(f'{$ours / $theirs:.3f}')")
    metrics+="ratio_vs_torch_$label=$ratio"$'\n'
    record "6. vs torch $label (hidden $hidden)" PASS "ratio_vs_torch_$label=$ratio ours=$ours theirs=$theirs samples/s"
  fi
done
label=""
metrics=${metrics%$'\n'}

say "== 3. compute-sanitizer memcheck and racecheck"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
if [[ -z $sanitizer ]]; then
  record "3. compute-sanitizer" SKIPPED "compute-sanitizer not found (PATH, /usr/local/cuda*/bin)"
else
  for tool in memcheck racecheck; do
    for t in cuda_model_test cuda_prefetch_test tensor_parallel_test nccl_communicator_test; do
      log=$logs/sanitizer.$tool.$t.log
      bounded 25 "$sanitizer" --tool "$tool" --error-exitcode 99 "$bin/$t" >"$log" 2>&1
      rc=$?
      summary_line=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1)
      if ((rc == 200)); then
        record "3. $tool $t" NOTRUN "no time left in the ${budget}s budget"
      elif grep -qE 'Device not supported|Unable to find injection|not supported on this platform|Error: .*(initialize|permission)' "$log"; then
        record "3. $tool $t" SKIPPED "refused here: $(grep -m1 -E 'not supported|Unable|Error' "$log" | cut -c1-120)"
      elif ((dry)); then
        # No GPU: the tests skip before any kernel, so there is nothing to check.
        if ((rc == 0)); then
          record "3. $tool $t" PASS "dry run: ran; the tests skipped before any kernel ($summary_line)"
        else
          record "3. $tool $t" SKIPPED "dry run: rc=$rc without a GPU: $(tail -n 1 "$log" | cut -c1-120)"
        fi
      elif ((rc == 124 || rc == 137)); then
        record "3. $tool $t" TIMEOUT "after 25s or the budget ($summary_line)"
      elif ((rc != 0)); then
        record "3. $tool $t" FAIL "rc=$rc ${summary_line:-$(tail -n 1 "$log" | cut -c1-120)}"
      else
        record "3. $tool $t" PASS "$summary_line"
      fi
    done
  done
fi
finish
