// The substrax SDK (docs/sdk.md): everything a training program uses, in one include.
//   substrax/program.h             Init, Program: the program's connection to its job
//   substrax/device_mesh_manager.h meshes of the guide (data-parallel, model-parallel, hybrid)
//   substrax/sharding.h            PartitionSpec, NamedSharding, shard layouts
//   substrax/spmd.h                placement, gradient and metric reductions, SpmdTrainStep
//   substrax/optimizer.h           sgd, momentum, adam
//   substrax/prefetch.h            PrefetchToDevice
//   substrax/tensor.h              Tensor, TensorTree, Batch
//   substrax/metrics.h             metric reductions on host values
//   substrax/version.h             the SDK's version
#ifndef SUBSTRAX_SUBSTRAX_H_
#define SUBSTRAX_SUBSTRAX_H_

#include "substrax/device.h"
#include "substrax/device_mesh_manager.h"
#include "substrax/mesh.h"
#include "substrax/metrics.h"
#include "substrax/optimizer.h"
#include "substrax/prefetch.h"
#include "substrax/program.h"
#include "substrax/sharding.h"
#include "substrax/spmd.h"
#include "substrax/tensor.h"
#include "substrax/version.h"

#endif  // SUBSTRAX_SUBSTRAX_H_
