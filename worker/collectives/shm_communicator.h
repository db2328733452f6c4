// ShmCommunicator: Communicator for ranks on one host, through shared memory (no sockets).
//
// Two modes, chosen at Create from the ranks' process indices:
//   - in-process (every rank in this process): the ranks meet in a process-local hub and read
//     and write each other's buffers directly. An all-reduce is a reduce-scatter (rank r sums
//     block r of every rank's buffer, in rank order 0..n-1) followed by an all-gather (rank r
//     writes its summed block into every rank's buffer): no copies beyond those two.
//   - cross-process (ranks in several processes of this host): rank 0 creates a POSIX
//     shared-memory segment (shm_open) holding the control words and one staging slot per rank;
//     its name goes to the others through the store, and it is unlinked as soon as every rank has
//     mapped it (nothing is left in /dev/shm, whatever happens later). Collectives larger than a
//     slot go through it in pieces.
//
// Sums are taken in rank order on every rank and in both modes, so results are bitwise
// reproducible run to run and equal on every rank; kMean multiplies the sum by 1/size(), as
// GlooCommunicator does.
//
// Same contract as every Communicator (communicator.h): the calling thread runs the collective;
// every collective has the options' timeout (DEADLINE_EXCEEDED naming the communicator and the
// ranks that had not arrived); a rank whose communicator is destroyed while others wait for it,
// or whose process the PeerMonitor reports dead, makes them fail with UNAVAILABLE naming it
// (RankInfo::description, process_name); after a failure every later collective is
// FAILED_PRECONDITION. A CUDA stream context is INVALID_ARGUMENT (host memory only).
#ifndef SUBSTRAX_WORKER_COLLECTIVES_SHM_COMMUNICATOR_H_
#define SUBSTRAX_WORKER_COLLECTIVES_SHM_COMMUNICATOR_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/gloo_communicator.h"
#include "worker/collectives/peer_monitor.h"
#include "worker/collectives/store.h"

namespace substrax {

// Cross-process mode: which stores a rank's copies into the segment use, where its peers read
// them (shm_write_tuner.h says why both exist).
enum class ShmWrites {
  kAuto,       // the faster of the two, measured as the ranks run (rank 0 decides for all)
  kCached,     // ordinary stores: the peers read the lines from this core's caches
  kStreaming,  // non-temporal stores: the lines go to memory, where the peers read them
};

struct ShmCommunicatorOptions {
  // Name used in messages ("world", "axis 'data' group 0").
  std::string name = "world";
  // Every collective must finish within this time.
  absl::Duration timeout = absl::Seconds(30);
  // How long meeting every rank may take at creation.
  absl::Duration connect_timeout = absl::Seconds(60);
  // Cross-process mode: bytes of each rank's staging slot in the segment (a multiple of 64, at
  // least 4096 and 256 per rank). Collectives stream through it in chunks of up to 32 KiB; at most
  // 16 chunks of it are used at once (a ring that stays in cache), so larger slots cost memory,
  // not speed; a smaller slot forces smaller chunks (the tests use 4096 to exercise wrapping).
  size_t slot_bytes = size_t{4} << 20;
  // Cross-process mode: see ShmWrites. Every rank must be given the same.
  ShmWrites writes = ShmWrites::kAuto;
};

class ShmCommunicator final : public Communicator {
 public:
  // Rank `rank` of ranks.size() ranks, all on this host, meeting through `store` (which must
  // outlive the call only; give each communicator its own key prefix). `monitor` (may be null)
  // must outlive the communicator. Errors: INVALID_ARGUMENT (rank out of range), UNAVAILABLE
  // (the segment could not be created or mapped: the message names it and the errno),
  // DEADLINE_EXCEEDED (ranks missing after connect_timeout, named).
  static absl::StatusOr<std::unique_ptr<ShmCommunicator>> Create(
      const ShmCommunicatorOptions& options, Store* store, int rank,
      std::vector<RankInfo> ranks, const PeerMonitor* monitor);
  ~ShmCommunicator() override;

  int rank() const override;
  int size() const override;
  const std::string& name() const override;
  // True when every rank is in this process (buffers are exchanged by pointer).
  bool in_process() const;

  // Opaque state of the two modes.
  class Impl;

 protected:
  CollectiveEvent DoAllReduce(void* data, DataType type, size_t count, ReduceOp op,
                              ExecutionContext context) override;
  CollectiveEvent DoAllGather(const void* input, void* output, DataType type, size_t count,
                              ExecutionContext context) override;
  CollectiveEvent DoBroadcast(void* data, DataType type, size_t count, int root,
                              ExecutionContext context) override;
  CollectiveEvent DoReduceScatter(const void* input, void* output, DataType type, size_t count,
                                  ReduceOp op, ExecutionContext context) override;
  CollectiveEvent DoBarrier(ExecutionContext context) override;

 private:
  explicit ShmCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_SHM_COMMUNICATOR_H_
