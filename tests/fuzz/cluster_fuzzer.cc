// Fuzz target: random sequences of the Cluster's rpcs (coordinator/cluster.h) on an
// InMemoryStateStore and a fake clock, checking the scheduler's invariants after every call.
// Only public methods are used, and the invariants are derived from the Job and Worker views
// (ListJobs, ListWorkers, GetJob), so that the target outlives changes of the internals:
//   - no device is in the meshes of two RUNNING jobs;
//   - the jobs ListWorkers shows on each worker are exactly the RUNNING jobs whose mesh has a
//     device of that worker (busy devices = the union of the running meshes);
//   - a RUNNING job has a non-empty mesh of registered devices of ALIVE workers (a worker is
//     declared dead only by Tick, which fails its attempts in the same call) and attempt >= 1;
//   - a job that ended never changes state again; transitions are only appended;
//   - device ids are unique across workers and stable for a (worker, local_index).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/cluster.h"
#include "coordinator/state_store.h"
#include "core/job_spec.h"
#include "substrax/v1/coordinator_service.pb.h"
#include "substrax/v1/job.pb.h"
#include "tests/fuzz/fuzz_input.h"

namespace substrax {
namespace {

// More calls per input only slow the fuzzer down: the states repeat.
constexpr int kMaxCalls = 120;
constexpr int kWorkers = 4;
constexpr int kHosts = 3;
constexpr int kIncarnations = 3;

// A small classification job, read without defaults: Specs() sets its mesh and restarts, then
// applies the defaults.
constexpr char kSpecYaml[] = R"yaml(
apiVersion: substrax/v1
kind: TrainJob
metadata: {name: fuzz}
spec:
  model: {type: mlp, hidden_sizes: [4], num_classes: 3}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 48, num_features: 2, num_outputs: 3}
  optimizer: {type: adam, learning_rate: 0.01}
  batch: {per_device_batch_size: 2}
  steps: 5
  progress_timeout_seconds: 30
)yaml";

// The specs a call may submit: data-parallel, model-parallel and hybrid meshes of 1 to 8
// devices, with 0 or 2 restarts, and one too big for any fuzzed cluster.
const std::vector<v1::JobSpec>& Specs() {
  static const auto* const specs = [] {
    struct Shape {
      v1::MeshType type;
      int data;
      int model;
    };
    const Shape shapes[] = {
        {v1::MESH_TYPE_DATA_PARALLEL, 1, 0}, {v1::MESH_TYPE_DATA_PARALLEL, 2, 0},
        {v1::MESH_TYPE_DATA_PARALLEL, 4, 0}, {v1::MESH_TYPE_MODEL_PARALLEL, 0, 2},
        {v1::MESH_TYPE_HYBRID, 2, 2},        {v1::MESH_TYPE_DATA_PARALLEL, 8, 0},
        {v1::MESH_TYPE_DATA_PARALLEL, 64, 0},
    };
    absl::StatusOr<v1::JobSpec> base = ReadJobSpecYaml(kSpecYaml);
    auto* out = new std::vector<v1::JobSpec>;
    for (const Shape& shape : shapes) {
      for (int restarts = 0; restarts <= 2; restarts += 2) {
        v1::JobSpec spec = base.ok() ? *base : v1::JobSpec();
        spec.set_name(absl::StrCat("fuzz-", out->size()));
        spec.mutable_mesh()->set_type(shape.type);
        spec.mutable_mesh()->set_data_parallel_size(shape.data);
        // A model-parallel mesh counts its devices in num_devices.
        if (shape.type == v1::MESH_TYPE_MODEL_PARALLEL) {
          spec.mutable_mesh()->set_num_devices(shape.model);
        } else {
          spec.mutable_mesh()->set_model_parallel_size(shape.model);
        }
        spec.set_max_restarts(restarts);
        ApplyJobSpecDefaults(&spec);
        const absl::Status valid = base.ok() ? ValidateJobSpec(spec) : base.status();
        if (!valid.ok()) {
          std::fprintf(stderr, "cluster_fuzzer: bad spec %s: %s\n", spec.name().c_str(),
                       valid.ToString().c_str());
          std::abort();
        }
        out->push_back(std::move(spec));
      }
    }
    return out;
  }();
  return *specs;
}

class ClusterFuzzer {
 public:
  explicit ClusterFuzzer(FuzzInput& in) : in_(in) {}

  void Run() {
    ClusterOptions options;
    options.refuse_jobs_that_cannot_fit = in_.Bool();
    options.restart_backoff = absl::Seconds(in_.Range(0, 2));
    absl::StatusOr<std::unique_ptr<Cluster>> cluster =
        Cluster::Create(options, [this] { return now_; }, &state_);
    Check(cluster.ok(), "Cluster::Create failed on an empty store", "");
    cluster_ = *std::move(cluster);
    for (int call = 0; call < kMaxCalls && !in_.empty(); ++call) {
      const std::string what = CallOne();
      CheckInvariants(what);
    }
  }

 private:
  [[noreturn]] static void Fail(const std::string& what, const std::string& detail) {
    std::fprintf(stderr, "cluster_fuzzer: %s\n%s\n", what.c_str(), detail.c_str());
    std::abort();
  }
  static void Check(bool condition, const std::string& what, const std::string& detail) {
    if (!condition) Fail(what, detail);
  }

  std::string WorkerId() { return absl::StrCat("w-", in_.Range(0, kWorkers - 1)); }
  std::string Incarnation() { return absl::StrCat("inc-", in_.Range(0, kIncarnations - 1)); }
  // A job the cluster knows (most of the time), or one it does not.
  std::string JobId() {
    if (job_ids_.empty() || in_.Range(0, 15) == 0) return "no-such-job";
    return job_ids_[in_.Range(0, static_cast<int64_t>(job_ids_.size()) - 1)];
  }
  // The job's current attempt, or a neighbour of it.
  int Attempt(const std::string& job_id) {
    absl::StatusOr<v1::Job> job = cluster_->GetJob(job_id);
    const int current = job.ok() ? job->attempt() : 0;
    return current + static_cast<int>(in_.Range(0, 7) == 0 ? in_.Range(-1, 1) : 0);
  }
  // A device of the job's mesh (most of the time), or any id.
  int DeviceOf(const v1::Job& job) {
    if (job.mesh().devices_size() == 0 || in_.Range(0, 15) == 0) {
      return static_cast<int>(in_.Range(-1, 20));
    }
    return job.mesh().devices(in_.Range(0, job.mesh().devices_size() - 1)).id();
  }
  // The worker of process `process` of the job's mesh: the p-th distinct worker in row-major
  // order (cluster.h).
  static std::string WorkerOfProcess(const v1::Job& job, int process) {
    std::vector<std::string> workers;
    for (const v1::Device& device : job.mesh().devices()) {
      bool known = false;
      for (const std::string& w : workers) known = known || w == device.worker_id();
      if (!known) workers.push_back(device.worker_id());
    }
    return process >= 0 && process < static_cast<int>(workers.size()) ? workers[process] : "";
  }

  std::string CallOne() {
    switch (in_.Range(0, 9)) {
      case 0: {
        v1::RegisterWorkerRequest request;
        request.set_worker_id(WorkerId());
        request.set_host(absl::StrCat("h-", in_.Range(0, kHosts - 1)));
        request.set_incarnation(Incarnation());
        request.set_address("addr:1");
        const int devices = static_cast<int>(in_.Range(0, 4));
        const bool repeat = in_.Range(0, 15) == 0;
        for (int i = 0; i < devices; ++i) {
          v1::Device* device = request.add_devices();
          device->set_local_index(repeat ? 0 : i);
          device->set_kind(v1::DEVICE_KIND_CPU);
          device->set_name("cpu");
        }
        cluster_->RegisterWorker(request).IgnoreError();
        return "RegisterWorker " + request.ShortDebugString();
      }
      case 1: {
        v1::HeartbeatRequest request;
        request.set_worker_id(WorkerId());
        request.set_incarnation(Incarnation());
        const int runners = static_cast<int>(in_.Range(0, 3));
        for (int i = 0; i < runners; ++i) {
          v1::RunnerRef* runner = request.add_runners();
          runner->set_job_id(JobId());
          runner->set_attempt(Attempt(runner->job_id()));
          runner->set_process_index(static_cast<int>(in_.Range(0, 3)));
          runner->set_ended(in_.Range(0, 3) == 0);
        }
        cluster_->Heartbeat(request).IgnoreError();
        return "Heartbeat " + request.ShortDebugString();
      }
      case 2: {
        const int64_t millis = in_.Range(0, 3) == 0 ? in_.Range(0, 60000) : in_.Range(0, 2000);
        now_ += absl::Milliseconds(millis);
        cluster_->Tick();
        return absl::StrCat("Tick after ", millis, "ms");
      }
      case 3: {
        const v1::JobSpec& spec =
            Specs()[in_.Range(0, static_cast<int64_t>(Specs().size()) - 1)];
        absl::StatusOr<v1::Job> job = cluster_->SubmitJob(spec);
        if (job.ok()) job_ids_.push_back(job->id());
        return "SubmitJob " + spec.name();
      }
      case 4: {
        const std::string job_id = JobId();
        cluster_->CancelJob(job_id, in_.Bool() ? "" : "fuzz").IgnoreError();
        return "CancelJob " + job_id;
      }
      case 5:
        return ReportSteps();
      case 6:
        return ReportAttemptStatus();
      case 7: {
        const std::string job_id = JobId();
        cluster_->GetJob(job_id).IgnoreError();
        return "GetJob " + job_id;
      }
      case 8: {
        std::vector<v1::JobState> states;
        if (in_.Bool()) states.push_back(static_cast<v1::JobState>(in_.Range(0, 5)));
        cluster_->ListJobs(states);
        return "ListJobs";
      }
      default:
        cluster_->ListWorkers();
        return "ListWorkers";
    }
  }

  std::string ReportSteps() {
    v1::ReportStepsRequest request;
    request.set_job_id(JobId());
    request.set_attempt(Attempt(request.job_id()));
    absl::StatusOr<v1::Job> job = cluster_->GetJob(request.job_id());
    const int reports = static_cast<int>(in_.Range(0, 3));
    for (int i = 0; i < reports; ++i) {
      v1::StepReport* report = request.add_reports();
      report->set_step(in_.Range(0, 3) == 0 ? in_.Int64() : in_.Range(1, 12));
      report->set_device_id(job.ok() ? DeviceOf(*job) : 0);
      if (in_.Range(0, 7) == 0) report->set_attempt(static_cast<int>(in_.Range(-1, 3)));
      switch (in_.Range(0, 7)) {
        case 0:
          (*report->mutable_values())["loss"] = std::numeric_limits<double>::quiet_NaN();
          break;
        case 1:
          (*report->mutable_values())["loss"] = std::numeric_limits<double>::infinity();
          break;
        default:
          (*report->mutable_values())["loss"] = 0.5;
          (*report->mutable_values())["accuracy"] = 0.75;
      }
      report->set_samples_per_second(static_cast<double>(in_.Range(0, 1000)));
    }
    cluster_->ReportSteps(request).IgnoreError();
    return "ReportSteps " + request.ShortDebugString();
  }

  std::string ReportAttemptStatus() {
    v1::ReportAttemptStatusRequest request;
    request.set_job_id(JobId());
    request.set_attempt(Attempt(request.job_id()));
    request.set_process_index(static_cast<int>(in_.Range(0, 7) == 0 ? in_.Range(-1, 4)
                                                                     : in_.Range(0, 3)));
    absl::StatusOr<v1::Job> job = cluster_->GetJob(request.job_id());
    const std::string worker = job.ok() ? WorkerOfProcess(*job, request.process_index()) : "";
    request.set_worker_id(worker.empty() || in_.Range(0, 7) == 0 ? WorkerId() : worker);
    request.set_state(static_cast<v1::RunnerState>(in_.Range(0, 3)));
    if (request.state() == v1::RUNNER_STATE_FAILED) {
      request.set_exit_code(1);
      request.set_error("fuzzed failure");
      request.set_error_code(static_cast<int>(in_.Range(0, 16)));
    }
    if (request.process_index() == 0) (*request.mutable_final_metrics())["test_accuracy"] = 0.5;
    cluster_->ReportAttemptStatus(request).IgnoreError();
    return "ReportAttemptStatus " + request.ShortDebugString();
  }

  void CheckInvariants(const std::string& call) {
    const std::vector<v1::Worker> workers = cluster_->ListWorkers();
    const std::vector<v1::Job> jobs = cluster_->ListJobs({});
    const std::string context = "after " + call;

    // Device ids: unique across workers, stable for a (worker, local_index).
    std::map<int, std::pair<std::string, int>> device_owner;
    std::map<std::string, const v1::Worker*> worker_by_id;
    for (const v1::Worker& worker : workers) {
      worker_by_id[worker.worker_id()] = &worker;
      for (const v1::Device& device : worker.devices()) {
        const std::pair<std::string, int> key(worker.worker_id(), device.local_index());
        Check(device_owner.emplace(device.id(), key).second,
              absl::StrCat("device id ", device.id(), " is on two workers"), context);
        auto [it, inserted] = stable_ids_.emplace(key, device.id());
        Check(it->second == device.id(),
              absl::StrCat("the id of ", key.first, "/", key.second, " changed"), context);
      }
    }

    std::map<int, std::string> busy;                          // device id -> running job
    std::map<std::string, std::set<std::string>> jobs_on;     // worker id -> running jobs
    for (const v1::Job& job : jobs) {
      const std::string where = absl::StrCat("job ", job.id(), " ", context);
      auto previous = seen_.find(job.id());
      if (previous != seen_.end()) {
        Check(!IsTerminalJobState(previous->second.state) ||
                  previous->second.state == job.state(),
              "a job that ended changed state", where);
        Check(job.transitions_size() >= previous->second.transitions,
              "transitions were removed", where);
      }
      seen_[job.id()] = {job.state(), job.transitions_size()};
      if (job.state() != v1::JOB_STATE_RUNNING) continue;

      Check(job.attempt() >= 1, "a RUNNING job with attempt 0", where);
      Check(job.mesh().devices_size() > 0, "a RUNNING job without a mesh", where);
      for (const v1::Device& device : job.mesh().devices()) {
        auto [it, inserted] = busy.emplace(device.id(), job.id());
        Check(inserted, absl::StrCat("device ", device.id(), " is in two running jobs: ",
                                     it->second, " and ", job.id()),
              where);
        auto owner = device_owner.find(device.id());
        Check(owner != device_owner.end() && owner->second.first == device.worker_id() &&
                  owner->second.second == device.local_index(),
              absl::StrCat("device ", device.id(), " of the mesh is not a registered device"),
              where);
        const v1::Worker* worker = worker_by_id[device.worker_id()];
        Check(worker != nullptr && worker->state() == v1::WORKER_STATE_ALIVE,
              "a RUNNING job on a worker that is not alive: " + device.worker_id(), where);
        jobs_on[device.worker_id()].insert(job.id());
      }
    }
    for (const v1::Worker& worker : workers) {
      const std::set<std::string> shown(worker.job_ids().begin(), worker.job_ids().end());
      Check(shown == jobs_on[worker.worker_id()],
            absl::StrCat("worker ", worker.worker_id(),
                         " shows other jobs than the running meshes on it"),
            context);
    }
  }

  struct Seen {
    v1::JobState state;
    int transitions;
  };

  FuzzInput& in_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  InMemoryStateStore state_;
  std::unique_ptr<Cluster> cluster_;
  std::vector<std::string> job_ids_;
  std::map<std::string, Seen> seen_;
  std::map<std::pair<std::string, int>, int> stable_ids_;
};

}  // namespace
}  // namespace substrax

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  substrax::FuzzInput in(data, size);
  substrax::ClusterFuzzer(in).Run();
  return 0;
}
