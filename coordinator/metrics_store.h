// MetricsStore: the raw per-device metric points runners report, and the queries over them.
//
// Points are kept as reported (one value per job, attempt, step, device and metric name), and
// reduced only when asked, so any reduction or grouping can be served later. A device that
// reports late or never is absent from a step: a query's value combines the devices that
// reported it, says how many did of how many are expected, and marks the step partial when
// some are missing; nothing waits for a device. Progress (Latest) shows only a step that every
// expected device reported, so it never shows a value averaged over the first to arrive.
//
// A second report for the same (job, attempt, step, device) replaces the first (a runner that
// resent a batch after a retry does not count twice).
//
// Memory: every point added, or a bounded recent window (keep_steps: the steps from the newest
// one that every expected device reported, at most keep_steps of them; so the window stays
// small unless some device falls behind). The coordinator keeps
// metric history in its StateStore (with retention) and builds a MetricsStore per query.
//
// Thread-safe.
#ifndef SUBSTRAX_COORDINATOR_METRICS_STORE_H_
#define SUBSTRAX_COORDINATOR_METRICS_STORE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/map.h"
#include "substrax/v1/job.pb.h"
#include "substrax/v1/metrics.pb.h"
#include "substrax/v1/metrics_service.pb.h"
#include "substrax/v1/topology.pb.h"

namespace substrax {

// The timing fields of a StepReport, kept as metrics of these names.
inline constexpr char kSamplesPerSecond[] = "samples_per_second";
inline constexpr char kDataWaitSeconds[] = "data_wait_seconds";
inline constexpr char kComputeSeconds[] = "compute_seconds";
inline constexpr char kCollectiveSeconds[] = "collective_seconds";

// Metric name -> reduction, as JobSpec.metrics declares it.
using DeclaredReductions = google::protobuf::Map<std::string, v1::Reduction>;

// The devices a step's values are expected from, device id -> host: those of the attempt's
// mesh. Empty: the devices that reported any point of the attempt (all a store knows of an
// attempt whose mesh is gone).
using ExpectedDevices = std::map<int, std::string>;

// The devices of `mesh`, as ExpectedDevices.
ExpectedDevices DevicesOf(const v1::Mesh& mesh);

// The reduction a query applies to `name`: `requested` unless REDUCTION_UNSPECIFIED, else the
// declared one, else SUM for samples_per_second (the job's throughput is the sum over its
// devices, as JobProgress.samples_per_second) and MEAN for everything else.
v1::Reduction EffectiveReduction(const std::string& name, v1::Reduction requested,
                                 const DeclaredReductions& declared);

class MetricsStore {
 public:
  // keep_steps 0: every point added is kept (a query's view of points read from the store).
  // keep_steps N > 0: per job, only its newest attempt's steps from the newest one that every
  // expected device (Add) reported, at most its N highest (the coordinator's in-memory view for
  // progress: bounded by active jobs x devices x N, and about one step per job while its
  // devices report together).
  explicit MetricsStore(int keep_steps = 0) : keep_steps_(keep_steps) {}

  // Keeps every values[] entry of the report, plus samples_per_second, data_wait_seconds,
  // compute_seconds and collective_seconds as metrics of those names. `expected`: the devices
  // of the report's attempt, which tell a store with keep_steps when a step is complete (only
  // their number is used: reports come from the attempt's devices).
  void Add(const v1::StepReport& report, const ExpectedDevices& expected = {});

  // Serves MetricsService.QueryMetrics:
  //  - the points of the attempt asked for; attempt 0: the job's latest attempt that has
  //    points (earlier attempts restarted from a checkpoint and their steps would overlap);
  //    the response names the attempt;
  //  - steps in [first, last] (last 0: to the latest);
  //  - one series per (name, group), names in the order asked (all the attempt has, sorted by
  //    name, when none are asked), groups sorted (device ids numerically, hosts by name);
  //    every device (host) of the attempt has a series, even one without points in the range;
  //  - at each step, the values of the group's devices that reported that step, reduced as
  //    EffectiveReduction says; num_values counts them; expected_values counts the group's
  //    devices in `expected` (1 per device series); partial when fewer reported; time is the
  //    latest arrival among them;
  //  - group: "" (GROUP_BY_NONE / UNSPECIFIED), the device id (GROUP_BY_DEVICE), the host
  //    (GROUP_BY_HOST); the devices (hosts) of `expected` have a series too;
  //  - REDUCTION_NONE keeps every value: one series per device (group = device id) whatever
  //    group_by says (a host's devices each get their own series; grouping without combining
  //    is exactly that), each point with num_values 1.
  // Errors: NOT_FOUND (the job has no points yet; the attempt asked for has none: the message
  // lists those that have; a requested name the attempt never reported: the message lists the
  // names it has), INVALID_ARGUMENT (attempt < 0, steps.first < 0,
  // steps.last < 0, or steps.last != 0 and last < first).
  // `expected`: the devices of the attempt asked for (see ExpectedDevices).
  absl::StatusOr<v1::QueryMetricsResponse> Query(const v1::QueryMetricsRequest& request,
                                                 const DeclaredReductions& declared,
                                                 const ExpectedDevices& expected = {}) const;

  // For JobProgress: the newest step of (job, attempt) that every device of `expected` reported;
  // that step's values[] metrics (not the timing ones) reduced over them, as declared (MEAN
  // when not declared); samples_per_second: every device's latest rate (from the newest step it
  // reported), summed. total_steps and final_metrics are left for the caller. std::nullopt when
  // no kept step has every expected device yet (the caller keeps showing what it had).
  std::optional<v1::JobProgress> Latest(const std::string& job_id, int attempt,
                                        const DeclaredReductions& declared,
                                        const ExpectedDevices& expected = {}) const;

  // Drops every point of the job.
  void Forget(const std::string& job_id);

 private:
  struct DevicePoint {
    std::string host;
    google::protobuf::Timestamp time;
    std::map<std::string, double> values;
  };
  struct Attempt {
    // step -> device id -> what the device reported at that step.
    std::map<int64_t, std::map<int, DevicePoint>> steps;
    // Every device that reported (with its host), and every metric name reported.
    std::map<int, std::string> devices;
    std::set<std::string> names;
  };
  // attempt -> points.
  using JobPoints = std::map<int, Attempt>;

  const int keep_steps_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, JobPoints> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_METRICS_STORE_H_
