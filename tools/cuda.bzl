"""CUDA in the Bazel build: a config switch and nvcc-compiled libraries.

`--config=cuda` (see .bazelrc) turns on `//tools:cuda_enabled`. Targets choose their CUDA or CPU
sources with `if_cuda(a, b)`. `cuda_library` compiles .cu files with the toolkit's nvcc into
objects that a cc_library links; keep .cu files free of heavy includes (plain C++ interfaces
to kernels), so nvcc needs only the workspace root and the CUDA headers.
"""

# Compute capability 9.0 (H100/H200), plus PTX for later GPUs to JIT from.
_NVCC_ARCH = "-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90"

def if_cuda(if_true, if_false = []):
    return select({
        "//tools:cuda_enabled": if_true,
        "//conditions:default": if_false,
    })

def cuda_library(name, srcs, hdrs = [], deps = [], visibility = None):
    objs = []
    for src in srcs:
        obj = src.replace(".cu", "") + ".cu.o"
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs + ["@cuda//:headers"],
            outs = [obj],
            cmd = ("$(execpath @cuda//:nvcc) -c -std=c++17 -O3 " + _NVCC_ARCH +
                   " -Xcompiler -fPIC -I. -I$(GENDIR) -Iexternal/cuda/include" +
                   " -o $@ $(location " + src + ")"),
            tools = ["@cuda//:nvcc"],
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        linkstatic = True,
        visibility = visibility,
    )
