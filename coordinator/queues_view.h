// What ListQueues answers: the scheduling configuration in force, where it came from, and the
// policy's view of each queue (quota, use, borrowing, pending jobs by priority class). Pure.
#ifndef SUBSTRAX_COORDINATOR_QUEUES_VIEW_H_
#define SUBSTRAX_COORDINATOR_QUEUES_VIEW_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/scheduler.h"
#include "substrax/v1/job_service.pb.h"
#include "substrax/v1/scheduling.pb.h"

namespace substrax {

// Where the scheduling configuration in force came from; the coordinator sets it at each load
// or refused reload of --queues (CoordinatorServer::SetQueuesSource).
struct QueuesConfigStatus {
  // The file's path, or "built-in default".
  std::string source = "built-in default";
  // When the configuration in force was loaded; InfinitePast for the built-in default.
  absl::Time loaded = absl::InfinitePast();
  // Why the last reload was refused (the configuration in force stays); empty: none.
  std::string last_error;
};

// ListQueues' answer. Each queue of `config` in its order, with a backend per quota of the
// configuration and per pool its jobs hold (from `queues`, the policy's view as of its last
// pass); a queue of `queues` that `config` no longer has (its jobs still hold devices after a
// reload) comes after them. Priority classes highest value first.
v1::ListQueuesResponse MakeListQueuesResponse(const v1::SchedulingConfig& config,
                                              const std::vector<scheduling::QueueStatus>& queues,
                                              const QueuesConfigStatus& source);

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_QUEUES_VIEW_H_
