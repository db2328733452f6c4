#include "worker/doctor/links.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/collectives/gloo_communicator.h"

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

namespace {

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
  for (int round = 0; round < Rounds(n); ++round) {
    const int peer = PartnerInRound(process, n, round);
    if (peer < 0 || peer == process) continue;
    links.push_back(MeasureOne(process, peer, store, options));
  }
  std::sort(links.begin(), links.end(), [](const Link& a, const Link& b) { return a.peer < b.peer; });
  return links;
}

}  // namespace substrax::doctor
