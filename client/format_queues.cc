// `substraxctl queues`, and what `get` says of a job's queue and preemptions.
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/format.h"
#include "rpc/proto_time.h"

namespace substrax::ctl {
namespace {

// "cpu 16, cuda 8": `count` of each backend of the queue that has it, and (unless `zeros`)
// where it is not 0; `none` if none.
std::string PerBackend(const v1::QueueState& queue,
                       const std::function<std::optional<int64_t>(const v1::QueueDevices&)>& count,
                       bool zeros, const char* none) {
  std::vector<std::string> parts;
  for (const v1::QueueDevices& d : queue.devices()) {
    const std::optional<int64_t> n = count(d);
    if (n.has_value() && (zeros || *n != 0)) parts.push_back(absl::StrCat(d.backend(), " ", *n));
  }
  return parts.empty() ? none : absl::StrJoin(parts, ", ");
}

// "high 2, low 5" in the classes' order (highest first), then any class no longer configured.
std::string PendingCell(const v1::QueueState& queue, const v1::ListQueuesResponse& r) {
  std::vector<std::string> parts;
  auto pending = queue.pending();
  for (const v1::PriorityClass& c : r.priority_classes()) {
    auto it = pending.find(c.name());
    if (it == pending.end()) continue;
    if (it->second > 0) parts.push_back(absl::StrCat(c.name(), " ", it->second));
    pending.erase(it);
  }
  for (const auto& [name, n] : pending) {
    if (n > 0) parts.push_back(absl::StrCat(name, " ", n));
  }
  return parts.empty() ? "0" : absl::StrJoin(parts, ", ");
}

std::string PolicyName(v1::SchedulingPolicy policy) {
  switch (policy) {
    case v1::SCHEDULING_POLICY_QUEUES:
      return "queues (priority, fair share, age; backfill, preemption)";
    case v1::SCHEDULING_POLICY_FIFO:
      return "fifo (submission order)";
    default:
      return "unspecified";
  }
}

}  // namespace

std::string FormatQueues(const v1::ListQueuesResponse& r, const FormatOptions& options) {
  Table table({"QUEUE", "COHORT", "QUOTA", "USED", "BORROWED", "PENDING", "SHARE"});
  for (const v1::QueueState& q : r.queues()) {
    const std::string name = q.name() == r.default_queue() ? q.name() + " (default)" : q.name();
    auto quota = [](const v1::QueueDevices& d) -> std::optional<int64_t> {
      if (!d.has_quota()) return std::nullopt;
      return d.quota();
    };
    auto used = [](const v1::QueueDevices& d) -> std::optional<int64_t> { return d.used(); };
    auto borrowed = [](const v1::QueueDevices& d) -> std::optional<int64_t> {
      return d.borrowed();
    };
    table.AddRow({name, q.cohort().empty() ? "-" : q.cohort(), PerBackend(q, quota, true, "-"),
                  PerBackend(q, used, false, "0"), PerBackend(q, borrowed, false, "0"),
                  PendingCell(q, r), absl::StrFormat("%.2f", q.fair_share())});
  }
  std::string out = table.Render(options.color);
  std::vector<std::string> classes;
  for (const v1::PriorityClass& c : r.priority_classes()) {
    classes.push_back(absl::StrCat(c.name(), " (", c.value(),
                                   c.name() == r.default_priority_class() ? ", default)" : ")"));
  }
  absl::StrAppend(&out, "Priority classes: ", classes.empty() ? "-" : absl::StrJoin(classes, ", "),
                  "\n");
  absl::StrAppend(&out, "Policy: ", PolicyName(r.policy()), "\n");
  std::string source = absl::StrCat("Configuration: ", r.config_source());
  if (r.has_config_load_time()) {
    absl::StrAppend(&source, ", loaded ", FormatTimestamp(r.config_load_time(), options.zone), " (",
                    FormatAge(options.now - FromProtoTime(r.config_load_time())), " ago)");
  }
  absl::StrAppend(&out, source, "\n");
  if (!r.config_error().empty()) {
    std::string refused = absl::StrCat("The queues file was not loaded: ", r.config_error(),
                                       "; the configuration above stays");
    if (options.color) refused = absl::StrCat(kRed, refused, kReset);
    absl::StrAppend(&out, refused, "\n");
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> SchedulingFields(const v1::Job& job,
                                                                  const FormatOptions& options) {
  std::vector<std::pair<std::string, std::string>> fields;
  if (!job.queue().empty()) {
    std::string queue = job.queue();
    if (!job.priority_class().empty()) {
      absl::StrAppend(&queue, ", priority ", job.priority_class(), " (", job.priority(), ")");
    }
    fields.emplace_back("Queue", queue);
  }
  if (job.has_preemption()) {
    const v1::JobPreemption& p = job.preemption();
    auto clock = [&](const google::protobuf::Timestamp& t) {
      return absl::FormatTime("%H:%M:%S", FromProtoTime(t), options.zone);
    };
    std::string line = absl::StrCat("preempting for job ", p.for_job());
    if (!IsUnsetProtoTime(p.requested_time())) {
      absl::StrAppend(&line, " since ", clock(p.requested_time()));
    }
    if (!p.reason().empty()) absl::StrAppend(&line, ": ", p.reason());
    if (!IsUnsetProtoTime(p.deadline_time())) {
      absl::StrAppend(&line, " (stopped by force at ", clock(p.deadline_time()), ")");
    }
    fields.emplace_back("Preempt", line);
  }
  if (job.preemptions() > 0) {
    fields.emplace_back("Preempts",
                        absl::StrFormat("%d, work lost: %.2f device-hours", job.preemptions(),
                                        job.work_lost_device_seconds() / 3600));
  }
  // One line per flagged device (docs/diagnosis.md#stragglers).
  for (const v1::Straggler& s : job.stragglers()) {
    fields.emplace_back("Slow", absl::StrFormat("device %d (process %d, host %s): %s %.2fx the "
                                                "others since step %d (a straggler)",
                                                s.device_id(), s.process_index(), s.host(),
                                                s.phase(), s.ratio(), s.since_step()));
  }
  return fields;
}

}  // namespace substrax::ctl
