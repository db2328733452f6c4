// CpuGroupConnector: how the groups of a mesh of CPU devices connect, chosen per group from where
// its members are:
//
//   every member on one host     the local factory's communicator (shared memory once it is
//                                ShmCommunicator; see LocalFactory), a group of one rank too;
//   every member on its own host flat Gloo over TCP, as GlooGroupConnector;
//   otherwise                    HierarchicalCommunicator (hierarchical_communicator.h): the
//                                local factory inside each host, Gloo between the hosts' leaders,
//                                and a flat Gloo communicator over every rank for the collectives
//                                other than all-reduce.
//
// CpuCollectives::kGloo makes every group flat Gloo (the comparison baseline, and a way out if
// the other paths misbehave).
//
// Store keys: a flat group rendezvouses under the group's prefix, as GlooGroupConnector; the
// others under "<prefix>/local/<host index>", "<prefix>/leaders" and "<prefix>/all". Every
// member connects its parts in the same order (local, then leaders if it leads its host, then
// all), so no two parts wait on each other.
//
// For each group it connects, the connector logs one line, from the group's first rank in this
// process: "collectives: world (4 ranks): hierarchical: 2 hosts (shared memory inside a host,
// Gloo between hosts)". The description of what runs inside a host is the factory's.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_CPU_GROUP_CONNECTOR_H_
#define SUBSTRAX_WORKER_COLLECTIVES_CPU_GROUP_CONNECTOR_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/gloo_communicator.h"
#include "worker/collectives/hierarchical_communicator.h"
#include "worker/collectives/mesh_communicators.h"
#include "worker/collectives/peer_monitor.h"
#include "worker/collectives/store.h"

namespace substrax {

// Which collectives CPU devices use (substrax-job train --cpu-collectives).
enum class CpuCollectives {
  kAuto,  // per group, as the header comment says
  kGloo,  // flat Gloo for every group
};

// "auto" or "gloo".
const char* CpuCollectivesName(CpuCollectives collectives);
// Errors: INVALID_ARGUMENT naming the accepted values.
absl::StatusOr<CpuCollectives> ParseCpuCollectives(absl::string_view name);

// What a local factory is asked for, besides the store, ranks and monitor. The fields are those
// of ShmCommunicatorOptions, in its order, so that ShmCommunicatorOptions{o.name, o.timeout,
// o.connect_timeout} converts one.
struct LocalCommunicatorOptions {
  // "world", "axis 'data' group 0", "world inside host a".
  std::string name;
  absl::Duration timeout;
  absl::Duration connect_timeout;
};

// Makes the communicator of ranks that are all on this host: rank `rank` of ranks.size(),
// rendezvousing through `store` (already prefixed for this communicator; it must outlive the
// call only); `monitor` (may be null) outlives the communicator. The shape of
// ShmCommunicator::Create and GlooCommunicator::Create.
using LocalCommunicatorCreate = std::function<absl::StatusOr<std::unique_ptr<Communicator>>(
    const LocalCommunicatorOptions& options, Store* store, int rank, std::vector<RankInfo> ranks,
    const PeerMonitor* monitor)>;

struct LocalFactory {
  // What the communicators it makes run on, for the connector's log line: "shared memory",
  // "Gloo".
  std::string description;
  LocalCommunicatorCreate create;
};

// Gloo over TCP between the ranks of a host, listening on `listen_host`.
LocalFactory GlooLocalFactory(const std::string& listen_host);

struct CpuGroupConnectorOptions {
  // Every Gloo communicator's options (timeouts, listen host); the local factory gets the same
  // timeouts. `name` is ignored: each communicator is named after its group.
  GlooCommunicatorOptions gloo;
  CpuCollectives collectives = CpuCollectives::kAuto;
  // Used by kAuto; must be set then.
  LocalFactory local;
  // Where the per-group line goes; null: stderr.
  std::function<void(const std::string&)> log;
};

class CpuGroupConnector final : public GroupConnector {
 public:
  // `process_of_position[i]` is the process that drives mesh position i. `store` and `monitor`
  // (may be null: one process) must outlive the connector. Errors (of Connect*):
  // INVALID_ARGUMENT when the process table does not cover the group or kAuto has no local
  // factory; whatever connecting a part returns, naming the group.
  CpuGroupConnector(CpuGroupConnectorOptions options, Store* store,
                    std::vector<int> process_of_position, const PeerMonitor* monitor)
      : options_(std::move(options)),
        store_(store),
        process_of_position_(std::move(process_of_position)),
        monitor_(monitor) {}

  absl::StatusOr<std::unique_ptr<Communicator>> ConnectWorld(
      const CommunicatorGroup& world) override;
  // The world is not needed: each group connects on its own.
  absl::StatusOr<std::unique_ptr<Communicator>> ConnectAxis(
      Communicator& world, const CommunicatorGroup& group) override;

 private:
  // A Gloo communicator named `name` over `ranks` under `prefix`.
  absl::StatusOr<std::unique_ptr<Communicator>> Gloo(const std::string& name,
                                                     const std::string& prefix, int rank,
                                                     std::vector<RankInfo> ranks) const;
  // The local factory's communicator named `name` over `ranks` under `prefix`.
  absl::StatusOr<std::unique_ptr<Communicator>> Local(const std::string& name,
                                                      const std::string& prefix, int rank,
                                                      std::vector<RankInfo> ranks) const;
  absl::StatusOr<std::unique_ptr<Communicator>> Hierarchical(
      const CommunicatorGroup& group, const std::vector<std::string>& host_of_rank,
      const HostTopology& topology, const std::vector<RankInfo>& ranks);
  // Logs `path` for `group` once per process: from the group's first rank in this process.
  void Log(const CommunicatorGroup& group, const std::string& path) const;

  const CpuGroupConnectorOptions options_;
  Store* const store_;
  const std::vector<int> process_of_position_;
  const PeerMonitor* const monitor_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_CPU_GROUP_CONNECTOR_H_
