// The worker daemon's runners: launching an attempt's process under its supervisor, stopping
// it, the housekeeping tick (program init timeouts, the work dir's cleanup), reaping and
// reporting how each ended. The rest of WorkerDaemon (registration, heartbeats, the assignment
// stream) is in daemon.cc.
#include "agent/daemon.h"
#include "agent/daemon_internal.h"
#include "agent/command_launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/data_paths.h"
#include "core/job_env.h"
#include "core/status.h"
#include "grpcpp/grpcpp.h"
#include "rpc/grpc_status.h"
#include "rpc/keepalive.h"
#include "rpc/pki.h"
#include "rpc/proto_time.h"
#include "rpc/transport.h"
#include "rpc/transport_flags.h"
#include "contract/cpu_features.h"
#include "contract/devices.h"
#include "agent/runner_outcome.h"
#include "base/backoff.h"

namespace substrax {
namespace {

using agent_internal::Deadline;
using agent_internal::Log;

}  // namespace

void WorkerDaemon::Launch(const v1::Assignment& assignment) {
  const std::string key = absl::StrCat(assignment.job_id(), "/", assignment.attempt());
  {
    // slurmd's rule: a replayed launch is refused. Held across the fork so that two deliveries
    // of one event cannot both pass.
    absl::MutexLock lock(&mu_);
    if (!launched_.insert(absl::StrCat(key, "/", assignment.process_index())).second) {
      Log(absl::StrCat("job ", key, " process ", assignment.process_index(),
                       " was launched before; ignoring the repeated assignment"));
      return;
    }
  }
  const bool command_job = assignment.spec().has_command();
  // A command job's processes get a directory of their own (their working dir, the report and
  // error files), whoever they run as.
  const AttemptFiles files = FilesOfAttempt(options_.work_dir, assignment,
                                            launch_settings_.switch_user || command_job);
  const bool program = assignment.spec().has_program();
  Runner runner;
  runner.job_id = assignment.job_id();
  runner.attempt = assignment.attempt();
  runner.process_index = assignment.process_index();
  runner.result_path = files.result;
  runner.stderr_path = files.log;
  runner.started_path = files.started;
  runner.activity_path = files.activity;
  if (program) runner.program = assignment.spec().program().path();
  runner.command = command_job;
  const std::string what = program       ? absl::StrCat("the program ", runner.program)
                           : command_job ? "the command's launcher"
                                         : "a runner";
  std::optional<v1::CommandLaunch> command_launch;
  if (command_job) {
    absl::StatusOr<v1::CommandLaunch> prepared =
        PrepareCommandLaunch(launch_settings_, assignment, files);
    if (!prepared.ok()) {
      ReportLaunchFailure(runner, std::string(prepared.status().message()));
      return;
    }
    command_launch = *std::move(prepared);
  }
  if (absl::Status s = WriteAttemptFiles(launch_settings_, assignment, files,
                                         command_launch ? &*command_launch : nullptr);
      !s.ok()) {
    ReportLaunchFailure(runner, absl::StrCat("cannot start ", what, ": ", s.message()));
    return;
  }
  // The program checks (launch.h) name the program, host and worker themselves.
  absl::StatusOr<ChildCommand> command = BuildCommand(launch_settings_, assignment, files);
  if (!command.ok()) {
    ReportLaunchFailure(runner, std::string(command.status().message()));
    return;
  }
  // Opened here, not in the child, so that a failure (a full or read-only disk) is reported;
  // the agent's alone (a job user writes it through the descriptor it inherits).
  const int log_fd =
      open(files.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (log_fd < 0) {
    ReportLaunchFailure(runner, absl::StrCat("cannot start ", what, ": cannot create its log ",
                                             files.log, ": ", std::strerror(errno)));
    return;
  }
  Supervision supervision;
  supervision.grace = options_.stop_grace;
  supervision.label = files.launch;
  {
    absl::MutexLock lock(&mu_);
    supervision.deadline = FenceDeadlineLocked();
  }
  absl::StatusOr<SupervisedChild> child = StartSupervised(*command, log_fd, supervision);
  if (!child.ok()) {
    close(log_fd);
    ReportLaunchFailure(runner,
                        absl::StrCat("cannot start ", what, ": ", child.status().message()));
    return;
  }
  runner.pid = child->job;
  runner.supervisor = child->supervisor;
  runner.control_fd = child->control_fd;
  runner.log_fd = log_fd;
  // Housekeeping wakes for the deadline and stops a program that has not joined its job by then.
  if (program) runner.init_deadline = absl::Now() + options_.program_init_timeout;
  Log(absl::StrCat("started ", program ? absl::StrCat("program ", runner.program) : "runner", " ",
                   runner.pid, " for job ", key, " process ", runner.process_index,
                   " (supervisor ", runner.supervisor, ")"));
  log_shipper_->Add(runner.job_id, runner.attempt, runner.process_index, files.log);
  absl::MutexLock lock(&mu_);
  runners_[key] = runner;
  const int64_t id = next_reaper_++;
  // Inserted under mu_, which the reaper needs before it can finish: never joined before this.
  reapers_[id] = std::thread([this, id, key, c = *child] { Reap(id, key, c); });
}

void WorkerDaemon::ReportLaunchFailure(const Runner& runner, const std::string& error) {
  Log(absl::StrCat("job ", runner.job_id, " attempt ", runner.attempt, " process ",
                   runner.process_index, ": ", error));
  v1::ReportAttemptStatusRequest failed;
  failed.set_job_id(runner.job_id);
  failed.set_attempt(runner.attempt);
  failed.set_worker_id(options_.worker_id);
  failed.set_process_index(runner.process_index);
  failed.set_state(v1::RUNNER_STATE_FAILED);
  failed.set_error(error);
  ReportStatus(failed);
}

void WorkerDaemon::Terminate(const std::string& key, const std::string& reason) {
  Terminate(key, StopOrder{.reason = reason, .grace = options_.stop_grace});
}

void WorkerDaemon::Terminate(const std::string& key, const StopOrder& order) {
  pid_t pid = 0;
  const std::string line = StopLogLine(order);
  {
    absl::MutexLock lock(&mu_);
    auto it = runners_.find(key);
    if (it == runners_.end() || it->second.stop_requested || it->second.ended) return;
    it->second.stop_requested = true;
    it->second.stop_reason = order.reason;
    // Housekeeping sends SIGKILL then if the runner is still there (it wakes for the change).
    it->second.grace = order.grace;
    it->second.kill_at = absl::Now() + order.grace;
    pid = it->second.pid;
    // Before the signal, so that the line precedes what the job writes on it. A local file; a
    // failed write (a full disk) loses only this line, which the agent's own log has too.
    if (!line.empty() && it->second.log_fd >= 0) {
      const std::string text = absl::StrCat("substrax-agent: ", line, "\n");
      [[maybe_unused]] const ssize_t written = write(it->second.log_fd, text.data(), text.size());
    }
    // Its supervisor signals the group (the agent never signals a process it does not reap).
    SendSignal(it->second.control_fd, SIGTERM, order.fence);
  }
  Log(absl::StrCat("stopping runner ", pid, " of job ", key, ": ",
                   line.empty() ? order.reason : line));
}

void WorkerDaemon::Housekeeping() {
  absl::Time next_cleanup = absl::Now();  // at start
  while (true) {
    std::vector<std::thread> done;
    struct Kill {
      std::string key;
      pid_t pid;
      absl::Duration grace;
    };
    std::vector<Kill> to_kill;
    std::vector<std::string> init_due;
    bool clean = false;
    bool exit = false;
    {
      absl::MutexLock lock(&mu_);
      absl::Time wake = next_cleanup;
      for (const auto& [key, r] : runners_) {
        if (!r.ended && !r.killed) wake = std::min(wake, r.kill_at);
        if (!r.ended) wake = std::min(wake, r.init_deadline);
      }
      auto ready = [this, wake]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (!finished_reapers_.empty()) return true;
        bool running = false;
        for (const auto& [key, r] : runners_) {
          if (r.ended) continue;
          running = true;
          if (!r.killed && r.kill_at < wake) return true;  // a new stop: its deadline is first
          if (r.init_deadline < wake) return true;  // a new program: its init deadline is first
        }
        return stopped_.HasBeenNotified() && !running;
      };
      mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
      const absl::Time now = absl::Now();
      bool running = false;
      for (auto& [key, r] : runners_) {
        if (r.ended) continue;
        running = true;
        if (!r.killed && r.kill_at <= now) {
          r.killed = true;
          SendSignal(r.control_fd, SIGKILL);
          to_kill.push_back({key, r.pid, r.grace});
        }
        if (r.init_deadline <= now) init_due.push_back(key);
      }
      for (int64_t id : finished_reapers_) {
        done.push_back(std::move(reapers_[id]));
        reapers_.erase(id);
        clean = true;
      }
      finished_reapers_.clear();
      clean = clean || now >= next_cleanup;
      exit = stopped_.HasBeenNotified() && !running;
    }
    for (const Kill& k : to_kill) {
      Log(absl::StrCat("runner ", k.pid, " of job ", k.key, " still there after ",
                       absl::FormatDuration(k.grace), ": SIGKILL"));
    }
    CheckProgramInits(init_due);
    for (std::thread& t : done) t.join();
    if (clean && !exit) {
      CleanWorkDirNow();
      next_cleanup = absl::Now() + options_.cleanup_interval;
    }
    if (exit) return;
  }
}

void WorkerDaemon::CheckProgramInits(const std::vector<std::string>& due) {
  for (const std::string& key : due) {
    std::string started_path, program;
    {
      absl::MutexLock lock(&mu_);
      auto it = runners_.find(key);
      if (it == runners_.end()) continue;
      it->second.init_deadline = absl::InfiniteFuture();  // checked once
      if (it->second.ended || it->second.stop_requested) continue;
      started_path = it->second.started_path;
      program = it->second.program;
    }
    // Outside the lock: a file system lookup.
    if (access(started_path.c_str(), F_OK) == 0) continue;
    {
      absl::MutexLock lock(&mu_);
      auto it = runners_.find(key);
      if (it == runners_.end() || it->second.ended) continue;
      it->second.init_timed_out = true;
    }
    Terminate(key, absl::StrCat("the program ", program, " did not call substrax::Init within ",
                                absl::FormatDuration(options_.program_init_timeout),
                                " (--program-init-timeout)"));
  }
}

void WorkerDaemon::CleanWorkDirNow() {
  std::set<std::string> running;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, r] : runners_) running.insert(AttemptFilePrefix(r.job_id, r.attempt));
  }
  // A log still being shipped stays too.
  for (const auto& [job_id, attempt] : log_shipper_->Pending()) {
    running.insert(AttemptFilePrefix(job_id, attempt));
  }
  absl::StatusOr<CleanupResult> cleaned =
      CleanWorkDir(options_.work_dir, options_.log_retention, running, absl::Now());
  if (!cleaned.ok()) {
    Log(absl::StrCat("work dir cleanup: ", cleaned.status().message()));
    return;
  }
  if (cleaned->attempts_deleted > 0) {
    Log(absl::StrCat("work dir cleanup: deleted the files of ", cleaned->attempts_deleted,
                     " ended attempts (", cleaned->bytes_deleted, " bytes); ",
                     cleaned->bytes_kept, " bytes kept"));
  }
  for (const std::string& error : cleaned->errors) {
    Log(absl::StrCat("work dir cleanup: cannot delete ", error));
  }
}

bool WorkerDaemon::AwaitRunnersExited(absl::Duration timeout) {
  auto none_running = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [key, runner] : runners_) {
      if (!runner.ended) return false;
    }
    return true;
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&none_running), timeout);
}

void WorkerDaemon::TerminateAll(const std::string& reason, bool fence) {
  std::vector<std::string> keys;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, runner] : runners_) keys.push_back(key);
  }
  for (const std::string& key : keys) {
    Terminate(key, StopOrder{.reason = reason, .grace = options_.stop_grace, .fence = fence});
  }
}

void WorkerDaemon::Reap(int64_t reaper, std::string key, SupervisedChild child) {
  // The supervisor reports the job's exit and SIGKILLs what it left behind in its group.
  const SupervisedExit exited = AwaitExit(&child);
  const pid_t pid = child.job;
  if (!exited.reported) {
    Log(absl::StrCat("job ", key, ": the supervisor ", child.supervisor, " of runner ", pid,
                     " died without reporting its exit (",
                     WIFSIGNALED(exited.wait_status)
                         ? absl::StrCat("killed by signal ", WTERMSIG(exited.wait_status))
                         : absl::StrCat("exit status ", WEXITSTATUS(exited.wait_status)),
                     "); its process group got SIGKILL"));
  }
  Runner runner;
  {
    // Listed in heartbeats as ended until the coordinator has its outcome.
    absl::MutexLock lock(&mu_);
    Runner& r = runners_[key];
    r.ended = true;
    close(r.control_fd);
    r.control_fd = -1;
    close(r.log_fd);
    r.log_fd = -1;
    if (exited.fence != FenceCause::kNone && !r.stop_requested) {
      r.stop_requested = true;
      r.stop_reason = absl::StrCat("fenced by its supervisor: ", FenceReason(exited.fence));
    }
    runner = r;
  }
  // The rest of its output reaches the coordinator before its outcome, so that the logs of an
  // ended job are complete (bounded: an unreachable coordinator gets the rest later).
  log_shipper_->Ended(runner.job_id, runner.attempt, runner.process_index);
  if (!log_shipper_->AwaitShipped(runner.job_id, runner.attempt, runner.process_index,
                                  options_.log_flush_timeout)) {
    Log(absl::StrCat("job ", key, ": the end of the runner's log is not shipped yet after ",
                     absl::FormatDuration(options_.log_flush_timeout),
                     "; it follows in the background"));
  }
  RunnerExit exit;
  exit.wait_status = exited.wait_status;
  exit.stop_requested = runner.stop_requested;
  exit.stop_reason = runner.stop_reason;
  exit.result_path = runner.result_path;
  exit.log_path = runner.stderr_path;
  exit.program = runner.program;
  exit.started_path = runner.started_path;
  exit.init_timed_out = runner.init_timed_out;
  exit.init_timeout = options_.program_init_timeout;
  exit.command = runner.command;
  std::string warning;
  v1::ReportAttemptStatusRequest report = RunnerOutcome(exit, &warning);
  if (!warning.empty()) Log(absl::StrCat("job ", key, ": ", warning));
  report.set_job_id(runner.job_id);
  report.set_attempt(runner.attempt);
  report.set_worker_id(options_.worker_id);
  report.set_process_index(runner.process_index);
  if (report.state() == v1::RUNNER_STATE_SUCCEEDED) {
    Log(absl::StrCat("runner ", pid, " of job ", key, " succeeded"));
  } else {
    Log(absl::StrCat("runner ", pid, " of job ", key, " failed: ", report.error()));
  }
  ReportStatus(report);
  absl::MutexLock lock(&mu_);
  runners_.erase(key);
  finished_reapers_.push_back(reaper);
}

void WorkerDaemon::ReportStatus(const v1::ReportAttemptStatusRequest& request) {
  // Retried while the coordinator is unreachable (UNAVAILABLE, DEADLINE_EXCEEDED): how a runner
  // ended must not be lost to an outage. Backoff doubles with jitter up to 1 s (a restarted
  // coordinator hears of it within about a second); the retries end when the daemon stops.
  // Other errors (the attempt already ended) are final.
  Backoff backoff({.initial = absl::Milliseconds(100), .max = absl::Seconds(1)});
  while (true) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(Deadline(absl::Seconds(2)));
    v1::ReportAttemptStatusResponse response;
    grpc::Status status = stub_->ReportAttemptStatus(&context, request, &response);
    if (status.ok()) return;
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      // Final: the attempt ended meanwhile (cancelled, failed elsewhere, or this worker was
      // declared dead and the report is stale), or the report itself is wrong.
      Log(absl::StrCat("status report of job ", request.job_id(), " attempt ", request.attempt(),
                       " process ", request.process_index(), " refused: ",
                       status.error_message()));
      return;
    }
    if (stopped_.WaitForNotificationWithTimeout(*backoff.Next())) {
      Log(absl::StrCat("could not report the status of job ", request.job_id(),
                       ": the agent stopped while the coordinator was unreachable"));
      return;
    }
  }
}

}  // namespace substrax
