#include "coordinator/request_limits.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/limits.h"
#include "core/job_spec.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

// Refused with INVALID_ARGUMENT whose message holds `field` and the limit.
template <typename Request>
void ExpectRefused(const Request& request, const std::string& field, size_t limit) {
  const absl::Status status = CheckRequest(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(field), std::string::npos) << status;
  EXPECT_NE(status.message().find(absl::StrCat("limit of ", limit)), std::string::npos)
      << status;
}

const std::string kLongName(limits::kMaxNameBytes + 1, 'n');
const std::string kLongPath(limits::kMaxPathBytes + 1, 'p');

TEST(RequestLimitsTest, CancelReason) {
  v1::CancelJobRequest request;
  request.set_job_id("j");
  request.set_reason(std::string(limits::kMaxReasonBytes, 'r'));
  EXPECT_TRUE(CheckRequest(request).ok());
  // The reason of the issue: 120 KB, forty times over, broke `list` for everyone.
  request.set_reason(std::string(120 * 1024, 'r'));
  ExpectRefused(request, "reason: 122880 bytes", limits::kMaxReasonBytes);
  request.set_reason("");
  request.set_job_id(kLongName);
  ExpectRefused(request, "job_id", limits::kMaxNameBytes);
}

TEST(RequestLimitsTest, FinalMetrics) {
  v1::ReportAttemptStatusRequest request;
  for (int i = 0; i < limits::kMaxFinalMetrics; ++i) {
    (*request.mutable_final_metrics())[std::to_string(i)] = i;
  }
  EXPECT_TRUE(CheckRequest(request).ok());
  (*request.mutable_final_metrics())["one more"] = 1;
  ExpectRefused(request, "final_metrics: 65 entries", limits::kMaxFinalMetrics);

  v1::ReportAttemptStatusRequest long_name;
  (*long_name.mutable_final_metrics())[kLongName] = 1;
  ExpectRefused(long_name, "final_metrics name 'nnnn", limits::kMaxNameBytes);
  v1::ReportAttemptStatusRequest worker;
  worker.set_worker_id(kLongName);
  ExpectRefused(worker, "worker_id", limits::kMaxNameBytes);
}

TEST(RequestLimitsTest, ADoctorsReportAndRequest) {
  v1::ReportAttemptStatusRequest request;
  for (int i = 0; i < limits::kMaxDoctorFindings; ++i) {
    v1::DoctorFinding* f = request.mutable_doctor()->add_findings();
    f->set_check("cpu");
    f->set_seen(std::string(limits::kMaxDoctorTextBytes, 's'));
  }
  for (int i = 0; i < limits::kMaxDoctorLinks; ++i) request.mutable_doctor()->add_links();
  EXPECT_TRUE(CheckRequest(request).ok());
  request.mutable_doctor()->add_links();
  ExpectRefused(request, "doctor.links: 17 entries", limits::kMaxDoctorLinks);
  request.mutable_doctor()->mutable_links()->RemoveLast();
  request.mutable_doctor()->add_findings();
  ExpectRefused(request, "doctor.findings: 65 entries", limits::kMaxDoctorFindings);
  request.mutable_doctor()->mutable_findings()->RemoveLast();
  request.mutable_doctor()->mutable_findings(3)->set_fix(
      std::string(limits::kMaxDoctorTextBytes + 1, 'f'));
  ExpectRefused(request, "doctor.findings.fix: 1025 bytes", limits::kMaxDoctorTextBytes);

  v1::RunDoctorRequest run;
  run.add_workers("w-1");
  EXPECT_TRUE(CheckRequest(run).ok());
  run.add_workers(kLongName);
  ExpectRefused(run, "workers 'nnnn", limits::kMaxNameBytes);
}

TEST(RequestLimitsTest, PythonEnvironmentsOfARegistration) {
  v1::RegisterWorkerRequest request;
  for (int i = 0; i < limits::kMaxPythonEnvsPerWorker; ++i) {
    request.add_python_envs(absl::StrCat("env", i));
  }
  EXPECT_TRUE(CheckRequest(request).ok());
  request.add_python_envs("one-more");
  ExpectRefused(request, "python_envs: 65 entries", limits::kMaxPythonEnvsPerWorker);
  v1::RegisterWorkerRequest long_name;
  long_name.add_python_envs(std::string(kMaxPythonEnvNameBytes + 1, 'e'));
  ExpectRefused(long_name, "python_envs 'eeee", kMaxPythonEnvNameBytes);
}

TEST(RequestLimitsTest, ACommandsArgvAndEnv) {
  v1::SubmitJobRequest request;
  v1::CommandSpec* command = request.mutable_spec()->mutable_command();
  for (int i = 0; i < kMaxCommandArgs; ++i) command->add_argv("a");
  EXPECT_TRUE(CheckRequest(request).ok());
  command->add_argv("a");
  ExpectRefused(request, "spec.command.argv: 1025 entries", kMaxCommandArgs);

  v1::SubmitJobRequest bytes;
  bytes.mutable_spec()->mutable_command()->add_argv(std::string(kMaxCommandArgvBytes, 'a'));
  ExpectRefused(bytes, "spec.command.argv: 65537 bytes in all", kMaxCommandArgvBytes);

  v1::SubmitJobRequest env;
  for (int i = 0; i <= kMaxCommandEnvVars; ++i) {
    (*env.mutable_spec()->mutable_command()->mutable_env())[absl::StrCat("JOB_", i)] = "1";
  }
  ExpectRefused(env, "spec.command.env: 257 entries", kMaxCommandEnvVars);
}

TEST(RequestLimitsTest, CheckpointsResumeAndListing) {
  v1::ReportCheckpointsRequest resumed;
  resumed.mutable_resumed()->set_path(kLongPath);
  ExpectRefused(resumed, "resumed.path", limits::kMaxPathBytes);

  v1::ReportCheckpointsRequest skipped;
  skipped.mutable_resumed()->add_skipped(kLongPath);
  ExpectRefused(skipped, "resumed.skipped[0]", limits::kMaxPathBytes);
  v1::ReportCheckpointsRequest many_skipped;
  for (int i = 0; i <= limits::kMaxCheckpointRecords; ++i) {
    many_skipped.mutable_resumed()->add_skipped("x");
  }
  ExpectRefused(many_skipped, "resumed.skipped", limits::kMaxCheckpointRecords);

  v1::ReportCheckpointsRequest listing;
  for (int i = 0; i <= limits::kMaxCheckpointRecords; ++i) {
    listing.mutable_listing()->add_checkpoints()->set_step(i);
  }
  ExpectRefused(listing, "listing.checkpoints", limits::kMaxCheckpointRecords);

  // Within the count, but paths of the longest kind on every record: over the listing's bytes.
  v1::ReportCheckpointsRequest heavy;
  for (int i = 0; i < 100; ++i) {
    heavy.mutable_listing()->add_checkpoints()->set_path(std::string(4000, 'c'));
  }
  ExpectRefused(heavy, "listing: ", limits::kMaxCheckpointListingBytes);
}

TEST(RequestLimitsTest, MetricNamesAndStates) {
  v1::QueryMetricsRequest query;
  for (int i = 0; i <= limits::kMaxQueryMetricNames; ++i) query.add_names("loss");
  ExpectRefused(query, "names: 65 entries", limits::kMaxQueryMetricNames);
  v1::QueryMetricsRequest long_name;
  long_name.add_names(kLongName);
  ExpectRefused(long_name, "names 'nnn", limits::kMaxNameBytes);

  v1::ListJobsRequest list;
  for (int i = 0; i <= limits::kMaxListStates; ++i) list.add_states(v1::JOB_STATE_RUNNING);
  ExpectRefused(list, "states", limits::kMaxListStates);
  v1::ListJobsRequest token;
  token.set_page_token(kLongName);
  ExpectRefused(token, "page_token", limits::kMaxNameBytes);
}

TEST(RequestLimitsTest, RendezvousAndDaemons) {
  v1::BarrierRequest barrier;
  barrier.set_num_participants(limits::kMaxBarrierParticipants + 1);
  ExpectRefused(barrier, "num_participants", limits::kMaxBarrierParticipants);
  v1::BarrierRequest barrier_id;
  barrier_id.set_barrier_id(kLongName);
  ExpectRefused(barrier_id, "barrier_id", limits::kMaxNameBytes);

  v1::KeyValueSetRequest set;
  set.set_value(std::string(limits::kMaxValueBytes + 1, 'v'));
  ExpectRefused(set, "value", limits::kMaxValueBytes);
  v1::KeyValueGetRequest get;
  get.mutable_scope()->set_secret(kLongName);
  ExpectRefused(get, "scope.secret", limits::kMaxNameBytes);

  v1::HeartbeatRequest heartbeat;
  heartbeat.add_runners()->set_job_id(kLongName);
  ExpectRefused(heartbeat, "runners[0].job_id", limits::kMaxNameBytes);
  v1::HeartbeatRequest activity;
  v1::RunnerRef* runner = activity.add_runners();
  runner->set_job_id("j");
  runner->mutable_activity()->add_collectives()->set_group(
      std::string(limits::kMaxActivityNameBytes + 1, 'g'));
  ExpectRefused(activity, "runners[0].activity.collectives.group",
                limits::kMaxActivityNameBytes);
  runner->mutable_activity()->clear_collectives();
  for (int i = 0; i <= limits::kMaxActivityDevices; ++i) {
    runner->mutable_activity()->add_devices();
  }
  ExpectRefused(activity, "runners[0].activity.devices", limits::kMaxActivityDevices);
  v1::WatchAssignmentsRequest watch;
  watch.set_epoch(kLongName);
  ExpectRefused(watch, "epoch", limits::kMaxNameBytes);
  v1::ShipLogsRequest ship;
  ship.set_data(std::string(limits::kMaxLogChunkBytes + 1, 'd'));
  ExpectRefused(ship, "data", limits::kMaxLogChunkBytes);
  v1::ReportStepsRequest steps;
  steps.add_reports()->set_host(kLongName);
  ExpectRefused(steps, "reports[0].host", limits::kMaxNameBytes);
}

template <typename Request>
void ExpectJobIdBounded() {
  Request request;
  request.set_job_id(kLongName);
  ExpectRefused(request, "job_id", limits::kMaxNameBytes);
}

TEST(RequestLimitsTest, JobIdsOfEveryUserCall) {
  ExpectJobIdBounded<v1::GetJobRequest>();
  ExpectJobIdBounded<v1::DeleteJobRequest>();
  ExpectJobIdBounded<v1::WatchJobRequest>();
  ExpectJobIdBounded<v1::GetMeshRequest>();
  ExpectJobIdBounded<v1::ReadLogsRequest>();
  ExpectJobIdBounded<v1::QueryMetricsRequest>();
  ExpectJobIdBounded<v1::ReportCheckpointsRequest>();
  EXPECT_TRUE(CheckRequest(v1::ListWorkersRequest()).ok());
  EXPECT_TRUE(CheckRequest(v1::ListQueuesRequest()).ok());
}

}  // namespace
}  // namespace substrax
