// The command launcher: `substrax-job command`, the job process the agent starts on each worker
// of a command job's attempt (spec.command; docs/command-jobs.md), as it starts `substrax-job
// run` for a built-in job. It is to a command what torchrun's elastic agent is to a training
// script, with the coordinator in place of a rendezvous backend:
//
//   1. joins the attempt through the launch contract (the SDK's ProgramImpl: the coordinator's
//      channel with the attempt's token, the rendezvous store, the started file);
//   2. meets the other workers before anything starts: process 0 picks two free ports on its
//      listen address (torch's master, JAX's coordinator; in the agent's --command-ports range
//      when it has one) and publishes them in the attempt's scope of the coordinator's store;
//      every other launcher waits for them (no DNS, no start-order race);
//   3. starts the command's processes (one, per_worker; one per local device, per_device) with
//      the environment contract (contract/command_env.h) on top of its own environment, in its
//      own process group (so the supervisor's fence reaches every one of them and theirs), their
//      output relayed line by line to its own (the attempt's log), prefixed "[rank R] " for
//      per_device;
//   4. tails each process's report file (contract/report_file.h) and forwards what it reads:
//      steps (ReportSteps, through the SDK's reporter), checkpoints and resumes (process 0
//      only: ReportCheckpoints), total steps and final metrics (the result);
//   5. on the first process that fails (non-zero exit or a signal) stops the others (SIGTERM to
//      the group, SIGKILL after the agent's stop grace) and fails the attempt naming the rank,
//      its device, the host, its error file's message (or its last lines of output); when every
//      process exits 0, the attempt's part succeeds with the final metrics reported;
//   6. on the agent's SIGTERM (a cancel, a preemption; the supervisor sends it to the whole
//      group, so the processes get it too) waits for the processes to exit, their final
//      checkpoint written (docs/command-jobs.md, "Preemption"), with no SIGKILL of its own: the
//      agent's, after its grace, bounds the wait.
//
// The launcher holds the attempt's token (the launch file's), never a credential of the worker;
// the command's processes get neither (SUBSTRAX_LAUNCH is not passed on).
#ifndef SUBSTRAX_WORKER_COMMAND_LAUNCHER_H_
#define SUBSTRAX_WORKER_COMMAND_LAUNCHER_H_

#include <string>

namespace substrax {

// Runs the launcher for the launch file at `launch_path`. Returns the exit status for
// `substrax-job command`: 0 when every process of the command succeeded; the failed process's
// exit status (128 + its signal when it was killed) when one failed; 1 when the launcher could
// not start the command (the reason is in the result file and on stderr).
int RunCommandLauncher(const std::string& launch_path);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COMMAND_LAUNCHER_H_
