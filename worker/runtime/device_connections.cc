#include "worker/runtime/device_connections.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/collectives/cpu_group_connector.h"
#include "worker/collectives/nccl_communicator.h"
#include "worker/collectives/shm_communicator.h"

namespace substrax {
namespace {

// What connects the CPU devices of one host (a group on one host, and the inside-host level of
// a hierarchical group): shared memory, no sockets.
LocalFactory HostLocalFactory() {
  return LocalFactory{
      "shared memory",
      [](const LocalCommunicatorOptions& o, Store* store, int rank, std::vector<RankInfo> ranks,
         const PeerMonitor* monitor) -> absl::StatusOr<std::unique_ptr<Communicator>> {
        ShmCommunicatorOptions shm;
        shm.name = o.name;
        shm.timeout = o.timeout;
        shm.connect_timeout = o.connect_timeout;
        absl::StatusOr<std::unique_ptr<ShmCommunicator>> comm =
            ShmCommunicator::Create(shm, store, rank, std::move(ranks), monitor);
        if (!comm.ok()) return comm.status();
        return std::unique_ptr<Communicator>(*std::move(comm));
      }};
}

// How the devices of this job connect: NCCL between GPUs; CPU devices per group (Gloo, the host's
// local communicator, or both in levels).
std::unique_ptr<GroupConnector> MakeConnector(const ConnectionOptions& options, const Device& me,
                                              const PeerMonitor* monitor) {
  if (me.kind == DeviceKind::kCuda) {
    NcclCommunicatorOptions nccl;
    nccl.device = me.local_index;
    nccl.timeout = options.collective_timeout;
    nccl.connect_timeout = options.connect_timeout;
    return std::make_unique<NcclGroupConnector>(nccl, options.store);
  }
  CpuGroupConnectorOptions cpu;
  cpu.gloo.timeout = options.collective_timeout;
  cpu.gloo.connect_timeout = options.connect_timeout;
  cpu.gloo.listen_host = options.listen_host;
  cpu.collectives = options.cpu_collectives;
  cpu.local = HostLocalFactory();
  return std::make_unique<CpuGroupConnector>(cpu, options.store, *options.process_of_position,
                                             monitor);
}

}  // namespace

int NumProcesses(const std::vector<int>& process_of_position) {
  int num_processes = 0;
  for (int p : process_of_position) num_processes = std::max(num_processes, p + 1);
  return num_processes;
}

absl::StatusOr<std::unique_ptr<PeerMonitor>> StartPeerMonitor(const ConnectionOptions& options) {
  const int num_processes = NumProcesses(*options.process_of_position);
  if (num_processes <= 1) return std::unique_ptr<PeerMonitor>();
  PeerMonitor::Options monitor_options;
  monitor_options.process_index = options.process_index;
  monitor_options.num_processes = num_processes;
  monitor_options.listen_host = options.listen_host;
  monitor_options.connect_timeout = options.connect_timeout;
  return PeerMonitor::Start(monitor_options, options.store);
}

absl::StatusOr<std::unique_ptr<DeviceConnection>> DeviceConnection::Connect(
    const ConnectionOptions& options, int device_id, const PeerMonitor* monitor) {
  absl::StatusOr<std::vector<int64_t>> coords = options.mesh->CoordinatesOf(device_id);
  if (!coords.ok()) return coords.status();
  std::unique_ptr<DeviceConnection> connection(new DeviceConnection());
  connection->connector_ = MakeConnector(options, options.mesh->DeviceAt(*coords), monitor);
  absl::StatusOr<std::unique_ptr<MeshCommunicators>> comms =
      MeshCommunicators::Create(*options.mesh, device_id, *connection->connector_);
  if (!comms.ok()) return comms.status();
  connection->comms_ = *std::move(comms);
  if (monitor != nullptr) {
    // Backends whose collectives would wait for a dead peer until their timeout (NCCL) abort at
    // once when told.
    DeviceConnection* self = connection.get();
    connection->death_forwarder_ = std::thread([self, monitor] {
      while (!self->done_.HasBeenNotified()) {
        if (!monitor->AwaitDeath(absl::Milliseconds(100))) continue;
        const PeerMonitor::Death death = monitor->Deaths().front();
        self->comms_->PeerDied(
            absl::StrCat("process ", death.process_index, " died: ", death.reason));
        return;
      }
    });
  }
  return connection;
}

DeviceConnection::~DeviceConnection() {
  done_.Notify();
  if (death_forwarder_.joinable()) death_forwarder_.join();
}

}  // namespace substrax
