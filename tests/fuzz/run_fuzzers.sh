#!/usr/bin/env bash
# make fuzz: builds the libFuzzer targets of tests/fuzz with clang (bazel build --config=fuzz)
# and runs each for FUZZ_SECONDS seconds (default 60) from its corpus, tests/fuzz/corpus/<name>/.
# Exits non-zero when any target crashes (or hangs for over 25 s on one input); the inputs
# that did are left in tests/fuzz/crashes/<name>/ (git-ignored): fix the bug, then copy each into
# corpus/<name>/, where //tests/fuzz:<name>_corpus_test replays it in every test run.
# Inputs a run finds that grow coverage go to a scratch directory: the corpora in git stay small.
# Arguments: the targets to run (default: all).
set -uo pipefail
cd "$(dirname "$0")/../.."

seconds=${FUZZ_SECONDS:-60}
targets=(job_spec_fuzzer mesh_fuzzer idx_fuzzer csv_fuzzer cluster_fuzzer safetensors_fuzzer)
if [ $# -gt 0 ]; then targets=("$@"); fi

labels=()
for t in "${targets[@]}"; do labels+=("//tests/fuzz:$t"); done
bazel build --config=fuzz "${labels[@]}" || exit 1
bin=$(bazel info --config=fuzz bazel-bin 2>/dev/null) || exit 1

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
for t in "${targets[@]}"; do
  echo "== $t: ${seconds}s"
  mkdir -p "$scratch/$t" "tests/fuzz/crashes/$t"
  # The first directory takes new inputs; the committed corpus is only read.
  if "$bin/tests/fuzz/$t" -max_total_time="$seconds" -timeout=25 -print_final_stats=1 \
      -artifact_prefix="tests/fuzz/crashes/$t/" "$scratch/$t" "tests/fuzz/corpus/$t" \
      >"$scratch/$t.log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^Done [0-9]+ runs' "$scratch/$t.log" || true
  else
    tail -60 "$scratch/$t.log"
    echo "$t FAILED: the input is in tests/fuzz/crashes/$t/"
    failed+=("$t")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing found crashes in: ${failed[*]}"
  exit 1
fi
echo "fuzzing: ${#targets[@]} targets ran ${seconds}s each without a crash"
