#include "worker/collectives/communicator.h"

#include "absl/strings/str_cat.h"

namespace substrax {

absl::Status Communicator::CheckSizes(const char* op, size_t input, size_t output,
                                      size_t expected_output) {
  if (output == expected_output) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, " on communicator '", name(), "' (", size(), " ranks): an input of ", input,
      " values needs an output of ", expected_output, ", got ", output));
}

absl::Status Communicator::AllReduce(absl::Span<float> data, ReduceOp op) {
  return DoAllReduce(data, op);
}

absl::Status Communicator::AllReduce(absl::Span<double> data, ReduceOp op) {
  return DoAllReduce(data, op);
}

absl::Status Communicator::AllGather(absl::Span<const float> input, absl::Span<float> output) {
  if (absl::Status s = CheckSizes("all_gather", input.size(), output.size(), input.size() * size());
      !s.ok()) {
    return s;
  }
  return DoAllGather(input, output);
}

absl::Status Communicator::AllGather(absl::Span<const double> input, absl::Span<double> output) {
  if (absl::Status s = CheckSizes("all_gather", input.size(), output.size(), input.size() * size());
      !s.ok()) {
    return s;
  }
  return DoAllGather(input, output);
}

absl::Status Communicator::Broadcast(absl::Span<float> data, int root) {
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast on communicator '", name(),
                                                   "': root ", root, " is not a rank of 0..",
                                                   size() - 1));
  }
  return DoBroadcast(data, root);
}

absl::Status Communicator::ReduceScatter(absl::Span<const float> input, absl::Span<float> output,
                                         ReduceOp op) {
  if (input.size() % size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce_scatter on communicator '", name(), "': ", input.size(),
        " values do not split into ", size(), " equal blocks"));
  }
  if (absl::Status s =
          CheckSizes("reduce_scatter", input.size(), output.size(), input.size() / size());
      !s.ok()) {
    return s;
  }
  return DoReduceScatter(input, output, op);
}

absl::Status Communicator::Barrier() { return DoBarrier(); }

}  // namespace substrax
