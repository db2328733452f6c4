// allreduce: all-reduce bandwidth of our GlooCommunicator next to what it wraps (raw Gloo), of our
// ShmCommunicator (shared memory), and of Open MPI over TCP and over shared memory, 2 processes on
// this machine, sum of float32, every result verified.
//
//   bazel run -c opt //bench:allreduce [-- --max_bytes=... --mpirun=... --mpi_binary=...]
//
// Forks two worker processes that rendezvous through a FileStore in a fresh temporary
// directory; each connects a GlooCommunicator (through a PrefixStore, with a PeerMonitor, as the
// runtime does) and a raw Gloo context (gloo::rendezvous::FileStore, its own TCP device on
// 127.0.0.1), and for each size runs the two taking turns iteration by iteration
// (allreduce_common.h says how a size is timed and why). The workers leave their per-iteration
// times in the store; this process summarises them. Then it runs //bench:allreduce_mpi under
// mpirun with the same plan, once over TCP (btl self,tcp) and once over shared memory (btl
// self,vader), and reads its summary lines. In the shared-memory run the MPI processes also
// connect our ShmCommunicator (cross-process: one shared-memory segment) and take turns with
// MPI_Allreduce: the two shared-memory all-reduces are compared in the same processes, under
// the same load. Without mpirun, the ShmCommunicator takes turns with the other two in the
// forked workers instead. See README.md for how to read the table.
//
// Exit status: 0 when every peer ran and every result was exact; 1 when a peer failed or a
// result was wrong; non-zero from CLI11 for a bad command line. A missing mpirun or MPI binary
// skips the MPI column with a message instead of failing.
#include <limits.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/allreduce_common.h"
#include "bench/host.h"
#include "core/status.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "worker/collectives/gloo_communicator.h"
#include "worker/collectives/shm_communicator.h"

namespace substrax::bench {
namespace {

constexpr int kRanks = 2;
const char* const kPeerNames[] = {"ours", "gloo", "shm"};

struct Options {
  PlanOptions plan;
  // The mpirun to launch the MPI peer with: a path, or a name looked up in PATH.
  std::string mpirun = "mpirun";
  // //bench:allreduce_mpi; empty: the runfiles copy (bazel run), else the one beside this binary.
  std::string mpi_binary;
};

// Median time and wrong elements of one peer at one size.
struct Result {
  double seconds = 0;
  int64_t wrong = 0;
};

std::string SamplesKey(const char* peer, int64_t bytes, int rank) {
  return absl::StrCat("samples/", peer, "/", bytes, "/", rank);
}

// "<wrong elements> <nanoseconds of each timed iteration>..."
std::string Serialize(const Samples& samples) {
  std::string out = absl::StrCat(samples.wrong_elements);
  for (double s : samples.seconds) absl::StrAppend(&out, " ", static_cast<int64_t>(s * 1e9));
  return out;
}

absl::StatusOr<Samples> Parse(const std::string& text) {
  Samples samples;
  const std::vector<absl::string_view> fields = absl::StrSplit(text, ' ', absl::SkipEmpty());
  for (size_t i = 0; i < fields.size(); ++i) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(fields[i], &value)) {
      return absl::InternalError(absl::StrCat("bad samples field '", fields[i], "'"));
    }
    if (i == 0) {
      samples.wrong_elements = value;
    } else {
      samples.seconds.push_back(static_cast<double>(value) * 1e-9);
    }
  }
  return samples;
}

// A raw Gloo context as a Gloo user would make one: Gloo's own FileStore, a TCP device.
absl::StatusOr<std::shared_ptr<gloo::Context>> ConnectRawGloo(int rank, const std::string& dir,
                                                              std::chrono::milliseconds timeout) {
  try {
    gloo::rendezvous::FileStore store(dir);
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, kRanks);
    context->setTimeout(timeout);
    context->connectFullMesh(store, device);
    return context;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("connecting raw Gloo: ", e.what()));
  }
}

// Gloo reports errors by throwing.
template <typename Fn>
absl::Status GlooCall(const char* what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("raw gloo ", what, ": ", e.what()));
  }
}

// One worker process: ours and raw Gloo (and shm when `with_shm`), every size, samples into the
// store.
absl::Status RunWorker(int rank, const std::string& dir, const PlanOptions& options,
                       bool with_shm) {
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<FileStore> store, FileStore::Create(dir));
  PeerMonitor::Options monitor_options;
  monitor_options.process_index = rank;
  monitor_options.num_processes = kRanks;
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<PeerMonitor> monitor,
                            PeerMonitor::Start(monitor_options, store.get()));
  PrefixStore ours_store(store.get(), "ours");
  const GlooCommunicatorOptions ours_options;
  std::vector<RankInfo> ranks;
  for (int r = 0; r < kRanks; ++r) {
    RankInfo& info = ranks.emplace_back();
    info.process_index = r;
    info.description = absl::StrCat("bench process ", r);
  }
  SUBSTRAX_ASSIGN_OR_RETURN(
      std::unique_ptr<GlooCommunicator> comm,
      GlooCommunicator::Create(ours_options, &ours_store, rank, ranks, monitor.get()));
  // The same collective timeout as ours, so that neither waits differently.
  const std::chrono::milliseconds timeout(absl::ToInt64Milliseconds(ours_options.timeout));
  SUBSTRAX_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> context,
                            ConnectRawGloo(rank, dir + "/gloo", timeout));
  PrefixStore shm_store(store.get(), "shm");
  std::unique_ptr<ShmCommunicator> shm_comm;
  if (with_shm) {
    SUBSTRAX_ASSIGN_OR_RETURN(shm_comm, ShmCommunicator::Create(ShmCommunicatorOptions(),
                                                                &shm_store, rank, ranks,
                                                                monitor.get()));
  }

  const AllReducePeer ours{
      kPeerNames[0],
      [&](absl::Span<float> data) { return comm->AllReduce(data, ReduceOp::kSum); },
      [&] { return comm->Barrier(); },
  };
  // What GlooCommunicator::AllReduce does, minus its tags, status translation and checks.
  const AllReducePeer raw_gloo{
      kPeerNames[1],
      [&](absl::Span<float> data) {
        return GlooCall("allreduce", [&] {
          gloo::AllreduceOptions opts(context);
          opts.setOutput(data.data(), data.size());
          opts.setReduceFunction(
              static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
          opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
          gloo::allreduce(opts);
        });
      },
      [&] {
        return GlooCall("barrier", [&] {
          gloo::BarrierOptions opts(context);
          gloo::barrier(opts);
        });
      },
  };

  const AllReducePeer shm{
      kPeerNames[2],
      [&](absl::Span<float> data) { return shm_comm->AllReduce(data, ReduceOp::kSum); },
      [&] { return shm_comm->Barrier(); },
  };

  std::vector<const AllReducePeer*> peers = {&ours, &raw_gloo};
  if (with_shm) peers.push_back(&shm);
  const std::vector<SizePlan> plan = MakePlan(options);
  std::vector<float> buffer(plan.empty() ? 0 : plan.back().elements());
  int iteration = 0;
  std::vector<Samples> samples;
  for (const SizePlan& size : plan) {
    SUBSTRAX_RETURN_IF_ERROR(RunSize(peers, options, size, rank, kRanks, &iteration,
                                     absl::MakeSpan(buffer).subspan(0, size.elements()), &samples));
    for (size_t p = 0; p < peers.size(); ++p) {
      SUBSTRAX_RETURN_IF_ERROR(
          store->Set(SamplesKey(kPeerNames[p], size.bytes, rank), Serialize(samples[p])));
    }
  }
  // Neither rank tears its connections down while the other still runs its last call.
  SUBSTRAX_RETURN_IF_ERROR(ours.barrier());
  if (with_shm) SUBSTRAX_RETURN_IF_ERROR(shm.barrier());
  return raw_gloo.barrier();
}

// Forks the two workers and waits for them. Errors: INTERNAL naming the worker that failed (its
// own message is on stderr).
absl::Status RunWorkers(const std::string& dir, const PlanOptions& options, bool with_shm) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < kRanks; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    if (pid == 0) {
      const absl::Status status = RunWorker(rank, dir, options, with_shm);
      if (!status.ok()) {
        std::fprintf(stderr, "allreduce worker rank %d (pid %d): %s\n", rank, getpid(),
                     status.ToString().c_str());
      }
      std::fflush(nullptr);
      _exit(status.ok() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  // Bounded: every collective and connection in the workers has a timeout.
  absl::Status result;
  for (int rank = 0; rank < kRanks; ++rank) {
    int status = 0;
    waitpid(pids[rank], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      result.Update(absl::InternalError(absl::StrCat("worker rank ", rank, " failed (wait status ",
                                                     status, "); its error is above")));
    }
  }
  return result;
}

// results[peer][bytes] from what the workers left in the store.
absl::Status CollectWorkerResults(const std::string& dir, const std::vector<SizePlan>& plan,
                                  bool with_shm,
                                  std::map<std::string, std::map<int64_t, Result>>* results) {
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<FileStore> store, FileStore::Create(dir));
  for (const char* peer : kPeerNames) {
    if (!with_shm && peer == kPeerNames[2]) continue;
    for (const SizePlan& size : plan) {
      std::vector<std::vector<double>> per_rank;
      Result& result = (*results)[peer][size.bytes];
      for (int rank = 0; rank < kRanks; ++rank) {
        SUBSTRAX_ASSIGN_OR_RETURN(
            std::string text, store->Get(SamplesKey(peer, size.bytes, rank), absl::ZeroDuration()));
        SUBSTRAX_ASSIGN_OR_RETURN(Samples samples, Parse(text));
        result.wrong += samples.wrong_elements;
        per_rank.push_back(std::move(samples.seconds));
      }
      result.seconds = MedianOfSlowestRank(per_rank);
    }
  }
  return absl::OkStatus();
}

// `name` itself if it holds a '/', else its first executable match in PATH; nullopt if none.
std::optional<std::string> FindExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    return access(name.c_str(), X_OK) == 0 ? std::optional<std::string>(name) : std::nullopt;
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "", ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

std::optional<std::string> FindMpiBinary(const std::string& flag) {
  std::vector<std::string> candidates;
  if (!flag.empty()) {
    candidates.push_back(flag);
  } else {
    candidates.push_back("bench/allreduce_mpi");  // bazel run: the cwd is our runfiles root
    char self[PATH_MAX] = {};
    if (readlink("/proc/self/exe", self, sizeof(self) - 1) > 0) {
      candidates.push_back((std::filesystem::path(self).parent_path() / "allreduce_mpi").string());
    }
  }
  for (const std::string& candidate : candidates) {
    if (access(candidate.c_str(), X_OK) == 0) return std::filesystem::absolute(candidate).string();
  }
  return std::nullopt;
}

// One way of running the MPI peer: its column, Open MPI's byte transfer layers, and whether our
// ShmCommunicator takes turns with it in the same processes (column "shm").
struct MpiTransport {
  const char* column;
  const char* btl;
  bool with_shm;
};
// TCP over loopback only, like Gloo's transport; shared memory (vader), like ShmCommunicator.
constexpr MpiTransport kMpiTcp = {"mpi", "self,tcp", false};
constexpr MpiTransport kMpiShm = {"mpi_shm", "self,vader", true};

// The mpirun and allreduce_mpi to run the MPI peer with, or why it cannot run.
struct MpiCommand {
  std::string mpirun;
  std::string binary;
  std::string missing;  // non-empty: the MPI columns are skipped, and why
};

MpiCommand FindMpi(const Options& options) {
  MpiCommand command;
  const std::optional<std::string> mpirun = FindExecutable(options.mpirun);
  const std::optional<std::string> binary = FindMpiBinary(options.mpi_binary);
  if (!mpirun) {
    command.missing = absl::StrCat("'", options.mpirun,
                                   "' is not installed or not in PATH (Debian package openmpi-bin)");
  } else if (!binary) {
    command.missing =
        "allreduce_mpi not found (not in runfiles, not beside this binary; pass --mpi_binary)";
  } else {
    command.mpirun = *mpirun;
    command.binary = *binary;
  }
  return command;
}

// Runs the MPI peer over `transport` and reads its "result" lines into results[transport.column]
// (and results["shm"] when transport.with_shm; its processes meet in `shm_store`, a directory).
// Errors: MPI ran and failed, or printed what this cannot read.
absl::Status RunMpi(const Options& options, const MpiCommand& command,
                    const MpiTransport& transport, const std::string& shm_store,
                    std::map<std::string, std::map<int64_t, Result>>* results) {
  std::vector<std::string> args = {
      command.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", absl::StrCat(kRanks),
      // Unbound, like the forked workers of the other two columns.
      "--bind-to", "none",
      // Only the transport asked for (no other fabrics); TCP on loopback only.
      "--mca", "btl", transport.btl, "--mca", "btl_tcp_if_include", "lo", "--mca",
      "oob_tcp_if_include", "lo",
      // mpirun ends the job if it runs longer than this (seconds).
      "--timeout", "900", command.binary};
  for (std::string& arg : ToArgs(options.plan)) args.push_back(std::move(arg));
  if (transport.with_shm) args.push_back(absl::StrCat("--shm_store=", shm_store));

  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    setenv("OMPI_MCA_btl", transport.btl, 1);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "exec %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  close(pipe_fds[1]);
  std::string output;
  char chunk[4096];
  for (ssize_t n; (n = read(pipe_fds[0], chunk, sizeof(chunk))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    output.append(chunk, n);
  }
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("mpirun ", absl::StrJoin(args, " "),
                                            " failed (wait status ", status,
                                            "); its errors are above. Output:\n", output));
  }
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    if (!absl::ConsumePrefix(&line, "result ")) continue;
    // result <peer> <bytes> <iterations> <seconds> <wrong>
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    int64_t bytes = 0, count = 0;
    Result result;
    if (f.size() != 5 || (f[0] != "mpi" && f[0] != "shm") || !absl::SimpleAtoi(f[1], &bytes) ||
        !absl::SimpleAtoi(f[2], &count) || !absl::SimpleAtod(f[3], &result.seconds) ||
        !absl::SimpleAtoi(f[4], &result.wrong)) {
      return absl::InternalError(absl::StrCat("bad line from allreduce_mpi: '", line, "'"));
    }
    (*results)[f[0] == "shm" ? "shm" : transport.column][bytes] = result;
  }
  return absl::OkStatus();
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "model name")) {
      return std::string(absl::StripAsciiWhitespace(rest.substr(rest.find(':') + 1)));
    }
  }
  return "unknown CPU";
}

// "12.3" or "-" when the peer has no result for this size.
std::string Cell(const std::map<int64_t, Result>& peer, int64_t bytes, bool bandwidth) {
  auto it = peer.find(bytes);
  if (it == peer.end()) return "-";
  if (bandwidth)
    return absl::StrFormat("%.2f", BusBandwidthGBps(bytes, it->second.seconds, kRanks));
  return absl::StrFormat("%.1f", it->second.seconds * 1e6);
}

std::string RatioCell(const std::map<int64_t, Result>& ours, const std::map<int64_t, Result>& other,
                      int64_t bytes, double* ratio) {
  auto a = ours.find(bytes), b = other.find(bytes);
  if (a == ours.end() || b == other.end() || a->second.seconds <= 0) return "-";
  *ratio = b->second.seconds / a->second.seconds;  // busbw ratio: the same bytes and ranks
  return absl::StrFormat("%.3f", *ratio);
}

int Main(const Options& options) {
  const std::vector<SizePlan> plan = MakePlan(options.plan);
  if (plan.empty()) {
    std::fprintf(stderr, "no sizes between --min_bytes and --max_bytes\n");
    return 1;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string dir_template = absl::StrCat(tmp ? tmp : "/tmp", "/substrax_bench_allreduce.XXXXXX");
  if (mkdtemp(dir_template.data()) == nullptr ||
      !std::filesystem::create_directory(dir_template + "/gloo")) {
    std::fprintf(stderr, "cannot make a temporary directory %s: %s\n", dir_template.c_str(),
                 std::strerror(errno));
    return 1;
  }
  const std::string dir = dir_template;
  const MpiCommand mpi = FindMpi(options);
  // shm takes turns with MPI's shared-memory transport when MPI runs, else with ours and Gloo.
  const bool shm_in_workers = !mpi.missing.empty();

  std::printf(
      "host: %ld CPUs (%s), load average %s at start; %d processes over 127.0.0.1 "
      "TCP and shared memory; sizes %s..%s doubling; timed iterations per size and peer %d..%d "
      "after %d warm-up; taking turns: %s; time = median over iterations of the slowest rank\n",
      sysconf(_SC_NPROCESSORS_ONLN), CpuModel().c_str(), LoadAverage().c_str(), kRanks,
      FormatBytes(plan.front().bytes).c_str(), FormatBytes(plan.back().bytes).c_str(),
      plan.back().iterations, plan.front().iterations, options.plan.warmup,
      shm_in_workers ? "ours, gloo and shm" : "ours and gloo; then mpi alone; then shm and mpishm");
  // Where the VM's two vCPUs sit now moves the shared-memory columns (see host.h).
  std::vector<std::string> round_trips = {
      absl::StrFormat("%.0f ns at start", CrossCpuRoundTripNs())};
  std::fflush(stdout);

  std::map<std::string, std::map<int64_t, Result>> results;
  absl::Status status = RunWorkers(dir, options.plan, shm_in_workers);
  if (status.ok()) status = CollectWorkerResults(dir, plan, shm_in_workers, &results);
  if (!status.ok()) {
    std::fprintf(stderr, "ours/raw Gloo: %s\n", status.ToString().c_str());
  } else if (!mpi.missing.empty()) {
    std::printf("MPI columns skipped: %s\n", mpi.missing.c_str());
  } else {
    for (const MpiTransport& transport : {kMpiTcp, kMpiShm}) {
      if (transport.with_shm) {
        round_trips.push_back(
            absl::StrFormat("%.0f ns before shm and mpishm", CrossCpuRoundTripNs()));
      }
      status = RunMpi(options, mpi, transport, dir + "/shm", &results);
      if (!status.ok()) {
        std::fprintf(stderr, "MPI peer (btl %s): %s\n", transport.btl,
                     status.ToString().c_str());
        break;
      }
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (!status.ok()) return 1;
  round_trips.push_back(absl::StrFormat("%.0f ns at the end", CrossCpuRoundTripNs()));
  std::printf("cache line CPU 0 -> CPU 1 -> CPU 0 (median; 0: not measured): %s\n",
              absl::StrJoin(round_trips, ", ").c_str());
  // shm against MPI's shared-memory transport when it ran, else against MPI over TCP.
  const char* shm_rival = results["mpi_shm"].empty() ? "mpi" : "mpi_shm";

  std::printf("%8s %6s | %9s %8s | %9s %8s | %9s %8s | %9s %8s | %9s %8s | %9s %8s %8s\n",
              "size", "iters", "ours_us", "ours_bus", "gloo_us", "gloo_bus", "shm_us", "shm_bus",
              "mpi_us", "mpi_bus", "mpishm_us", "mpishm_b", "ours/gloo", "ours/mpi",
              results["mpi_shm"].empty() ? "shm/mpi" : "shm/mpis");
  int64_t wrong = 0;
  double min_ratio_1mib = std::numeric_limits<double>::infinity();
  double shm_ratio_1mib = 0;
  for (const SizePlan& size : plan) {
    double vs_gloo = 0, vs_mpi = 0, shm_vs_mpi = 0;
    const std::string gloo_ratio =
        RatioCell(results["ours"], results["gloo"], size.bytes, &vs_gloo);
    const std::string mpi_ratio = RatioCell(results["ours"], results["mpi"], size.bytes, &vs_mpi);
    const std::string shm_ratio =
        RatioCell(results["shm"], results[shm_rival], size.bytes, &shm_vs_mpi);
    if (size.bytes == (int64_t{1} << 20)) shm_ratio_1mib = shm_vs_mpi;
    std::printf("%8s %6d", FormatBytes(size.bytes).c_str(), size.iterations);
    for (const char* peer : {"ours", "gloo", "shm", "mpi", "mpi_shm"}) {
      std::printf(" | %9s %8s", Cell(results[peer], size.bytes, false).c_str(),
                  Cell(results[peer], size.bytes, true).c_str());
      if (auto it = results[peer].find(size.bytes); it != results[peer].end()) {
        if (it->second.wrong > 0) {
          std::fprintf(stderr, "%s at %s: %lld wrong elements\n", peer,
                       FormatBytes(size.bytes).c_str(), static_cast<long long>(it->second.wrong));
        }
        wrong += it->second.wrong;
      }
    }
    std::printf(" | %9s %8s %8s\n", gloo_ratio.c_str(), mpi_ratio.c_str(), shm_ratio.c_str());
    if (size.bytes >= (int64_t{1} << 20)) min_ratio_1mib = std::min(min_ratio_1mib, vs_gloo);
  }
  std::printf(
      "times in microseconds; *_bus = bus bandwidth in GB/s (= algbw for 2 ranks); "
      "ratios are of bus bandwidth; wrong elements: %lld\n",
      static_cast<long long>(wrong));
  if (std::isinf(min_ratio_1mib)) {
    std::printf("ratio_vs_gloo_min_1MiB=n/a\n");
  } else {
    std::printf("ratio_vs_gloo_min_1MiB=%.3f\n", min_ratio_1mib);
  }
  // Last: shm's bus bandwidth over MPI's at 1 MiB, and which MPI transport it was.
  if (results["mpi"].empty() && results["mpi_shm"].empty()) {
    std::printf("shm not compared with MPI: MPI did not run\n");
  } else {
    std::printf("shm compared with MPI over %s\n",
                results["mpi_shm"].empty() ? "TCP (btl self,tcp; vader did not run)"
                                           : "shared memory (btl self,vader)");
  }
  if (shm_ratio_1mib > 0) {
    std::printf("ratio_shm_vs_mpi_1MiB=%.3f\n", shm_ratio_1mib);
  } else {
    std::printf("ratio_shm_vs_mpi_1MiB=n/a\n");
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace
}  // namespace substrax::bench

int main(int argc, char** argv) {
  substrax::bench::Options options;
  CLI::App app{
      "all-reduce bandwidth: substrax GlooCommunicator vs raw Gloo, substrax ShmCommunicator, "
      "Open MPI over TCP and over shared memory"};
  substrax::bench::AddPlanFlags(app, &options.plan);
  app.add_option("--mpirun", options.mpirun, "mpirun to launch the MPI peer with")
      ->capture_default_str();
  app.add_option("--mpi_binary", options.mpi_binary,
                 "path of //bench:allreduce_mpi (default: runfiles, then beside this binary)");
  CLI11_PARSE(app, argc, argv);
  return substrax::bench::Main(options);
}
