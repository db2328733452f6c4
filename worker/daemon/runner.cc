#include "worker/daemon/runner.h"

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "grpcpp/grpcpp.h"
#include "rpc/keepalive.h"
#include "rpc/proto_time.h"
#include "rpc/transport.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "worker/collectives/store.h"
#include "worker/daemon/coordinator_store.h"
#include "worker/daemon/step_reporter.h"
#include "worker/daemon/work_files.h"
#include "worker/runtime/trainer.h"

namespace substrax {
namespace {

// How long the last step reports may take to reach the coordinator before the result is written.
constexpr absl::Duration kFinalFlush = absl::Seconds(10);

// Writes the outcome for the daemon. A failure is logged (to the runner's log, which the daemon
// sends as the stderr tail) and otherwise ignored: the exit status says the rest. In particular
// a runner that trained successfully exits 0 even when its result cannot be written (a full
// disk), and the daemon reports exit status 0 as SUCCEEDED without final metrics: only a
// successful RunAssignment makes `substrax-worker run` exit 0 (see RunnerOutcome).
void WriteResult(const std::string& path, const v1::ReportAttemptStatusRequest& result) {
  absl::Status written = WriteFileAtomically(path, result.SerializeAsString());
  if (written.ok()) return;
  std::string metrics;
  for (const auto& [name, value] : result.final_metrics()) {
    absl::StrAppend(&metrics, " ", name, "=", value);
  }
  std::fprintf(stderr, "substrax runner: result not written (%s); the exit status carries it%s%s\n",
               written.ToString().c_str(), metrics.empty() ? "" : "; final metrics:",
               metrics.c_str());
  std::fflush(stderr);
}

// The StepReport of one device report.
v1::StepReport ToStepReport(const DeviceReport& r, const Mesh& mesh, int process_index) {
  v1::StepReport report;
  report.set_step(r.step);
  report.set_device_id(r.device_id);
  report.set_host(mesh.DeviceAt(*mesh.CoordinatesOf(r.device_id)).host);
  report.set_process_index(process_index);
  for (const auto& [name, value] : r.values) (*report.mutable_values())[name] = value;
  report.set_samples_per_second(r.samples_per_second);
  report.set_data_wait_seconds(r.data_wait_seconds);
  report.set_compute_seconds(r.compute_seconds);
  report.set_collective_seconds(r.collective_seconds);
  report.set_total_steps(r.total_steps);
  report.set_input_features(r.input_features);
  *report.mutable_time() = ToProtoTime(absl::Now());
  return report;
}

// Sends process 0's checkpoint report, retrying while the coordinator is unreachable (up to
// about a minute); a report that cannot be delivered is logged and training goes on: the
// checkpoint itself is committed on disk, only its listing in `get` is late.
void SendCheckpointReport(v1::CoordinatorService::StubInterface& stub,
                          const v1::ReportCheckpointsRequest& request) {
  absl::Duration backoff = absl::Milliseconds(100);
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::ReportCheckpointsResponse response;
    const grpc::Status status = stub.ReportCheckpoints(&context, request, &response);
    if (status.ok()) return;
    const bool retry = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!retry || absl::Now() + backoff > give_up) {
      std::fprintf(stderr, "substrax runner: checkpoint report not delivered: %s\n",
                   status.error_message().c_str());
      return;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

}  // namespace

std::vector<int> ProcessTable(const Mesh& mesh) {
  std::map<std::string, int> index;
  std::vector<int> table;
  for (const Device& d : mesh.devices()) {
    auto [it, inserted] = index.emplace(d.worker_id, static_cast<int>(index.size()));
    table.push_back(it->second);
  }
  return table;
}

absl::Status RunAssignment(const v1::Assignment& assignment, const RunnerOptions& options) {
  v1::ReportAttemptStatusRequest result;
  result.set_job_id(assignment.job_id());
  result.set_attempt(assignment.attempt());
  result.set_process_index(assignment.process_index());
  auto fail = [&](const absl::Status& status) {
    result.set_state(v1::RUNNER_STATE_FAILED);
    result.set_error(std::string(status.message()));
    result.set_error_code(static_cast<int32_t>(status.code()));
    WriteResult(options.result_path, result);
    return status;
  };
  absl::StatusOr<Mesh> mesh = Mesh::FromProto(assignment.mesh());
  if (!mesh.ok()) return fail(Annotate(mesh.status(), "assignment mesh"));
  const std::vector<int> processes = ProcessTable(*mesh);

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      MakeChannel(options.coordinator, options.transport, KeepaliveChannelArguments());
  if (!channel.ok()) return fail(Annotate(channel.status(), "the coordinator's channel"));
  std::shared_ptr<v1::CoordinatorService::StubInterface> stub =
      v1::CoordinatorService::NewStub(*channel);
  CoordinatorStore store(stub, assignment.job_id(), assignment.attempt(),
                         assignment.rendezvous_secret());

  TrainerOptions trainer(*mesh);
  trainer.spec = assignment.spec();
  trainer.process_of_position = processes;
  trainer.process_index = assignment.process_index();
  trainer.store = &store;
  trainer.listen_host = options.listen_host;
  trainer.collective_timeout = options.collective_timeout;
  trainer.data_access = DataAccess::Confined(options.data_roots);
  trainer.checkpoint_roots = options.checkpoint_roots;
  v1::ReportCheckpointsRequest checkpoint_report;
  checkpoint_report.set_job_id(assignment.job_id());
  checkpoint_report.set_attempt(assignment.attempt());
  trainer.on_resume = [&stub, checkpoint_report](const v1::CheckpointResume& resume) {
    if (resume.step() > 0) {
      std::fprintf(stderr, "substrax runner: resuming from the checkpoint of step %lld (%s)\n",
                   static_cast<long long>(resume.step()), resume.path().c_str());
    }
    for (const std::string& skipped : resume.skipped()) {
      std::fprintf(stderr, "substrax runner: checkpoint skipped: %s\n", skipped.c_str());
    }
    v1::ReportCheckpointsRequest request = checkpoint_report;
    *request.mutable_resumed() = resume;
    SendCheckpointReport(*stub, request);
  };
  trainer.on_checkpoint = [&stub, checkpoint_report](const v1::CheckpointListing& listing) {
    v1::ReportCheckpointsRequest request = checkpoint_report;
    *request.mutable_listing() = listing;
    SendCheckpointReport(*stub, request);
  };
  // Step reports leave the step loop at once: a slow coordinator must not slow training
  // (step_reporter.h has the bounds).
  GrpcStepSender sender(stub);
  StepReporterOptions reporting;
  reporting.job_id = assignment.job_id();
  reporting.attempt = assignment.attempt();
  StepReporter reporter(reporting, &sender, [base = result, &options](const absl::Status& status) {
    // The coordinator says this attempt has ended: stop now, wherever the other threads
    // are (they may be blocked in a collective that will never finish).
    std::fprintf(stderr, "substrax runner: stopping: %s\n", std::string(status.message()).c_str());
    v1::ReportAttemptStatusRequest stopped = base;
    stopped.set_state(v1::RUNNER_STATE_FAILED);
    stopped.set_error(absl::StrCat("stopped by the coordinator: ", status.message()));
    WriteResult(options.result_path, stopped);
    std::fflush(stderr);
    std::_Exit(1);
  });
  trainer.on_device_report = [&](const DeviceReport& r) {
    reporter.Enqueue(ToStepReport(r, *mesh, assignment.process_index()));
  };
  trainer.on_progress = [](const ProgressReport& r) {
    std::fprintf(stderr, "step %lld/%lld\n", static_cast<long long>(r.step),
                 static_cast<long long>(r.total_steps));
  };
  absl::StatusOr<TrainResult> trained = Train(trainer);
  // The last reports before the result: in the normal case no final step is lost.
  if (absl::Status flushed = reporter.Flush(kFinalFlush); !flushed.ok()) {
    std::fprintf(stderr, "substrax runner: %s\n", flushed.ToString().c_str());
  }
  if (!trained.ok()) return fail(trained.status());
  result.set_state(v1::RUNNER_STATE_SUCCEEDED);
  for (const auto& [name, value] : trained->evaluation) (*result.mutable_final_metrics())[name] = value;
  WriteResult(options.result_path, result);
  return absl::OkStatus();
}

}  // namespace substrax
