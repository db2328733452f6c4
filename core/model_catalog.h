// The parameters of each built-in model as pure data: names, global shapes and partition specs.
// The coordinator and `substraxctl` reason about a job with this (memory, shardings) without
// linking compute code; worker/compute builds its models from the same table, so the names and
// shapes can never disagree.
//
// Naming follows Flax: dense layers "dense_0", "dense_1", ... each with "kernel" [in, out] and
// "bias" [out]. linear and softmax_regression have one dense layer; an mlp with L hidden layers
// has L + 1.
//
// Pure functions; thread-safe.
#ifndef SUBSTRAX_CORE_MODEL_CATALOG_H_
#define SUBSTRAX_CORE_MODEL_CATALOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/sharding.h"
#include "substrax/v1/job.pb.h"

namespace substrax {

struct ParamSpec {
  // "dense_0/kernel".
  std::string name;
  std::vector<int64_t> shape;
  // How the parameter is laid out over the mesh; replicated (the empty spec) on data-parallel
  // meshes.
  PartitionSpec partition;
  // Inputs and outputs of the layer the parameter belongs to (for initialisation scales).
  int64_t fan_in = 0;
  int64_t fan_out = 0;
};

// The parameters of `model` for inputs of `num_features` values, in layer order.
// Errors: INVALID_ARGUMENT for an unknown model type, num_features < 1, or sizes the spec
// validation would reject (the message names the field).
absl::StatusOr<std::vector<ParamSpec>> ModelParams(const v1::ModelSpec& model,
                                                   int64_t num_features);

// Width of the model's output: classes for classification, output_size for regression.
int64_t ModelOutputSize(const v1::ModelSpec& model);

// Number of float32 values over all parameters.
int64_t ParamCount(const std::vector<ParamSpec>& params);

}  // namespace substrax

#endif  // SUBSTRAX_CORE_MODEL_CATALOG_H_
