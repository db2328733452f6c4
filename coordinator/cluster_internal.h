// Helpers shared by the files of the Cluster (cluster*.cc); internal to //coordinator:cluster.
#ifndef SUBSTRAX_COORDINATOR_CLUSTER_INTERNAL_H_
#define SUBSTRAX_COORDINATOR_CLUSTER_INTERNAL_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/device.h"
#include "core/mesh.h"
#include "google/protobuf/map.h"
#include "substrax/v1/job.pb.h"

namespace substrax::cluster_internal {

// Separates a pending job's reason from why it waits ("submitted; waiting for 4 free devices").
inline constexpr char kWaitingSeparator[] = "; waiting for ";
// The layout name of the global batch.
inline constexpr char kBatchLayout[] = "batch/inputs";

// "RUNNING" for JOB_STATE_RUNNING.
std::string StateName(v1::JobState state);

// "1 worker", "2 workers".
std::string Count(size_t n, absl::string_view noun);

// The shard layouts an attempt's runners need: the global batch split over the data axis.
// Parameter layouts depend on the input width, which only the data knows; a program job
// without a batch has none at all. Errors: the sharding's (the batch does not divide over the
// data axis).
absl::StatusOr<google::protobuf::Map<std::string, v1::ShardLayout>> LayoutsFor(
    const v1::JobSpec& spec, const Mesh& mesh);

// The scheduling pool a job of `backend` draws from, "cpu" or "cuda" (BackendName): auto's
// is CUDA when any of `alive` is a GPU, as DevicesForBackend decides.
std::string PoolName(v1::Backend backend, const std::vector<Device>& alive);

// The workers of an attempt's processes: process p is the p-th distinct worker_id in row-major
// device order (the runtime's rule).
std::vector<std::string> ProcessWorkers(const Mesh& mesh);

// A doctor job's devices among `devices` (cluster_doctor.cc): the first of each worker its
// spec.doctor names, of any kind (it computes nothing on them).
std::vector<Device> DoctorDevices(const v1::JobSpec& spec, const std::vector<Device>& devices);

}  // namespace substrax::cluster_internal

#endif  // SUBSTRAX_COORDINATOR_CLUSTER_INTERNAL_H_
