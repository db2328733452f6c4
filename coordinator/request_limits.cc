#include "coordinator/request_limits.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "coordinator/limits.h"
#include "core/job_spec.h"
#include "core/status.h"

namespace substrax {
namespace {

// INVALID_ARGUMENT naming `field` when `value` has more than `max` bytes (CheckName's message).
absl::Status CheckBytes(absl::string_view field, absl::string_view value, size_t max) {
  if (value.size() <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value.size(),
                                                 " bytes, more than the limit of ", max));
}

absl::Status CheckCount(absl::string_view field, int count, int max) {
  if (count <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", count, " entries, more than the limit of ", max));
}

// The field's name for a map key or list entry that is too long: its first bytes, so that the
// message itself stays small.
std::string Entry(absl::string_view field, absl::string_view key) {
  return absl::StrCat(field, " '", key.substr(0, 32), key.size() > 32 ? "...'" : "'");
}

absl::Status CheckScope(const v1::RendezvousScope& scope) {
  SUBSTRAX_RETURN_IF_ERROR(CheckName("scope.job_id", scope.job_id()));
  return CheckName("scope.secret", scope.secret());
}

}  // namespace

absl::Status CheckRequest(const v1::RegisterWorkerRequest& request) {
  // Cluster::RegisterWorker checks names, devices and roots (it reports them per field), and the
  // characters of the Python environments' names.
  SUBSTRAX_RETURN_IF_ERROR(CheckCount("python_envs", request.python_envs_size(),
                                      limits::kMaxPythonEnvsPerWorker));
  for (const std::string& name : request.python_envs()) {
    SUBSTRAX_RETURN_IF_ERROR(CheckBytes(Entry("python_envs", name), name, kMaxPythonEnvNameBytes));
  }
  return absl::OkStatus();
}

absl::Status CheckRequest(const v1::HeartbeatRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckName("worker_id", request.worker_id()));
  SUBSTRAX_RETURN_IF_ERROR(CheckName("incarnation", request.incarnation()));
  SUBSTRAX_RETURN_IF_ERROR(CheckName("watch_epoch", request.watch_epoch()));
  SUBSTRAX_RETURN_IF_ERROR(
      CheckCount("runners", request.runners_size(), limits::kMaxRunnersPerHeartbeat));
  for (int i = 0; i < request.runners_size(); ++i) {
    const v1::RunnerRef& runner = request.runners(i);
    const std::string at = absl::StrCat("runners[", i, "]");
    SUBSTRAX_RETURN_IF_ERROR(CheckName(at + ".job_id", runner.job_id()));
    const v1::ProcessActivity& activity = runner.activity();
    SUBSTRAX_RETURN_IF_ERROR(CheckCount(at + ".activity.devices", activity.devices_size(),
                                        limits::kMaxActivityDevices));
    SUBSTRAX_RETURN_IF_ERROR(CheckCount(at + ".activity.collectives",
                                        activity.collectives_size(),
                                        limits::kMaxActivityCollectives));
    for (const v1::DeviceActivity& d : activity.devices()) {
      SUBSTRAX_RETURN_IF_ERROR(
          CheckBytes(at + ".activity.devices.phase", d.phase(), limits::kMaxActivityNameBytes));
    }
    for (const v1::CollectiveCounter& c : activity.collectives()) {
      SUBSTRAX_RETURN_IF_ERROR(CheckBytes(at + ".activity.collectives.group", c.group(),
                                          limits::kMaxActivityNameBytes));
      SUBSTRAX_RETURN_IF_ERROR(CheckBytes(at + ".activity.collectives.last_kind", c.last_kind(),
                                          limits::kMaxActivityNameBytes));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRequest(const v1::WatchAssignmentsRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckName("worker_id", request.worker_id()));
  SUBSTRAX_RETURN_IF_ERROR(CheckName("incarnation", request.incarnation()));
  return CheckName("epoch", request.epoch());
}

absl::Status CheckRequest(const v1::ReportStepsRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckName("job_id", request.job_id()));
  SUBSTRAX_RETURN_IF_ERROR(CheckReportLimits(request));
  for (int i = 0; i < request.reports_size(); ++i) {
    SUBSTRAX_RETURN_IF_ERROR(
        CheckName(absl::StrCat("reports[", i, "].job_id"), request.reports(i).job_id()));
    SUBSTRAX_RETURN_IF_ERROR(
        CheckName(absl::StrCat("reports[", i, "].host"), request.reports(i).host()));
  }
  return absl::OkStatus();
}

absl::Status CheckRequest(const v1::ReportAttemptStatusRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckName("job_id", request.job_id()));
  SUBSTRAX_RETURN_IF_ERROR(CheckName("worker_id", request.worker_id()));
  SUBSTRAX_RETURN_IF_ERROR(
      CheckCount("final_metrics", request.final_metrics_size(), limits::kMaxFinalMetrics));
  for (const auto& [name, value] : request.final_metrics()) {
    SUBSTRAX_RETURN_IF_ERROR(CheckName(Entry("final_metrics name", name), name));
  }
  const v1::DoctorReport& doctor = request.doctor();
  SUBSTRAX_RETURN_IF_ERROR(
      CheckCount("doctor.findings", doctor.findings_size(), limits::kMaxDoctorFindings));
  SUBSTRAX_RETURN_IF_ERROR(
      CheckCount("doctor.links", doctor.links_size(), limits::kMaxDoctorLinks));
  SUBSTRAX_RETURN_IF_ERROR(CheckName("doctor.worker_id", doctor.worker_id()));
  SUBSTRAX_RETURN_IF_ERROR(CheckName("doctor.host", doctor.host()));
  for (const v1::DoctorFinding& f : doctor.findings()) {
    for (const auto& [field, text] : {std::pair<const char*, const std::string*>{
                                          "doctor.findings.check", &f.check()},
                                      {"doctor.findings.seen", &f.seen()},
                                      {"doctor.findings.fix", &f.fix()}}) {
      SUBSTRAX_RETURN_IF_ERROR(CheckBytes(field, *text, limits::kMaxDoctorTextBytes));
    }
  }
  for (const v1::DoctorLink& l : doctor.links()) {
    SUBSTRAX_RETURN_IF_ERROR(
        CheckBytes("doctor.links.error", l.error(), limits::kMaxDoctorTextBytes));
  }
  // error and stderr_tail are cut to kMaxErrorBytes and kMaxStderrBytes by the Cluster.
  return absl::OkStatus();
}

absl::Status CheckRequest(const v1::ReportCheckpointsRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckName("job_id", request.job_id()));
  if (request.has_resumed()) {
    const v1::CheckpointResume& resumed = request.resumed();
    SUBSTRAX_RETURN_IF_ERROR(CheckBytes("resumed.path", resumed.path(), limits::kMaxPathBytes));
    SUBSTRAX_RETURN_IF_ERROR(
        CheckCount("resumed.skipped", resumed.skipped_size(), limits::kMaxCheckpointRecords));
    for (int i = 0; i < resumed.skipped_size(); ++i) {
      SUBSTRAX_RETURN_IF_ERROR(CheckBytes(absl::StrCat("resumed.skipped[", i, "]"),
                                          resumed.skipped(i), limits::kMaxPathBytes));
    }
  }
  if (request.has_listing()) {
    SUBSTRAX_RETURN_IF_ERROR(CheckCount("listing.checkpoints", request.listing().checkpoints_size(),
                                        limits::kMaxCheckpointRecords));
    const size_t bytes = request.listing().ByteSizeLong();
    if (bytes > limits::kMaxCheckpointListingBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "listing: ", bytes, " bytes, more than the limit of ", limits::kMaxCheckpointListingBytes,
          "; list fewer checkpoints (keep_last) or shorter paths"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRequest(const v1::KeyValueSetRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckScope(request.scope()));
  SUBSTRAX_RETURN_IF_ERROR(CheckBytes("key", request.key(), limits::kMaxKeyBytes));
  return CheckBytes("value", request.value(), limits::kMaxValueBytes);
}

absl::Status CheckRequest(const v1::KeyValueGetRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckScope(request.scope()));
  return CheckBytes("key", request.key(), limits::kMaxKeyBytes);
}

absl::Status CheckRequest(const v1::BarrierRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckScope(request.scope()));
  SUBSTRAX_RETURN_IF_ERROR(CheckName("barrier_id", request.barrier_id()));
  if (request.num_participants() > limits::kMaxBarrierParticipants) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_participants: ", request.num_participants(), ", more than the limit of ",
        limits::kMaxBarrierParticipants));
  }
  return absl::OkStatus();
}

absl::Status CheckRequest(const v1::ShipLogsRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckName("worker_id", request.worker_id()));
  SUBSTRAX_RETURN_IF_ERROR(CheckName("job_id", request.job_id()));
  SUBSTRAX_RETURN_IF_ERROR(CheckName("host", request.host()));
  return CheckBytes("data", request.data(), limits::kMaxLogChunkBytes);
}

absl::Status CheckRequest(const v1::SubmitJobRequest& request) {
  // Cluster::SubmitJob checks the spec's size (kMaxSpecBytes) and every field of it, and the
  // request id (kMaxRequestIdBytes, its charset); a command's argv is bounded here too, before
  // it is defaulted or copied.
  const v1::CommandSpec& command = request.spec().command();
  SUBSTRAX_RETURN_IF_ERROR(
      CheckCount("spec.command.argv", command.argv_size(), kMaxCommandArgs));
  size_t bytes = 0;
  for (const std::string& arg : command.argv()) bytes += arg.size() + 1;
  if (bytes > kMaxCommandArgvBytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec.command.argv: ", bytes, " bytes in all, "
                                                   "more than the limit of ",
                                                   kMaxCommandArgvBytes));
  }
  return CheckCount("spec.command.env", command.env_size(), kMaxCommandEnvVars);
}

absl::Status CheckRequest(const v1::GetJobRequest& request) {
  return CheckName("job_id", request.job_id());
}

absl::Status CheckRequest(const v1::DiagnoseJobRequest& request) {
  return CheckName("job_id", request.job_id());
}

absl::Status CheckRequest(const v1::RunDoctorRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckCount("workers", request.workers_size(), limits::kMaxWorkers));
  for (const std::string& worker : request.workers()) {
    SUBSTRAX_RETURN_IF_ERROR(CheckName(Entry("workers", worker), worker));
  }
  return absl::OkStatus();
}

absl::Status CheckRequest(const v1::ListJobsRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckCount("states", request.states_size(), limits::kMaxListStates));
  return CheckName("page_token", request.page_token());
}

absl::Status CheckRequest(const v1::CancelJobRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckName("job_id", request.job_id()));
  return CheckBytes("reason", request.reason(), limits::kMaxReasonBytes);
}

absl::Status CheckRequest(const v1::DeleteJobRequest& request) {
  return CheckName("job_id", request.job_id());
}

absl::Status CheckRequest(const v1::WatchJobRequest& request) {
  return CheckName("job_id", request.job_id());
}

absl::Status CheckRequest(const v1::ListWorkersRequest&) { return absl::OkStatus(); }
absl::Status CheckRequest(const v1::ListQueuesRequest&) { return absl::OkStatus(); }

absl::Status CheckRequest(const v1::GetMeshRequest& request) {
  return CheckName("job_id", request.job_id());
}

absl::Status CheckRequest(const v1::ReadLogsRequest& request) {
  return CheckName("job_id", request.job_id());
}

absl::Status CheckRequest(const v1::QueryMetricsRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckName("job_id", request.job_id()));
  SUBSTRAX_RETURN_IF_ERROR(
      CheckCount("names", request.names_size(), limits::kMaxQueryMetricNames));
  for (const std::string& name : request.names()) {
    SUBSTRAX_RETURN_IF_ERROR(CheckName(Entry("names", name), name));
  }
  return absl::OkStatus();
}

}  // namespace substrax
