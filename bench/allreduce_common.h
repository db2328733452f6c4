// Shared by //bench:allreduce and //bench:allreduce_mpi, so that every peer (our
// GlooCommunicator, raw Gloo, Open MPI) is measured the same way: the same sizes and iteration
// counts, the same verified timing loop, the same statistics and bandwidth formula.
//
// Timing: before every call the ranks fill their data (rank r, element i, iteration k get a
// small integer, so the float32 sum is exact) and pass an untimed barrier; the call alone is
// timed on every rank; then the result is checked element by element. The time of an
// iteration is the slowest rank's (the all-reduce is done when every rank has its result); a
// size's time is the median over its iterations. The median, not the best of k: Gloo hands
// every message from its device thread to the caller, so on a small VM its per-iteration times
// spread over 10x (a sleeping thread's vCPU takes up to milliseconds to wake), and the minimum
// is one lucky iteration that moves from run to run; the median of a few hundred iterations,
// taken in turns with the other peer, moves far less.
//
// Bandwidth follows nccl-tests (src/common.h, src/all_reduce.cu): algbw = bytes / time,
// busbw = algbw * 2(n-1)/n, in GB/s (1e9 bytes per second).
//
// Not thread-safe: one benchmark loop per process.
#ifndef SUBSTRAX_BENCH_ALLREDUCE_COMMON_H_
#define SUBSTRAX_BENCH_ALLREDUCE_COMMON_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/types/span.h"

namespace substrax::bench {

struct PlanOptions {
  // Smallest and largest message, in bytes of float32 data; sizes double in between.
  int64_t min_bytes = int64_t{4} << 10;
  int64_t max_bytes = int64_t{64} << 20;
  // Bytes all-reduced in the timed iterations of one size by one peer: small messages get more
  // iterations than large ones, within [min_iterations, max_iterations]. Sets the run time.
  // The defaults keep a run near 3 minutes on 2 cores. With them, raw Gloo measured against
  // itself (both columns the same code) came out 0.94..1.04 per size on the development VM
  // (README.md says why): differences of that size are the machine's noise, not the code.
  int64_t timed_bytes = int64_t{4} << 30;
  int min_iterations = 128;
  int max_iterations = 400;
  // Untimed, verified iterations of each peer before a size's timed ones (connections, caches,
  // the allocator).
  int warmup = 3;
};

// Registers PlanOptions as command-line flags; ToArgs gives them back as arguments, so that the
// MPI binary runs exactly the plan of the binary that launched it.
void AddPlanFlags(CLI::App& app, PlanOptions* options);
std::vector<std::string> ToArgs(const PlanOptions& options);

struct SizePlan {
  int64_t bytes = 0;
  int iterations = 0;  // timed, per peer
  int64_t elements() const { return bytes / static_cast<int64_t>(sizeof(float)); }
};

// The sizes from min_bytes to max_bytes (powers of two) with their iteration counts.
std::vector<SizePlan> MakePlan(const PlanOptions& options);

// "4 KiB", "64 MiB".
std::string FormatBytes(int64_t bytes);

// One implementation under test, as seen by the timing loop. `all_reduce` sums `data` over all
// ranks in place; `barrier` returns once every rank has entered it. `name` is for messages.
struct AllReducePeer {
  std::string name;
  std::function<absl::Status(absl::Span<float> data)> all_reduce;
  std::function<absl::Status()> barrier;
};

struct Samples {
  // Seconds of each timed iteration on this rank, in order.
  std::vector<double> seconds;
  // Result elements that differed from the exact sum, over every iteration (warm-up included).
  int64_t wrong_elements = 0;
};

// Runs one size for every peer in `peers`: options.warmup untimed iterations each, then
// size.iterations timed ones each, the peers taking turns iteration by iteration (who goes
// first alternates too). Turns, not one peer after the other: on a shared machine the load
// changes within seconds, and turns make it hit every peer alike, so that it does not show up
// as a difference between them. Every iteration fills `data`, passes an untimed barrier, times
// the all-reduce alone and verifies the result, as described at the top. `*iteration` numbers
// the data pattern and is advanced, so that no two iterations see the same values. samples[p]
// receives peer p's. Errors: whatever a peer returns, annotated with the iteration and size.
absl::Status RunSize(const std::vector<const AllReducePeer*>& peers, const PlanOptions& options,
                     const SizePlan& size, int rank, int num_ranks, int* iteration,
                     absl::Span<float> data, std::vector<Samples>* samples);

// The median over iterations of the slowest rank's time: per_rank[r][k] is rank r's seconds in
// iteration k (every rank has the same count). 0 when there are no iterations.
double MedianOfSlowestRank(const std::vector<std::vector<double>>& per_rank);

// nccl-tests' bus bandwidth of an all-reduce of `bytes` over `num_ranks` taking `seconds`, GB/s.
double BusBandwidthGBps(int64_t bytes, double seconds, int num_ranks);

}  // namespace substrax::bench

#endif  // SUBSTRAX_BENCH_ALLREDUCE_COMMON_H_
