#include "worker/collectives/shm_communicator.h"

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "worker/collectives/shm_communicator_internal.h"

namespace substrax {
namespace shm {

std::string Group::Describe(int r) const {
  const RankInfo& info = ranks[r];
  std::string out = absl::StrCat("rank ", r, " (", info.description);
  if (!info.process_name.empty()) absl::StrAppend(&out, ", ", info.process_name);
  return absl::StrCat(out, ")");
}

std::string Group::Where(const char* op) const {
  return absl::StrCat(op, " on shared-memory communicator '", options.name, "' (rank ", rank,
                      " of ", size(), ", ", ranks[rank].description, ") failed: ");
}

std::string Group::Connecting(const char* mode) const {
  return absl::StrCat("connecting shared-memory communicator '", options.name, "' (rank ", rank,
                      " of ", size(), ", ", ranks[rank].description, ", ", mode, ")");
}

namespace {

std::string DescribeAll(const Group& group, const std::vector<int>& ranks) {
  std::vector<std::string> names;
  for (int r : ranks) names.push_back(group.Describe(r));
  return names.empty() ? std::string("none") : absl::StrJoin(names, ", ");
}

}  // namespace

absl::Status Group::Timeout(const char* op, const std::vector<int>& missing) const {
  return absl::DeadlineExceededError(absl::StrCat(
      Where(op), "it did not complete within its timeout (", absl::FormatDuration(options.timeout),
      ") and no peer is known to have died; not arrived: ", DescribeAll(*this, missing),
      ". A peer is stuck, far slower, or called a different collective"));
}

absl::Status Group::Left(const char* op, int r) const {
  return absl::UnavailableError(absl::StrCat(
      Where(op), Describe(r),
      " left the group: its communicator was destroyed (or its process exited) while this rank "
      "waited for it"));
}

absl::Status Group::Aborted(const char* op, absl::StatusCode code, int r,
                            const std::vector<int>& missing) const {
  return absl::Status(
      code, absl::StrCat(Where(op), Describe(r), " failed this collective first (",
                         absl::StatusCodeToString(code), "; its error says why); not arrived: ",
                         DescribeAll(*this, missing)));
}

absl::Status Group::DeadPeers(const char* op) const {
  if (monitor == nullptr) return absl::OkStatus();
  std::vector<std::string> dead;
  for (const PeerMonitor::Death& d : monitor->Deaths()) {
    std::vector<int> of_process;
    std::string who;
    for (int r = 0; r < size(); ++r) {
      if (ranks[r].process_index != d.process_index) continue;
      of_process.push_back(r);
      if (!ranks[r].process_name.empty()) who = ranks[r].process_name + ", ";
    }
    if (of_process.empty()) continue;
    dead.push_back(absl::StrCat("process ", d.process_index, " (", who,
                                of_process.size() == 1 ? "rank " : "ranks ",
                                absl::StrJoin(of_process, ", "), ") died: ", d.reason));
  }
  if (dead.empty()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(Where(op), absl::StrJoin(dead, "; "),
                   ". The job attempt cannot continue; check the dead process's log"));
}

bool Backoff::Pause() {
  // 256 pause instructions (a few microseconds), then yields for up to kYieldFor, then sleeps of
  // 20 us doubling to 640 us. The yield phase is long on purpose: with one device thread per core
  // the peer usually arrives within a fraction of a step, and a sleeping waiter wakes late (the
  // timer slack, and a VM's wake-up latency, add 50-100 us to each sleep; measured, the step's
  // collectives took 15-30% of a 2-device step with 64 yields, 6-10% with this). A yield on a
  // core with other work runs that work, so an oversubscribed host still makes progress.
  constexpr int kSpins = 64;
  constexpr absl::Duration kYieldFor = absl::Milliseconds(2);
  const int round = rounds_++;
  if (round < kSpins) {
    for (int i = 0; i < 4; ++i) _mm_pause();
    return false;
  }
  const absl::Time now = absl::Now();
  if (round == kSpins) yield_until_ = now + kYieldFor;
  if (now < yield_until_) {
    sched_yield();
  } else {
    absl::SleepFor(absl::Microseconds(20 << std::min(sleeps_++, 5)));
  }
  return true;
}

uint64_t EncodeAbort(int rank, absl::StatusCode code) {
  return (static_cast<uint64_t>(code) << 32) | static_cast<uint32_t>(rank + 1);
}

void DecodeAbort(uint64_t word, int* rank, absl::StatusCode* code) {
  *rank = static_cast<int>(word & 0xffffffffu) - 1;
  *code = static_cast<absl::StatusCode>(word >> 32);
}

absl::Status Unusable(const Group& group, const char* op, uint64_t abort_word) {
  int rank = 0;
  absl::StatusCode code;
  DecodeAbort(abort_word, &rank, &code);
  return absl::FailedPreconditionError(absl::StrCat(
      op, " on shared-memory communicator '", group.options.name, "' (rank ", group.rank, " of ",
      group.size(), "): an earlier collective failed, so this group is unusable: ",
      group.Describe(rank), " failed with ", absl::StatusCodeToString(code)));
}

Range BlockOf(size_t count, int parts, int part, size_t granule) {
  const size_t units = count / granule;
  const size_t each = units / parts, extra = units % parts;
  const size_t p = static_cast<size_t>(part);
  Range range;
  range.begin = granule * (p * each + std::min(p, extra));
  range.end = range.begin + granule * (each + (p < extra ? 1 : 0));
  if (part == parts - 1) range.end = count;
  return range;
}

absl::Status AwaitAllAttached(const Group& group, const std::string& who,
                              const std::function<bool(int)>& attached) {
  const absl::Time deadline = absl::Now() + group.options.connect_timeout;
  Backoff backoff;
  for (;;) {
    std::vector<int> missing;
    for (int r = 0; r < group.size(); ++r) {
      if (!attached(r)) missing.push_back(r);
    }
    if (missing.empty()) return absl::OkStatus();
    if (backoff.Pause() && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(who, ": not every rank joined within the connect timeout (",
                       absl::FormatDuration(group.options.connect_timeout),
                       "); missing: ", DescribeAll(group, missing)));
    }
  }
}

std::string RandomId() {
  std::random_device device;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    char word[9];
    std::snprintf(word, sizeof(word), "%08x", static_cast<unsigned>(device()));
    id += word;
  }
  return id;
}

}  // namespace shm

absl::Status ShmCommunicator::Impl::Execute(const shm::Collective& c, ExecutionContext context) {
  if (context.stream != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.name, " on shared-memory communicator '", group_.options.name,
        "': a CUDA stream was given, but it moves host memory on the calling thread; use an "
        "NCCL communicator for GPU buffers"));
  }
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(c.name, " on shared-memory communicator '", group_.options.name,
                     "': an earlier collective failed, so this group is unusable: ",
                     broken_.message()));
  }
  absl::Status status = Run(c);
  if (!status.ok()) broken_ = status;
  return status;
}

absl::StatusOr<std::unique_ptr<ShmCommunicator>> ShmCommunicator::Create(
    const ShmCommunicatorOptions& options, Store* store, int rank, std::vector<RankInfo> ranks,
    const PeerMonitor* monitor) {
  const int size = static_cast<int>(ranks.size());
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory communicator '", options.name,
                                                   "': rank ", rank, " is not in 0..", size - 1));
  }
  shm::Group group{options, rank, std::move(ranks), monitor};
  bool in_process = true;
  for (const RankInfo& info : group.ranks) {
    in_process = in_process && info.process_index == group.ranks[rank].process_index;
  }
  std::unique_ptr<Impl> impl;
  if (in_process) {
    SUBSTRAX_ASSIGN_OR_RETURN(impl, shm::ConnectInProcess(std::move(group), store));
  } else {
    SUBSTRAX_ASSIGN_OR_RETURN(impl, shm::ConnectCrossProcess(std::move(group), store));
  }
  return std::unique_ptr<ShmCommunicator>(new ShmCommunicator(std::move(impl)));
}

ShmCommunicator::ShmCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShmCommunicator::~ShmCommunicator() = default;

int ShmCommunicator::rank() const { return impl_->group().rank; }
int ShmCommunicator::size() const { return impl_->group().size(); }
const std::string& ShmCommunicator::name() const { return impl_->group().options.name; }
bool ShmCommunicator::in_process() const { return impl_->in_process(); }

CollectiveEvent ShmCommunicator::DoAllReduce(void* data, DataType type, size_t count, ReduceOp op,
                                             ExecutionContext context) {
  return CollectiveEvent::Done(impl_->Execute(
      {shm::Kind::kAllReduce, "all_reduce", data, data, type, count, op, 0}, context));
}

CollectiveEvent ShmCommunicator::DoAllGather(const void* input, void* output, DataType type,
                                             size_t count, ExecutionContext context) {
  return CollectiveEvent::Done(impl_->Execute(
      {shm::Kind::kAllGather, "all_gather", input, output, type, count, ReduceOp::kSum, 0},
      context));
}

CollectiveEvent ShmCommunicator::DoBroadcast(void* data, DataType type, size_t count, int root,
                                             ExecutionContext context) {
  return CollectiveEvent::Done(impl_->Execute(
      {shm::Kind::kBroadcast, "broadcast", data, data, type, count, ReduceOp::kSum, root},
      context));
}

CollectiveEvent ShmCommunicator::DoReduceScatter(const void* input, void* output, DataType type,
                                                 size_t count, ReduceOp op,
                                                 ExecutionContext context) {
  return CollectiveEvent::Done(impl_->Execute(
      {shm::Kind::kReduceScatter, "reduce_scatter", input, output, type, count, op, 0}, context));
}

CollectiveEvent ShmCommunicator::DoBarrier(ExecutionContext context) {
  return CollectiveEvent::Done(impl_->Execute(shm::Collective(), context));
}

}  // namespace substrax
