// Hang attribution of running attempts (hang_attribution.h): the views of an attempt's
// processes, from what their agents relayed with their heartbeats.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/cluster.h"

namespace substrax {

HangAttribution Cluster::AttributeHangLocked(const JobEntry& entry) const {
  std::vector<ProcessView> views;
  for (size_t p = 0; p < entry.processes.size(); ++p) {
    const Process& process = entry.processes[p];
    ProcessView& view = views.emplace_back();
    view.name = absl::StrCat("process ", p, " (", DescribeWorkerLocked(process.worker_id), ")");
    view.has_activity = process.has_activity;
    view.activity = process.activity;
    view.suspended = process.suspended;
    view.log_tail = process.log_tail;
  }
  return AttributeHang(views);
}

}  // namespace substrax
