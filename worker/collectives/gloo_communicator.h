// GlooCommunicator: Communicator over Gloo's TCP transport, for CPU devices.
//
// Each communicator is one Gloo context connected as a full mesh through a Store (give each
// communicator its own key prefix). Collectives run Gloo's ring algorithms; tags come from a
// per-communicator counter, so every rank's n-th collective matches the others' n-th.
// Failures go through TranslateGlooError with the process's PeerMonitor, so a dead peer is
// named as such on every surviving rank.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_GLOO_COMMUNICATOR_H_
#define SUBSTRAX_WORKER_COLLECTIVES_GLOO_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/gloo_errors.h"
#include "worker/collectives/mesh_communicators.h"
#include "worker/collectives/peer_monitor.h"
#include "worker/collectives/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace substrax {

struct GlooCommunicatorOptions {
  // Name used in messages ("world", "axis 'data' group 0").
  std::string name = "world";
  // Every collective must finish within this time. After it, a collective fails with
  // DEADLINE_EXCEEDED (or UNAVAILABLE when a peer is known to be dead).
  absl::Duration timeout = absl::Seconds(30);
  // How long connecting to every peer may take at creation.
  absl::Duration connect_timeout = absl::Seconds(60);
  // Address this rank listens on for its peers: an IP address or host name reachable by them.
  std::string listen_host = "127.0.0.1";
  // How long a failed collective waits for the peer monitor to see a death before reporting a
  // broken connection without a culprit (the monitor and Gloo see the same closed sockets at
  // nearly the same time).
  absl::Duration death_grace = absl::Seconds(1);
};

// Who a rank is, for messages.
struct RankInfo {
  int process_index = 0;
  std::string description;  // "device 2 (cpu:2 on host-b)"
  // Who runs the process, for messages: "worker w-2 (host b)"; may be empty.
  std::string process_name;
};

// Each member of `group` as a RankInfo: its process from `process_of_position` (indexed by mesh
// position), its device, and "worker W (host H)" when the device has a worker. Errors:
// INVALID_ARGUMENT when the table has no entry for a member's position.
absl::StatusOr<std::vector<RankInfo>> RanksOfGroup(const CommunicatorGroup& group,
                                                   const std::vector<int>& process_of_position);

class GlooCommunicator final : public Communicator {
 public:
  // Connects rank `rank` of a group of ranks.size() ranks through `store` (which must outlive
  // the call only). `monitor` (may be null) must outlive the communicator.
  // Errors: INVALID_ARGUMENT (rank out of range), UNAVAILABLE or DEADLINE_EXCEEDED (peers could
  // not be reached in connect_timeout; the message names the communicator and rank).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      const GlooCommunicatorOptions& options, Store* store, int rank,
      std::vector<RankInfo> ranks, const PeerMonitor* monitor);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::string& name() const override { return options_.name; }

 protected:
  // Gloo's algorithms run on the calling thread: each returns an event that is already done.
  // The context must be the calling thread (a CUDA stream is INVALID_ARGUMENT).
  CollectiveEvent DoAllReduce(void* data, DataType type, size_t count, ReduceOp op,
                              ExecutionContext context) override;
  CollectiveEvent DoAllGather(const void* input, void* output, DataType type, size_t count,
                              ExecutionContext context) override;
  CollectiveEvent DoBroadcast(void* data, DataType type, size_t count, int root,
                              ExecutionContext context) override;
  // This Gloo (0.5, Debian 12) has no reduce-scatter with tags and timeouts: an all-reduce of
  // the whole input, keeping this rank's block. Correct, with the same error model, but it moves
  // the bytes of a full all-reduce (twice those of a true reduce-scatter).
  CollectiveEvent DoReduceScatter(const void* input, void* output, DataType type, size_t count,
                                  ReduceOp op, ExecutionContext context) override;
  CollectiveEvent DoBarrier(ExecutionContext context) override;

 private:
  GlooCommunicator(const GlooCommunicatorOptions& options, int rank, std::vector<RankInfo> ranks,
                   const PeerMonitor* monitor);
  template <typename T>
  absl::Status AllReduceImpl(T* data, size_t count, ReduceOp op);
  absl::Status AllReduceTyped(void* data, DataType type, size_t count, ReduceOp op);
  // Runs one Gloo operation, translating whatever it throws.
  template <typename Fn>
  absl::Status Run(const char* op, Fn&& fn);
  // INVALID_ARGUMENT for a CUDA stream: Gloo moves host memory only.
  absl::Status CheckHost(const char* op, ExecutionContext context) const;
  uint32_t NextTag() { return next_tag_++; }

  const GlooCommunicatorOptions options_;
  const int rank_;
  const std::vector<RankInfo> ranks_;
  const PeerMonitor* const monitor_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t next_tag_ = 0;
  // Set after a collective fails: Gloo's context is not usable afterwards.
  absl::Status broken_;
};

// Connects the groups of a mesh with Gloo: each group is its own Gloo context, rendezvousing
// under its own prefix of `store`.
class GlooGroupConnector final : public GroupConnector {
 public:
  // `process_of_position[i]` is the process that drives mesh position i (for messages that name
  // a dead peer). `store` and `monitor` (may be null: one process) must outlive the connector.
  // Errors (of Connect*): INVALID_ARGUMENT when the process table does not cover the group.
  GlooGroupConnector(GlooCommunicatorOptions options, Store* store,
                     std::vector<int> process_of_position, const PeerMonitor* monitor)
      : options_(std::move(options)),
        store_(store),
        process_of_position_(std::move(process_of_position)),
        monitor_(monitor) {}

  absl::StatusOr<std::unique_ptr<Communicator>> ConnectWorld(
      const CommunicatorGroup& world) override;
  absl::StatusOr<std::unique_ptr<Communicator>> ConnectAxis(
      Communicator& world, const CommunicatorGroup& group) override;

 private:
  const GlooCommunicatorOptions options_;
  Store* const store_;
  const std::vector<int> process_of_position_;
  const PeerMonitor* const monitor_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_GLOO_COMMUNICATOR_H_
