// Which stores a rank of a cross-process ShmCommunicator uses for the copies its peers read from
// the segment, when the choice is left to measurement (ShmWrites::kAuto).
//
// Ordinary stores leave the lines in the writer's caches, where a peer's read finds them: fast
// when the two cores share a cache, slow when the lines must cross between caches that they do
// not share (on a Zen 4 VM whose host moves the vCPUs, a 1 MiB all-reduce took ~110 µs in one
// placement and ~500 µs in the other). Streaming (non-temporal) stores send the lines to memory,
// where the peer reads them at the memory's speed in either placement (~160 µs). Which is faster
// depends on where the ranks run, which can change while they run, so every rank runs the same
// schedule of trials: of every kPeriod calls of at least kMinBytes, the first kTrials use the
// mode not in force, and at the end of the period the trials are compared with the calls of the
// same size in the mode in force. Rank 0's tuner decides, through the segment, for every rank;
// the other ranks' tuners only keep the schedule (their calls are counted alike: every rank runs
// the same collectives).
//
// Not thread-safe; one per communicator.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_SHM_WRITE_TUNER_H_
#define SUBSTRAX_WORKER_COLLECTIVES_SHM_WRITE_TUNER_H_

#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace substrax::shm {

class WriteTuner {
 public:
  // Calls smaller than this are neither tried nor counted: they use the mode in force.
  static constexpr size_t kMinBytes = 64 << 10;
  static constexpr int kPeriod = 128;
  static constexpr int kTrials = 4;
  // The trials must be this much faster (per call of their size) for the mode to change.
  static constexpr double kMargin = 0.10;

  // Whether a call of `bytes` streams, with `streaming` the mode in force.
  bool Streams(size_t bytes, bool streaming) const;

  // After a call of `bytes` that Streams(bytes, streaming) said would stream (`streamed`) and
  // took `elapsed`: the mode to put in force (the same as `streaming` except at the end of a
  // period whose trials were faster).
  bool Record(size_t bytes, bool streamed, bool streaming, absl::Duration elapsed);

 private:
  int counted_ = 0;  // calls of at least kMinBytes in this period
  // This period's trials (bytes, seconds), and its calls in the mode in force by size (seconds,
  // calls).
  std::vector<std::pair<size_t, double>> trials_;
  std::map<size_t, std::pair<double, int>> in_force_;
};

}  // namespace substrax::shm

#endif  // SUBSTRAX_WORKER_COLLECTIVES_SHM_WRITE_TUNER_H_
