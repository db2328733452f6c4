// Tensor, TensorTree, Batch: public (part of the SDK, docs/sdk.md), declared in substrax/tensor.h.
#ifndef SUBSTRAX_WORKER_TENSOR_TENSOR_H_
#define SUBSTRAX_WORKER_TENSOR_TENSOR_H_

#include "substrax/tensor.h"

#endif  // SUBSTRAX_WORKER_TENSOR_TENSOR_H_
