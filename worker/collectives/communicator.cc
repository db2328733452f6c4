#include "worker/collectives/communicator.h"

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "contract/activity.h"
#include "worker/collectives/job_failpoints.h"

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

// A collective still in flight, counted as completed in the activity file once it is.
class CountedPending final : public CollectiveEvent::Pending {
 public:
  CountedPending(int slot, CollectiveEvent event) : slot_(slot), event_(std::move(event)) {}
  bool IsReady() override {
    const bool ready = event_.IsReady();
    if (ready) Complete(event_.Await());
    return ready;
  }
  absl::Status Await() override {
    absl::Status status = event_.Await();
    Complete(status);
    return status;
  }

 private:
  // A collective that failed is not completed: the report shows where the rank was stuck.
  void Complete(const absl::Status& status) {
    if (!status.ok() || counted_.exchange(true)) return;
    if (ActivityBoard* board = ProcessActivityBoard()) board->Complete(slot_);
  }
  const int slot_;
  const CollectiveEvent event_;
  std::atomic<bool> counted_{false};
};

}  // namespace

bool Communicator::SkippedByFailpoint() {
  // Numbered on the communicator the job calls, not on a hierarchical one's parts.
  return activity_slot_ != kNotCounted &&
         JobFailpointBeforeAllReduce(++all_reduces_) == AllReduceFault::kSkip;
}

int Communicator::Entering(int64_t kind, size_t count) {
  if (activity_slot_ == kNotCounted) return -1;
  ActivityBoard* board = ProcessActivityBoard();
  if (board == nullptr) return -1;
  if (activity_slot_ == kUnregistered) {
    activity_slot_ = board->GroupSlot(name(), ThreadActivityDevice(), rank(), size());
  }
  board->Enter(activity_slot_, static_cast<CollectiveKind>(kind), static_cast<int64_t>(count));
  return activity_slot_;
}

CollectiveEvent Communicator::Counted(int slot, CollectiveEvent event) {
  if (slot < 0) return event;
  if (event.IsReady()) {
    ActivityBoard* board = ProcessActivityBoard();
    if (board != nullptr && event.Await().ok()) board->Complete(slot);
    return event;
  }
  return CollectiveEvent(std::make_shared<CountedPending>(slot, std::move(event)));
}

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
  if (SkippedByFailpoint()) return CollectiveEvent::Done();
  const int slot = Entering(static_cast<int64_t>(CollectiveKind::kAllReduce), count);
  return Counted(slot, DoAllReduce(data, type, count, op, context));
}

CollectiveEvent Communicator::AllGatherAsync(const void* input, void* output, DataType type,
                                             size_t count, ExecutionContext context) {
  if (absl::Status s = CheckBuffers("all_gather", input, output, count); !s.ok()) {
    return CollectiveEvent::Done(s);
  }
  if (count == 0) return CollectiveEvent::Done();
  const int slot = Entering(static_cast<int64_t>(CollectiveKind::kAllGather), count);
  return Counted(slot, DoAllGather(input, output, type, count, context));
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
  const int slot = Entering(static_cast<int64_t>(CollectiveKind::kBroadcast), count);
  return Counted(slot, DoBroadcast(data, type, count, root, context));
}

CollectiveEvent Communicator::ReduceScatterAsync(const void* input, void* output, DataType type,
                                                 size_t count, ReduceOp op,
                                                 ExecutionContext context) {
  if (absl::Status s = CheckBuffers("reduce_scatter", input, output, count); !s.ok()) {
    return CollectiveEvent::Done(s);
  }
  if (count == 0) return CollectiveEvent::Done();
  const int slot = Entering(static_cast<int64_t>(CollectiveKind::kReduceScatter), count);
  return Counted(slot, DoReduceScatter(input, output, type, count, op, context));
}

CollectiveEvent Communicator::BarrierAsync(ExecutionContext context) {
  const int slot = Entering(static_cast<int64_t>(CollectiveKind::kBarrier), 0);
  return Counted(slot, DoBarrier(context));
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
  if (SkippedByFailpoint()) return CollectiveEvent::Done();
  size_t total = 0;
  for (const ReduceBuffer& b : buffers) total += b.count;
  // One group, one collective in the count (every rank groups its buffers alike).
  const int slot = Entering(static_cast<int64_t>(CollectiveKind::kAllReduce), total);
  if (empty == 0) return Counted(slot, DoAllReduceGroup(buffers, type, op, context));
  std::vector<ReduceBuffer> nonempty;
  for (const ReduceBuffer& b : buffers) {
    if (b.count > 0) nonempty.push_back(b);
  }
  return Counted(slot, DoAllReduceGroup(nonempty, type, op, context));
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
