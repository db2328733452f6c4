// What daemon.cc and daemon_runners.cc (one class, WorkerDaemon, in two files) share: how the
// agent logs, and gRPC deadlines. Not for other targets.
#ifndef SUBSTRAX_AGENT_DAEMON_INTERNAL_H_
#define SUBSTRAX_AGENT_DAEMON_INTERNAL_H_

#include <chrono>
#include <cstdio>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace substrax::agent_internal {

// One line on stderr, prefixed, flushed at once (the agent's log is its stderr).
inline void Log(const std::string& message) {
  std::fprintf(stderr, "substrax-agent: %s\n", message.c_str());
  std::fflush(stderr);
}

// A gRPC deadline `d` from now.
inline std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

}  // namespace substrax::agent_internal

#endif  // SUBSTRAX_AGENT_DAEMON_INTERNAL_H_
