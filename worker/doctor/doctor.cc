#include "worker/doctor/doctor.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "contract/launch.h"
#include "rpc/proto_time.h"
#include "worker/doctor/gpu.h"
#include "worker/sdk/program_impl.h"

namespace substrax::doctor {
namespace {

v1::DoctorVerdict ToProto(Verdict verdict) {
  switch (verdict) {
    case Verdict::kOk:
      return v1::DOCTOR_VERDICT_OK;
    case Verdict::kWarning:
      return v1::DOCTOR_VERDICT_WARNING;
    case Verdict::kProblem:
      return v1::DOCTOR_VERDICT_PROBLEM;
  }
  return v1::DOCTOR_VERDICT_UNSPECIFIED;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

const char* VerdictName(Verdict verdict) {
  return verdict == Verdict::kOk ? "ok" : verdict == Verdict::kWarning ? "WARNING" : "PROBLEM";
}

}  // namespace

v1::DoctorReport ToReport(int process_index, const std::vector<Finding>& findings,
                          const std::vector<Link>& links) {
  v1::DoctorReport report;
  report.set_process_index(process_index);
  for (const Finding& f : findings) {
    v1::DoctorFinding* out = report.add_findings();
    out->set_check(f.check);
    out->set_verdict(ToProto(f.verdict));
    out->set_seen(f.seen);
    out->set_fix(f.fix);
  }
  for (const Link& l : links) {
    v1::DoctorLink* out = report.add_links();
    out->set_peer(l.peer);
    *out->mutable_latency() = ToProtoDuration(l.latency);
    out->set_bytes_per_second(l.bytes_per_second);
    out->set_error(l.error);
  }
  return report;
}

absl::Status RunDoctorProcess(v1::ProgramLaunch launch) {
  absl::StatusOr<std::unique_ptr<ProgramImpl>> started = ProgramImpl::FromLaunchProto(launch);
  if (!started.ok()) {
    WriteAttemptFailure(launch, started.status());
    return started.status();
  }
  ProgramImpl& program = **started;
  const int process = program.process_index();
  const int processes = program.num_processes();
  std::vector<Finding> findings = CheckHost(
      {launch.data_roots().begin(), launch.data_roots().end()},
      {launch.checkpoint_roots().begin(), launch.checkpoint_roots().end()},
      Dirname(launch.result_path()));
  if (std::optional<Finding> gpu = CheckGpu(); gpu.has_value()) findings.push_back(*gpu);
  for (const Finding& f : findings) {
    std::fprintf(stderr, "doctor: %s: %s: %s%s%s\n", f.check.c_str(), VerdictName(f.verdict),
                 f.seen.c_str(), f.fix.empty() ? "" : "; ", f.fix.c_str());
  }
  LinkOptions options;
  if (!launch.listen_host().empty()) options.listen_host = launch.listen_host();
  if (launch.has_collective_timeout()) {
    options.timeout = std::clamp(FromProtoDuration(launch.collective_timeout()),
                                 absl::Seconds(5), absl::Seconds(60));
  }
  std::fprintf(stderr, "doctor: measuring the links of process %d of %d\n", process, processes);
  std::fflush(stderr);
  const std::vector<Link> links = MeasureLinks(process, processes, program.store(), options);
  for (const Link& l : links) {
    if (!l.error.empty()) {
      std::fprintf(stderr, "doctor: link to process %d: %s\n", l.peer, l.error.c_str());
    } else {
      std::fprintf(stderr, "doctor: link to process %d: latency %.3f ms, %.0f MB/s\n", l.peer,
                   absl::ToDoubleMilliseconds(l.latency), l.bytes_per_second / 1e6);
    }
  }
  v1::ReportAttemptStatusRequest result;
  result.set_state(v1::RUNNER_STATE_SUCCEEDED);
  *result.mutable_doctor() = ToReport(process, findings, links);
  WriteAttemptResult(launch, std::move(result));
  std::fflush(stderr);
  return absl::OkStatus();
}

}  // namespace substrax::doctor
