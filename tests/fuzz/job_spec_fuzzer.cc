// Fuzz target: a TrainJob YAML document through everything the coordinator and `substraxctl
// plan` do with it: ParseJobSpecYaml (read, defaults, validation), the raw path of a client that
// skipped the checks (ReadJobSpecYaml, ApplyJobSpecDefaults, ValidateJobSpec), and for a valid
// spec the mesh (CreateMeshForJob), its data-parallel layout and the plan (PlanJob) on a cluster
// just big enough for it.
//
// Besides crashes and sanitizer findings it checks what the headers promise: both paths agree,
// defaults are idempotent, and a valid spec's mesh has RequiredDevices() devices.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/device_mesh_manager.h"
#include "core/job_spec.h"
#include "core/mesh.h"
#include "core/plan.h"
#include "core/sharding.h"
#include "google/protobuf/util/message_differencer.h"
#include "substrax/v1/job.pb.h"

namespace substrax {
namespace {

// Larger meshes are valid but only slow the fuzzer down: they take no other code path.
constexpr int64_t kMaxFuzzedDevices = 512;

void Check(bool condition, const char* what, const std::string& detail) {
  if (condition) return;
  std::fprintf(stderr, "job_spec_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

// The mesh, its layout and the plan of a valid spec.
void PlanValidSpec(const v1::JobSpec& spec) {
  const int64_t required = RequiredDevices(spec);
  Check(required >= 1, "a valid spec needs no devices", spec.DebugString());
  if (required > kMaxFuzzedDevices) return;
  // Hosts as wide as the model axis, so that every mesh type fits without crossing hosts.
  const int64_t per_host = ModelAxisSize(spec);
  const std::vector<Device> devices = MakeUniformCluster(
      static_cast<int>((required + per_host - 1) / per_host), static_cast<int>(per_host));
  absl::StatusOr<Mesh> mesh = CreateMeshForJob(spec.mesh(), devices);
  Check(mesh.ok(), "a valid spec's mesh does not fit a cluster sized for it",
        mesh.status().ToString() + "\n" + spec.DebugString());
  Check(mesh->size() == required, "the mesh's size is not RequiredDevices()",
        mesh->ShapeString());
  DeviceMeshManager::GetMeshInfo(*mesh).ToString();
  if (mesh->HasAxis(kDataAxis)) {
    absl::StatusOr<NamedSharding> sharding = CreateDataParallelSharding(*mesh);
    Check(sharding.ok(), "no data-parallel sharding on a mesh with a data axis",
          sharding.status().ToString());
    const int64_t global_batch = PerDeviceBatchSize(spec) * DataAxisSize(spec);
    absl::StatusOr<ShardLayout> layout = sharding->Layout({global_batch, 3});
    Check(layout.ok(), "the global batch does not divide over the data axis",
          layout.status().ToString());
  }
  // The data's width; files are not read here (the spec may name any path).
  const int64_t num_features =
      spec.data().format() == v1::DATA_FORMAT_SYNTHETIC ? spec.data().synthetic().num_features()
                                                         : 784;
  absl::StatusOr<JobPlan> plan = PlanJob(spec, devices, num_features);
  if (plan.ok()) {
    Check(plan->memory.total() >= 0, "negative planned memory", spec.DebugString());
  }
}

void FuzzJobSpec(const std::string& yaml) {
  absl::StatusOr<v1::JobSpec> parsed = ParseJobSpecYaml(yaml, "fuzz.yaml");

  absl::StatusOr<v1::JobSpec> raw = ReadJobSpecYaml(yaml, "fuzz.yaml");
  if (raw.ok()) {
    v1::JobSpec defaulted = *raw;
    ApplyJobSpecDefaults(&defaulted);
    v1::JobSpec twice = defaulted;
    ApplyJobSpecDefaults(&twice);
    Check(google::protobuf::util::MessageDifferencer::Equals(defaulted, twice),
          "ApplyJobSpecDefaults is not idempotent", defaulted.DebugString());
    // ParseJobSpecYaml may refuse more: it sees which fields the YAML wrote, so an explicit
    // `model_parallel_size: 0` is an error there, while the message path (no presence in
    // proto3) reads the 0 as "not given" and defaults it. It may never accept what the
    // message path refuses.
    const bool valid = ValidateJobSpec(defaulted).ok();
    Check(valid || !parsed.ok(), "ParseJobSpecYaml accepts a spec Defaults+Validate refuse",
          parsed.status().ToString() + "\n" + defaulted.DebugString());
  } else {
    Check(!parsed.ok(), "ParseJobSpecYaml accepts what ReadJobSpecYaml refuses",
          raw.status().ToString());
  }
  if (parsed.ok()) PlanValidSpec(*parsed);
}

}  // namespace
}  // namespace substrax

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  substrax::FuzzJobSpec(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
