#include "coordinator/change_feed.h"

#include <utility>
#include <vector>

namespace substrax {

std::string ChangeFeed::WorkerTopic(const std::string& worker_id) { return "worker/" + worker_id; }
std::string ChangeFeed::JobTopic(const std::string& job_id) { return "job/" + job_id; }
std::string ChangeFeed::LogsTopic(const std::string& job_id) { return "logs/" + job_id; }

ChangeFeed::Id ChangeFeed::Subscribe(const std::string& topic, std::function<void()> on_change) {
  absl::MutexLock lock(&mu_);
  const Id id = next_id_++;
  by_id_.emplace(id, std::make_pair(topic, std::make_shared<std::function<void()>>(
                                               std::move(on_change))));
  by_topic_.emplace(topic, id);
  return id;
}

void ChangeFeed::Unsubscribe(Id id) {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  auto [first, last] = by_topic_.equal_range(it->second.first);
  for (auto t = first; t != last; ++t) {
    if (t->second == id) {
      by_topic_.erase(t);
      break;
    }
  }
  by_id_.erase(it);
}

void ChangeFeed::Mark(const std::string& topic) {
  absl::MutexLock lock(&mu_);
  // Only topics someone waits for are worth remembering until the flush.
  if (by_topic_.count(topic) > 0) marked_.insert(topic);
}

void ChangeFeed::Flush() {
  std::vector<std::shared_ptr<std::function<void()>>> calls;
  {
    absl::MutexLock lock(&mu_);
    if (marked_.empty()) return;
    for (const std::string& topic : marked_) {
      auto [first, last] = by_topic_.equal_range(topic);
      for (auto t = first; t != last; ++t) calls.push_back(by_id_.at(t->second).second);
    }
    marked_.clear();
  }
  for (const auto& call : calls) (*call)();
}

size_t ChangeFeed::subscriptions() const {
  absl::MutexLock lock(&mu_);
  return by_id_.size();
}

}  // namespace substrax
