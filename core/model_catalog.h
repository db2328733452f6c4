// The parameters of each built-in model as pure data: names, global shapes and partition specs.
// The coordinator and `substraxctl` reason about a job with this (memory, shardings) without
// linking compute code; worker/compute builds its models from the same table, so the names and
// shapes can never disagree.
//
// Naming follows Flax: dense layers "dense_0", "dense_1", ... each with "kernel" [in, out] and
// "bias" [out]. linear and softmax_regression have one dense layer; an mlp with L hidden layers
// has L + 1.
//
// Tensor parallelism (an mlp on a mesh with a "model" axis of size m > 1), as in Megatron-LM:
// dense layers pair up, (0, 1), (2, 3), ...; the first of a pair is column-parallel (its kernel
// and bias split along the output dimension over "model"), the second row-parallel (its kernel
// split along the input dimension; its bias replicated, added after the all-reduce over
// "model" that sums the partial outputs). A last layer without a partner is replicated. So a
// pair costs one all-reduce over the model axis in the forward pass and one in the backward
// pass (except for the first pair, whose input needs no gradient).
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

// How a dense layer is laid out over the model axis.
enum class LayerSplit { kReplicated, kColumn, kRow };

// The split of each dense layer of `model` on a model axis of `model_axis_size` (all
// kReplicated when it is 1 or the model is not an mlp).
std::vector<LayerSplit> LayerSplits(const v1::ModelSpec& model, int64_t model_axis_size);

// The parameters of `model` for inputs of `num_features` values, in layer order, with the
// partition specs of a model axis of `model_axis_size`.
// Errors: INVALID_ARGUMENT for an unknown model type, num_features < 1, sizes the spec
// validation would reject, or a split width that does not divide by the model axis (the
// message names the field).
absl::StatusOr<std::vector<ParamSpec>> ModelParams(const v1::ModelSpec& model,
                                                   int64_t num_features,
                                                   int64_t model_axis_size = 1);

// Width of the model's output: classes for classification, output_size for regression.
int64_t ModelOutputSize(const v1::ModelSpec& model);

// Number of float32 values over all parameters.
int64_t ParamCount(const std::vector<ParamSpec>& params);

}  // namespace substrax

#endif  // SUBSTRAX_CORE_MODEL_CATALOG_H_
