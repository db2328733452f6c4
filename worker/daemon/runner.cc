#include "worker/daemon/runner.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "grpcpp/grpcpp.h"
#include "rpc/keepalive.h"
#include "rpc/proto_time.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "worker/collectives/store.h"
#include "worker/daemon/coordinator_store.h"
#include "worker/runtime/trainer.h"

namespace substrax {
namespace {

void WriteResult(const std::string& path, const v1::ReportAttemptStatusRequest& result) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  result.SerializeToOstream(&out);
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

  auto channel = grpc::CreateCustomChannel(options.coordinator, grpc::InsecureChannelCredentials(),
                                           KeepaliveChannelArguments());
  std::shared_ptr<v1::CoordinatorService::StubInterface> stub =
      v1::CoordinatorService::NewStub(channel);
  CoordinatorStore store(stub, assignment.job_id(), assignment.attempt());

  TrainerOptions trainer(*mesh);
  trainer.spec = assignment.spec();
  trainer.process_of_position = processes;
  trainer.process_index = assignment.process_index();
  trainer.store = &store;
  trainer.listen_host = options.listen_host;
  trainer.collective_timeout = options.collective_timeout;
  trainer.on_device_report = [&](const DeviceReport& r) {
    // One RPC per device and report interval; a lost report is logged, never fatal: metrics
    // must not take training down.
    v1::ReportStepsRequest request;
    request.set_job_id(assignment.job_id());
    request.set_attempt(assignment.attempt());
    v1::StepReport* report = request.add_reports();
    report->set_job_id(assignment.job_id());
    report->set_attempt(assignment.attempt());
    report->set_step(r.step);
    report->set_device_id(r.device_id);
    report->set_host(mesh->DeviceAt(*mesh->CoordinatesOf(r.device_id)).host);
    report->set_process_index(assignment.process_index());
    for (const auto& [name, value] : r.values) (*report->mutable_values())[name] = value;
    report->set_samples_per_second(r.samples_per_second);
    report->set_data_wait_seconds(r.data_wait_seconds);
    report->set_compute_seconds(r.compute_seconds);
    report->set_collective_seconds(r.collective_seconds);
    report->set_total_steps(r.total_steps);
    report->set_input_features(r.input_features);
    *report->mutable_time() = ToProtoTime(absl::Now());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ReportStepsResponse response;
    grpc::Status status = stub->ReportSteps(&context, request, &response);
    if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      // The coordinator says this attempt has ended: stop now, wherever the other threads
      // are (they may be blocked in a collective that will never finish).
      std::fprintf(stderr, "substrax runner: stopping: %s\n", status.error_message().c_str());
      v1::ReportAttemptStatusRequest stopped = result;
      stopped.set_state(v1::RUNNER_STATE_FAILED);
      stopped.set_error(absl::StrCat("stopped by the coordinator: ", status.error_message()));
      WriteResult(options.result_path, stopped);
      std::fflush(stderr);
      std::_Exit(1);
    }
    if (!status.ok()) {
      std::fprintf(stderr, "substrax runner: step report of device %d at step %lld not stored: %s\n",
                   r.device_id, static_cast<long long>(r.step), status.error_message().c_str());
    }
  };
  trainer.on_progress = [](const ProgressReport& r) {
    std::fprintf(stderr, "step %lld/%lld\n", static_cast<long long>(r.step),
                 static_cast<long long>(r.total_steps));
  };
  absl::StatusOr<TrainResult> trained = Train(trainer);
  if (!trained.ok()) return fail(trained.status());
  result.set_state(v1::RUNNER_STATE_SUCCEEDED);
  for (const auto& [name, value] : trained->evaluation) (*result.mutable_final_metrics())[name] = value;
  WriteResult(options.result_path, result);
  return absl::OkStatus();
}

}  // namespace substrax
