#include "worker/collectives/communicator.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace substrax {

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return sizeof(float);
    case DataType::kFloat64:
      return sizeof(double);
  }
  return 0;
}

const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
  }
  return "unknown";
}

CollectiveEvent CollectiveEvent::Done(absl::Status status) {
  CollectiveEvent event;
  event.done_ = std::move(status);
  return event;
}

bool CollectiveEvent::IsReady() const { return pending_ == nullptr || pending_->IsReady(); }

absl::Status CollectiveEvent::Await() const {
  return pending_ == nullptr ? done_ : pending_->Await();
}

namespace {

class AllPending final : public CollectiveEvent::Pending {
 public:
  explicit AllPending(std::vector<CollectiveEvent> events) : events_(std::move(events)) {}
  bool IsReady() override {
    for (const CollectiveEvent& e : events_) {
      if (!e.IsReady()) return false;
    }
    return true;
  }
  absl::Status Await() override {
    absl::Status status;
    for (const CollectiveEvent& e : events_) status.Update(e.Await());
    return status;
  }

 private:
  const std::vector<CollectiveEvent> events_;
};

}  // namespace

CollectiveEvent CollectiveEvent::All(std::vector<CollectiveEvent> events) {
  if (events.size() == 1) return std::move(events.front());
  return CollectiveEvent(std::make_shared<AllPending>(std::move(events)));
}

absl::Status Communicator::CheckSizes(const char* op, size_t input, size_t output,
                                      size_t expected_output) {
  if (output == expected_output) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, " on communicator '", name(), "' (", size(), " ranks): an input of ", input,
      " values needs an output of ", expected_output, ", got ", output));
}

absl::Status Communicator::Indivisible(size_t input) {
  return absl::InvalidArgumentError(absl::StrCat("reduce_scatter on communicator '", name(),
                                                 "': ", input, " values do not split into ",
                                                 size(), " equal blocks"));
}

absl::Status Communicator::CheckBuffers(const char* op, const void* a, const void* b,
                                        size_t count) {
  if (count == 0 || (a != nullptr && b != nullptr)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, " on communicator '", name(), "': ", count,
                                                 " values but a null buffer"));
}

CollectiveEvent Communicator::AllReduceAsync(void* data, DataType type, size_t count,
                                             ReduceOp op, ExecutionContext context) {
  if (absl::Status s = CheckBuffers("all_reduce", data, data, count); !s.ok()) {
    return CollectiveEvent::Done(s);
  }
  if (count == 0) return CollectiveEvent::Done();
  return DoAllReduce(data, type, count, op, context);
}

CollectiveEvent Communicator::AllGatherAsync(const void* input, void* output, DataType type,
                                             size_t count, ExecutionContext context) {
  if (absl::Status s = CheckBuffers("all_gather", input, output, count); !s.ok()) {
    return CollectiveEvent::Done(s);
  }
  if (count == 0) return CollectiveEvent::Done();
  return DoAllGather(input, output, type, count, context);
}

CollectiveEvent Communicator::BroadcastAsync(void* data, DataType type, size_t count, int root,
                                             ExecutionContext context) {
  if (root < 0 || root >= size()) {
    return CollectiveEvent::Done(absl::InvalidArgumentError(
        absl::StrCat("broadcast on communicator '", name(), "': root ", root,
                     " is not a rank of 0..", size() - 1)));
  }
  if (absl::Status s = CheckBuffers("broadcast", data, data, count); !s.ok()) {
    return CollectiveEvent::Done(s);
  }
  if (count == 0) return CollectiveEvent::Done();
  return DoBroadcast(data, type, count, root, context);
}

CollectiveEvent Communicator::ReduceScatterAsync(const void* input, void* output, DataType type,
                                                 size_t count, ReduceOp op,
                                                 ExecutionContext context) {
  if (absl::Status s = CheckBuffers("reduce_scatter", input, output, count); !s.ok()) {
    return CollectiveEvent::Done(s);
  }
  if (count == 0) return CollectiveEvent::Done();
  return DoReduceScatter(input, output, type, count, op, context);
}

CollectiveEvent Communicator::BarrierAsync(ExecutionContext context) {
  return DoBarrier(context);
}

CollectiveEvent Communicator::AllReduceGroupAsync(absl::Span<const ReduceBuffer> buffers,
                                                  DataType type, ReduceOp op,
                                                  ExecutionContext context) {
  size_t empty = 0;
  for (const ReduceBuffer& b : buffers) {
    if (absl::Status s = CheckBuffers("all_reduce", b.data, b.data, b.count); !s.ok()) {
      return CollectiveEvent::Done(s);
    }
    if (b.count == 0) ++empty;
  }
  if (empty == buffers.size()) return CollectiveEvent::Done();
  if (empty == 0) return DoAllReduceGroup(buffers, type, op, context);
  std::vector<ReduceBuffer> nonempty;
  for (const ReduceBuffer& b : buffers) {
    if (b.count > 0) nonempty.push_back(b);
  }
  return DoAllReduceGroup(nonempty, type, op, context);
}

CollectiveEvent Communicator::DoAllReduceGroup(absl::Span<const ReduceBuffer> buffers,
                                               DataType type, ReduceOp op,
                                               ExecutionContext context) {
  std::vector<CollectiveEvent> events;
  events.reserve(buffers.size());
  for (const ReduceBuffer& b : buffers) {
    events.push_back(DoAllReduce(b.data, type, b.count, op, context));
  }
  return CollectiveEvent::All(std::move(events));
}

}  // namespace substrax
