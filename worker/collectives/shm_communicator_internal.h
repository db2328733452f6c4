// What the two modes of ShmCommunicator (shm_in_process.cc, shm_cross_process.cc) share: the
// collective being run, the group for messages, waiting with back-off, and splitting a range
// into blocks. Not for use outside ShmCommunicator.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_SHM_COMMUNICATOR_INTERNAL_H_
#define SUBSTRAX_WORKER_COLLECTIVES_SHM_COMMUNICATOR_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collectives/shm_communicator.h"

namespace substrax::shm {

enum class Kind { kAllReduce, kAllGather, kBroadcast, kReduceScatter, kBarrier };

// One collective call, arguments already checked by Communicator. All-reduce and broadcast are
// in place (input == output); count is per rank as in communicator.h.
struct Collective {
  Kind kind = Kind::kBarrier;
  const char* name = "barrier";
  const void* input = nullptr;
  void* output = nullptr;
  DataType type = DataType::kFloat32;
  size_t count = 0;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
};

// The group as this rank sees it, and the messages that name its ranks.
struct Group {
  ShmCommunicatorOptions options;
  int rank = 0;
  std::vector<RankInfo> ranks;
  const PeerMonitor* monitor = nullptr;

  int size() const { return static_cast<int>(ranks.size()); }
  // "rank 1 (device 1, worker w-1 (host b))".
  std::string Describe(int r) const;
  // "all_reduce on shared-memory communicator 'world' (rank 0 of 2, device 0) failed: ".
  std::string Where(const char* op) const;
  // "connecting shared-memory communicator 'world' (rank 0 of 2, device 0, in-process)".
  std::string Connecting(const char* mode) const;
  // DEADLINE_EXCEEDED naming the ranks that had not arrived.
  absl::Status Timeout(const char* op, const std::vector<int>& missing) const;
  // UNAVAILABLE: rank `r` destroyed its communicator while this one waited for it.
  absl::Status Left(const char* op, int r) const;
  // `code`: rank `r` failed this collective first (the group is broken for everyone).
  absl::Status Aborted(const char* op, absl::StatusCode code, int r,
                       const std::vector<int>& missing) const;
  // UNAVAILABLE naming every process of this group the monitor has seen die; OK when none (or
  // no monitor).
  absl::Status DeadPeers(const char* op) const;
};

// Waiting for a peer on a machine that may have fewer cores than busy threads: spin a few
// microseconds (a peer that is running answers within that), then yield for up to 2 ms (a
// peer a little behind arrives within that, and the yields give the core to any other thread
// that wants it), then sleep with a back-off capped well below a millisecond.
class Backoff {
 public:
  // Waits a little. True once past the spinning phase: time for the caller's slow checks
  // (deadline, peers gone), which would cost more than the spin itself.
  bool Pause();
  void Reset() {
    rounds_ = 0;
    sleeps_ = 0;
  }

 private:
  int rounds_ = 0;
  int sleeps_ = 0;
  absl::Time yield_until_;
};

// The abort word (in-process hub or segment): 0, or the first failing rank and its code.
uint64_t EncodeAbort(int rank, absl::StatusCode code);
void DecodeAbort(uint64_t word, int* rank, absl::StatusCode* code);
// FAILED_PRECONDITION for a collective called after the group broke.
absl::Status Unusable(const Group& group, const char* op, uint64_t abort_word);

// Elements [begin, end) of part `part` of `count` split into `parts`: equal parts in units of
// `granule` elements (64-byte lines for float32 with 16), the remainder spread one unit at a
// time over the first parts, the odd tail to the last. Deterministic: every rank computes the
// same split.
struct Range {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};
Range BlockOf(size_t count, int parts, int part, size_t granule);

// Waits until attached(r) holds for every rank r (each rank sets its own flag when it has joined),
// or the connect timeout passes: DEADLINE_EXCEEDED, prefixed with `who`, naming the missing.
absl::Status AwaitAllAttached(const Group& group, const std::string& who,
                              const std::function<bool(int)>& attached);

// 128 random bits as 32 hex digits: names that no other communicator picks.
std::string RandomId();

}  // namespace substrax::shm

namespace substrax {

class ShmCommunicator::Impl {
 public:
  explicit Impl(shm::Group group) : group_(std::move(group)) {}
  virtual ~Impl() = default;

  virtual bool in_process() const = 0;
  const shm::Group& group() const { return group_; }

  // Checks the context and whether the group is still usable, runs `c` and remembers a failure.
  absl::Status Execute(const shm::Collective& c, ExecutionContext context);

 protected:
  // Runs `c` with every rank of the group; errors as shm_communicator.h describes.
  virtual absl::Status Run(const shm::Collective& c) = 0;

  const shm::Group group_;

 private:
  absl::Status broken_;
};

namespace shm {
// The two modes' connection steps (Create has checked the rank and options).
absl::StatusOr<std::unique_ptr<ShmCommunicator::Impl>> ConnectInProcess(Group group,
                                                                        Store* store);
absl::StatusOr<std::unique_ptr<ShmCommunicator::Impl>> ConnectCrossProcess(Group group,
                                                                           Store* store);
}  // namespace shm

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_SHM_COMMUNICATOR_INTERNAL_H_
