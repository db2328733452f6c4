#include "worker/runtime/local_devices.h"

#include <pthread.h>
#include <sched.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "contract/activity.h"
#include "core/status.h"
#include "worker/runtime/checkpointing.h"
#include "worker/runtime/preemption.h"

namespace substrax {
namespace {

// One CPU per device thread, or none when there are fewer CPUs than device threads.
std::vector<int> CpusForDeviceThreads(size_t device_threads) {
  std::vector<int> cpus = AllowedCpus();
  if (cpus.size() < device_threads) return {};
  cpus.resize(device_threads);
  return cpus;
}

void PinCallingThread(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  // Best effort: a thread that cannot be pinned still runs, only less predictably.
  (void)pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
}

}  // namespace

std::vector<int> LocalDeviceIds(const Mesh& mesh, const std::vector<int>& process_of_position,
                                int process_index) {
  std::vector<int> local;
  for (int64_t i = 0; i < mesh.size() && i < static_cast<int64_t>(process_of_position.size());
       ++i) {
    if (process_of_position[i] == process_index) local.push_back(mesh.devices()[i].id);
  }
  return local;
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

absl::Status RunOnLocalDevices(const ConnectionOptions& options,
                               const LocalDeviceOptions& local_options,
                               const std::function<absl::Status(DeviceContext&)>& fn) {
  const Mesh& mesh = *options.mesh;
  const std::vector<int> local =
      LocalDeviceIds(mesh, *options.process_of_position, options.process_index);
  if (local.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "process ", options.process_index, " drives no device of mesh ", mesh.ShapeString()));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<PeerMonitor> monitor, StartPeerMonitor(options));
  const std::vector<int> cpus =
      local_options.pin_device_threads ? CpusForDeviceThreads(local.size()) : std::vector<int>();
  if (!cpus.empty()) {
    std::fprintf(stderr, "device threads pinned to CPUs %s\n", absl::StrJoin(cpus, ", ").c_str());
  }
  std::vector<absl::Status> results(local.size());
  std::vector<std::thread> device_threads;
  for (size_t i = 0; i < local.size(); ++i) {
    device_threads.emplace_back([&, i] {
      // Before anything else, so that the threads the device starts (its input pipeline) share
      // its CPU and leave the other devices' alone.
      if (!cpus.empty()) PinCallingThread(cpus[i]);
      // The communicators this thread uses count for this device in the activity file.
      SetThreadActivityDevice(local[i]);
      absl::StatusOr<std::unique_ptr<DeviceConnection>> connection =
          DeviceConnection::Connect(options, local[i], monitor.get());
      if (!connection.ok()) {
        results[i] = Annotate(connection.status(), "connecting the device to the mesh");
        return;
      }
      DeviceContext ctx;
      ctx.mesh = &mesh;
      ctx.coords = *mesh.CoordinatesOf(local[i]);
      ctx.device = mesh.DeviceAt(ctx.coords);
      ctx.comms = &(*connection)->comms();
      results[i] = fn(ctx);
    });
  }
  for (std::thread& t : device_threads) t.join();
  // The run has not succeeded until its last checkpoint is committed.
  const absl::Status flushed = local_options.checkpoints != nullptr
                                   ? local_options.checkpoints->Flush()
                                   : absl::OkStatus();
  for (size_t i = 0; i < results.size(); ++i) {
    // Every device stopped after the same step; its final checkpoint is what the stop promised.
    if (IsStoppedBySigterm(results[i])) {
      return flushed.ok() ? results[i]
                          : Annotate(flushed, absl::StrCat("stopping on SIGTERM: ",
                                                           "the final checkpoint failed"));
    }
    if (!results[i].ok()) {
      const Device& d = mesh.DeviceAt(*mesh.CoordinatesOf(local[i]));
      return Annotate(results[i], absl::StrCat(d.ToString(), ", process ", options.process_index));
    }
  }
  return flushed;
}

}  // namespace substrax
