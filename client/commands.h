// substraxctl's commands: each takes the parsed flags, talks to the coordinator over gRPC, writes
// data to `out` and messages to `err`, and returns the process exit code (client/args.h). main.cc
// only parses the command line and calls these; tests drive them against a fake server.
//
// Every RPC carries a deadline (CommandContext::timeout) except the WatchJob stream and a
// followed ReadLogs stream.
// Errors: each gRPC error is printed as "substraxctl: <CODE>: <message>"; an unreachable
// coordinator adds which address was tried and how to fix it (exit 3).
#ifndef SUBSTRAX_CLIENT_COMMANDS_H_
#define SUBSTRAX_CLIENT_COMMANDS_H_

#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/args.h"
#include "client/format.h"
#include "rpc/transport.h"

namespace substrax::ctl {

struct CommandContext {
  // The coordinator's "host:port" (ResolveCoordinator).
  std::string coordinator = kDefaultCoordinator;
  // How to reach it (ResolveTransport).
  TransportOptions transport;
  // Deadline of every unary RPC.
  absl::Duration timeout = absl::Seconds(10);
  OutputFormat format = OutputFormat::kTable;
  // Where data and messages go.
  std::ostream* out = &std::cout;
  std::ostream* err = &std::cerr;
  // stdout is a terminal: `watch` redraws a bar in place instead of printing lines.
  bool terminal = false;
  // Width of that terminal.
  int columns = 80;
  // Its height in lines; 0: unknown (not a terminal and no $LINES).
  int rows = 0;
  // Sparklines may use Unicode blocks: a terminal with a UTF-8 locale.
  bool unicode = false;
  // ANSI colours in tables (a terminal, NO_COLOR unset).
  bool color = false;
  // Times are shown in this zone; ages and ETAs are measured with this clock.
  absl::TimeZone zone = absl::LocalTimeZone();
  std::function<absl::Time()> clock = [] { return absl::Now(); };
  // Directory relative paths on the command line are relative to (BUILD_WORKING_DIRECTORY
  // under `bazel run`); empty: the current directory.
  std::string working_directory;
};

// submit FILE [--watch]: parses and validates FILE locally (a bad spec prints every problem as
// file:line:column and exits 2 without contacting the coordinator), submits it, prints the job
// id (table) or the job (json, yaml); with `watch` continues as WatchCommand.
int SubmitCommand(const CommandContext& ctx, const std::string& path, bool watch,
                  const std::string& resume_from = "");
// `substraxctl checkpoints JOB`: the committed checkpoints the job's runners last reported.
int CheckpointsCommand(const CommandContext& ctx, const std::string& job_id);
// list [--state S,...]: jobs newest first (every page).
int ListCommand(const CommandContext& ctx, const std::string& states);
// get JOB.
int GetCommand(const CommandContext& ctx, const std::string& job_id);
// Why a job is stuck or slow: FormatDiagnosis of JobService.DiagnoseJob.
int DiagnoseCommand(const CommandContext& ctx, const std::string& job_id);
// doctor [--worker W]... [--wait D] [--job ID]: starts a preflight of the cluster
// (JobService.RunDoctor; with --job, shows an earlier one), follows the doctor job until it
// ends or `wait` runs out (then cancels it), and shows each worker's host checks, clock,
// certificate and links, with what to do, and the workers not tested. Exit 0 without
// problems (warnings allowed), 1 with any.
int DoctorCommand(const CommandContext& ctx, const std::vector<std::string>& workers,
                  absl::Duration wait, const std::string& job_id);
// watch JOB: follows the job until it ends; exit 0 if it SUCCEEDED, 1 if FAILED or CANCELLED.
int WatchCommand(const CommandContext& ctx, const std::string& job_id);
// cancel JOB [--reason TEXT].
// delete JOB: removes an ended job and its metrics from the coordinator. Prints "JOB deleted".
int DeleteCommand(const CommandContext& ctx, const std::string& job_id);
int CancelCommand(const CommandContext& ctx, const std::string& job_id,
                  const std::string& reason);
// workers.
int WorkersCommand(const CommandContext& ctx);
// queues: each queue's quota, use, borrowing and pending jobs, the priority classes, the policy
// and where its configuration came from (and why a reload was refused).
int QueuesCommand(const CommandContext& ctx);
// grpc.health.v1 Check of `address` (default: the coordinator) for `service` ("" = the server):
// prints SERVING or NOT_SERVING; exit 0 only when SERVING (3 when unreachable).
int HealthCommand(const CommandContext& ctx, const std::string& address,
                  const std::string& service);
// mesh JOB.
int MeshCommand(const CommandContext& ctx, const std::string& job_id);

// plan FILE [--workers NxD]: a dry run of the job on the devices of --workers ("2x2": 2 workers,
// hosts worker-0 and worker-1, of 2 CPU devices each) or, without it, of the coordinator's alive
// workers: the mesh, every parameter's layout, per-device memory and the collectives of a step
// (core/plan.h). Exit 2 for a bad flag or spec and for a job the devices cannot hold (the
// coordinator's "spec.mesh: ..." message); 1 when the data's header cannot be read here (the
// input width comes from it) or no worker is alive; 3 when the coordinator is unreachable.
// With `env` (--env), for a command job (spec.command): instead of the plan, the environment
// each process of the planned attempt gets (client/plan_env.h; docs/command-jobs.md), with
// placeholders for the ports and the attempt directory the launch picks; exit 2 for a spec
// without spec.command.
int PlanCommand(const CommandContext& ctx, const std::string& path, const std::string& workers,
                bool env = false);

struct MetricsFlags {
  std::vector<std::string> names;  // --name (repeatable or comma-separated); empty: all
  std::string reduce;              // --reduce; empty: the job's declared reductions
  std::string steps;               // --steps; empty: all
  std::string group_by;            // --group-by; empty: none
  int attempt = 0;                 // --attempt; 0: the latest attempt with points
  std::string tensorboard = "";    // --tensorboard DIR; empty: print the series instead
  bool plot = false;               // --plot: a chart (client/plot.h) instead of the table
  int width = 0;                   // --width of the chart; 0: the terminal's columns
  int height = 0;                  // --height of the chart; 0: the terminal's lines less one, or 20
};
// metrics JOB: malformed flags exit 2 before any RPC. With --tensorboard DIR the series go to a
// new TensorBoard event file in DIR (created if missing; a relative DIR is relative to
// ctx.working_directory) and one line names it; exit 1 when DIR cannot be written or there are
// no points. With `plot`, the series (loss when no --name is given) are drawn as a chart; --plot
// with -o json or yaml or with --tensorboard, and --width or --height without --plot or below
// the chart's minimum (client/plot.h), are usage errors.
int MetricsCommand(const CommandContext& ctx, const std::string& job_id,
                   const MetricsFlags& flags);

struct LogsFlags {
  int process = -1;     // --process; -1: every process
  int attempt = 0;      // --attempt; 0: the latest attempt
  int tail = 0;         // --tail; 0: every line
  bool follow = false;  // -f, --follow
};
// logs JOB: the output (stdout and stderr) of the attempt's processes, each line as
// "[p<process> <host>] <text>" (table) or one object per line (json, yaml); notices (bytes
// dropped by the coordinator's bound, a log left incomplete) go to stderr. With `follow`, new
// lines as the workers ship them until the attempt has ended and its logs are complete (no
// deadline, as watch). Malformed flags exit 2 before any RPC.
int LogsCommand(const CommandContext& ctx, const std::string& job_id, const LogsFlags& flags);

struct LocalFlags {
  std::string state_dir = kDefaultLocalStateDir;
  int workers = 2;
  int cpu_devices = 2;
  // Each worker offers this machine's GPUs (the agents' --devices cuda) instead of CPU devices;
  // only with one worker (two would offer the same GPUs).
  bool gpus = false;
  // Each worker's --data-root flags: where jobs may read data files. None: synthetic data only.
  std::vector<std::string> data_roots;
  // Each worker's --checkpoint-root flags; none: <state-dir>/checkpoints (created), so that a
  // local cluster checkpoints out of the box.
  std::vector<std::string> checkpoint_roots;
  // Each worker's --programs-dir flags: where program jobs (spec.program) may run programs
  // from. None: no program jobs.
  std::vector<std::string> programs_dirs;
  // Each worker's --python-env flags (NAME=DIR): the environments command jobs may name.
  std::vector<std::string> python_envs;
  // The coordinator's gRPC port and Prometheus port; 0: any free port.
  int port = 0;
  int metrics_port = 0;
  // Empty: found next to substraxctl or in the Bazel layout.
  std::string coordinator_binary;
  // The agent (--agent-binary, or its older name --worker-binary) and the job binary it starts
  // for built-in jobs (--job-binary).
  std::string agent_binary;
  std::string job_binary;
  // How long `up` waits for the coordinator to answer and every worker to be alive.
  absl::Duration start_timeout = absl::Seconds(60);
  // How long `down` waits after SIGTERM before SIGKILL.
  absl::Duration stop_grace = absl::Seconds(10);
  // This executable's directory (where sibling binaries are looked for).
  std::string self_dir;
};
// local up: starts the coordinator and the workers; prints `export SUBSTRAX_COORDINATOR=ADDR` on
// stdout (for eval) and how to use the cluster on stderr. Exit 1 when a cluster already runs in
// the state dir, a binary is missing, or the cluster does not come up in time (all it started
// is stopped again; the message shows the end of the log that explains why).
int LocalUpCommand(const CommandContext& ctx, const LocalFlags& flags);
// local down: stops every process of the cluster and removes its pid and address files.
int LocalDownCommand(const CommandContext& ctx, const LocalFlags& flags);
// local status: the processes (alive or dead) and, when the coordinator answers, its workers.
// Exit 0 when every process is alive, 1 otherwise (also when there is no cluster).
int LocalStatusCommand(const CommandContext& ctx, const LocalFlags& flags);

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_COMMANDS_H_
