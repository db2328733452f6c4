#include "bench/allreduce_common.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace substrax::bench {
namespace {

// Rank r's value at element i in iteration k: an integer below 1024, so that sums over up to
// 2^14 ranks are exact in float32 (24-bit mantissa). Every term varies, so a missing or
// doubled contribution, a stale buffer or a shifted block all give wrong elements.
uint32_t Pattern(int rank, int64_t i, int iteration) {
  return (static_cast<uint32_t>(i) * 7u + static_cast<uint32_t>(iteration) * 13u +
          static_cast<uint32_t>(rank) * 101u) &
         1023u;
}

void Fill(int rank, int iteration, absl::Span<float> data) {
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<float>(Pattern(rank, i, iteration));
}

int64_t CountWrong(int num_ranks, int iteration, absl::Span<const float> data) {
  int64_t wrong = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    uint32_t expected = 0;
    for (int r = 0; r < num_ranks; ++r) expected += Pattern(r, i, iteration);
    wrong += data[i] != static_cast<float>(expected);
  }
  return wrong;
}

}  // namespace

void AddPlanFlags(CLI::App& app, PlanOptions* options) {
  app.add_option("--min_bytes", options->min_bytes, "smallest message in bytes (power of two)")
      ->capture_default_str();
  app.add_option("--max_bytes", options->max_bytes, "largest message in bytes (power of two)")
      ->capture_default_str();
  app.add_option("--timed_bytes", options->timed_bytes,
                 "bytes all-reduced in the timed iterations of one size by one peer")
      ->capture_default_str();
  app.add_option("--min_iterations", options->min_iterations, "timed iterations, at least")
      ->capture_default_str();
  app.add_option("--max_iterations", options->max_iterations, "timed iterations, at most")
      ->capture_default_str();
  app.add_option("--warmup", options->warmup, "untimed iterations of each peer before each size")
      ->capture_default_str();
}

std::vector<std::string> ToArgs(const PlanOptions& options) {
  return {
      absl::StrCat("--min_bytes=", options.min_bytes),
      absl::StrCat("--max_bytes=", options.max_bytes),
      absl::StrCat("--timed_bytes=", options.timed_bytes),
      absl::StrCat("--min_iterations=", options.min_iterations),
      absl::StrCat("--max_iterations=", options.max_iterations),
      absl::StrCat("--warmup=", options.warmup),
  };
}

std::vector<SizePlan> MakePlan(const PlanOptions& options) {
  std::vector<SizePlan> plan;
  for (int64_t bytes = std::max<int64_t>(options.min_bytes, sizeof(float));
       bytes <= options.max_bytes; bytes *= 2) {
    const int64_t wanted = options.timed_bytes / bytes;
    const int64_t iterations = std::clamp<int64_t>(
        wanted, options.min_iterations, std::max(options.min_iterations, options.max_iterations));
    plan.push_back({bytes, static_cast<int>(iterations)});
  }
  return plan;
}

std::string FormatBytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0) {
    return absl::StrCat(bytes >> 30, " GiB");
  }
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) {
    return absl::StrCat(bytes >> 20, " MiB");
  }
  if (bytes >= (int64_t{1} << 10) && bytes % (int64_t{1} << 10) == 0) {
    return absl::StrCat(bytes >> 10, " KiB");
  }
  return absl::StrCat(bytes, " B");
}

absl::Status RunSize(const std::vector<const AllReducePeer*>& peers, const PlanOptions& options,
                     const SizePlan& size, int rank, int num_ranks, int* iteration,
                     absl::Span<float> data, std::vector<Samples>* samples) {
  const int num_peers = static_cast<int>(peers.size());
  samples->assign(num_peers, Samples());
  for (int k = 0; k < options.warmup + size.iterations; ++k) {
    for (int turn = 0; turn < num_peers; ++turn, ++*iteration) {
      const int p = (turn + k) % num_peers;
      const AllReducePeer& peer = *peers[p];
      Fill(rank, *iteration, data);
      absl::Status status = peer.barrier();
      std::chrono::steady_clock::time_point start, end;
      if (status.ok()) {
        start = std::chrono::steady_clock::now();
        status = peer.all_reduce(data);
        end = std::chrono::steady_clock::now();
      }
      if (!status.ok()) {
        return absl::Status(status.code(),
                            absl::StrCat(peer.name, ", iteration ", *iteration, " (",
                                         FormatBytes(size.bytes), "): ", status.message()));
      }
      Samples& out = (*samples)[p];
      out.wrong_elements += CountWrong(num_ranks, *iteration, data);
      if (k >= options.warmup) {
        out.seconds.push_back(std::chrono::duration<double>(end - start).count());
      }
    }
  }
  return absl::OkStatus();
}

double MedianOfSlowestRank(const std::vector<std::vector<double>>& per_rank) {
  if (per_rank.empty() || per_rank[0].empty()) return 0;
  std::vector<double> slowest = per_rank[0];
  for (const std::vector<double>& times : per_rank) {
    for (size_t k = 0; k < slowest.size() && k < times.size(); ++k) {
      slowest[k] = std::max(slowest[k], times[k]);
    }
  }
  const size_t mid = slowest.size() / 2;
  std::nth_element(slowest.begin(), slowest.begin() + mid, slowest.end());
  if (slowest.size() % 2 == 1) return slowest[mid];
  const double upper = slowest[mid];
  return (upper + *std::max_element(slowest.begin(), slowest.begin() + mid)) / 2;
}

double BusBandwidthGBps(int64_t bytes, double seconds, int num_ranks) {
  if (seconds <= 0) return 0;
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  return algbw * 2.0 * (num_ranks - 1) / num_ranks;
}

}  // namespace substrax::bench
