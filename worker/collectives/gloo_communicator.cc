#include "worker/collectives/gloo_communicator.h"

#include <signal.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace substrax {
namespace {

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Lets Gloo rendezvous through our Store. Gloo expects exceptions; the adapter keeps the
// Status it turned into one so that the caller can report it unchanged.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(substrax::Store* store, absl::Duration timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(key, std::string(data.begin(), data.end())));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_->Get(key, timeout_);
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, Millis(timeout_)); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
    for (const std::string& key : keys) {
      Check(store_->Get(key, std::max(deadline - absl::Now(), absl::ZeroDuration())).status());
    }
  }

  const absl::Status& last_error() const { return last_error_; }

 private:
  void Check(const absl::Status& status) {
    if (status.ok()) return;
    last_error_ = status;
    throw gloo::IoException(std::string(status.message()));
  }

  substrax::Store* const store_;
  const absl::Duration timeout_;
  absl::Status last_error_;
};

template <typename T>
gloo::AllreduceOptions::Func ReduceFunction(ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case ReduceOp::kMax:
      return static_cast<Fn>(&gloo::max<T>);
    case ReduceOp::kMin:
      return static_cast<Fn>(&gloo::min<T>);
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      break;
  }
  return static_cast<Fn>(&gloo::sum<T>);
}

// Gloo's TCP pairs write with writev, which raises SIGPIPE when the peer has died: with the
// default disposition that kills this process before the collective can report the dead peer.
// As gRPC does at start, ignore SIGPIPE unless the program installed a handler of its own (the
// write then fails with EPIPE, which the collective turns into a clear error).
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current;
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    const GlooCommunicatorOptions& options, Store* store, int rank, std::vector<RankInfo> ranks,
    const PeerMonitor* monitor) {
  const int size = static_cast<int>(ranks.size());
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("communicator '", options.name, "': rank ",
                                                   rank, " is not in 0..", size - 1));
  }
  IgnoreSigpipeUnlessHandled();
  std::unique_ptr<GlooCommunicator> comm(
      new GlooCommunicator(options, rank, std::move(ranks), monitor));
  const std::string who = absl::StrCat("connecting communicator '", options.name, "' (rank ", rank,
                                       " of ", size, ", ", comm->ranks_[rank].description, ")");
  GlooStoreAdapter adapter(store, options.connect_timeout);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.listen_host;
    comm->device_ = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(Millis(options.connect_timeout));
    context->connectFullMesh(adapter, comm->device_);
    context->setTimeout(Millis(options.timeout));
    comm->context_ = std::move(context);
  } catch (...) {
    if (!adapter.last_error().ok()) return Annotate(adapter.last_error(), who);
    std::string message;
    const GlooErrorKind kind = ClassifyCurrentGlooException(&message);
    const absl::StatusCode code = kind == GlooErrorKind::kTimeout ? absl::StatusCode::kDeadlineExceeded
                                                                  : absl::StatusCode::kUnavailable;
    return absl::Status(code, absl::StrCat(who, ": ", message));
  }
  return comm;
}

GlooCommunicator::GlooCommunicator(const GlooCommunicatorOptions& options, int rank,
                                   std::vector<RankInfo> ranks, const PeerMonitor* monitor)
    : options_(options), rank_(rank), ranks_(std::move(ranks)), monitor_(monitor) {}

GlooCommunicator::~GlooCommunicator() = default;

template <typename Fn>
absl::Status GlooCommunicator::Run(const char* op, Fn&& fn) {
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, " on communicator '", options_.name,
                     "': an earlier collective failed, so this group is unusable: ",
                     broken_.message()));
  }
  try {
    fn();
    return absl::OkStatus();
  } catch (...) {
    std::string message;
    const GlooErrorKind kind = ClassifyCurrentGlooException(&message);
    std::vector<PeerMonitor::Death> deaths;
    if (monitor_ != nullptr && (kind == GlooErrorKind::kIo || kind == GlooErrorKind::kTimeout)) {
      // The monitor sees the same closed sockets as Gloo, usually first; give it a moment so
      // that the error can name who died.
      monitor_->AwaitDeath(options_.death_grace);
      deaths = monitor_->Deaths();
    }
    CollectiveCall call;
    call.op = op;
    call.communicator = options_.name;
    call.rank = rank_;
    call.size = size();
    call.self = ranks_[rank_].description;
    for (int r = 0; r < size(); ++r) {
      const int p = ranks_[r].process_index;
      if (p >= static_cast<int>(call.ranks_of_process.size())) {
        call.ranks_of_process.resize(p + 1);
        call.process_names.resize(p + 1);
      }
      call.ranks_of_process[p].push_back(r);
      call.process_names[p] = ranks_[r].process_name;
    }
    broken_ = TranslateGlooError(kind, message, call, deaths);
    return broken_;
  }
}

absl::Status GlooCommunicator::CheckHost(const char* op, ExecutionContext context) const {
  if (context.stream == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, " on Gloo communicator '", options_.name,
      "': a CUDA stream was given, but Gloo moves host memory on the calling thread; use an "
      "NCCL communicator for GPU buffers"));
}

template <typename T>
absl::Status GlooCommunicator::AllReduceImpl(T* data, size_t count, ReduceOp op) {
  SUBSTRAX_RETURN_IF_ERROR(Run("all_reduce", [&] {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setReduceFunction(ReduceFunction<T>(op));
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setTag(NextTag());
    opts.setTimeout(Millis(options_.timeout));
    gloo::allreduce(opts);
  }));
  if (op == ReduceOp::kMean) {
    const T scale = T(1) / static_cast<T>(size());
    for (size_t i = 0; i < count; ++i) data[i] *= scale;
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllReduceTyped(void* data, DataType type, size_t count,
                                              ReduceOp op) {
  if (type == DataType::kFloat64) return AllReduceImpl(static_cast<double*>(data), count, op);
  return AllReduceImpl(static_cast<float*>(data), count, op);
}

CollectiveEvent GlooCommunicator::DoAllReduce(void* data, DataType type, size_t count,
                                              ReduceOp op, ExecutionContext context) {
  if (absl::Status s = CheckHost("all_reduce", context); !s.ok()) return CollectiveEvent::Done(s);
  return CollectiveEvent::Done(AllReduceTyped(data, type, count, op));
}

CollectiveEvent GlooCommunicator::DoAllGather(const void* input, void* output, DataType type,
                                              size_t count, ExecutionContext context) {
  if (absl::Status s = CheckHost("all_gather", context); !s.ok()) return CollectiveEvent::Done(s);
  return CollectiveEvent::Done(Run("all_gather", [&] {
    gloo::AllgatherOptions opts(context_);
    if (type == DataType::kFloat64) {
      opts.setInput(static_cast<double*>(const_cast<void*>(input)), count);
      opts.setOutput(static_cast<double*>(output), count * size());
    } else {
      opts.setInput(static_cast<float*>(const_cast<void*>(input)), count);
      opts.setOutput(static_cast<float*>(output), count * size());
    }
    opts.setTag(NextTag());
    opts.setTimeout(Millis(options_.timeout));
    gloo::allgather(opts);
  }));
}

CollectiveEvent GlooCommunicator::DoBroadcast(void* data, DataType type, size_t count, int root,
                                              ExecutionContext context) {
  if (absl::Status s = CheckHost("broadcast", context); !s.ok()) return CollectiveEvent::Done(s);
  return CollectiveEvent::Done(Run("broadcast", [&] {
    gloo::BroadcastOptions opts(context_);
    if (type == DataType::kFloat64) {
      opts.setOutput(static_cast<double*>(data), count);
    } else {
      opts.setOutput(static_cast<float*>(data), count);
    }
    opts.setRoot(root);
    opts.setTag(NextTag());
    opts.setTimeout(Millis(options_.timeout));
    gloo::broadcast(opts);
  }));
}

CollectiveEvent GlooCommunicator::DoReduceScatter(const void* input, void* output, DataType type,
                                                  size_t count, ReduceOp op,
                                                  ExecutionContext context) {
  if (absl::Status s = CheckHost("reduce_scatter", context); !s.ok()) {
    return CollectiveEvent::Done(s);
  }
  const size_t bytes = count * DataTypeSize(type);
  std::vector<char> all(static_cast<const char*>(input),
                        static_cast<const char*>(input) + bytes * size());
  absl::Status status = AllReduceTyped(all.data(), type, count * size(), op);
  if (status.ok()) std::memcpy(output, all.data() + rank_ * bytes, bytes);
  return CollectiveEvent::Done(status);
}

CollectiveEvent GlooCommunicator::DoBarrier(ExecutionContext context) {
  if (absl::Status s = CheckHost("barrier", context); !s.ok()) return CollectiveEvent::Done(s);
  return CollectiveEvent::Done(Run("barrier", [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(NextTag());
    opts.setTimeout(Millis(options_.timeout));
    gloo::barrier(opts);
  }));
}

absl::StatusOr<std::vector<RankInfo>> RanksOfGroup(const CommunicatorGroup& group,
                                                   const std::vector<int>& process_of_position) {
  std::vector<RankInfo> ranks;
  for (size_t i = 0; i < group.members.size(); ++i) {
    const int64_t position = group.positions[i];
    if (position < 0 || position >= static_cast<int64_t>(process_of_position.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "communicator '", group.name, "': the process table has ", process_of_position.size(),
          " entries, no process for mesh position ", position));
    }
    const Device& d = group.members[i];
    ranks.push_back(RankInfo{
        process_of_position[position], d.ToString(),
        d.worker_id.empty() ? std::string()
                            : absl::StrCat("worker ", d.worker_id, " (host ", d.host, ")")});
  }
  return ranks;
}

absl::StatusOr<std::unique_ptr<Communicator>> GlooGroupConnector::ConnectWorld(
    const CommunicatorGroup& world) {
  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<RankInfo> ranks,
                            RanksOfGroup(world, process_of_position_));
  GlooCommunicatorOptions options = options_;
  options.name = world.name;
  PrefixStore store(store_, world.store_prefix);
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                            GlooCommunicator::Create(options, &store, world.rank,
                                                     std::move(ranks), monitor_));
  return std::unique_ptr<Communicator>(std::move(comm));
}

absl::StatusOr<std::unique_ptr<Communicator>> GlooGroupConnector::ConnectAxis(
    Communicator&, const CommunicatorGroup& group) {
  // Gloo groups connect on their own; the world is not needed.
  return ConnectWorld(group);
}

}  // namespace substrax
