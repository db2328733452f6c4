#include "coordinator/hang_attribution.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "rpc/proto_time.h"

namespace substrax {
namespace {

// One rank of a group.
struct Member {
  int process = 0;
  const v1::CollectiveCounter* counter = nullptr;
};

bool Waiting(const v1::CollectiveCounter& c) { return c.entered() > c.completed(); }

// "14:02:11 UTC".
std::string ClockTime(absl::Time t) {
  return absl::FormatTime("%H:%M:%S UTC", t, absl::UTCTimeZone());
}

// Process `p` is blamed (once).
void Blame(HangAttribution& out, int p) {
  if (std::find(out.blamed.begin(), out.blamed.end(), p) == out.blamed.end()) {
    out.blamed.push_back(p);
  }
}

// At most kMaxNamed of `parts` joined with "; ", then how many more: a stall of thousands of
// ranks names the first ones, never a message without bound.
constexpr size_t kMaxNamed = 8;
std::string JoinNamed(const std::vector<std::string>& parts) {
  if (parts.size() <= kMaxNamed) return absl::StrJoin(parts, "; ");
  return absl::StrCat(absl::StrJoin(parts.begin(), parts.begin() + kMaxNamed, "; "), "; and ",
                      parts.size() - kMaxNamed, " more");
}

// Whether device `device` of `process` waits in any collective.
bool DeviceWaits(const ProcessView& process, int device) {
  for (const v1::CollectiveCounter& c : process.activity.collectives()) {
    if (c.device_id() == device && Waiting(c)) return true;
  }
  return false;
}

// What device `device` of `process` is doing: "in compute since 14:02:11 UTC (step 812)".
std::string Doing(const ProcessView& process, int device) {
  if (process.suspended) return "its process is stopped by a signal";
  if (!process.has_activity) return "no sign of life (its agent relays nothing)";
  for (const v1::DeviceActivity& d : process.activity.devices()) {
    if (d.device_id() != device) continue;
    if (d.phase().empty()) return "not started training yet";
    return absl::StrCat("in ", d.phase(), " since ", ClockTime(FromProtoTime(d.since())),
                        " (step ", d.step(), ")");
  }
  return "its device published nothing";
}

std::string RankName(const ProcessView& process, const v1::CollectiveCounter& c) {
  return absl::StrCat("rank ", c.rank(), " (device ", c.device_id(), " of ", process.name, ")");
}

std::string Collective(const v1::CollectiveCounter& c) {
  return absl::StrCat(c.last_kind().empty() ? "collective" : c.last_kind(), " of ",
                      c.last_count(), " values");
}

// "; last log lines of process 1 (...): 'a' | 'b'" for the blamed processes with a log.
std::string LogLines(const std::vector<ProcessView>& processes, const std::vector<int>& blamed) {
  std::string out;
  // The first two processes blamed: their lines say what happened; more would only repeat it.
  for (size_t i = 0; i < blamed.size() && i < 2; ++i) {
    const int p = blamed[i];
    std::vector<std::string> lines;
    for (absl::string_view line : absl::StrSplit(processes[p].log_tail, '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (!line.empty()) lines.emplace_back(line);
    }
    // A full tail may start in the middle of a line: only whole lines count.
    if (processes[p].log_tail.size() >= kHangLogTailBytes && !lines.empty()) {
      lines.erase(lines.begin());
    }
    if (lines.empty()) continue;
    if (lines.size() > 3) lines.erase(lines.begin(), lines.end() - 3);
    absl::StrAppend(&out, "; last log lines of ", processes[p].name, ": '",
                    absl::StrJoin(lines, "' | '"), "'");
  }
  return out;
}

}  // namespace

HangAttribution AttributeHang(const std::vector<ProcessView>& processes) {
  HangAttribution out;
  std::map<std::string, std::vector<Member>> groups;
  for (size_t p = 0; p < processes.size(); ++p) {
    for (const v1::CollectiveCounter& c : processes[p].activity.collectives()) {
      groups[c.group()].push_back({static_cast<int>(p), &c});
    }
  }
  // Processes that relay nothing: they may hold the ranks every group waits for.
  std::vector<int> silent;
  for (size_t p = 0; p < processes.size(); ++p) {
    if (!processes[p].has_activity || processes[p].suspended) silent.push_back(static_cast<int>(p));
  }

  // The group with the most ranks waiting for a rank that is not itself waiting.
  const std::vector<Member>* best = nullptr;
  std::vector<const Member*> best_culprits;
  int best_waiting = 0;
  int64_t best_n = 0;
  for (const auto& [name, members] : groups) {
    int64_t n = 0;
    int waiting = 0;
    for (const Member& m : members) n = std::max(n, m.counter->entered());
    for (const Member& m : members) waiting += Waiting(*m.counter) ? 1 : 0;
    if (waiting == 0) continue;
    std::vector<const Member*> culprits;
    for (const Member& m : members) {
      if (m.counter->entered() < n &&
          !DeviceWaits(processes[m.process], m.counter->device_id())) {
        culprits.push_back(&m);
      }
    }
    if (culprits.empty()) continue;
    if (best == nullptr || waiting > best_waiting) {
      best = &members;
      best_culprits = culprits;
      best_waiting = waiting;
      best_n = n;
    }
  }
  if (best != nullptr) {
    const v1::CollectiveCounter& any = *std::find_if(best->begin(), best->end(), [&](const Member& m) {
                                          return m.counter->entered() == best_n;
                                        })->counter;
    int entered = 0;
    for (const Member& m : *best) entered += m.counter->entered() == best_n ? 1 : 0;
    out.found = true;
    out.summary = absl::StrCat(any.last_kind().empty() ? "collective" : any.last_kind(), " #",
                               best_n, " over ", any.group(), " entered by ", entered, " of ",
                               any.size(), " ranks; ");
    std::vector<std::string> parts;
    for (const Member* m : best_culprits) {
      const ProcessView& process = processes[m->process];
      parts.push_back(absl::StrCat(RankName(process, *m->counter), " has not entered it: ",
                                   Doing(process, m->counter->device_id())));
      Blame(out, m->process);
    }
    absl::StrAppend(&out.summary, JoinNamed(parts), LogLines(processes, out.blamed));
    return out;
  }

  // Every rank of a group waits at the same count: desynced when their collectives differ.
  for (const auto& [name, members] : groups) {
    if (members.empty() || static_cast<int>(members.size()) < members[0].counter->size()) continue;
    const int64_t n = members[0].counter->entered();
    bool all_wait_at_n = true;
    std::map<std::pair<std::string, int64_t>, std::vector<const Member*>> by_collective;
    for (const Member& m : members) {
      all_wait_at_n = all_wait_at_n && m.counter->entered() == n && Waiting(*m.counter);
      by_collective[{m.counter->last_kind(), m.counter->last_count()}].push_back(&m);
    }
    if (!all_wait_at_n || by_collective.size() < 2) continue;
    auto common = std::max_element(
        by_collective.begin(), by_collective.end(),
        [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    std::vector<std::string> odd;
    for (const auto& [what, ranks] : by_collective) {
      if (what == common->first) continue;
      for (const Member* m : ranks) {
        odd.push_back(absl::StrCat(RankName(processes[m->process], *m->counter), " is in ",
                                   Collective(*m->counter)));
        Blame(out, m->process);
      }
    }
    out.found = true;
    out.summary = absl::StrCat("desync over ", name, " at collective #", n, ": ",
                               common->second.size(), " of ", members.size(), " ranks are in ",
                               Collective(*common->second.front()->counter), ", but ",
                               JoinNamed(odd),
                               " (a rank skipped a collective or called another)",
                               LogLines(processes, out.blamed));
    return out;
  }

  // Only when the others are seen waiting (without any activity relayed, nothing is known).
  bool someone_waits = false;
  for (const auto& [name, members] : groups) {
    for (const Member& m : members) someone_waits = someone_waits || Waiting(*m.counter);
  }
  if (!silent.empty() && someone_waits) {
    std::vector<std::string> names;
    for (int p : silent) {
      names.push_back(absl::StrCat(processes[p].name, ": ", Doing(processes[p], -1)));
      out.blamed.push_back(p);
    }
    out.found = true;
    out.summary = absl::StrCat("the other processes wait; ", JoinNamed(names),
                               LogLines(processes, out.blamed));
  }
  return out;
}

HangAttribution AttributeCommandStall(const std::vector<ProcessView>& processes) {
  HangAttribution out;
  // Per process and device: when its report file last had a line, and its last step.
  struct Last {
    absl::Time at = absl::InfinitePast();
    int64_t step = 0;
  };
  std::vector<std::map<int, Last>> last(processes.size());
  absl::Time newest = absl::InfinitePast();
  for (size_t p = 0; p < processes.size(); ++p) {
    for (int id : processes[p].device_ids) last[p][id];
    for (const v1::DeviceActivity& d : processes[p].activity.devices()) {
      if (d.phase() != "report") continue;
      Last& l = last[p][d.device_id()];
      l.at = std::max(l.at, FromProtoTime(d.since()));
      l.step = std::max(l.step, d.step());
      newest = std::max(newest, l.at);
    }
  }
  if (newest == absl::InfinitePast()) return out;  // no process reports: nothing is known
  std::vector<std::string> parts;
  for (size_t p = 0; p < processes.size(); ++p) {
    for (const auto& [device, l] : last[p]) {
      const std::string who = absl::StrCat("device ", device, " (", processes[p].name, ")");
      if (l.at == absl::InfinitePast()) {
        parts.push_back(absl::StrCat(who, " has written no report line"));
      } else if (l.at < newest - absl::Seconds(2)) {
        parts.push_back(absl::StrCat(who, " stopped reporting at ",
                                     ClockTime(l.at),
                                     " (step ", l.step, ")"));
      } else {
        continue;
      }
      if (processes[p].suspended) absl::StrAppend(&parts.back(), ": it is stopped by a signal");
      Blame(out, static_cast<int>(p));
    }
  }
  if (out.blamed.empty()) return out;
  out.found = true;
  out.summary = absl::StrCat(
      JoinNamed(parts), "; the others reported until ",
      ClockTime(newest),
      " (a process whose report file still has heartbeats is alive, waiting)",
      LogLines(processes, out.blamed));
  return out;
}

}  // namespace substrax
