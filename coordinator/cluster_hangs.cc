// Hang attribution of running attempts (hang_attribution.h): the views of an attempt's
// processes, from what their agents relayed with their heartbeats.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/cluster.h"
#include "rpc/proto_time.h"

namespace substrax {

HangAttribution Cluster::AttributeHangLocked(const JobEntry& entry) const {
  std::vector<ProcessView> views;
  for (size_t p = 0; p < entry.processes.size(); ++p) {
    const Process& process = entry.processes[p];
    ProcessView& view = views.emplace_back();
    view.name = absl::StrCat("process ", p, " (", DescribeWorkerLocked(process.worker_id), ")");
    view.has_activity = process.has_activity;
    view.activity = process.activity;
    view.device_ids = process.device_ids;
    view.suspended = process.suspended;
    view.log_tail = process.log_tail;
  }
  return entry.job.spec().has_command() ? AttributeCommandStall(views) : AttributeHang(views);
}

absl::StatusOr<v1::DiagnoseJobResponse> Cluster::DiagnoseJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = FindJobOrNullLocked(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  v1::DiagnoseJobResponse response;
  *response.mutable_job() = JobViewLocked(*entry);
  if (entry->job.state() != v1::JOB_STATE_RUNNING) return response;
  absl::Time newest = absl::InfinitePast();
  for (size_t p = 0; p < entry->processes.size(); ++p) {
    const Process& process = entry->processes[p];
    v1::ProcessDiagnosis* d = response.add_processes();
    d->set_process_index(static_cast<int32_t>(p));
    d->set_worker_id(process.worker_id);
    auto worker = workers_.find(process.worker_id);
    if (worker != workers_.end()) d->set_host(worker->second.proto.host());
    for (int id : process.device_ids) d->add_device_ids(id);
    d->set_last_step(process.last_step);
    d->set_suspended(process.suspended);
    if (process.has_activity) *d->mutable_activity() = process.activity;
    newest = std::max(newest, process.last_progress);
  }
  if (newest != absl::InfinitePast()) {
    *response.mutable_since_last_step() = ToProtoDuration(lease_clock_() - newest);
  }
  const HangAttribution hang = AttributeHangLocked(*entry);
  if (hang.found) response.set_waiting_for(hang.summary);
  return response;
}

}  // namespace substrax
