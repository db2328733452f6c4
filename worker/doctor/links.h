// The links between the doctor's processes, one per worker (docs/diagnosis.md): each pair of
// processes measures its link alone, in rounds where every process has at most one partner, so
// that one slow link names its two ends and a slow host is slow on all of its links. Up to
// kAllPairsUpTo processes every pair is measured (a round-robin schedule, the circle method);
// beyond, each process and the next around the ring (process n - 1 and 0 included), in 2 or 3
// rounds. Each pair connects a 2-rank Gloo communicator through the store and times small
// all-reduces (the latency: the median round trip of one float) and large ones (the bandwidth:
// bytes all-reduced per second).
#ifndef SUBSTRAX_WORKER_DOCTOR_LINKS_H_
#define SUBSTRAX_WORKER_DOCTOR_LINKS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collectives/store.h"

namespace substrax::doctor {

struct LinkOptions {
  std::string listen_host = "127.0.0.1";
  absl::Duration timeout = absl::Seconds(30);
  int latency_rounds = 20;
  size_t bandwidth_floats = size_t{1} << 20;  // 4 MiB
  int bandwidth_rounds = 3;
};

struct Link {
  int peer = 0;
  absl::Duration latency;            // median round trip of a 1-float all-reduce
  double bytes_per_second = 0;       // of the large all-reduces
  std::string error;                 // set when the pair could not connect or measure
};

// Every pair is measured up to this many processes; the ring's neighbours beyond.
inline constexpr int kAllPairsUpTo = 8;

// The partner of `process` in round `round` of the circle method over `n` processes (-1: it
// sits out). Rounds: n - 1 for an even n, n for an odd one.
int PartnerInRound(int process, int n, int round);
int Rounds(int n);

// The pairs measured among `n` processes, round by round (every pair up to kAllPairsUpTo, the
// ring's neighbours beyond); in a round no process is in two pairs. Each pair (low, high).
std::vector<std::vector<std::pair<int, int>>> LinkRounds(int n);

// Process `process` of `n` measures its links of LinkRounds(n) (all n processes call it at
// once, with the same store). A pair that fails is reported in its Link, not as an error.
std::vector<Link> MeasureLinks(int process, int n, Store* store, const LinkOptions& options);

}  // namespace substrax::doctor

#endif  // SUBSTRAX_WORKER_DOCTOR_LINKS_H_
