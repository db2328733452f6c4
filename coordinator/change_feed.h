// ChangeFeed: who is waiting for which part of the coordinator's state, woken after it changed
// and never under the lock of whoever changed it (STYLE.md rule 10). The Cluster marks a topic
// under its own lock (Mark costs a set insertion) and flushes once it has unlocked; the gRPC
// layer subscribes its streams (a worker's assignment queue, a job, a job's logs) and gets a
// call per flush that touched their topic, instead of a thread that polls.
//
// Thread-safe. Callbacks run on the thread that flushes, with no lock of the feed held; they
// must not block (a stream reactor starts a write or notes that one is due).
#ifndef SUBSTRAX_COORDINATOR_CHANGE_FEED_H_
#define SUBSTRAX_COORDINATOR_CHANGE_FEED_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace substrax {

class ChangeFeed {
 public:
  using Id = uint64_t;

  // The topics the Cluster marks.
  static std::string WorkerTopic(const std::string& worker_id);  // its assignment queue
  static std::string JobTopic(const std::string& job_id);        // the job, or its deletion
  static std::string LogsTopic(const std::string& job_id);       // a stored piece of its logs

  // Calls `on_change` after every later change of `topic`, until Unsubscribe. Several
  // subscribers may share a topic.
  Id Subscribe(const std::string& topic, std::function<void()> on_change);
  // Stops the calls. A flush already under way may still make one call after this returns, so
  // a subscriber's callback holds what it touches (a shared_ptr), never a raw pointer to
  // something freed at Unsubscribe.
  void Unsubscribe(Id id);
  // Notes a change of `topic`; the caller may hold its own lock.
  void Mark(const std::string& topic);
  // Calls the subscribers of every topic marked since the last flush, once each. Call without
  // holding a lock that a subscriber takes.
  void Flush();
  // Subscriptions now (tests).
  size_t subscriptions() const;

 private:
  mutable absl::Mutex mu_;
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<Id, std::pair<std::string, std::shared_ptr<std::function<void()>>>> by_id_
      ABSL_GUARDED_BY(mu_);
  std::multimap<std::string, Id> by_topic_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> marked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_CHANGE_FEED_H_
