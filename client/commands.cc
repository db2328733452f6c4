#include "client/commands.h"

#include "grpc/health/v1/health.grpc.pb.h"

#include <sstream>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/backoff.h"
#include "client/plot.h"
#include "client/progress.h"
#include "client/tensorboard_export.h"
#include "client/command_util.h"
#include "client/plan_env.h"
#include "core/device.h"
#include "core/input_shape.h"
#include "core/job_spec.h"
#include "core/plan.h"
#include "rpc/pki.h"
#include "substrax/v1/job_service.grpc.pb.h"
#include "substrax/v1/metrics_service.grpc.pb.h"

namespace substrax::ctl {
namespace {

// How many times `submit` sends its request before it reports the error.
constexpr int kSubmitAttempts = 4;

// Prints a flag error as the command line parser would and returns the usage exit code.
int UsageError(const CommandContext& ctx, const absl::Status& status) {
  *ctx.err << "substraxctl: " << status.message() << "\n";
  return kExitUsage;
}

// Loads, defaults and validates the job spec at `path` into `spec`. A bad spec prints
// "substraxctl: <invalid_note>:" and every problem, one a line; returns the exit code.
int LoadSpec(const CommandContext& ctx, const std::string& path, absl::string_view invalid_note,
             v1::JobSpec* spec) {
  absl::StatusOr<v1::JobSpec> loaded = LoadJobSpecFile(UserPath(path, ctx.working_directory));
  if (!loaded.ok()) {
    if (loaded.status().code() == absl::StatusCode::kInvalidArgument) {
      *ctx.err << "substraxctl: " << invalid_note << ":\n" << loaded.status().message() << "\n";
    } else {
      *ctx.err << "substraxctl: " << loaded.status().message() << "\n";
    }
    return kExitUsage;
  }
  *spec = *std::move(loaded);
  return kExitOk;
}

// The devices of `plan`: `workers` CPU devices as --workers describes them, or those of the
// coordinator's alive workers when the flag is empty. `source` says which, for messages;
// `known` gets what plan --env shows of each worker.
int PlanDevices(const CommandContext& ctx, const std::string& workers, std::vector<Device>* devices,
                std::string* source, std::map<std::string, PlanWorker>* known) {
  if (!workers.empty()) {
    absl::StatusOr<WorkersShape> shape = ParseWorkersShape(workers);
    if (!shape.ok()) return UsageError(ctx, shape.status());
    // Worker daemons name themselves after their host; each poses as one host.
    *devices = MakeUniformCluster(shape->workers, shape->devices_per_worker);
    for (Device& d : *devices) {
      d.host = absl::StrCat("worker-", d.id / shape->devices_per_worker);
      d.worker_id = d.host;
      (*known)[d.worker_id].host = d.host;
    }
    *source = absl::StrCat("--workers ", workers);
    return kExitOk;
  }
  v1::ListWorkersResponse response;
  if (int rc = CallJobService(ctx, &v1::JobService::Stub::ListWorkers, v1::ListWorkersRequest(),
                              &response)) {
    if (rc == kExitUnreachable) {
      *ctx.err << "substraxctl: plan needs the coordinator only for the cluster's devices; "
                  "without one, describe them: --workers 2x2 (2 workers of 2 devices)\n";
    }
    return rc;
  }
  int alive = 0;
  for (const v1::Worker& worker : response.workers()) {
    if (worker.state() != v1::WORKER_STATE_ALIVE) continue;
    ++alive;
    for (const v1::Device& device : worker.devices()) devices->push_back(DeviceFromProto(device));
    PlanWorker& plan_worker = (*known)[worker.worker_id()];
    plan_worker.host = AddressHost(worker.address().empty() ? worker.host() : worker.address());
    plan_worker.data_roots.assign(worker.data_roots().begin(), worker.data_roots().end());
    plan_worker.checkpoint_roots.assign(worker.checkpoint_roots().begin(),
                                        worker.checkpoint_roots().end());
  }
  if (devices->empty()) {
    *ctx.err << "substraxctl: the coordinator at " << ctx.coordinator
             << " has no alive worker with devices; start workers, or plan for a cluster shape "
                "with --workers 2x2 (2 workers of 2 devices)\n";
    return kExitError;
  }
  *source = absl::StrCat("the alive workers at ", ctx.coordinator);
  return kExitOk;
}

// --plot draws for people; its size flags mean nothing without it.
absl::Status CheckPlotFlags(const CommandContext& ctx, const MetricsFlags& flags) {
  if (flags.plot && ctx.format != OutputFormat::kTable) {
    return absl::InvalidArgumentError(
        "--plot draws a chart for people and cannot be combined with -o json or -o yaml; "
        "leave out --plot to get the series as data");
  }
  if (flags.plot && !flags.tensorboard.empty()) {
    return absl::InvalidArgumentError(
        "--plot draws the series and --tensorboard writes them to files; choose one");
  }
  if (!flags.plot && (flags.width != 0 || flags.height != 0)) {
    return absl::InvalidArgumentError("--width and --height size the chart of --plot; add --plot");
  }
  if (flags.width != 0 && flags.width < kMinPlotWidth) {
    return absl::InvalidArgumentError(absl::StrCat("--width: ", flags.width, " columns is too "
                                                   "narrow for a chart; give at least ",
                                                   kMinPlotWidth));
  }
  if (flags.height != 0 && flags.height < kMinPlotHeight) {
    return absl::InvalidArgumentError(absl::StrCat("--height: ", flags.height, " lines is too "
                                                   "low for a chart; give at least ",
                                                   kMinPlotHeight));
  }
  return absl::OkStatus();
}

}  // namespace

int SubmitCommand(const CommandContext& ctx, const std::string& path, bool watch,
                  const std::string& resume_from) {
  v1::SubmitJobRequest request;
  if (int rc = LoadSpec(ctx, path, "invalid job spec, nothing was submitted",
                        request.mutable_spec())) {
    return rc;
  }
  // A directory on the workers: the coordinator checks it against their checkpoint roots.
  if (!resume_from.empty()) request.mutable_spec()->set_resume_from(resume_from);
  // Drawn once per invocation and sent again on every retry below: a submit whose answer was
  // lost returns the job it made rather than making a second one.
  request.set_request_id(pki::RandomToken(16));
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Connect(ctx, ctx.coordinator);
  if (!channel.ok()) return ReportCredentialError(ctx, channel.status());
  std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(*channel);
  v1::SubmitJobResponse response;
  // Retries what may go better a moment later and is safe to repeat with the request id:
  // UNAVAILABLE (the coordinator restarting or unreachable, its state store failing, the same
  // request still being stored) and DEADLINE_EXCEEDED (the answer may have been lost), a few
  // times with exponential backoff and jitter; anything else is the user's to fix.
  Backoff backoff({.initial = absl::Milliseconds(250), .max = absl::Seconds(2)});
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    SetDeadline(&context, ctx.timeout);
    const grpc::Status status = stub->SubmitJob(&context, request, &response);
    if (status.ok()) break;
    const bool retryable = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!retryable || attempt == kSubmitAttempts) {
      return ReportRpcError(ctx, status, channel->get());
    }
    absl::SleepFor(*backoff.Next());
  }
  PrintResult(ctx, response.job(), [&] { return response.job().id() + "\n"; });
  return watch ? WatchCommand(ctx, response.job().id()) : kExitOk;
}

int ListCommand(const CommandContext& ctx, const std::string& states) {
  absl::StatusOr<std::vector<v1::JobState>> parsed = ParseJobStates(states);
  if (!parsed.ok()) return UsageError(ctx, parsed.status());
  v1::ListJobsRequest request;
  for (v1::JobState s : *parsed) request.add_states(s);
  request.set_page_size(1000);
  // Every page: a cluster keeps few enough jobs for one screen of pages.
  v1::ListJobsResponse all;
  do {
    v1::ListJobsResponse page;
    if (int rc = CallJobService(ctx, &v1::JobService::Stub::ListJobs, request, &page)) return rc;
    for (v1::Job& job : *page.mutable_jobs()) *all.add_jobs() = std::move(job);
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return PrintResult(
      ctx, all,
      [&] { return FormatJobsTable({all.jobs().begin(), all.jobs().end()}, FormatOptionsOf(ctx)); },
      all.jobs().empty(), "no jobs");
}

int CheckpointsCommand(const CommandContext& ctx, const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::GetJobResponse response;
  if (int rc = CallJobService(ctx, &v1::JobService::Stub::GetJob, request, &response)) return rc;
  const v1::Job& job = response.job();
  v1::CheckpointListing listing;
  *listing.mutable_checkpoints() = job.checkpoints();
  const std::string none =
      job.spec().has_checkpoint()
          ? absl::StrCat("no checkpoint of job ", job_id, " has been committed yet (",
                         job.spec().checkpoint().directory(), ")")
          : absl::StrCat("job ", job_id, " does not checkpoint (its spec has no checkpoint "
                         "section)");
  return PrintResult(
      ctx, listing, [&] { return FormatCheckpointsTable(job, FormatOptionsOf(ctx)); },
      job.checkpoints().empty(), none);
}

int GetCommand(const CommandContext& ctx, const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::GetJobResponse response;
  if (int rc = CallJobService(ctx, &v1::JobService::Stub::GetJob, request, &response)) return rc;
  // A job that has run has shardings; the table shows them after the job (best effort: the job
  // is shown even if the mesh cannot be fetched).
  std::string shardings;
  if (!response.job().mesh().devices().empty() && ctx.format == OutputFormat::kTable) {
    v1::GetMeshRequest mesh_request;
    mesh_request.set_job_id(job_id);
    v1::GetMeshResponse mesh;
    std::ostringstream ignored;
    CommandContext quiet = ctx;
    quiet.err = &ignored;
    if (CallJobService(quiet, &v1::JobService::Stub::GetMesh, mesh_request, &mesh) == 0 &&
        !mesh.layouts().empty()) {
      shardings = "\nShardings:\n" + FormatShardingSummary(mesh);
    }
  }
  return PrintResult(ctx, response.job(), [&] {
    return FormatJobDetails(response.job(), FormatOptionsOf(ctx)) + shardings;
  });
}

int WatchCommand(const CommandContext& ctx, const std::string& job_id) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Connect(ctx, ctx.coordinator);
  if (!channel.ok()) return ReportCredentialError(ctx, channel.status());
  std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(*channel);
  // No deadline: a job may run for days. The stream ends when the job does.
  grpc::ClientContext context;
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  std::unique_ptr<grpc::ClientReader<v1::WatchJobResponse>> reader =
      stub->WatchJob(&context, request);

  const ProgressStyle style{ctx.terminal, ctx.columns, ctx.unicode};
  EtaEstimator eta;
  // The loss of each step the stream showed, latest last, for the trend beside the bar. The
  // stream carries every report, so no metrics query is needed. Progress moves only to a step
  // every device reported (reduced over all of them); should a step's value change all the
  // same (a resent report), the latest replaces it.
  std::vector<double> losses;
  int64_t loss_step = -1;
  std::optional<v1::Job> last;
  bool bar_shown = false;  // a bar is on the current terminal line
  auto end_bar = [&] {
    if (bar_shown) *ctx.out << "\n";
    bar_shown = false;
  };
  v1::WatchJobResponse update;
  while (reader->Read(&update)) {
    const v1::Job& job = update.job();
    if (ctx.format != OutputFormat::kTable) {
      *ctx.out << (ctx.format == OutputFormat::kJson ? ToJsonLine(job)
                                                     : "---\n" + JsonToYaml(ToJsonLine(job)));
      ctx.out->flush();
      last = job;
      continue;
    }
    const bool changed = !last.has_value() || last->state() != job.state() ||
                         last->attempt() != job.attempt();
    if (changed && !IsTerminal(job.state())) {
      end_bar();
      *ctx.out << RenderStateChange(job) << "\n";
    } else if (!changed) {
      // What happened within the state since the last update: a straggler flagged or cleared
      // (docs/diagnosis.md), on a line of its own.
      for (int i = last->transitions_size(); i < job.transitions_size(); ++i) {
        const v1::JobTransition& t = job.transitions(i);
        if (t.from() != t.to() || t.reason().empty()) continue;
        end_bar();
        *ctx.out << "job " << job.id() << ": " << t.reason() << "\n";
      }
    }
    if (job.state() == v1::JOB_STATE_RUNNING && job.progress().total_steps() > 0) {
      if (changed) {  // a new attempt restarts the estimate and the trend
        eta = EtaEstimator();
        losses.clear();
        loss_step = -1;
      }
      eta.Observe(ctx.clock(), job.progress().step());
      const auto loss = job.progress().metrics().find("loss");
      if (loss != job.progress().metrics().end()) {
        if (losses.empty() || job.progress().step() != loss_step) {
          losses.push_back(loss->second);
          if (losses.size() > kLossTrendLength) losses.erase(losses.begin());
        } else {
          losses.back() = loss->second;
        }
        loss_step = job.progress().step();
      }
      const std::string line =
          RenderProgress(job, eta.Remaining(job.progress().total_steps()), style, losses);
      if (ctx.terminal) {
        *ctx.out << "\r" << line << "\x1b[K";
        bar_shown = true;
      } else if (changed || last->progress().step() != job.progress().step()) {
        *ctx.out << line << "\n";
      }
    }
    ctx.out->flush();
    last = job;
  }
  end_bar();
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return ReportRpcError(ctx, status, channel->get());
  if (!last.has_value() || !IsTerminal(last->state())) {
    *ctx.err << "substraxctl: the coordinator ended the watch before job " << job_id
             << " ended (last state "
             << (last.has_value() ? JobStateName(last->state()) : "unknown")
             << "); run `substraxctl watch " << job_id << "` again\n";
    return kExitError;
  }
  if (ctx.format == OutputFormat::kTable) *ctx.out << FormatJobOutcome(*last);
  ctx.out->flush();
  if (last->state() == v1::JOB_STATE_SUCCEEDED) return kExitOk;
  *ctx.err << "substraxctl: job " << last->id() << " " << JobStateName(last->state());
  if (!last->error().empty()) *ctx.err << ": " << last->error();
  *ctx.err << "\n";
  return kExitError;
}

int CancelCommand(const CommandContext& ctx, const std::string& job_id,
                  const std::string& reason) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  v1::CancelJobResponse response;
  if (int rc = CallJobService(ctx, &v1::JobService::Stub::CancelJob, request, &response)) {
    return rc;
  }
  return PrintResult(ctx, response.job(), [&] {
    return absl::StrCat(response.job().id(), " ", JobStateName(response.job().state()), "\n");
  });
}

int LogsCommand(const CommandContext& ctx, const std::string& job_id, const LogsFlags& flags) {
  if (flags.process < -1) {
    return UsageError(ctx, absl::InvalidArgumentError(absl::StrCat(
                               "--process: ", flags.process,
                               " is not a process index (0, 1, ...)")));
  }
  if (flags.attempt < 0) {
    return UsageError(ctx, absl::InvalidArgumentError(absl::StrCat(
                               "--attempt: ", flags.attempt,
                               " is not an attempt (1 is the first)")));
  }
  if (flags.tail < 0) {
    return UsageError(ctx, absl::InvalidArgumentError(
                               absl::StrCat("--tail: ", flags.tail, " lines; give 1 or more")));
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Connect(ctx, ctx.coordinator);
  if (!channel.ok()) return ReportCredentialError(ctx, channel.status());
  std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(*channel);
  grpc::ClientContext context;
  // A followed log lasts as long as its job; a one-off read gets the usual deadline.
  if (!flags.follow) SetDeadline(&context, ctx.timeout);
  v1::ReadLogsRequest request;
  request.set_job_id(job_id);
  request.set_attempt(flags.attempt);
  if (flags.process >= 0) request.set_process_index(flags.process);
  request.set_tail_lines(flags.tail);
  request.set_follow(flags.follow);
  std::unique_ptr<grpc::ClientReader<v1::ReadLogsResponse>> reader =
      stub->ReadLogs(&context, request);
  v1::ReadLogsResponse response;
  while (reader->Read(&response)) {
    for (const std::string& notice : response.notices()) {
      *ctx.err << "substraxctl: " << notice << "\n";
    }
    for (const v1::LogLine& line : response.lines()) {
      switch (ctx.format) {
        case OutputFormat::kJson:
          *ctx.out << ToJsonLine(line);
          break;
        case OutputFormat::kYaml:
          *ctx.out << "---\n" << JsonToYaml(ToJsonLine(line));
          break;
        default:
          *ctx.out << "[p" << line.process_index() << " " << line.host() << "] " << line.text()
                   << "\n";
      }
    }
    ctx.err->flush();
    ctx.out->flush();
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return ReportRpcError(ctx, status, channel->get());
  return kExitOk;
}

int DeleteCommand(const CommandContext& ctx, const std::string& job_id) {
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  v1::DeleteJobResponse response;
  if (int rc = CallJobService(ctx, &v1::JobService::Stub::DeleteJob, request, &response)) {
    return rc;
  }
  *ctx.out << job_id << " deleted\n";
  return kExitOk;
}

int WorkersCommand(const CommandContext& ctx) {
  v1::ListWorkersResponse response;
  if (int rc = CallJobService(ctx, &v1::JobService::Stub::ListWorkers, v1::ListWorkersRequest(),
                              &response)) {
    return rc;
  }
  return PrintResult(
      ctx, response, [&] { return FormatWorkersTable(response, FormatOptionsOf(ctx)); },
      response.workers().empty(), "no workers have registered");
}

int DiagnoseCommand(const CommandContext& ctx, const std::string& job_id) {
  v1::DiagnoseJobRequest request;
  request.set_job_id(job_id);
  v1::DiagnoseJobResponse response;
  if (int rc = CallJobService(ctx, &v1::JobService::Stub::DiagnoseJob, request, &response)) {
    return rc;
  }
  return PrintResult(ctx, response, [&] { return FormatDiagnosis(response, FormatOptionsOf(ctx)); });
}

int QueuesCommand(const CommandContext& ctx) {
  v1::ListQueuesResponse response;
  if (int rc = CallJobService(ctx, &v1::JobService::Stub::ListQueues, v1::ListQueuesRequest(),
                              &response)) {
    return rc;
  }
  return PrintResult(ctx, response, [&] { return FormatQueues(response, FormatOptionsOf(ctx)); });
}

int HealthCommand(const CommandContext& ctx, const std::string& address,
                  const std::string& service) {
  const std::string target = address.empty() ? ctx.coordinator : address;
  // The health-only listeners (--health-listen) are plaintext, for kubelet probes.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      Connect(ctx, target, /*plaintext=*/!address.empty());
  if (!channel.ok()) return ReportCredentialError(ctx, channel.status());
  std::unique_ptr<grpc::health::v1::Health::Stub> stub =
      grpc::health::v1::Health::NewStub(*channel);
  grpc::ClientContext context;
  SetDeadline(&context, ctx.timeout);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    CommandContext at_target = ctx;
    at_target.coordinator = target;
    return ReportRpcError(at_target, status, channel->get());
  }
  const bool serving = response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  *ctx.out << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())
           << "\n";
  ctx.out->flush();
  return serving ? kExitOk : kExitError;
}

int MeshCommand(const CommandContext& ctx, const std::string& job_id) {
  v1::GetMeshRequest request;
  request.set_job_id(job_id);
  v1::GetMeshResponse response;
  if (int rc = CallJobService(ctx, &v1::JobService::Stub::GetMesh, request, &response)) {
    return rc;
  }
  return PrintResult(ctx, response, [&] { return FormatMeshDetails(response); });
}

int PlanCommand(const CommandContext& ctx, const std::string& path, const std::string& workers,
                bool env) {
  v1::JobSpec spec;
  if (int rc = LoadSpec(ctx, path, "invalid job spec", &spec)) return rc;
  if (env && !spec.has_command()) {
    return UsageError(ctx, absl::InvalidArgumentError(absl::StrCat(
        "--env: job ", spec.name(), " has no spec.command; --env shows the environment of a "
        "command job's processes (docs/command-jobs.md); leave it out to plan this job")));
  }
  std::vector<Device> devices;
  std::string source;
  std::map<std::string, PlanWorker> known;
  if (int rc = PlanDevices(ctx, workers, &devices, &source, &known)) return rc;
  // A program or command job has no data section: its own code defines the inputs.
  absl::StatusOr<int64_t> features =
      RunsUserCode(spec) ? absl::StatusOr<int64_t>(0) : InputFeatures(spec.data());
  if (!features.ok()) {
    *ctx.err << "substraxctl: " << features.status().message() << "\n";
    return ExitCodeForStatus(features.status().code());
  }
  absl::StatusOr<JobPlan> plan = PlanJob(spec, devices, *features);
  if (!plan.ok()) {
    // The coordinator's own message (the same CreateMeshForJob), then what it was checked on.
    *ctx.err << "substraxctl: " << plan.status().message() << "\n"
             << "substraxctl: job " << spec.name() << " cannot run on the "
             << devices.size() << " devices of " << source << "\n";
    return ExitCodeForStatus(plan.status().code());
  }
  const std::string title =
      absl::StrCat(env ? "environment of job " : "plan of job ", spec.name(), " on ",
                   devices.size(), " devices of ", source);
  if (env) {
    absl::StatusOr<std::vector<PlannedProcess>> processes =
        PlanCommandEnv(spec, plan->mesh, known);
    if (!processes.ok()) {
      *ctx.err << "substraxctl: " << processes.status().message() << "\n";
      return ExitCodeForStatus(processes.status().code());
    }
    *ctx.out << (ctx.format == OutputFormat::kTable
                     ? FormatPlanEnv(*processes, spec, title)
                     : FormatMessage(PlanEnvToStruct(*processes, spec), ctx.format));
  } else if (ctx.format == OutputFormat::kTable) {
    *ctx.out << FormatPlan(*plan, spec, title);
  } else {
    const std::string json = PlanToJson(*plan, spec);
    *ctx.out << (ctx.format == OutputFormat::kJson ? json : JsonToYaml(json));
  }
  ctx.out->flush();
  return kExitOk;
}

int MetricsCommand(const CommandContext& ctx, const std::string& job_id,
                   const MetricsFlags& flags) {
  if (absl::Status s = CheckPlotFlags(ctx, flags); !s.ok()) return UsageError(ctx, s);
  v1::QueryMetricsRequest request;
  request.set_job_id(job_id);
  for (const std::string& names : flags.names) {
    for (absl::string_view name : absl::StrSplit(names, ',', absl::SkipWhitespace())) {
      request.add_names(std::string(name));
    }
  }
  // A chart of every metric at once would mix scales: the loss unless asked otherwise.
  if (flags.plot && request.names().empty()) request.add_names("loss");
  absl::StatusOr<v1::StepRange> steps = ParseStepRange(flags.steps);
  if (!steps.ok()) return UsageError(ctx, steps.status());
  *request.mutable_steps() = *steps;
  absl::StatusOr<v1::Reduction> reduction = ParseReduction(flags.reduce);
  if (!reduction.ok()) return UsageError(ctx, reduction.status());
  request.set_reduction(*reduction);
  absl::StatusOr<v1::GroupBy> group_by = ParseGroupBy(flags.group_by);
  if (!group_by.ok()) return UsageError(ctx, group_by.status());
  request.set_group_by(*group_by);
  if (flags.attempt < 0) {
    return UsageError(ctx, absl::InvalidArgumentError(absl::StrCat(
        "--attempt: ", flags.attempt, " is not an attempt: give N >= 1, or 0 for the latest")));
  }
  request.set_attempt(flags.attempt);

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Connect(ctx, ctx.coordinator);
  if (!channel.ok()) return ReportCredentialError(ctx, channel.status());
  std::unique_ptr<v1::MetricsService::Stub> stub = v1::MetricsService::NewStub(*channel);
  grpc::ClientContext context;
  SetDeadline(&context, ctx.timeout);
  v1::QueryMetricsResponse response;
  const grpc::Status status = stub->QueryMetrics(&context, request, &response);
  if (!status.ok()) return ReportRpcError(ctx, status, channel->get());
  const std::string none = absl::StrCat("no metrics for job ", job_id, " in that range");
  if (!flags.tensorboard.empty()) {
    if (response.series().empty()) {
      *ctx.err << "substraxctl: " << none << "\n";
      return kExitError;
    }
    absl::StatusOr<TensorBoardExport> written = WriteTensorBoard(
        response, *group_by, UserPath(flags.tensorboard, ctx.working_directory), ctx.clock());
    if (!written.ok()) {
      *ctx.err << "substraxctl: --tensorboard: " << written.status().message() << "\n";
      return kExitError;
    }
    *ctx.out << "wrote " << written->series << " series over " << written->steps
             << " steps (attempt " << response.attempt() << ") to " << written->path << "\n";
    return kExitOk;
  }
  auto render = [&] {
    if (!flags.plot) return FormatMetricsTable(response);
    PlotOptions options;
    options.width = flags.width > 0 ? flags.width : ctx.columns;
    options.height = flags.height > 0 ? flags.height
                     : ctx.rows > 0   ? ctx.rows - 1  // the prompt's line stays on screen
                                      : kDefaultPlotHeight;
    options.color = ctx.color;
    return RenderPlot(PlotSeriesOf(response), options);
  };
  return PrintResult(ctx, response, render, response.series().empty(), none);
}

}  // namespace substrax::ctl
