#include "worker/collectives/hierarchical_communicator.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/status.h"

namespace substrax {

HostTopology::HostTopology(const std::vector<std::string>& host_of_rank) {
  std::map<std::string, int> index_of;
  for (int r = 0; r < static_cast<int>(host_of_rank.size()); ++r) {
    auto [it, added] = index_of.emplace(host_of_rank[r], static_cast<int>(hosts.size()));
    if (added) {
      hosts.push_back(host_of_rank[r]);
      ranks_of_host.emplace_back();
    }
    host_index.push_back(it->second);
    local_rank.push_back(static_cast<int>(ranks_of_host[it->second].size()));
    ranks_of_host[it->second].push_back(r);
  }
}

namespace {

absl::Status CheckPart(const std::string& name, absl::string_view part, const Communicator* comm,
                       int size, int rank) {
  if (comm == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("hierarchical communicator '", name, "': no ", part, " communicator"));
  }
  if (comm->size() != size || comm->rank() != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("hierarchical communicator '", name, "': the ", part, " communicator '",
                     comm->name(), "' is rank ", comm->rank(), " of ", comm->size(),
                     ", the topology wants rank ", rank, " of ", size));
  }
  return absl::OkStatus();
}

template <typename T>
void Scale(void* data, size_t count, int size) {
  // As GlooCommunicator: one multiplication by 1/size, so a mean over one rank is exact.
  const T scale = T(1) / static_cast<T>(size);
  T* values = static_cast<T*>(data);
  for (size_t i = 0; i < count; ++i) values[i] *= scale;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HierarchicalCommunicator>> HierarchicalCommunicator::Create(
    std::string name, const std::vector<std::string>& host_of_rank, int rank,
    HierarchicalParts parts) {
  const int size = static_cast<int>(host_of_rank.size());
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("hierarchical communicator '", name, "': rank ",
                                                   rank, " is not in 0..", size - 1));
  }
  const HostTopology topology(host_of_rank);
  const int host = topology.host_index[rank];
  SUBSTRAX_RETURN_IF_ERROR(CheckPart(name, "flat (all ranks)", parts.all.get(), size, rank));
  SUBSTRAX_RETURN_IF_ERROR(CheckPart(
      name, absl::StrCat("inside-host (host ", host_of_rank[rank], ")"), parts.local.get(),
      static_cast<int>(topology.ranks_of_host[host].size()), topology.local_rank[rank]));
  if (topology.is_leader(rank)) {
    SUBSTRAX_RETURN_IF_ERROR(CheckPart(name, "between-hosts (leaders)", parts.leaders.get(),
                                       topology.num_hosts(), host));
  } else if (parts.leaders != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("hierarchical communicator '", name, "': rank ", rank,
                     " is not its host's leader, but was given a between-hosts communicator"));
  }
  // The whole is counted in the activity file, not its parts.
  for (Communicator* part : {parts.local.get(), parts.leaders.get(), parts.all.get()}) {
    if (part != nullptr) part->NotCounted();
  }
  return std::unique_ptr<HierarchicalCommunicator>(new HierarchicalCommunicator(
      std::move(name), rank, size, host_of_rank[rank], std::move(parts)));
}

void HierarchicalCommunicator::PeerDied(const std::string& who) {
  for (Communicator* part : {parts_.local.get(), parts_.leaders.get(), parts_.all.get()}) {
    if (part != nullptr) part->PeerDied(who);
  }
}

absl::Status HierarchicalCommunicator::Usable(const char* op) const {
  if (broken_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      op, " on communicator '", name_,
      "': an earlier collective failed, so this group is unusable: ", broken_.message()));
}

absl::Status HierarchicalCommunicator::CheckHost(const char* op, ExecutionContext context) const {
  if (context.stream == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, " on hierarchical communicator '", name_,
      "': a CUDA stream was given, but its collectives run on the calling thread over host "
      "memory (CPU devices)"));
}

absl::Status HierarchicalCommunicator::Fail(const char* op, const std::string& level,
                                            const absl::Status& status) {
  broken_ = Annotate(status, absl::StrCat(op, " on hierarchical communicator '", name_, "' (rank ",
                                          rank_, " of ", size_, "), ", level));
  return broken_;
}

absl::Status HierarchicalCommunicator::AllReduceLevels(void* data, DataType type, size_t count,
                                                       ReduceOp op, ExecutionContext context) {
  SUBSTRAX_RETURN_IF_ERROR(CheckHost("all_reduce", context));
  SUBSTRAX_RETURN_IF_ERROR(Usable("all_reduce"));
  // A mean of means would weigh hosts with fewer ranks more: sum, and divide once at the end.
  const ReduceOp level_op = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  const std::string inside = absl::StrCat("inside host ", host_);
  if (absl::Status s = parts_.local->AllReduceAsync(data, type, count, level_op, context).Await();
      !s.ok()) {
    return Fail("all_reduce", inside, s);
  }
  if (parts_.leaders != nullptr) {
    absl::Status s = parts_.leaders->AllReduceAsync(data, type, count, level_op, context).Await();
    if (!s.ok()) {
      // This host's other ranks wait for our result in the broadcast below; destroying the local
      // communicator makes them fail now (their peer is gone) instead of at their timeout.
      parts_.local.reset();
      return Fail("all_reduce", "between hosts", s);
    }
  }
  // The leader is local rank 0 (its host's lowest group rank).
  if (absl::Status s = parts_.local->BroadcastAsync(data, type, count, 0, context).Await();
      !s.ok()) {
    return Fail("all_reduce", absl::StrCat(inside, " (broadcasting the result)"), s);
  }
  if (op == ReduceOp::kMean) {
    if (type == DataType::kFloat64) {
      Scale<double>(data, count, size_);
    } else {
      Scale<float>(data, count, size_);
    }
  }
  return absl::OkStatus();
}

CollectiveEvent HierarchicalCommunicator::DoAllReduce(void* data, DataType type, size_t count,
                                                      ReduceOp op, ExecutionContext context) {
  return CollectiveEvent::Done(AllReduceLevels(data, type, count, op, context));
}

template <typename Fn>
CollectiveEvent HierarchicalCommunicator::OnAll(const char* op, ExecutionContext context, Fn&& fn) {
  if (absl::Status s = CheckHost(op, context); !s.ok()) return CollectiveEvent::Done(s);
  if (absl::Status s = Usable(op); !s.ok()) return CollectiveEvent::Done(s);
  absl::Status s = fn(*parts_.all).Await();
  if (!s.ok()) return CollectiveEvent::Done(Fail(op, "over every rank", s));
  return CollectiveEvent::Done();
}

CollectiveEvent HierarchicalCommunicator::DoAllGather(const void* input, void* output,
                                                      DataType type, size_t count,
                                                      ExecutionContext context) {
  return OnAll("all_gather", context, [&](Communicator& all) {
    return all.AllGatherAsync(input, output, type, count, context);
  });
}

CollectiveEvent HierarchicalCommunicator::DoBroadcast(void* data, DataType type, size_t count,
                                                      int root, ExecutionContext context) {
  return OnAll("broadcast", context, [&](Communicator& all) {
    return all.BroadcastAsync(data, type, count, root, context);
  });
}

CollectiveEvent HierarchicalCommunicator::DoReduceScatter(const void* input, void* output,
                                                          DataType type, size_t count, ReduceOp op,
                                                          ExecutionContext context) {
  return OnAll("reduce_scatter", context, [&](Communicator& all) {
    return all.ReduceScatterAsync(input, output, type, count, op, context);
  });
}

CollectiveEvent HierarchicalCommunicator::DoBarrier(ExecutionContext context) {
  return OnAll("barrier", context, [&](Communicator& all) { return all.BarrierAsync(context); });
}

}  // namespace substrax
