// RunAssignment: the runner process of one job attempt on one worker (`substrax-worker run`):
// the built-in trainer as a program on the SDK (worker/sdk). It trains its part of the job with
// the coordinator's store for rendezvous, sends every device's step reports to the coordinator,
// and writes how it ended to a result file that the worker daemon reports (the daemon is the one that reports attempt status: it also sees
// runners that crash before they can write anything).
#ifndef SUBSTRAX_WORKER_DAEMON_RUNNER_H_
#define SUBSTRAX_WORKER_DAEMON_RUNNER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/mesh.h"
#include "rpc/transport.h"
#include "substrax/v1/coordinator_service.pb.h"

namespace substrax {

struct RunnerOptions {
  // host:port of the coordinator, and how to reach it (the daemon's own credentials).
  std::string coordinator;
  TransportOptions transport;
  // Address peers reach this runner on (Gloo, peer monitor).
  std::string listen_host = "127.0.0.1";
  // Where the outcome is written (a serialized v1::ReportAttemptStatusRequest).
  std::string result_path;
  absl::Duration collective_timeout = absl::Seconds(30);
  // The daemon's data roots (absolute, normalized): the only directories data files are read
  // from (worker/data/safe_open.h). None: no data files, synthetic data only.
  std::vector<std::string> data_roots;
  // The daemon's checkpoint roots: a job's checkpoint directory and resume_from must lie
  // beneath one (worker/runtime/checkpointing.h). None: no checkpoints.
  std::vector<std::string> checkpoint_roots;
};

// Trains the assignment. Errors: whatever training returns (also written to the result file).
absl::Status RunAssignment(const v1::Assignment& assignment, const RunnerOptions& options);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_DAEMON_RUNNER_H_
