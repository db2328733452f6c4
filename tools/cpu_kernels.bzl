"""Compiler flags of the CPU kernels: the Eigen models, the optimizer loops, the shared-memory
reductions. docs/performance.md says why these and not others.

  -O3 -mavx2 -mfma -mf16c   x86-64-v3: 8-wide float vectors and fused multiply-add in Eigen's
                            GEMM kernels; -O3 lets GCC vectorize loops whose trip count is only
                            known at run time (the optimizers' element loops).
  -ffp-contract=off         no fused multiply-add the source did not ask for: GCC would fuse
                            a*b+c in scalar code but not in the vectorized body of the same loop,
                            so results would depend on where a buffer starts (the peeled
                            iterations). Eigen's explicit FMA in its GEMM kernel stays.
  -fno-math-errno           sqrt never sets errno (its arguments here are >= 0), so loops that
                            take square roots (Adam) vectorize.

Only these libraries are built so; every program that reaches them checks the host first
(//worker/compute:cpu_features), so a CPU without AVX2 and FMA gets a clear error, never an
illegal instruction.
"""

CPU_KERNEL_COPTS = [
    "-O3",
    "-mavx2",
    "-mfma",
    "-mf16c",
    "-ffp-contract=off",
    "-fno-math-errno",
]
