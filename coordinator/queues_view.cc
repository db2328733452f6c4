#include "coordinator/queues_view.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "rpc/proto_time.h"

namespace substrax {

namespace {

// One queue: the configuration's quotas per backend, then the policy's use of every pool.
v1::QueueState MakeQueueState(const v1::QueueConfig* config, const scheduling::QueueStatus* now) {
  v1::QueueState queue;
  queue.set_name(config != nullptr ? config->name() : now->name);
  queue.set_cohort(config != nullptr ? config->cohort() : now->cohort);
  std::map<std::string, v1::QueueDevices> devices;
  if (config != nullptr) {
    for (const v1::DeviceQuota& quota : config->quotas()) {
      v1::QueueDevices& d = devices[quota.backend()];
      d.set_quota(quota.devices());
      if (quota.has_borrowing_limit()) d.set_borrowing_limit(quota.borrowing_limit());
    }
  }
  if (now != nullptr) {
    for (const auto& [pool, n] : now->used) devices[pool].set_used(n);
    for (const auto& [pool, n] : now->borrowed) devices[pool].set_borrowed(n);
    for (const auto& [priority_class, n] : now->pending) {
      (*queue.mutable_pending())[priority_class] = n;
    }
    queue.set_fair_share(now->fair_share);
  }
  for (auto& [backend, d] : devices) {
    d.set_backend(backend);
    *queue.add_devices() = std::move(d);
  }
  return queue;
}

}  // namespace

v1::ListQueuesResponse MakeListQueuesResponse(const v1::SchedulingConfig& config,
                                              const std::vector<scheduling::QueueStatus>& queues,
                                              const QueuesConfigStatus& source) {
  v1::ListQueuesResponse response;
  response.set_policy(config.policy());
  std::map<std::string, const scheduling::QueueStatus*> by_name;
  for (const scheduling::QueueStatus& q : queues) by_name[q.name] = &q;
  std::set<std::string> shown;
  for (const v1::QueueConfig& q : config.queues()) {
    auto it = by_name.find(q.name());
    *response.add_queues() = MakeQueueState(&q, it == by_name.end() ? nullptr : it->second);
    shown.insert(q.name());
  }
  for (const scheduling::QueueStatus& q : queues) {
    if (shown.insert(q.name).second) *response.add_queues() = MakeQueueState(nullptr, &q);
  }
  response.set_default_queue(config.default_queue());
  std::vector<v1::PriorityClass> classes(config.priority_classes().begin(),
                                         config.priority_classes().end());
  std::stable_sort(
      classes.begin(), classes.end(),
      [](const v1::PriorityClass& a, const v1::PriorityClass& b) { return a.value() > b.value(); });
  for (v1::PriorityClass& c : classes) *response.add_priority_classes() = std::move(c);
  response.set_default_priority_class(config.default_priority_class());
  response.set_config_source(source.source);
  if (source.loaded != absl::InfinitePast()) {
    *response.mutable_config_load_time() = ToProtoTime(source.loaded);
  }
  response.set_config_error(source.last_error);
  return response;
}

}  // namespace substrax
