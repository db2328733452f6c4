#include "worker/collectives/job_failpoints.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <deque>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace substrax {
namespace {

struct Armed {
  std::string name;
  int process = -1;
  int64_t at = 0;
  int peer = -1;  // slow_link: only the link to this process (-1: every link)
  std::atomic<bool> fired{false};
};

std::atomic<int> g_process{-1};

std::deque<Armed>& ArmedList() {
  static std::deque<Armed>* const list = [] {
    auto* out = new std::deque<Armed>();
    const char* env = std::getenv(kJobFailpointsEnv);
    if (env == nullptr) return out;
    for (absl::string_view entry : absl::StrSplit(env, ',', absl::SkipEmpty())) {
      std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
      int process = -1;
      int64_t at = -1;
      int peer = -1;
      for (size_t i = 1; i < parts.size(); ++i) {
        std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(parts[i], '=');
        if (kv.first == "process" && absl::SimpleAtoi(kv.second, &process)) continue;
        if (kv.first == "at" && absl::SimpleAtoi(kv.second, &at)) continue;
        if (kv.first == "peer" && absl::SimpleAtoi(kv.second, &peer) && peer >= 0) continue;
        process = -1;  // an unknown or malformed field: the entry is refused below
        break;
      }
      const bool known = parts[0] == "sleep_before_all_reduce" || parts[0] == "skip_all_reduce" ||
                         parts[0] == "hang_at_step" || parts[0] == "slow_link";
      if (!known || process < 0 || at < 0) {
        std::fprintf(stderr,
                     "%s: ignored '%s': expected NAME:process=P:at=N[:peer=Q] with NAME one "
                     "of sleep_before_all_reduce, skip_all_reduce, hang_at_step, slow_link\n",
                     kJobFailpointsEnv, std::string(entry).c_str());
        continue;
      }
      Armed& a = out->emplace_back();
      a.name = std::string(parts[0]);
      a.process = process;
      a.at = at;
      a.peer = peer;
      std::fprintf(stderr, "%s: armed %s (process %d, at %lld)\n", kJobFailpointsEnv,
                   a.name.c_str(), a.process, static_cast<long long>(a.at));
    }
    return out;
  }();
  return *list;
}

// The armed failpoint `name` of this process reached at `number`, fired now (once).
bool Fires(absl::string_view name, int64_t number) {
  const int process = g_process.load(std::memory_order_relaxed);
  if (process < 0) return false;
  for (Armed& a : ArmedList()) {
    if (a.name != name || a.process != process || number < a.at) continue;
    if (!a.fired.exchange(true)) {
      std::fprintf(stderr, "%s: %s fires at %lld\n", kJobFailpointsEnv, a.name.c_str(),
                   static_cast<long long>(number));
      return true;
    }
  }
  return false;
}

[[noreturn]] void SleepForever() {
  for (;;) sleep(3600);
}

}  // namespace

void SetJobFailpointProcess(int process_index) {
  ArmedList();  // parsed (and printed) once, at start
  g_process.store(process_index, std::memory_order_relaxed);
}

AllReduceFault JobFailpointBeforeAllReduce(int64_t number) {
  if (g_process.load(std::memory_order_relaxed) < 0) return AllReduceFault::kNone;
  if (Fires("sleep_before_all_reduce", number)) SleepForever();
  return Fires("skip_all_reduce", number) ? AllReduceFault::kSkip : AllReduceFault::kNone;
}

void JobFailpointAtStep(int64_t step) {
  if (g_process.load(std::memory_order_relaxed) < 0) return;
  const int process = g_process.load(std::memory_order_relaxed);
  for (Armed& a : ArmedList()) {
    // Every device of the process stops: not once per process but for every thread.
    if (a.name == "hang_at_step" && a.process == process && step >= a.at) {
      if (!a.fired.exchange(true)) {
        std::fprintf(stderr, "%s: hang_at_step fires at step %lld\n", kJobFailpointsEnv,
                     static_cast<long long>(step));
      }
      SleepForever();
    }
  }
}

absl::Duration JobFailpointLinkDelay(int peer) {
  const int process = g_process.load(std::memory_order_relaxed);
  if (process < 0) return absl::ZeroDuration();
  for (const Armed& a : ArmedList()) {
    if (a.name == "slow_link" && a.process == process && (a.peer < 0 || a.peer == peer)) {
      return absl::Milliseconds(a.at);
    }
  }
  return absl::ZeroDuration();
}

}  // namespace substrax
