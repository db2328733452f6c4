// The prefetcher: public (part of the SDK, docs/sdk.md), declared in substrax/prefetch.h.
#ifndef SUBSTRAX_WORKER_DATA_PREFETCH_H_
#define SUBSTRAX_WORKER_DATA_PREFETCH_H_

#include "substrax/prefetch.h"

#endif  // SUBSTRAX_WORKER_DATA_PREFETCH_H_
