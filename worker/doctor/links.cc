#include "worker/doctor/links.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/collectives/gloo_communicator.h"
#include "worker/collectives/job_failpoints.h"

namespace substrax::doctor {

int Rounds(int n) { return n % 2 == 0 ? n - 1 : n; }

int PartnerInRound(int process, int n, int round) {
  // The circle method over m = n (even) or n + 1 (odd, the extra one a bye): m - 1 sits fixed,
  // the others rotate; in round r, i meets (2r - i) mod (m - 1), and the one that would meet
  // itself meets m - 1.
  const int m = n % 2 == 0 ? n : n + 1;
  int partner;
  if (process == m - 1) {
    partner = (round * 2) % (m - 1) == 0 ? 0 : -1;
    for (int i = 0; i < m - 1; ++i) {
      if ((2 * round - i + 2 * (m - 1)) % (m - 1) == i) partner = i;
    }
  } else {
    partner = ((2 * round - process) % (m - 1) + (m - 1)) % (m - 1);
    if (partner == process) partner = m - 1;
  }
  return partner >= n ? -1 : partner;
}

std::vector<std::vector<std::pair<int, int>>> LinkRounds(int n) {
  std::vector<std::vector<std::pair<int, int>>> rounds;
  if (n < 2) return rounds;
  if (n <= kAllPairsUpTo) {
    for (int round = 0; round < Rounds(n); ++round) {
      std::vector<std::pair<int, int>>& pairs = rounds.emplace_back();
      for (int p = 0; p < n; ++p) {
        const int q = PartnerInRound(p, n, round);
        if (q > p) pairs.emplace_back(p, q);
      }
    }
    return rounds;
  }
  // The ring: (i, i + 1) for even i, then for odd i, then (n - 1, 0) when n is odd.
  rounds.resize(n % 2 == 0 ? 2 : 3);
  for (int i = 0; i + 1 < n; ++i) rounds[i % 2].emplace_back(i, i + 1);
  if (n % 2 == 0) {
    rounds[1].emplace_back(0, n - 1);
  } else {
    rounds[2].emplace_back(0, n - 1);
  }
  return rounds;
}

namespace {

// Sleeps before each all-reduce when the slow_link failpoint is armed for this pair.
void SlowLinkFailpoint(int peer) {
  const absl::Duration delay = JobFailpointLinkDelay(peer);
  if (delay > absl::ZeroDuration()) absl::SleepFor(delay);
}

Link MeasureOne(int process, int peer, Store* store, const LinkOptions& options) {
  Link link;
  link.peer = peer;
  const int low = std::min(process, peer), high = std::max(process, peer);
  PrefixStore pair_store(store, absl::StrCat("doctor/link/", low, "-", high));
  GlooCommunicatorOptions gloo;
  gloo.name = absl::StrCat("doctor link ", low, "-", high);
  gloo.timeout = options.timeout;
  gloo.connect_timeout = options.timeout;
  gloo.listen_host = options.listen_host;
  std::vector<RankInfo> ranks(2);
  ranks[0].process_index = low;
  ranks[0].description = absl::StrCat("process ", low);
  ranks[1].process_index = high;
  ranks[1].description = absl::StrCat("process ", high);
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm =
      GlooCommunicator::Create(gloo, &pair_store, process == low ? 0 : 1, ranks, nullptr);
  if (!comm.ok()) {
    link.error = std::string(comm.status().message());
    return link;
  }
  std::vector<absl::Duration> trips;
  std::vector<float> one(1, 1.0f);
  for (int i = 0; i < options.latency_rounds; ++i) {
    const absl::Time start = absl::Now();
    SlowLinkFailpoint(peer);  // timed, as a slow link would be
    if (absl::Status s = (*comm)->AllReduce(absl::MakeSpan(one), ReduceOp::kSum); !s.ok()) {
      link.error = std::string(s.message());
      return link;
    }
    trips.push_back(absl::Now() - start);
  }
  std::sort(trips.begin(), trips.end());
  link.latency = trips.empty() ? absl::ZeroDuration() : trips[trips.size() / 2];
  std::vector<float> big(options.bandwidth_floats, 1.0f);
  const absl::Time start = absl::Now();
  for (int i = 0; i < options.bandwidth_rounds; ++i) {
    SlowLinkFailpoint(peer);
    if (absl::Status s = (*comm)->AllReduce(absl::MakeSpan(big), ReduceOp::kSum); !s.ok()) {
      link.error = std::string(s.message());
      return link;
    }
  }
  const double seconds = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - start));
  link.bytes_per_second =
      static_cast<double>(big.size() * sizeof(float)) * options.bandwidth_rounds / seconds;
  return link;
}

}  // namespace

std::vector<Link> MeasureLinks(int process, int n, Store* store, const LinkOptions& options) {
  std::vector<Link> links;
  for (const std::vector<std::pair<int, int>>& round : LinkRounds(n)) {
    for (const auto& [a, b] : round) {
      if (a == process || b == process) {
        links.push_back(MeasureOne(process, a == process ? b : a, store, options));
      }
    }
  }
  std::sort(links.begin(), links.end(), [](const Link& a, const Link& b) { return a.peer < b.peer; });
  return links;
}

}  // namespace substrax::doctor
