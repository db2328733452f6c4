// shm_reduce_kernels.inc compiled with -mavx2 (BUILD.bazel); shm_reduce.cc calls it only on a
// CPU that has AVX2.
#include <algorithm>
#include <cstring>

#include "worker/collectives/communicator.h"

namespace substrax::shm::avx2 {
#include "worker/collectives/shm_reduce_kernels.inc"
}  // namespace substrax::shm::avx2
