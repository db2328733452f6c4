// Stragglers: the devices of a running attempt whose compute or data time is consistently above
// the others'. Fed the per-device phase times every report already carries
// (StepReport.compute_seconds, data_wait_seconds: the device's seconds in that phase over the
// report's interval), one complete step (every device of the attempt reported it) at a time.
//
// The statistic, per phase and device, over the last `window` complete steps (every device of
// the attempt reported them): the median of the device's times (its level), over the median of
// the other devices' levels (the reference): its ratio. A device is flagged once its ratio is at
// least `threshold` (1.5: half again as slow as its peers) with at least `min_steps` steps in
// the window, and its excess over the reference is at least `min_share` of the devices' median
// interval (compute + data + collective): a phase too small to slow the job (a few milliseconds
// of data wait) is noise, not a straggler. It is cleared once its ratio falls below
// `clear_below`, or its excess below half of that share (hysteresis: one noisy report neither
// flags nor clears, and medians of raw times ignore the spikes a shared CPU gives every device).
// Levels both under `floor_seconds` count as equal (nothing measured). A mesh of one device has
// no peers: nothing is flagged.
//
// Pure; thread-compatible (the Cluster calls it under its lock).
#ifndef SUBSTRAX_COORDINATOR_STRAGGLERS_H_
#define SUBSTRAX_COORDINATOR_STRAGGLERS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace substrax {

struct StragglerOptions {
  int window = 20;
  int min_steps = 10;
  double threshold = 1.5;
  double clear_below = 1.2;
  double floor_seconds = 1e-3;
  double min_share = 0.05;
};

// A device's phase times over one report interval.
struct PhaseTimes {
  double compute_seconds = 0;
  double data_seconds = 0;
  double collective_seconds = 0;
};

// A flagged device, or one that stopped being one.
struct StragglerChange {
  int device_id = 0;
  std::string phase;  // "compute" or "data"
  // The median of its ratios over the window when the change happened.
  double ratio = 0;
  int steps = 0;      // steps in the window
  int64_t step = 0;   // the step at which it changed
  bool flagged = false;
};

class StragglerDetector {
 public:
  // `devices`: the attempt's device ids (every complete step has each of them).
  StragglerDetector(std::vector<int> devices, StragglerOptions options = {});

  // One device's times at `step`. Once every device has reported `step`, that step is
  // evaluated; the returned changes are the devices flagged or cleared by it. Reports of a step
  // older than the newest evaluated one are ignored; at most kPendingSteps steps wait for their
  // last device (the oldest are dropped).
  std::vector<StragglerChange> Add(int64_t step, int device_id, const PhaseTimes& times);

  // The devices flagged now, by (device, phase), with their latest ratio.
  const std::map<std::pair<int, std::string>, StragglerChange>& flagged() const {
    return flagged_;
  }

  static constexpr size_t kPendingSteps = 64;

 private:
  std::vector<StragglerChange> Evaluate(int64_t step, const std::map<int, PhaseTimes>& times);

  const std::vector<int> devices_;
  const StragglerOptions options_;
  std::map<int64_t, std::map<int, PhaseTimes>> pending_;
  int64_t evaluated_ = -1;
  // Per (device, phase): its times over the window, newest last ("total": its interval).
  std::map<std::pair<int, std::string>, std::deque<double>> times_;
  std::map<std::pair<int, std::string>, StragglerChange> flagged_;
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_STRAGGLERS_H_
