// The element-wise reductions of ShmCommunicator: every rank's values summed (or max'd, min'd)
// in rank order, so that the result is bitwise the same whichever rank computes it.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_SHM_REDUCE_H_
#define SUBSTRAX_WORKER_COLLECTIVES_SHM_REDUCE_H_

#include <cstddef>

#include "worker/collectives/communicator.h"

namespace substrax::shm {

// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[num_srcs - 1][i], left to right; for kMean
// the sum is then multiplied by T(1) / T(num_srcs), as GlooCommunicator does. `dst` must not
// overlap any source. Element-wise adds in a fixed order: vectorizing them (AVX2 where the CPU
// has it) changes no bit of the result.
void ReduceInOrder(DataType type, ReduceOp op, const void* const* srcs, int num_srcs, void* dst,
                   size_t count);

}  // namespace substrax::shm

#endif  // SUBSTRAX_WORKER_COLLECTIVES_SHM_REDUCE_H_
