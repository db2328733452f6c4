#!/bin/bash
# GPU checks for a lent GPU machine (one H200; CUDA driver and Python with PyTorch there, none of
# our Debian libraries). Runs in a copy of the repository with gpu-bundle/ carried along.
#
# On the build machine (no GPU needed):
#   bazel build -c opt --config=cuda //worker/compute:cuda_model_test \
#     //worker/data:cuda_prefetch_test //worker/runtime:step_loop_test //bench:gpu_mlp \
#     //worker:substrax-worker
#   tools/gpu_bundle.sh            # -> gpu-bundle/bin (binaries), gpu-bundle/lib (their .so files)
# Then, through the device tool, carrying gpu-bundle:
#   run(command="tests/gpu/run.sh", carry=["gpu-bundle"], timeout_s=480)
#
# Steps (each bounded by `timeout`; the whole script stays under 8 minutes):
#   1. the GPU unit tests, which must not skip here: worker/compute:cuda_model_test (CudaModel
#      and CudaOptimizer vs the CPU reference), worker/data:cuda_prefetch_test, and the CUDA
#      variant of worker/runtime:step_loop_test (the one step loop on GPU memory with NCCL);
#   2. Fashion-MNIST MLP on one GPU to test_accuracy >= 0.87
#      (examples/fashion_mnist_mlp_gpu.yaml with the bundle's copy of the data);
#   3. our training step vs PyTorch on this GPU, same model/batch/optimizer:
#      ratio_vs_torch=<ours / theirs samples per second>;
#   4. time per step with and without prefetch (from step 3's binary).
# Results also go to $OUT/gpu-results.txt when $OUT is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
bundle=${GPU_BUNDLE:-gpu-bundle}
out=${OUT:-/tmp}
log="$out/gpu-results.txt"
: >"$log"
export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
say() { echo "$@" | tee -a "$log"; }

if [[ ! -d $bundle/bin ]]; then
  say "FAIL: $bundle/bin is missing; build and run tools/gpu_bundle.sh first, carry gpu-bundle"
  exit 1
fi
timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
  tee -a "$log"

say "== 1. GPU unit tests"
for t in cuda_model_test cuda_prefetch_test step_loop_test; do
  timeout 120 "$bundle/bin/$t" --gtest_brief=0 >"$out/$t.log" 2>&1
  rc=$?
  tail -n 30 "$out/$t.log" | tee -a "$log"
  if ((rc != 0)); then
    say "FAIL: $t rc=$rc"; status=1
  else
    say "PASS: $t"
  fi
  # Only the tests of the build without CUDA may skip on a GPU machine.
  if grep -E "^\[  SKIPPED \] [A-Za-z/]+\." "$out/$t.log" |
    grep -vE "FactoriesSayHowToBuild|WithoutCudaCreateSaysHowToBuild" | grep -q .; then
    say "FAIL: $t skipped GPU tests on a GPU machine (see above)"; status=1
  fi
done

say "== 2. Fashion-MNIST MLP on one GPU (test_accuracy >= 0.87)"
sed "s#/usr/share/datasets/fashion-mnist#$PWD/$bundle/data#" examples/fashion_mnist_mlp_gpu.yaml \
  >"$out/fashion_mnist_gpu.yaml"
timeout 240 "$bundle/bin/substrax-worker" train --devices cuda --job "$out/fashion_mnist_gpu.yaml" \
  >"$out/train_gpu.out" 2>"$out/train_gpu.err"
rc=$?
tail -n 8 "$out/train_gpu.err" | tee -a "$log"
tee -a "$log" <"$out/train_gpu.out"
accuracy=$(sed -n 's/^test_accuracy=//p' "$out/train_gpu.out")
if ((rc != 0)) || [[ -z $accuracy ]]; then
  say "FAIL: substrax-worker train --devices cuda rc=$rc"; status=1
elif python3 -c "import sys; sys.exit(0 if $accuracy >= 0.87 else 1)"; then
  say "PASS: test_accuracy=$accuracy >= 0.87"
else
  say "FAIL: test_accuracy=$accuracy < 0.87"; status=1
fi

say "== 3./4. training step vs PyTorch; time per step with and without prefetch"
timeout 120 "$bundle/bin/gpu_mlp" --steps 2000 >"$out/gpu_mlp.log" 2>&1
rc=$?
tee -a "$log" <"$out/gpu_mlp.log"
ours=$(sed -n 's/^samples_per_second=//p' "$out/gpu_mlp.log")
((rc == 0)) || { say "FAIL: gpu_mlp rc=$rc"; status=1; }
timeout 180 python3 bench/torch_mlp.py --steps 2000 >"$out/torch_mlp.log" 2>&1
rc=$?
tee -a "$log" <"$out/torch_mlp.log"
theirs=$(sed -n 's/^samples_per_second=//p' "$out/torch_mlp.log")
((rc == 0)) || { say "FAIL: torch_mlp.py rc=$rc"; status=1; }
if [[ -n $ours && -n $theirs ]]; then
  say "ratio_vs_torch=$(python3 -c "print(f'{$ours / $theirs:.3f}')")"
fi
say "exit status $status"
exit $status
