// ShmCommunicator's in-process mode: every rank is a thread of this process. The ranks meet in a
// hub (found through a process-wide registry under an id that travels through the store) and
// exchange buffer pointers: each collective is an arrival barrier, every rank working on its own
// block of every rank's buffers, and a departure barrier, after which no rank touches another's
// buffers.
//
// Both barriers count arrivals in one hub-wide atomic (barrier b is complete at size*(b+1)). A
// rank that gives up on the arrival barrier (timeout, a peer gone) takes its arrival back with a
// compare-and-swap that only succeeds while the barrier is incomplete, so either it returns and
// no peer ever passes that barrier (nobody reads its freed buffers), or the barrier completed
// first and it runs the collective like everyone else. The departure barrier has no timeout: past
// the arrival barrier every rank only copies and adds, which ends.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "worker/collectives/shm_communicator_internal.h"
#include "worker/collectives/shm_reduce.h"

namespace substrax::shm {
namespace {

constexpr char kHubKey[] = "shm_communicator/hub";
// Bytes of the partial result one rank sums into before copying it to every rank: small enough to
// stay in L1/L2 while it is copied out.
constexpr size_t kScratchBytes = 32 << 10;
// Blocks are split in whole 64-byte lines of float32 (false sharing between neighbours otherwise).
constexpr size_t kGranule = 16;

struct alignas(64) HubRank {
  // Barriers this rank has arrived at (for messages: who is missing).
  std::atomic<uint64_t> entered{0};
  std::atomic<bool> left{false};
  std::atomic<bool> attached{false};
  // This rank's buffers of the current collective: written before its arrival (a release of the
  // hub's counter), read by peers after they see the barrier complete (an acquire).
  const void* input = nullptr;
  void* output = nullptr;
  // The collective it called (written and read as the buffers are): every rank must call the
  // same one, or the ranks are desynced.
  const Collective* call = nullptr;
};

class Hub;

// Hubs by id, for the ranks that join rank 0's. Weak pointers: the communicators own the hub.
class Registry {
 public:
  static Registry& Get() {
    static Registry* registry = new Registry();  // never destroyed: hubs may outlive main
    return *registry;
  }
  void Add(const std::string& id, const std::shared_ptr<Hub>& hub) {
    std::lock_guard<std::mutex> lock(mu_);
    hubs_[id] = hub;
  }
  std::shared_ptr<Hub> Find(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = hubs_.find(id);
    return it == hubs_.end() ? nullptr : it->second.lock();
  }
  void Remove(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    hubs_.erase(id);
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<Hub>> hubs_;
};

class Hub {
 public:
  Hub(int size, std::string id) : id_(std::move(id)), ranks(size) {}
  ~Hub() { Registry::Get().Remove(id_); }
  const std::string& id() const { return id_; }

 private:
  const std::string id_;

 public:
  std::vector<HubRank> ranks;
  alignas(64) std::atomic<uint64_t> arrivals{0};
  alignas(64) std::atomic<uint64_t> abort{0};
};

class InProcessImpl final : public ShmCommunicator::Impl {
 public:
  InProcessImpl(Group group, std::shared_ptr<Hub> hub)
      : Impl(std::move(group)),
        hub_(std::move(hub)),
        srcs_(group_.size()),
        scratch_(kScratchBytes / sizeof(double)) {}
  ~InProcessImpl() override { hub_->ranks[group_.rank].left.store(true, std::memory_order_release); }

  bool in_process() const override { return true; }

 protected:
  absl::Status Run(const Collective& c) override {
    if (uint64_t word = hub_->abort.load(std::memory_order_acquire); word != 0) {
      return Unusable(group_, c.name, word);
    }
    HubRank& me = hub_->ranks[group_.rank];
    me.input = c.input;
    me.output = c.output;
    me.call = &c;
    const absl::Time deadline = absl::Now() + group_.options.timeout;
    SUBSTRAX_RETURN_IF_ERROR(Arrive(c.name, deadline));
    if (absl::Status desync = CheckSameCall(c, deadline); !desync.ok()) return desync;
    Work(c);
    return Arrive(c.name, absl::InfiniteFuture());
  }

 private:
  // One barrier. With a finite deadline it may fail (and then this rank's arrival is taken back,
  // unless the barrier completed meanwhile); with none it waits until every rank arrives.
  absl::Status Arrive(const char* op, absl::Time deadline) {
    const uint64_t barrier = barriers_++;
    const uint64_t target = static_cast<uint64_t>(group_.size()) * (barrier + 1);
    hub_->ranks[group_.rank].entered.store(barrier + 1, std::memory_order_relaxed);
    hub_->arrivals.fetch_add(1, std::memory_order_acq_rel);
    Backoff backoff;
    while (hub_->arrivals.load(std::memory_order_acquire) < target) {
      if (!backoff.Pause() || deadline == absl::InfiniteFuture()) continue;
      absl::Status status = Check(op, barrier + 1, deadline);
      if (status.ok()) continue;
      uint64_t seen = hub_->arrivals.load(std::memory_order_acquire);
      while (seen < target) {
        if (hub_->arrivals.compare_exchange_weak(seen, seen - 1, std::memory_order_acq_rel)) {
          uint64_t none = 0;
          hub_->abort.compare_exchange_strong(none, EncodeAbort(group_.rank, status.code()));
          return status;
        }
      }
      break;  // everyone arrived after all: run the collective
    }
    return absl::OkStatus();
  }

  // Why the barrier cannot complete, if it cannot: a peer failed first, left, or time is up.
  absl::Status Check(const char* op, uint64_t entered, absl::Time deadline) const {
    std::vector<int> missing;
    for (int r = 0; r < group_.size(); ++r) {
      if (hub_->ranks[r].entered.load(std::memory_order_relaxed) < entered) missing.push_back(r);
    }
    if (uint64_t word = hub_->abort.load(std::memory_order_acquire); word != 0) {
      int rank = 0;
      absl::StatusCode code;
      DecodeAbort(word, &rank, &code);
      return group_.Aborted(op, code, rank, missing);
    }
    for (int r : missing) {
      if (hub_->ranks[r].left.load(std::memory_order_acquire)) return group_.Left(op, r);
    }
    if (absl::Now() >= deadline) return group_.Timeout(op, missing);
    return absl::OkStatus();
  }

  // After the arrival barrier: whether every rank called the same collective (kind, type,
  // count, operation, root). If not, the ranks are desynced (one skipped a collective or called
  // another): no rank touches the others' buffers, each waits out the collective's timeout as
  // for a hang (so that the job's hang attribution, which compares every rank's counts, names
  // the odd rank), and the group is unusable from then on.
  absl::Status CheckSameCall(const Collective& c, absl::Time deadline) {
    bool same = true;
    for (int r = 0; r < group_.size() && same; ++r) {
      const Collective& o = *hub_->ranks[r].call;
      same = o.kind == c.kind && o.type == c.type && o.count == c.count && o.op == c.op &&
             o.root == c.root;
    }
    if (same) return absl::OkStatus();
    // Only now the message (this runs at every collective).
    std::string calls;
    for (int r = 0; r < group_.size(); ++r) {
      const Collective& o = *hub_->ranks[r].call;
      absl::StrAppend(&calls, r == 0 ? "" : ", ", group_.Describe(r), " called ", o.name, " of ",
                      o.count, " ", DataTypeName(o.type), " values");
    }
    uint64_t none = 0;
    hub_->abort.compare_exchange_strong(
        none, EncodeAbort(group_.rank, absl::StatusCode::kDeadlineExceeded));
    absl::SleepFor(deadline - absl::Now());
    return absl::DeadlineExceededError(
        absl::StrCat(group_.Where(c.name), "desync: the ranks called different collectives (",
                     calls, ")"));
  }

  // This rank's share of the collective, between the two barriers.
  void Work(const Collective& c) {
    const int n = group_.size(), me = group_.rank;
    const size_t es = DataTypeSize(c.type);
    const size_t tile = kScratchBytes / es;
    const auto in = [&](int r, size_t element) {
      return static_cast<const char*>(hub_->ranks[r].input) + element * es;
    };
    const auto out = [&](int r, size_t element) {
      return static_cast<char*>(hub_->ranks[r].output) + element * es;
    };
    switch (c.kind) {
      case Kind::kAllReduce: {
        // Block `me` of every rank's buffer: summed in rank order, written back to all.
        const Range block = BlockOf(c.count, n, me, kGranule);
        for (size_t at = block.begin; at < block.end; at += tile) {
          const size_t len = std::min(tile, block.end - at);
          for (int r = 0; r < n; ++r) srcs_[r] = in(r, at);
          ReduceInOrder(c.type, c.op, srcs_.data(), n, scratch_.data(), len);
          for (int r = 0; r < n; ++r) std::memcpy(out(r, at), scratch_.data(), len * es);
        }
        break;
      }
      case Kind::kReduceScatter:
        // Block `me` of every rank's input, summed into this rank's output (through the scratch:
        // the output may be the input's block `me`, in place).
        for (size_t at = 0; at < c.count; at += tile) {
          const size_t len = std::min(tile, c.count - at);
          for (int r = 0; r < n; ++r) srcs_[r] = in(r, me * c.count + at);
          ReduceInOrder(c.type, c.op, srcs_.data(), n, scratch_.data(), len);
          std::memcpy(out(me, at), scratch_.data(), len * es);
        }
        break;
      case Kind::kAllGather:
        // Every rank fills its own output; an in-place input is already where it belongs.
        for (int r = 0; r < n; ++r) {
          if (in(r, 0) != out(me, r * c.count)) {
            std::memcpy(out(me, r * c.count), in(r, 0), c.count * es);
          }
        }
        break;
      case Kind::kBroadcast:
        if (me != c.root) std::memcpy(out(me, 0), in(c.root, 0), c.count * es);
        break;
      case Kind::kBarrier:
        break;
    }
  }

  const std::shared_ptr<Hub> hub_;
  uint64_t barriers_ = 0;
  std::vector<const void*> srcs_;
  std::vector<double> scratch_;  // doubles: aligned for either type
};

}  // namespace

absl::StatusOr<std::unique_ptr<ShmCommunicator::Impl>> ConnectInProcess(Group group,
                                                                        Store* store) {
  const std::string who = group.Connecting("in-process");
  std::shared_ptr<Hub> hub;
  if (group.rank == 0) {
    hub = std::make_shared<Hub>(group.size(), RandomId());
    Registry::Get().Add(hub->id(), hub);
    SUBSTRAX_RETURN_IF_ERROR(
        Annotate(store->Set(kHubKey, absl::StrCat(getpid(), " ", hub->id())), who));
  } else {
    absl::StatusOr<std::string> value = store->Get(kHubKey, group.options.connect_timeout);
    if (!value.ok()) return Annotate(value.status(), absl::StrCat(who, ": waiting for rank 0"));
    std::pair<std::string, std::string> fields = absl::StrSplit(*value, ' ');
    int64_t pid = 0;
    if (!absl::SimpleAtoi(fields.first, &pid) || pid != getpid()) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": rank 0's hub is in process ", fields.first, ", not this one (", getpid(),
          "); the ranks' process indices say they share a process"));
    }
    hub = Registry::Get().Find(fields.second);
    if (hub == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(who, ": rank 0's hub ", fields.second,
                       " is gone (rank 0's communicator was destroyed before this rank joined, "
                       "or the store holds a key of an earlier group)"));
    }
  }
  hub->ranks[group.rank].attached.store(true, std::memory_order_release);
  SUBSTRAX_RETURN_IF_ERROR(AwaitAllAttached(group, who, [&](int r) {
    return hub->ranks[r].attached.load(std::memory_order_acquire);
  }));
  Registry::Get().Remove(hub->id());  // every rank holds it now
  return std::unique_ptr<ShmCommunicator::Impl>(new InProcessImpl(std::move(group), hub));
}

}  // namespace substrax::shm
