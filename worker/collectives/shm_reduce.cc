#include "worker/collectives/shm_reduce.h"

#include <algorithm>
#include <cstring>

namespace substrax::shm {
namespace generic {
#include "worker/collectives/shm_reduce_kernels.inc"
}  // namespace generic

namespace avx2 {
void Reduce(DataType type, ReduceOp op, const void* const* srcs, int num_srcs, void* dst,
            size_t count);
}  // namespace avx2

void ReduceInOrder(DataType type, ReduceOp op, const void* const* srcs, int num_srcs, void* dst,
                   size_t count) {
  // The default build targets plain x86-64 (SSE2); AVX2 doubles the width where it exists.
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  if (has_avx2) return avx2::Reduce(type, op, srcs, num_srcs, dst, count);
  generic::Reduce(type, op, srcs, num_srcs, dst, count);
}

}  // namespace substrax::shm
