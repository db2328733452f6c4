// The devices of one process, each on its own thread: the one fan-out behind
// substrax::Program::RunOnDevices (worker/sdk) and Train (trainer.h). Per device it connects the
// communicators (device_connections.h), builds the device's context and runs the caller's
// function; it watches the job's other processes (the peer monitor), pins the threads where
// asked, and names the device and process in a failure.
#ifndef SUBSTRAX_WORKER_RUNTIME_LOCAL_DEVICES_H_
#define SUBSTRAX_WORKER_RUNTIME_LOCAL_DEVICES_H_

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "substrax/spmd.h"
#include "worker/runtime/device_connections.h"

namespace substrax {

class Checkpointer;

struct LocalDeviceOptions {
  // Each device thread (and the threads it starts: its input pipeline) on its own CPU, the i-th
  // this process may use, when there are at least as many as devices (a line on stderr says
  // which); otherwise unpinned. For a process that has the host to itself (`substrax-job
  // train`): processes that share a host would pin their first devices to the same CPUs.
  bool pin_device_threads = false;
  // The process's checkpoint writer (checkpointing.h), flushed once every device has returned:
  // a run has not succeeded before its last checkpoint is committed. Null: none.
  Checkpointer* checkpoints = nullptr;
};

// The ids of the mesh devices process `process_index` drives, in mesh order.
std::vector<int> LocalDeviceIds(const Mesh& mesh, const std::vector<int>& process_of_position,
                                int process_index);

// The CPUs this process may run on, in order (empty when the kernel does not say).
std::vector<int> AllowedCpus();

// Runs `fn` once per device this process drives (options.process_index), each on its own thread
// with that device's context and connected communicators, and waits for all of them. When a
// device's `fn` fails the others are not stopped: a device blocked in a collective with it gets
// the collective's error (a peer that left, or the collective timeout).
// Errors: the first failing device's error (in mesh order), annotated with the device and the
// process; UNAVAILABLE / DEADLINE_EXCEEDED when the communicators or the peer monitor cannot
// connect (a peer process died or never came); INVALID_ARGUMENT when the process drives no
// device of the mesh; after training, the checkpoint writer's (a checkpoint not written).
absl::Status RunOnLocalDevices(const ConnectionOptions& options,
                               const LocalDeviceOptions& local_options,
                               const std::function<absl::Status(DeviceContext&)>& fn);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_LOCAL_DEVICES_H_
