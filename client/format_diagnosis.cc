// `substraxctl diagnose`: why a job is stuck or slow (docs/diagnosis.md).
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/format.h"
#include "rpc/proto_time.h"

namespace substrax::ctl {
namespace {

std::string Clock(const google::protobuf::Timestamp& t, absl::TimeZone zone) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  return absl::FormatTime("%H:%M:%S", FromProtoTime(t), zone);
}

// The transitions that say something about hangs and stragglers.
bool IsDiagnosis(const std::string& reason) {
  for (const char* mark : {"straggler", "stalled", "desync", "timed out", "suspended"}) {
    if (absl::StrContains(reason, mark)) return true;
  }
  return false;
}

}  // namespace

std::string FormatDiagnosis(const v1::DiagnoseJobResponse& r, const FormatOptions& options) {
  const v1::Job& job = r.job();
  std::string out = absl::StrCat("Job:      ", job.id(), " ", JobStateName(job.state()),
                                 ", attempt ", job.attempt(), ", step ", job.progress().step());
  if (job.progress().total_steps() > 0) absl::StrAppend(&out, " of ", job.progress().total_steps());
  absl::StrAppend(&out, "\n");
  if (job.state() == v1::JOB_STATE_RUNNING) {
    if (r.has_since_last_step()) {
      absl::StrAppend(&out, "Progress: last step ",
                      FormatShortDuration(FromProtoDuration(r.since_last_step())), " ago\n");
    }
    absl::StrAppend(&out, "Waiting:  ",
                    r.waiting_for().empty()
                        ? "no rank waits for another"
                        : absl::StrCat(r.waiting_for(),
                                       " (a snapshot: it matters when no step has come for a "
                                       "while)"),
                    "\n");
  }
  if (!job.error().empty()) absl::StrAppend(&out, "Error:    ", job.error(), "\n");
  std::vector<std::string> slow;
  for (const v1::Straggler& s : job.stragglers()) {
    slow.push_back(absl::StrFormat("device %d (process %d, host %s): %s %.2fx the others since "
                                   "step %d",
                                   s.device_id(), s.process_index(), s.host(), s.phase(),
                                   s.ratio(), s.since_step()));
  }
  absl::StrAppend(&out, "Slow:     ", slow.empty() ? "no straggler" : absl::StrJoin(slow, "; "),
                  "\n");

  if (!r.processes().empty()) {
    Table processes({"PROCESS", "WORKER", "HOST", "DEVICES", "STEP", "STATE"});
    Table devices({"DEVICE", "PROCESS", "STEP", "PHASE", "SINCE"});
    Table collectives({"GROUP", "DEVICE", "RANK", "ENTERED", "COMPLETED", "LAST"});
    for (const v1::ProcessDiagnosis& p : r.processes()) {
      const std::string index = absl::StrCat(p.process_index());
      std::string state = p.suspended() ? "stopped by a signal" : "running";
      if (!p.has_activity()) absl::StrAppend(&state, ", nothing relayed");
      processes.AddRow({index, p.worker_id(), p.host(), absl::StrJoin(p.device_ids(), ","),
                        absl::StrCat(p.last_step()), state});
      for (const v1::DeviceActivity& d : p.activity().devices()) {
        devices.AddRow({absl::StrCat(d.device_id()), index, absl::StrCat(d.step()),
                        d.phase().empty() ? "-" : d.phase(), Clock(d.since(), options.zone)});
      }
      for (const v1::CollectiveCounter& c : p.activity().collectives()) {
        const bool waits = c.entered() > c.completed();
        collectives.AddRow(
            {c.group(), absl::StrCat(c.device_id()), absl::StrCat(c.rank(), "/", c.size()),
             Cell(absl::StrCat(c.entered()), waits ? kYellow : nullptr),
             absl::StrCat(c.completed()),
             c.last_kind().empty() ? "-" : absl::StrCat(c.last_kind(), " of ", c.last_count())});
      }
    }
    absl::StrAppend(&out, "\nProcesses:\n", processes.Render(options.color, "  "));
    absl::StrAppend(&out, "\nDevices (as their agents last relayed them):\n",
                    devices.Render(options.color, "  "));
    absl::StrAppend(&out, "\nCollectives (entered more than completed: waiting in it):\n",
                    collectives.Render(options.color, "  "));
  }
  std::vector<std::string> history;
  for (const v1::JobTransition& t : job.transitions()) {
    if (!IsDiagnosis(t.reason())) continue;
    history.push_back(absl::StrCat("  ", FormatTimestamp(t.time(), options.zone), "  ",
                                   t.reason(), "\n"));
  }
  absl::StrAppend(&out, "\nHistory (hangs and stragglers):\n",
                  history.empty() ? "  none\n" : absl::StrJoin(history, ""));
  return out;
}

}  // namespace substrax::ctl
