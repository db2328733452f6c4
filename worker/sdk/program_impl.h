// The SDK's Program (substrax/program.h), with what substrax's own runner needs beyond the
// public surface: the launch, the rendezvous store, the coordinator's stub and raw step reports.
// The built-in trainer (`substrax-job run`) is a program on the SDK: it starts through the
// same Init as a user's program and reports through the same channel.
#ifndef SUBSTRAX_WORKER_SDK_PROGRAM_IMPL_H_
#define SUBSTRAX_WORKER_SDK_PROGRAM_IMPL_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/mesh.h"
#include "substrax/program.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "substrax/v1/program.pb.h"
#include "worker/collectives/store.h"
#include "worker/sdk/step_reporter.h"
#include "core/model_catalog.h"
#include "worker/runtime/checkpointing.h"
#include "worker/runtime/device_connections.h"
#include "worker/runtime/local_devices.h"
#include "contract/launch.h"

namespace substrax {

// The environment variable that overrides InitOptions::standalone_devices.
inline constexpr char kDevicesEnv[] = "SUBSTRAX_DEVICES";

class ProgramImpl final : public Program {
 public:
  // In a job: reads the launch file at `launch_path`, connects to the coordinator and creates
  // the launch's started file. Errors: as substrax::Init.
  static absl::StatusOr<std::unique_ptr<ProgramImpl>> FromLaunch(const std::string& launch_path);
  // The same from a launch in memory (substrax's runner builds it from its command line); an
  // empty started_path creates no file.
  static absl::StatusOr<std::unique_ptr<ProgramImpl>> FromLaunchProto(v1::ProgramLaunch launch);
  // Standalone, `devices` local CPU devices.
  static absl::StatusOr<std::unique_ptr<ProgramImpl>> Standalone(int devices,
                                                                 JobSettings settings);
  ~ProgramImpl() override;

  bool standalone() const override { return !launch_.has_value(); }
  const JobSettings& settings() const override { return settings_; }
  int process_index() const override { return process_index_; }
  int num_processes() const override { return NumProcesses(process_of_position_); }
  const Mesh& mesh() const override { return mesh_; }
  std::vector<int> local_device_ids() const override;
  absl::Status RunOnDevices(const std::function<absl::Status(DeviceContext&)>& fn) override;
  void SetTotalSteps(int64_t total_steps) override;
  absl::Status ReportMetrics(const DeviceContext& ctx, int64_t step, const Metrics& metrics,
                             const ReportTiming& timing) override;
  void SetFinalMetrics(const Metrics& metrics) override;
  absl::Status ConfigureCheckpoints(const CheckpointOptions& options) override;
  absl::StatusOr<int64_t> RestoreCheckpoint(const DeviceContext& ctx, TensorTree* params,
                                            Optimizer& optimizer) override;
  absl::Status SaveCheckpoint(const DeviceContext& ctx, int64_t step, const TensorTree& params,
                              const Optimizer& optimizer) override;
  int Finish(const absl::Status& status) override;

  // --- For substrax's runner ---
  // The launch (in a job only).
  const v1::ProgramLaunch* launch() const { return launch_ ? &*launch_ : nullptr; }
  // The job's process table: the process of each mesh position.
  const std::vector<int>& process_of_position() const { return process_of_position_; }
  // The attempt's rendezvous store.
  Store* store() const { return store_.get(); }
  // The coordinator (null standalone).
  const std::shared_ptr<v1::CoordinatorService::StubInterface>& stub() const { return stub_; }
  // How this process's devices connect.
  ConnectionOptions connection_options() const;
  // RunOnDevices as substrax's trainer runs it: the device threads as `local` says (pinned or
  // not, and its own checkpoint writer flushed once every device returned). Errors: as
  // RunOnDevices.
  absl::Status RunOnDevices(const std::function<absl::Status(DeviceContext&)>& fn,
                            const LocalDeviceOptions& local);
  // Queues one step report as it is (job and attempt are set by the reporter). No-op standalone.
  void EnqueueStepReport(v1::StepReport report);
  // Sends a checkpoint report (where the attempt resumed from, or the directory's listing after
  // a commit), retrying while the coordinator is unreachable (up to about a minute); one that
  // cannot be delivered is printed and dropped: the checkpoint itself is committed on disk, only
  // its listing in `get` is late. Job and attempt are filled in. No-op standalone.
  void ReportCheckpoints(v1::ReportCheckpointsRequest request) const;
  // Process 0, once per attempt: where it resumed from and which checkpoints it skipped, printed
  // and reported (ReportCheckpoints).
  void ReportResume(const v1::CheckpointResume& resume) const;

 private:
  ProgramImpl(Mesh mesh, JobSettings settings) : mesh_(std::move(mesh)), settings_(settings) {}
  // Standalone: prints the step's metrics reduced over the local devices once all reported, with
  // the process's throughput since the previous line.
  void PrintWhenComplete(int device_id, int64_t step, const Metrics& metrics,
                         const ReportTiming& timing);
  // Standalone: the process's samples per second since the previous printed report (0: not
  // known), and the step and time that report counts from next.
  double SamplesPerSecondLocked(int64_t step, double reported) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Standalone, at Finish: the throughput over the printed reports, on stderr.
  void PrintThroughput();
  void WriteResult(v1::ReportAttemptStatusRequest result) const;

  Mesh mesh_;
  JobSettings settings_;
  std::optional<v1::ProgramLaunch> launch_;
  std::vector<int> process_of_position_;
  int process_index_ = 0;
  std::shared_ptr<v1::CoordinatorService::StubInterface> stub_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<GrpcStepSender> sender_;
  std::unique_ptr<StepReporter> reporter_;
  bool ran_ = false;

  // Checkpoints (ConfigureCheckpoints): the arrays' layouts, where this attempt resumes from (the
  // reader is not thread-safe: one device reads at a time), and the writer.
  bool checkpoints_configured_ = false;
  std::vector<ParamSpec> checkpoint_params_;
  std::optional<ResumePoint> resume_;
  absl::Mutex reader_mu_;
  std::unique_ptr<Checkpointer> checkpointer_;

  absl::Mutex mu_;
  int64_t total_steps_ ABSL_GUARDED_BY(mu_) = 0;
  Metrics final_metrics_ ABSL_GUARDED_BY(mu_);
  // Standalone: the metrics of each step until every local device reported it, and the sum of
  // the devices' measured samples per second (ReportTiming).
  std::map<int64_t, std::map<int, Metrics>> pending_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, double> pending_samples_per_second_ ABSL_GUARDED_BY(mu_);
  // Standalone throughput: the step and time of the previous printed report (at first: where
  // the run started, RunOnDevices and RestoreCheckpoint), and the samples and time measured.
  int64_t printed_step_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time printed_at_ ABSL_GUARDED_BY(mu_) = absl::Now();
  double measured_samples_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration measured_time_ ABSL_GUARDED_BY(mu_);
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_SDK_PROGRAM_IMPL_H_
