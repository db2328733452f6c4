// `substraxctl doctor` (commands.h; docs/diagnosis.md): starts a doctor job, follows it to its
// end within --wait, and shows the workers' findings.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/command_util.h"
#include "client/commands.h"
#include "client/format.h"
#include "substrax/v1/job_service.grpc.pb.h"

namespace substrax::ctl {
namespace {

// How often the doctor job is looked at while it runs.
constexpr absl::Duration kDoctorPoll = absl::Milliseconds(300);

// The doctor job once it ended, or as it is when `wait` ran out (then cancelled). Returns the
// exit code of a failed call, else kExitOk.
int FollowDoctorJob(const CommandContext& ctx, absl::Duration wait, v1::Job* job) {
  const absl::Time deadline = absl::Now() + wait;
  std::string said;
  while (!IsTerminal(job->state())) {
    const std::string now =
        job->state() == v1::JOB_STATE_PENDING && job->transitions_size() > 0
            ? absl::StrCat("pending: ", job->transitions(job->transitions_size() - 1).reason())
            : JobStateName(job->state());
    if (now != said) *ctx.err << "substraxctl: doctor job " << job->id() << " " << now << "\n";
    said = now;
    if (absl::Now() >= deadline) {
      v1::CancelJobRequest cancel;
      cancel.set_job_id(job->id());
      cancel.set_reason(absl::StrCat("substraxctl doctor: not done within --wait ",
                                     FormatShortDuration(wait)));
      v1::CancelJobResponse cancelled;
      if (int rc = CallJobService(ctx, &v1::JobService::Stub::CancelJob, cancel, &cancelled)) {
        return rc;
      }
      *ctx.err << "substraxctl: the doctor job did not end within --wait "
               << FormatShortDuration(wait) << "; cancelled it, showing what it reported\n";
    } else {
      absl::SleepFor(kDoctorPoll);
    }
    v1::GetJobRequest get;
    get.set_job_id(job->id());
    v1::GetJobResponse got;
    if (int rc = CallJobService(ctx, &v1::JobService::Stub::GetJob, get, &got)) return rc;
    *job = got.job();
    if (absl::Now() >= deadline && !IsTerminal(job->state())) break;  // cancelled: as it is
  }
  return kExitOk;
}

}  // namespace

int DoctorCommand(const CommandContext& ctx, const std::vector<std::string>& workers,
                  absl::Duration wait, const std::string& job_id) {
  v1::Job job;
  if (job_id.empty()) {
    v1::RunDoctorRequest request;
    for (const std::string& w : workers) request.add_workers(w);
    v1::RunDoctorResponse response;
    if (int rc = CallJobService(ctx, &v1::JobService::Stub::RunDoctor, request, &response)) {
      return rc;
    }
    job = response.job();
    const auto& tested = job.spec().doctor().workers();
    *ctx.err << "substraxctl: doctor job " << job.id() << " tests "
             << (tested.size() == 1 ? "1 worker" : absl::StrCat(tested.size(), " workers"))
             << " (" << absl::StrJoin(tested, ", ") << ")\n";
  } else {
    v1::GetJobRequest get;
    get.set_job_id(job_id);
    v1::GetJobResponse got;
    if (int rc = CallJobService(ctx, &v1::JobService::Stub::GetJob, get, &got)) return rc;
    job = got.job();
    if (!job.spec().has_doctor()) {
      *ctx.err << "substraxctl: " << job_id << " is not a doctor job (its spec has no doctor "
               << "section); run `substraxctl doctor` without --job to start one\n";
      return kExitUsage;
    }
  }
  if (int rc = FollowDoctorJob(ctx, wait, &job)) return rc;
  v1::ListWorkersResponse listed;
  if (int rc = CallJobService(ctx, &v1::JobService::Stub::ListWorkers, v1::ListWorkersRequest(),
                              &listed)) {
    return rc;
  }
  const v1::DoctorSummary summary = SummarizeDoctor(job, listed, ctx.clock());
  PrintResult(ctx, summary, [&] { return FormatDoctor(summary, FormatOptionsOf(ctx)); });
  return summary.problems() > 0 ? kExitError : kExitOk;
}

}  // namespace substrax::ctl
