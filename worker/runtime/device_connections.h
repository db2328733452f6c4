// How the devices of one process of a job connect to every device of the mesh: the liveness
// monitor of the job's processes, and per device its communicators (CPU devices: per group, a
// host-local communicator, flat Gloo or hierarchical, see cpu_group_connector.h; NCCL between
// GPUs), told at once when a peer process dies. Shared by the built-in trainer and
// the SDK (substrax::Program::RunOnDevices), so a user's program gets exactly the runner's
// connections.
#ifndef SUBSTRAX_WORKER_RUNTIME_DEVICE_CONNECTIONS_H_
#define SUBSTRAX_WORKER_RUNTIME_DEVICE_CONNECTIONS_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/mesh.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/cpu_group_connector.h"
#include "worker/collectives/mesh_communicators.h"
#include "worker/collectives/peer_monitor.h"
#include "worker/collectives/store.h"

namespace substrax {

struct ConnectionOptions {
  // The job's mesh and, for each mesh position, the process that drives that device; both must
  // outlive the connections.
  const Mesh* mesh = nullptr;
  const std::vector<int>* process_of_position = nullptr;
  int process_index = 0;
  // The attempt's rendezvous store; must outlive the connections.
  Store* store = nullptr;
  // Address peers reach this process on (Gloo and the peer monitor).
  std::string listen_host = "127.0.0.1";
  // Every collective must finish within this time: a dead peer becomes an error, not a hang.
  absl::Duration collective_timeout = absl::Seconds(30);
  // Connecting to every peer at start may take this long.
  absl::Duration connect_timeout = absl::Seconds(60);
  // How CPU devices' groups connect (cpu_group_connector.h); ignored for GPUs.
  CpuCollectives cpu_collectives = CpuCollectives::kAuto;
};

// The number of processes of the job (1 + the largest index in the process table).
int NumProcesses(const std::vector<int>& process_of_position);

// The liveness monitor of this process's peers, or null when the job has one process.
// Errors: those of PeerMonitor::Start (UNAVAILABLE / DEADLINE_EXCEEDED when a peer never came).
absl::StatusOr<std::unique_ptr<PeerMonitor>> StartPeerMonitor(const ConnectionOptions& options);

// One device's communicators, connected to every device of the mesh. Not thread-safe: the
// device's thread owns it.
class DeviceConnection {
 public:
  // Connects device `device_id` (one this process drives). `monitor` may be null (one process)
  // and must outlive the connection. Errors: those of MeshCommunicators::Create (UNAVAILABLE /
  // DEADLINE_EXCEEDED naming the peer that did not connect).
  static absl::StatusOr<std::unique_ptr<DeviceConnection>> Connect(const ConnectionOptions& options,
                                                                   int device_id,
                                                                   const PeerMonitor* monitor);
  ~DeviceConnection();

  MeshCommunicators& comms() { return *comms_; }

 private:
  DeviceConnection() = default;

  std::unique_ptr<GroupConnector> connector_;
  std::unique_ptr<MeshCommunicators> comms_;
  // Forwards the first peer death the monitor sees to the communicators.
  absl::Notification done_;
  std::thread death_forwarder_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_DEVICE_CONNECTIONS_H_
