#include "worker/command_launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/files.h"
#include "contract/activity.h"
#include "contract/command_env.h"
#include "contract/launch.h"
#include "contract/report_file.h"
#include "core/status.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "rpc/proto_time.h"
#include "worker/sdk/program_impl.h"

extern char** environ;

namespace substrax {
namespace {

// The key process 0 publishes the rendezvous under, in the attempt's scope.
constexpr char kRendezvousKey[] = "command/rendezvous";
// How often the launcher polls its processes and their report files.
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);
// Lines of each process's output kept for the error of a failed attempt, and their length.
constexpr size_t kLastLines = 20;
constexpr size_t kMaxKeptLineBytes = 512;
// A line of output longer than this is relayed in pieces of this size.
constexpr size_t kMaxRelayedLineBytes = 64 * 1024;
// The largest error file read, and the most of it put in the attempt's error.
constexpr int64_t kMaxErrorFileBytes = 256 * 1024;
constexpr size_t kMaxErrorTextBytes = 3 * 1024;

// Set by the signal handler: the launcher (or its group) was told to stop, and by whom.
std::atomic<int> stop_signal{0};
std::atomic<pid_t> stop_sender{0};
int signal_pipe_write = -1;

void OnStopSignal(int signal, siginfo_t* info, void*) {
  stop_sender.store(info != nullptr ? info->si_pid : 0);
  stop_signal.store(signal);
  const char byte = 0;
  // Only wakes the poll: a full pipe already will.
  [[maybe_unused]] ssize_t n = write(signal_pipe_write, &byte, 1);
}

void Say(const std::string& line) {
  std::fprintf(stdout, "substrax: %s\n", line.c_str());
  std::fflush(stdout);
}

// Where process 0's launcher meets the others.
struct Rendezvous {
  std::string host;
  int torch_port = 0;
  int jax_port = 0;
};

std::string EncodeRendezvous(const Rendezvous& r) {
  return absl::StrCat(r.host, " ", r.torch_port, " ", r.jax_port);
}

absl::StatusOr<Rendezvous> DecodeRendezvous(const std::string& value) {
  const std::vector<std::string> parts = absl::StrSplit(value, ' ');
  Rendezvous r;
  if (parts.size() != 3 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &r.torch_port) ||
      !absl::SimpleAtoi(parts[2], &r.jax_port)) {
    return absl::DataLossError(absl::StrCat("the rendezvous key ", kRendezvousKey, " holds '",
                                            value, "', not 'HOST TORCH_PORT JAX_PORT'"));
  }
  r.host = parts[0];
  return r;
}

// A socket bound to `address` with `port` (0: any), or -1 with errno set.
int BindTo(const addrinfo& address, int port) {
  sockaddr_storage storage{};
  std::memcpy(&storage, address.ai_addr, address.ai_addrlen);
  if (storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
  }
  const int fd = socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&storage), address.ai_addrlen) != 0) {
    const int error = errno;
    close(fd);
    errno = error;
    return -1;
  }
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage storage{};
  socklen_t length = sizeof(storage);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &length) != 0) return 0;
  return storage.ss_family == AF_INET
             ? ntohs(reinterpret_cast<sockaddr_in*>(&storage)->sin_port)
             : ntohs(reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port);
}

// Two free ports on `host` (the launch's listen address), from [first, last] when a range is
// given. They are free when picked: the command binds them a moment later (torchrun picks its
// port the same way).
absl::StatusOr<std::pair<int, int>> PickPorts(const std::string& host, int first, int last) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), "0", &hints, &found); error != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the listen address ", host, " (the agent's --listen-host) cannot be resolved: ",
        gai_strerror(error)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(found, freeaddrinfo);
  std::vector<int> fds;
  int error = 0;
  if (first == 0) {
    for (int i = 0; i < 2; ++i) {
      const int fd = BindTo(*found, 0);
      if (fd < 0) {
        error = errno;
        break;
      }
      fds.push_back(fd);
    }
  } else {
    for (int port = first; port <= last && fds.size() < 2; ++port) {
      const int fd = BindTo(*found, port);
      if (fd >= 0) fds.push_back(fd);
      else error = errno;
    }
  }
  std::vector<int> ports;
  for (int fd : fds) {
    ports.push_back(BoundPort(fd));
    close(fd);
  }
  if (ports.size() < 2) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot pick two free ports on ", host,
        first == 0 ? "" : absl::StrCat(" in --command-ports ", first, "-", last), ": ",
        error != 0 ? std::strerror(error) : "every port is taken"));
  }
  return std::make_pair(ports[0], ports[1]);
}

// Process 0 picks and publishes; the others wait for it, as long as the attempt runs.
absl::StatusOr<Rendezvous> Meet(ProgramImpl& program, const v1::ProgramLaunch& launch) {
  if (launch.assignment().process_index() == 0) {
    Rendezvous r;
    r.host = launch.listen_host();
    SUBSTRAX_ASSIGN_OR_RETURN(
        auto ports, PickPorts(r.host, launch.command().port_range_first(),
                              launch.command().port_range_last()));
    r.torch_port = ports.first;
    r.jax_port = ports.second;
    SUBSTRAX_RETURN_IF_ERROR(Annotate(program.store()->Set(kRendezvousKey, EncodeRendezvous(r)),
                                      "publishing the rendezvous ports"));
    Say(absl::StrCat("rendezvous: torch master ", r.host, ":", r.torch_port,
                     ", JAX coordinator ", r.host, ":", r.jax_port));
    return r;
  }
  const absl::Time start = absl::Now();
  absl::Duration next_note = absl::Seconds(30);
  while (true) {
    if (stop_signal.load() != 0) {
      return absl::CancelledError("stopped while waiting for process 0's rendezvous ports");
    }
    absl::StatusOr<std::string> value = program.store()->Get(kRendezvousKey, absl::Seconds(5));
    if (value.ok()) {
      SUBSTRAX_ASSIGN_OR_RETURN(Rendezvous r, DecodeRendezvous(*value));
      Say(absl::StrCat("rendezvous after ", absl::FormatDuration(absl::Now() - start),
                       ": torch master ", r.host, ":", r.torch_port, ", JAX coordinator ", r.host,
                       ":", r.jax_port));
      return r;
    }
    if (!absl::IsDeadlineExceeded(value.status())) {
      return Annotate(value.status(), "waiting for process 0's rendezvous ports");
    }
    if (absl::Now() - start >= next_note) {
      Say(absl::StrCat("still waiting for process 0's rendezvous ports after ",
                       absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Seconds(1)))));
      next_note += absl::Seconds(30);
    }
  }
}

// One process of the command on this worker.
struct Child {
  int local = 0;       // its index among this worker's processes
  int rank = 0;        // RANK
  int device_id = -1;  // per_device: its device
  std::string prefix;  // of its relayed lines
  // What it executes, prepared before fork.
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string report_file;
  std::string error_file;
  // Its part of the assignment, for its step records (per_device: its device alone).
  v1::Assignment assignment;
  std::unique_ptr<ReportFileTailer> tailer;
  pid_t pid = 0;
  int out_fd = -1;
  std::string partial;
  std::deque<std::string> last_lines;
  std::optional<int> wait_status;
  int64_t last_step = 0;  // of its report file
};

int ExitCode(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

std::string DescribeExit(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(wait_status), " (",
                        strsignal(WTERMSIG(wait_status)), ")");
  }
  return absl::StrCat("exited with status ", ExitCode(wait_status));
}

// The environment of a child: the launcher's own (the agent's fixed base, --job-env-pass and
// the spec's env) without the launch file, then the contract, whose names replace any earlier;
// `bin_dir` (a python_env's bin/) first in PATH, as a venv's activation puts it, so that the
// command's own `python` and scripts are the environment's.
std::vector<std::string> ChildEnv(const std::vector<CommandEnvVar>& contract,
                                  const std::string& bin_dir) {
  std::map<std::string, std::string> by_name;
  std::vector<std::string> order;
  auto set = [&](const std::string& name, const std::string& value) {
    if (by_name.emplace(name, value).second) {
      order.push_back(name);
    } else {
      by_name[name] = value;
    }
  };
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) continue;
    const std::string name(entry.substr(0, eq));
    if (name == kLaunchEnv) continue;
    set(name, std::string(entry.substr(eq + 1)));
  }
  for (const CommandEnvVar& var : contract) set(var.name, var.value);
  if (!bin_dir.empty()) {
    auto path = by_name.find("PATH");
    set("PATH", path == by_name.end() || path->second.empty()
                    ? bin_dir
                    : absl::StrCat(bin_dir, ":", path->second));
  }
  std::vector<std::string> env;
  for (const std::string& name : order) env.push_back(absl::StrCat(name, "=", by_name[name]));
  return env;
}

// Forks and executes `child` with its output on a pipe the launcher reads, in the launcher's
// process group, killed when the launcher dies. Errors: pipe's or fork's.
absl::Status StartChild(const std::string& executable, const std::string& working_dir,
                        Child& child) {
  std::vector<char*> argv, envp;
  for (std::string& a : child.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : child.env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string chdir_failed =
      absl::StrCat("substrax: cannot enter the working directory ", working_dir, "\n");
  const std::string exec_failed = absl::StrCat("substrax: cannot execute ", executable, "\n");
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe");
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close(out[0]);
    close(out[1]);
    if (null_fd >= 0) close(null_fd);
    return absl::ErrnoToStatus(error, "fork");
  }
  if (pid == 0) {
    // Async-signal-safe calls only: the launcher has gRPC's threads.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(137);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(out[1], 1);
    dup2(out[1], 2);
    if (chdir(working_dir.c_str()) != 0) {
      [[maybe_unused]] ssize_t n = write(2, chdir_failed.data(), chdir_failed.size());
      _exit(127);
    }
    execve(executable.c_str(), argv.data(), envp.data());
    [[maybe_unused]] ssize_t n = write(2, exec_failed.data(), exec_failed.size());
    _exit(127);
  }
  close(out[1]);
  if (null_fd >= 0) close(null_fd);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  child.pid = pid;
  child.out_fd = out[0];
  return absl::OkStatus();
}

// The error file of a failed process, as one text: the message, then the traceback's tail.
// Accepts the format of docs/command-jobs.md ({"message", "traceback", "retry"}) and the one
// torch's @record writes to TORCHELASTIC_ERROR_FILE ({"message": {"message", "extraInfo":
// {"py_callstack"}}}). `retry` is set false when the file says retrying cannot help.
std::optional<std::string> ReadErrorFile(const std::string& path, bool* retry) {
  struct stat st;
  const int fd = OpenRegularFileNoFollow(path, &st);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> text(std::string(
      static_cast<size_t>(std::min<int64_t>(st.st_size, kMaxErrorFileBytes)), '\0'));
  const ssize_t n = pread(fd, text->data(), text->size(), 0);
  close(fd);
  if (n < 0) return std::nullopt;
  text->resize(static_cast<size_t>(n));
  google::protobuf::Struct object;
  if (!google::protobuf::util::JsonStringToMessage(*text, &object).ok()) {
    return absl::StrCat("(its error file ", path, " is not JSON) ", text->substr(0, 512));
  }
  const auto& fields = object.fields();
  std::string message, traceback;
  auto string_of = [](const google::protobuf::Map<std::string, google::protobuf::Value>& f,
                      const char* name) -> std::string {
    auto it = f.find(name);
    return it != f.end() && it->second.has_string_value() ? it->second.string_value() : "";
  };
  if (auto it = fields.find("message"); it != fields.end() && it->second.has_struct_value()) {
    const auto& inner = it->second.struct_value().fields();
    message = string_of(inner, "message");
    if (auto extra = inner.find("extraInfo");
        extra != inner.end() && extra->second.has_struct_value()) {
      traceback = string_of(extra->second.struct_value().fields(), "py_callstack");
    }
  } else {
    message = string_of(fields, "message");
    traceback = string_of(fields, "traceback");
  }
  if (auto it = fields.find("retry"); it != fields.end() && it->second.has_bool_value()) {
    *retry = it->second.bool_value();
  }
  if (traceback.size() > kMaxErrorTextBytes) {
    traceback = absl::StrCat("...", traceback.substr(traceback.size() - kMaxErrorTextBytes));
  }
  return traceback.empty() ? message : absl::StrCat(message, "\n", traceback);
}

class Launcher {
 public:
  Launcher(ProgramImpl& program, const v1::ProgramLaunch& launch)
      : program_(program), launch_(launch), command_(launch.command()) {}

  // Everything after the rendezvous: the processes, until they have all ended.
  int Run(const Rendezvous& rendezvous);

 private:
  absl::Status Prepare(const Rendezvous& rendezvous);
  // Reads what each process wrote, relays whole lines; `final`: also the last partial line.
  void RelayOutput(Child& child, bool final);
  void Relay(Child& child, absl::string_view line);
  void ForwardReports(Child& child);
  void Forward(Child& child, const ReportRecord& record);
  // The child's devices wrote a report line now (the activity file, contract/activity.h).
  void PublishAlive(const Child& child);
  // Reaps what exited; the first failure stops the others.
  void Reap();
  // SIGTERM to the group (the processes and theirs), SIGKILL after the agent's stop grace.
  void StopAll(const std::string& why);
  // After the launcher got a stop signal. From its supervisor (the agent's stop, a preemption,
  // a fence: always sent to the whole group, so the processes have it too), the launcher waits
  // for them without a SIGKILL of its own: the supervisor's, after the agent's grace (a
  // preemption's may be longer than --stop-grace), bounds the wait, and the processes die with
  // the launcher (PR_SET_PDEATHSIG). From anyone else: StopAll.
  void StopOnSignal();
  int Finish();
  bool AllEnded() const;

  ProgramImpl& program_;
  const v1::ProgramLaunch& launch_;
  const v1::CommandLaunch& command_;
  std::vector<Child> children_;
  int64_t total_steps_ = 0;
  v1::ReportAttemptStatusRequest final_;
  v1::CheckpointListing listing_;
  bool warned_checkpoint_ = false;
  // This worker's host, as the mesh names it.
  std::string host_;
  // The first process that failed, and whether the launcher is stopping the rest (and until
  // when they get to exit).
  const Child* failed_ = nullptr;
  bool stopping_ = false;
  std::string stop_reason_;
  absl::Time kill_at_ = absl::InfiniteFuture();
  bool killed_ = false;
};

absl::Status Launcher::Prepare(const Rendezvous& rendezvous) {
  const v1::Assignment& a = launch_.assignment();
  const bool per_device =
      a.spec().command().processes() == v1::COMMAND_PROCESSES_PER_DEVICE;
  for (const v1::Device& d : a.mesh().devices()) {
    if (!a.local_device_ids().empty() && d.id() == a.local_device_ids(0)) host_ = d.host();
  }
  const std::string mesh_file = absl::StrCat(command_.attempt_dir(), "/mesh.json");
  SUBSTRAX_RETURN_IF_ERROR(WriteFileAtomically(mesh_file, EncodeMeshFile(a.mesh())));
  std::vector<int> devices;
  if (per_device) {
    devices.assign(a.local_device_ids().begin(), a.local_device_ids().end());
  } else {
    devices.push_back(-1);
  }
  for (size_t i = 0; i < devices.size(); ++i) {
    Child child;
    child.local = static_cast<int>(i);
    child.device_id = devices[i];
    child.report_file = absl::StrCat(command_.attempt_dir(), "/report-", i, ".jsonl");
    child.error_file = absl::StrCat(command_.attempt_dir(), "/error-", i, ".json");
    CommandEnvOptions options;
    options.torch_master_host = options.jax_coordinator_host = rendezvous.host;
    options.torch_master_port = rendezvous.torch_port;
    options.jax_coordinator_port = rendezvous.jax_port;
    options.processes = per_device ? CommandProcesses::kPerDevice : CommandProcesses::kPerWorker;
    options.device_id = devices[i];
    // Attempts count from 1: the first is no restart.
    options.restart_count = std::max(0, a.attempt() - 1);
    options.backend = a.mesh().devices_size() > 0 &&
                              a.mesh().devices(0).kind() != v1::DEVICE_KIND_CPU
                          ? CommandBackend::kCuda
                          : CommandBackend::kCpu;
    options.agent_cuda_visible_devices.assign(command_.agent_cuda_visible_devices().begin(),
                                              command_.agent_cuda_visible_devices().end());
    options.mesh_file = mesh_file;
    options.report_file = child.report_file;
    options.error_file = child.error_file;
    SUBSTRAX_ASSIGN_OR_RETURN(std::vector<CommandEnvVar> contract,
                              RenderCommandEnv(launch_, options));
    for (const CommandEnvVar& var : contract) {
      if (var.name == "RANK") absl::SimpleAtoi(var.value, &child.rank);
    }
    const bool python_env = !a.spec().command().python_env().empty();
    const std::string& executable = command_.executable();
    child.env = ChildEnv(contract, python_env ? executable.substr(0, executable.rfind('/')) : "");
    child.argv.assign(a.spec().command().argv().begin(), a.spec().command().argv().end());
    // An interpreter finds its environment from the path it was started as (a venv's
    // bin/python from its pyvenv.cfg beside it): argv[0] is the path, not the bare name.
    if (python_env) child.argv[0] = executable;
    child.assignment = a;
    child.assignment.clear_layouts();
    if (per_device) {
      child.assignment.clear_local_device_ids();
      child.assignment.add_local_device_ids(devices[i]);
      child.prefix = absl::StrCat("[rank ", child.rank, "] ");
    }
    child.tailer = std::make_unique<ReportFileTailer>(child.report_file);
    children_.push_back(std::move(child));
  }
  return absl::OkStatus();
}

void Launcher::Relay(Child& child, absl::string_view line) {
  std::string out = absl::StrCat(child.prefix, line, "\n");
  std::fwrite(out.data(), 1, out.size(), stdout);
  child.last_lines.emplace_back(line.substr(0, kMaxKeptLineBytes));
  if (child.last_lines.size() > kLastLines) child.last_lines.pop_front();
}

void Launcher::RelayOutput(Child& child, bool final) {
  if (child.out_fd < 0) return;
  char buffer[16384];
  while (true) {
    const ssize_t n = read(child.out_fd, buffer, sizeof(buffer));
    if (n > 0) {
      child.partial.append(buffer, static_cast<size_t>(n));
      size_t start = 0;
      for (size_t nl; (nl = child.partial.find('\n', start)) != std::string::npos;
           start = nl + 1) {
        Relay(child, absl::string_view(child.partial).substr(start, nl - start));
      }
      child.partial.erase(0, start);
      while (child.partial.size() > kMaxRelayedLineBytes) {
        Relay(child, absl::string_view(child.partial).substr(0, kMaxRelayedLineBytes));
        child.partial.erase(0, kMaxRelayedLineBytes);
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // EOF (every writer has closed it) or nothing more now.
    if (n == 0 || final) {
      if (!child.partial.empty()) Relay(child, child.partial);
      child.partial.clear();
      if (n == 0) {
        close(child.out_fd);
        child.out_fd = -1;
      }
    }
    break;
  }
  std::fflush(stdout);
}

void Launcher::Forward(Child& child, const ReportRecord& record) {
  const bool process_zero = launch_.assignment().process_index() == 0;
  if (const auto* step = std::get_if<ReportStep>(&record)) {
    absl::StatusOr<std::vector<v1::StepReport>> reports =
        ToStepReports(*step, child.assignment, total_steps_);
    if (!reports.ok()) {
      Say(absl::StrCat("report file ", child.report_file, ": step ", step->step,
                       " skipped: ", reports.status().message()));
      return;
    }
    for (v1::StepReport& report : *reports) program_.EnqueueStepReport(std::move(report));
  } else if (const auto* total = std::get_if<ReportTotalSteps>(&record)) {
    total_steps_ = total->total_steps;
    program_.SetTotalSteps(total_steps_);
  } else if (const auto* final = std::get_if<ReportFinal>(&record)) {
    if (absl::Status s = AddFinalMetrics(*final, &final_); !s.ok()) {
      Say(absl::StrCat("report file ", child.report_file, ": final metrics skipped: ",
                       s.message()));
    }
  } else if (const auto* checkpoint = std::get_if<ReportCheckpoint>(&record)) {
    if (!process_zero) {
      if (!warned_checkpoint_) {
        Say("checkpoint records are listed from process 0's report files only; this process's "
            "are skipped");
      }
      warned_checkpoint_ = true;
      return;
    }
    v1::CheckpointRecord r = ToCheckpointRecord(*checkpoint, absl::ToUnixSeconds(absl::Now()));
    r.set_mesh(program_.mesh().ShapeString());
    AddCheckpoint(r, &listing_);
    v1::ReportCheckpointsRequest request;
    *request.mutable_listing() = listing_;
    program_.ReportCheckpoints(std::move(request));
  } else if (const auto* resumed = std::get_if<ReportResumed>(&record)) {
    if (process_zero && child.local == 0) program_.ReportResume(ToCheckpointResume(*resumed));
  }
  // Every line (a heartbeat too) says the process is alive: published for hang attribution
  // (its devices' "report" phase, since now).
  if (const auto* step = std::get_if<ReportStep>(&record)) {
    child.last_step = std::max(child.last_step, step->step);
  }
  PublishAlive(child);
}

void Launcher::PublishAlive(const Child& child) {
  ActivityBoard* board = ProcessActivityBoard();
  if (board == nullptr) return;
  const std::vector<int> devices =
      child.device_id >= 0 ? std::vector<int>{child.device_id} : program_.local_device_ids();
  for (int id : devices) {
    board->SetPhase(board->DeviceSlot(id), ActivityPhase::kReport, child.last_step);
  }
}

void Launcher::ForwardReports(Child& child) {
  ReportPoll poll = child.tailer->Poll();
  for (const std::string& warning : poll.warnings) Say(warning);
  for (const ReportRecord& record : poll.records) Forward(child, record);
}

void Launcher::StopAll(const std::string& why) {
  if (stopping_) return;
  stopping_ = true;
  stop_reason_ = why;
  kill_at_ = absl::Now() + FromProtoDuration(command_.stop_grace());
  Say(absl::StrCat("stopping the command's processes: ", why));
  // The whole group, the processes' own children too; the launcher's handler only notes it.
  kill(0, SIGTERM);
}

void Launcher::StopOnSignal() {
  const int signal = stop_signal.load();
  if (signal == 0 || stopping_) return;
  const std::string why = absl::StrCat("the launcher got signal ", signal, " (", strsignal(signal),
                                       "): the attempt is stopping");
  const pid_t parent = getppid();
  if (parent == 1 || stop_sender.load() != parent) {
    StopAll(why);
    return;
  }
  stopping_ = true;
  stop_reason_ = why;
  Say(absl::StrCat(why, "; the command's processes got it too (their process group) and may "
                        "write a checkpoint: waiting for them to exit (the agent sends SIGKILL "
                        "after its grace)"));
}

void Launcher::Reap() {
  for (Child& child : children_) {
    if (child.wait_status.has_value()) continue;
    int status = 0;
    const pid_t r = waitpid(child.pid, &status, WNOHANG);
    if (r != child.pid) continue;
    child.wait_status = status;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    Say(absl::StrCat("rank ", child.rank, " (pid ", child.pid, ") ", DescribeExit(status)));
    // A process killed by the stop the launcher got too is not the attempt's failure.
    if (!ok) StopOnSignal();
    if (!ok && failed_ == nullptr && !stopping_) {
      failed_ = &child;
      StopAll(absl::StrCat("rank ", child.rank, " ", DescribeExit(status)));
    }
  }
}

bool Launcher::AllEnded() const {
  for (const Child& child : children_) {
    if (!child.wait_status.has_value()) return false;
  }
  return true;
}

int Launcher::Finish() {
  for (Child& child : children_) {
    RelayOutput(child, /*final=*/true);
    ForwardReports(child);
    const ReportCounters& n = child.tailer->counters();
    int64_t records = 0;
    for (const auto& [type, count] : n.records) records += count;
    if (records > 0 || n.skipped_unknown_type + n.skipped_malformed + n.skipped_oversized > 0) {
      Say(absl::StrCat("report file ", child.report_file, ": ", records, " records read; skipped: ",
                       n.skipped_malformed, " malformed, ", n.skipped_oversized, " oversized, ",
                       n.skipped_unknown_type, " of an unknown type"));
    }
  }
  program_.SetFinalMetrics(Metrics(final_.final_metrics().begin(), final_.final_metrics().end()));
  if (failed_ != nullptr) {
    const Child& child = *failed_;
    bool retry = true;
    std::string error = absl::StrCat(
        "rank ", child.rank,
        child.device_id >= 0 ? absl::StrCat(" (device ", child.device_id, ")") : "", " on host ",
        host_, " ", DescribeExit(*child.wait_status));
    if (std::optional<std::string> text = ReadErrorFile(child.error_file, &retry)) {
      absl::StrAppend(&error, ": ", *text);
    } else if (!child.last_lines.empty()) {
      absl::StrAppend(&error, "; its last lines:\n",
                      absl::StrJoin(child.last_lines.begin(), child.last_lines.end(), "\n"));
    }
    // The coordinator fails the job at once, without restarts, on INVALID_ARGUMENT.
    program_.Finish(retry ? absl::UnknownError(error) : absl::InvalidArgumentError(error));
    return ExitCode(*child.wait_status);
  }
  if (stopping_) {
    program_.Finish(absl::CancelledError(stop_reason_));
    return 128 + SIGTERM;
  }
  return program_.Finish(absl::OkStatus());
}

int Launcher::Run(const Rendezvous& rendezvous) {
  if (absl::Status s = Prepare(rendezvous); !s.ok()) {
    return program_.Finish(Annotate(s, "preparing the command's processes"));
  }
  const std::string& executable = command_.executable();
  for (Child& child : children_) {
    if (absl::Status s = StartChild(executable, command_.working_dir(), child); !s.ok()) {
      StopAll(absl::StrCat("cannot start rank ", child.rank, ": ", s.message()));
      break;
    }
    Say(absl::StrCat("started rank ", child.rank, " (pid ", child.pid, "): ",
                     absl::StrJoin(child.argv, " "), " [", executable, "]"));
  }
  while (true) {
    std::vector<pollfd> fds;
    for (const Child& child : children_) {
      if (child.out_fd >= 0) fds.push_back({child.out_fd, POLLIN, 0});
    }
    poll(fds.data(), fds.size(), static_cast<int>(absl::ToInt64Milliseconds(kPollInterval)));
    for (Child& child : children_) RelayOutput(child, /*final=*/false);
    for (Child& child : children_) ForwardReports(child);
    StopOnSignal();
    Reap();
    if (AllEnded()) break;
    if (stopping_ && !killed_ && absl::Now() >= kill_at_) {
      killed_ = true;
      Say("processes still running after the stop grace: SIGKILL");
      for (const Child& child : children_) {
        if (!child.wait_status.has_value() && child.pid > 0) kill(child.pid, SIGKILL);
      }
    }
    // A process that never started has nothing to wait for.
    for (Child& child : children_) {
      if (child.pid == 0 && !child.wait_status.has_value()) child.wait_status = 127 << 8;
    }
  }
  return Finish();
}

void InstallStopHandlers() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0) signal_pipe_write = fds[1];
  struct sigaction action {};
  action.sa_sigaction = OnStopSignal;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaction(s, &action, nullptr);
}

}  // namespace

int RunCommandLauncher(const std::string& launch_path) {
  InstallStopHandlers();
  absl::StatusOr<std::unique_ptr<ProgramImpl>> program = ProgramImpl::FromLaunch(launch_path);
  if (!program.ok()) {
    std::fprintf(stderr, "substrax-job command: %s\n",
                 std::string(program.status().message()).c_str());
    return 1;
  }
  const v1::ProgramLaunch& launch = *(*program)->launch();
  if (!launch.has_command() || launch.command().executable().empty()) {
    return (*program)->Finish(absl::FailedPreconditionError(
        "the launch file has no command part (ProgramLaunch.command): the agent that started "
        "this launcher is older than its substrax-job; upgrade it"));
  }
  absl::StatusOr<Rendezvous> rendezvous = Meet(**program, launch);
  if (!rendezvous.ok()) return (*program)->Finish(rendezvous.status());
  Launcher launcher(**program, launch);
  return launcher.Run(*rendezvous);
}

}  // namespace substrax
