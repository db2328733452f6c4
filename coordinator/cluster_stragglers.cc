// Stragglers of running attempts (stragglers.h): fed from every step report, kept in
// Job.stragglers, and each flag and clear recorded as a transition.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/cluster.h"
#include "rpc/proto_time.h"

namespace substrax {

void Cluster::StartStragglerDetectorLocked(JobEntry& entry) {
  std::vector<int> devices;
  for (const Process& process : entry.processes) {
    devices.insert(devices.end(), process.device_ids.begin(), process.device_ids.end());
  }
  entry.stragglers = std::make_shared<StragglerDetector>(std::move(devices));
}

void Cluster::NoteStragglerLocked(JobEntry& entry, const StragglerChange& change) {
  v1::Job& job = entry.job;
  int process = 0;
  for (size_t p = 0; p < entry.processes.size(); ++p) {
    for (int id : entry.processes[p].device_ids) {
      if (id == change.device_id) process = static_cast<int>(p);
    }
  }
  const std::string& worker = entry.processes[process].worker_id;
  const std::string device =
      absl::StrCat("device ", change.device_id, " (process ", process, ", ",
                   DescribeWorkerLocked(worker), ")");
  auto* list = job.mutable_stragglers();
  for (int i = 0; i < list->size(); ++i) {
    if (list->Get(i).device_id() == change.device_id && list->Get(i).phase() == change.phase) {
      list->DeleteSubrange(i, 1);
      break;
    }
  }
  std::string reason;
  if (change.flagged) {
    v1::Straggler* s = job.add_stragglers();
    s->set_device_id(change.device_id);
    s->set_process_index(process);
    s->set_worker_id(worker);
    s->set_host(workers_.at(worker).proto.host());
    s->set_phase(change.phase);
    s->set_ratio(change.ratio);
    s->set_since_step(change.step);
    *s->mutable_since_time() = ToProtoTime(clock_());
    reason = absl::StrFormat(
        "straggler: %s: its %s time is %.2fx the other devices' median over the last %d "
        "reports (to step %d); the job runs at its pace",
        device, change.phase, change.ratio, change.steps, change.step);
  } else {
    reason = absl::StrFormat("%s is no longer a straggler: its %s time is %.2fx the others' "
                             "(to step %d)",
                             device, change.phase, change.ratio, change.step);
  }
  straggling_.insert(job.id());
  TransitionLocked(entry, v1::JOB_STATE_RUNNING, reason);
}

std::vector<std::pair<std::string, v1::Straggler>> Cluster::Stragglers() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, v1::Straggler>> out;
  for (auto it = straggling_.begin(); it != straggling_.end();) {
    const JobEntry* entry = FindJobOrNullLocked(*it);
    if (entry == nullptr || entry->job.state() != v1::JOB_STATE_RUNNING ||
        entry->job.stragglers().empty()) {
      it = straggling_.erase(it);
      continue;
    }
    for (const v1::Straggler& s : entry->job.stragglers()) out.emplace_back(*it, s);
    ++it;
  }
  return out;
}

}  // namespace substrax
