// Write and read throughput of a sharded checkpoint against a plain file of the same bytes, and
// the step-time cost of checkpointing a training job every 100 steps, in the same run. See
// README.md.
//
//   bazel run -c opt //bench:checkpoint                          # 256 MiB over 4 processes
//   bazel run -c opt //bench:checkpoint -- --mib 64 --dir /mnt/fast
//
// The state: parameters, and the two Adam slots of each, of a few dense layers, F32, on a
// (data=P/2, model=2) mesh of P simulated processes, one device each (SimulatedJob). Each round:
//
//   plain write       one file: write() of every array's bytes, fsync
//   checkpoint write  every process's EncodeProcessShards + WriteShardFile (fsync'd), then
//                     MakeManifest + CommitCheckpoint (manifest, rename, directory fsync)
//   plain read        read() of the whole file into one buffer
//   checkpoint read   CheckpointReader::Open + ReadBlock of every array whole (every shard
//                     file read once and checked against its XXH3)
//
// Before the reads every file is dropped from the page cache with posix_fadvise(DONTNEED)
// (dropping the whole cache needs root) and mincore() then says how much of it is still
// cached: the output says where the reads came from. MB/s counts the state's bytes (1e6 B),
// not the files' headers or the manifest. Both reads are compared with the state after they
// are timed; a difference fails the run (exit 1).
//
// Then the training rounds: the same job (an MLP 784-512-256-10 on synthetic data, data
// parallel over 2 CPU devices, Train() in this process) without a checkpoint section and with
// `checkpoint: {directory: <dir>, every_steps: 100}`, in turns. The loop is timed on its own
// clock from the report after the warm-up steps to the report after the last step, so the
// timed steps hold one checkpoint per 100 steps, each copied to host memory and written by the
// asynchronous writer while training goes on; beside the wall time, cpu_s is the process's CPU
// time over the same steps, all threads (the writer's too). Every run must end with the same
// parameters, bit for bit, and a checkpointed run must commit the checkpoints its spec asks
// for, the last one holding those parameters; otherwise the run fails (exit 1).
//
// The last lines are `ratio_write_vs_plain=` and `ratio_read_vs_plain=` (checkpoint MB/s over
// plain MB/s, of the median rounds) and `checkpoint_overhead_every_100_steps=`: the median
// checkpointed run's time over the median plain run's, minus 1.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/host.h"
#include "core/device.h"
#include "core/device_mesh_manager.h"
#include "core/job_spec.h"
#include "core/mesh.h"
#include "substrax/v1/job.pb.h"
#include "worker/checkpoint/commit.h"
#include "worker/checkpoint/sharded.h"
#include "worker/checkpoint/simulated_job.h"
#include "worker/collectives/store.h"
#include "worker/runtime/step_loop.h"
#include "worker/runtime/trainer.h"
#include "worker/tensor/tensor.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;

struct Options {
  int mib = 256;
  int processes = 4;
  int rounds = 3;
  std::string dir;        // empty: $TMPDIR, else /tmp
  int train_steps = 300;  // timed steps of each training run; a multiple of kCheckpointEvery
  int train_rounds = 5;   // 0: no training rounds
};

constexpr int64_t kColumns = 1024;
constexpr int kLayers = 4;

// The state of a job after training: per layer a kernel [rows, kColumns] split over both mesh
// axes and a bias [kColumns] split over "model", each with its Adam slots "mu" and "nu", about
// `bytes` in all. Values are cheap to make and differ from array to array.
std::map<std::string, GlobalArray> MakeState(int64_t bytes, int64_t data_axis) {
  const int64_t per_array = bytes / static_cast<int64_t>(sizeof(float)) / (3 * kLayers);
  int64_t rows = (per_array - kColumns) / kColumns;
  rows = std::max(data_axis, rows - rows % data_axis);
  std::map<std::string, GlobalArray> state;
  int salt = 0;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (const auto& [prefix, slot] : {std::pair{"params/", ""}, std::pair{"optimizer/", "/mu"},
                                       std::pair{"optimizer/", "/nu"}}) {
      for (const bool kernel : {true, false}) {
        Tensor value(kernel ? std::vector<int64_t>{rows, kColumns}
                            : std::vector<int64_t>{kColumns});
        ++salt;
        for (int64_t i = 0; i < value.size(); ++i) {
          value.data()[i] = static_cast<float>((i * 7919 + salt) % 100'003) * 1e-4f - 5.0f;
        }
        state[absl::StrCat(prefix, "dense_", layer, kernel ? "/kernel" : "/bias", slot)] = {
            std::move(value), kernel ? PartitionSpec::Of({"data", "model"})
                                     : PartitionSpec::Of({"model"})};
      }
    }
  }
  return state;
}

int64_t StateBytes(const std::map<std::string, GlobalArray>& state) {
  int64_t bytes = 0;
  for (const auto& [name, array] : state) bytes += array.value.size() * sizeof(float);
  return bytes;
}

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status PlainWrite(const std::string& path, const std::map<std::string, GlobalArray>& state) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", path);
  for (const auto& [name, array] : state) {
    const char* data = reinterpret_cast<const char*>(array.value.data());
    const size_t size = array.value.size() * sizeof(float);
    for (size_t done = 0; done < size;) {
      const ssize_t n = write(fd, data + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        close(fd);
        return Errno("cannot write", path);
      }
      done += static_cast<size_t>(n);
    }
  }
  if (fsync(fd) != 0) {
    close(fd);
    return Errno("cannot fsync", path);
  }
  close(fd);
  return absl::OkStatus();
}

absl::Status PlainRead(const std::string& path, std::string* buffer) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  for (size_t done = 0; done < buffer->size();) {
    const ssize_t n = read(fd, buffer->data() + done, buffer->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      return n == 0 ? absl::DataLossError(absl::StrCat(path, " is short"))
                    : Errno("cannot read", path);
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  return absl::OkStatus();
}

// Every regular file under `path` (or `path` itself).
std::vector<std::string> FilesUnder(const std::string& path) {
  if (!fs::is_directory(path)) return {path};
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(path)) {
    if (e.is_regular_file()) files.push_back(e.path().string());
  }
  return files;
}

// Asks the kernel to drop `files` from the page cache (they are fsync'd: clean pages go), and
// returns the fraction of their bytes still cached after, as mincore() sees it.
double EvictAndMeasure(const std::vector<std::string>& files) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  int64_t pages = 0, resident = 0;
  for (const std::string& file : files) {
    const int fd = open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_size > 0) {
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      void* map = mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
      if (map != MAP_FAILED) {
        std::vector<unsigned char> in_core((st.st_size + page - 1) / page);
        if (mincore(map, st.st_size, in_core.data()) == 0) {
          pages += static_cast<int64_t>(in_core.size());
          for (unsigned char c : in_core) resident += c & 1;
        }
        munmap(map, st.st_size);
      }
    }
    close(fd);
  }
  return pages == 0 ? 1.0 : static_cast<double>(resident) / pages;
}

struct Round {
  double plain_write = 0, checkpoint_write = 0, plain_read = 0, checkpoint_read = 0;  // seconds
  double cached = 0;  // fraction of the files' bytes in the page cache before the reads
  int64_t checkpoint_file_bytes = 0;
};

double Seconds(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// One round in `dir`; the checkpoint is saved as step `step`. Errors: a failed write or read,
// or a read that differs from the state (DATA_LOSS).
absl::StatusOr<Round> RunRound(const std::string& dir, int64_t step, const SimulatedJob& job,
                               const std::map<std::string, GlobalArray>& state) {
  Round round;
  const std::string plain = dir + "/plain.bin";
  const std::string checkpoints = dir + "/checkpoints";
  // Alternate which goes first, so that a drift in the machine's load hits both alike.
  const bool plain_first = step % 2 == 1;
  for (int turn = 0; turn < 2; ++turn) {
    absl::Time start = absl::Now();
    if ((turn == 0) == plain_first) {
      if (absl::Status s = PlainWrite(plain, state); !s.ok()) return s;
      round.plain_write = Seconds(start);
    } else {
      if (absl::Status s = job.Save(checkpoints, step); !s.ok()) return s;
      round.checkpoint_write = Seconds(start);
    }
  }
  const std::string committed = CommittedCheckpointDir(checkpoints, step);
  std::vector<std::string> files = FilesUnder(committed);
  for (const std::string& f : files) round.checkpoint_file_bytes += fs::file_size(f);
  files.push_back(plain);
  round.cached = EvictAndMeasure(files);

  std::string buffer(static_cast<size_t>(StateBytes(state)), '\0');
  std::map<std::string, Tensor> read;
  for (int turn = 0; turn < 2; ++turn) {
    absl::Time start = absl::Now();
    if ((turn == 0) == plain_first) {
      if (absl::Status s = PlainRead(plain, &buffer); !s.ok()) return s;
      round.plain_read = Seconds(start);
    } else {
      absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(committed);
      if (!reader.ok()) return reader.status();
      for (const v1::CheckpointArray& array : reader->manifest().arrays()) {
        std::vector<IndexRange> whole;
        for (int64_t d : array.global_shape()) whole.push_back({0, d});
        absl::StatusOr<Tensor> value = reader->ReadBlock(array.name(), whole);
        if (!value.ok()) return value.status();
        read[array.name()] = *std::move(value);
      }
      round.checkpoint_read = Seconds(start);
    }
  }

  // What was read is what was written, byte for byte.
  size_t at = 0;
  for (const auto& [name, array] : state) {
    const size_t size = array.value.size() * sizeof(float);
    if (std::memcmp(buffer.data() + at, array.value.data(), size) != 0) {
      return absl::DataLossError(absl::StrCat("the plain file's ", name, " differs"));
    }
    at += size;
    auto found = read.find(name);
    if (found == read.end() || !(found->second == array.value)) {
      return absl::DataLossError(absl::StrCat("the checkpoint's ", name, " differs"));
    }
  }
  std::error_code ec;
  fs::remove_all(committed, ec);
  fs::remove(plain, ec);
  return round;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One field of every round.
template <typename RoundType>
std::vector<double> Column(const std::vector<RoundType>& rounds, double RoundType::*field) {
  std::vector<double> column;
  for (const RoundType& r : rounds) column.push_back(r.*field);
  return column;
}

// "(min..max)" of the rounds' seconds.
std::string Spread(const std::vector<double>& seconds) {
  return absl::StrFormat("(%.3f..%.3f)", *std::min_element(seconds.begin(), seconds.end()),
                         *std::max_element(seconds.begin(), seconds.end()));
}

// --- The step-time overhead of checkpointing every 100 steps. ---

// The training job: the shape of examples/fashion_mnist_mlp.yaml's MLP on synthetic data, data
// parallel over 2 devices. Its reports come every kWarmupSteps steps: the loop is timed from
// the first report to the last, after the warm-up (threads starting, first allocations).
constexpr int64_t kWarmupSteps = 50;
constexpr int64_t kCheckpointEvery = 100;
constexpr char kTrainJob[] = R"(
apiVersion: substrax/v1
kind: TrainJob
metadata: {name: bench-checkpoint-overhead}
spec:
  model: {type: mlp, hidden_sizes: [512, 256], num_classes: 10}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 8192, num_test_examples: 256,
                num_features: 784, noise: 0.5}
  optimizer: {type: adam, learning_rate: 0.001}
  mesh: {data_parallel_size: 2}
  batch: {global_batch_size: 128}
  steps: STEPS
  seed: 7
  report_every_steps: WARMUP
)";

// CPU time of this process, all threads, in seconds.
double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// One training run: the timed steps' wall and CPU seconds and what the run ended with.
struct TrainRun {
  double seconds = 0;
  double cpu_seconds = 0;
  TrainResult result;
  // The job's checkpoints after its last commit (none without a checkpoint section).
  v1::CheckpointListing listing;
};

// Trains `spec` in this process, one thread per device, as `substrax-job train` does.
absl::StatusOr<TrainRun> TimeTraining(const v1::JobSpec& spec) {
  absl::StatusOr<Mesh> mesh =
      CreateMeshForJob(spec.mesh(), MakeUniformCluster(1, static_cast<int>(RequiredDevices(spec))));
  if (!mesh.ok()) return mesh.status();
  InMemoryStore store;
  TrainerOptions options(*mesh);
  options.spec = spec;
  options.process_of_position.assign(mesh->size(), 0);
  options.store = &store;
  options.checkpoint_roots = std::nullopt;  // any directory, as `substrax-job train`
  TrainRun run;
  absl::Duration warm = absl::InfiniteDuration(), end = absl::ZeroDuration();
  double warm_cpu = 0, end_cpu = 0;
  options.on_progress = [&](const ProgressReport& report) {
    if (report.step == kWarmupSteps) {
      warm = report.elapsed;
      warm_cpu = ProcessCpuSeconds();
    }
    if (report.step == report.total_steps) {
      end = report.elapsed;
      end_cpu = ProcessCpuSeconds();
    }
  };
  options.on_checkpoint = [&run](const v1::CheckpointListing& listing) { run.listing = listing; };
  absl::StatusOr<TrainResult> result = Train(options);
  if (!result.ok()) return result.status();
  if (end <= warm) {
    return absl::InternalError(
        absl::StrCat("no reports after step ", kWarmupSteps, " and after the last step"));
  }
  run.seconds = absl::ToDoubleSeconds(end - warm);
  run.cpu_seconds = end_cpu - warm_cpu;
  run.result = *std::move(result);
  return run;
}

// The parameters the checkpoint in `committed` holds, read whole.
absl::StatusOr<TensorTree> SavedParameters(const std::string& committed) {
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(committed);
  if (!reader.ok()) return reader.status();
  TensorTree params;
  for (const v1::CheckpointArray& array : reader->manifest().arrays()) {
    absl::string_view name = array.name();
    if (!absl::ConsumePrefix(&name, "params/")) continue;  // the optimizer's slots
    std::vector<IndexRange> whole;
    for (int64_t d : array.global_shape()) whole.push_back({0, d});
    absl::StatusOr<Tensor> value = reader->ReadBlock(array.name(), whole);
    if (!value.ok()) return value.status();
    params[std::string(name)] = *std::move(value);
  }
  return params;
}

struct TrainRound {
  double plain = 0, checkpointed = 0;          // seconds of the timed steps
  double plain_cpu = 0, checkpointed_cpu = 0;  // CPU seconds of the process in them
  int64_t checkpoint_bytes = 0;                // of the newest checkpoint: shard files and manifest
};

// One round: `plain`, and `plain` checkpointing into `dir` every kCheckpointEvery steps, in
// turns (which goes first alternates with `round`). Errors: a failed run; DATA_LOSS when a
// run's parameters differ from `reference` (the first run's, set by the first round) or the
// checkpoints are not the ones asked for, or the last one does not hold the final parameters.
absl::StatusOr<TrainRound> RunTrainRound(const std::string& dir, int round,
                                         const v1::JobSpec& plain, TensorTree* reference) {
  v1::JobSpec checkpointed = plain;
  checkpointed.mutable_checkpoint()->set_directory(dir);
  checkpointed.mutable_checkpoint()->set_every_steps(kCheckpointEvery);
  TrainRound result;
  for (int turn = 0; turn < 2; ++turn) {
    const bool checkpointing = (turn == 0) == (round % 2 == 0);
    absl::StatusOr<TrainRun> run = TimeTraining(checkpointing ? checkpointed : plain);
    if (!run.ok()) return run.status();
    if (reference->empty()) *reference = run->result.params;
    if (run->result.params != *reference) {
      return absl::DataLossError(absl::StrCat(
          "the run ", checkpointing ? "with" : "without",
          " checkpoints ended with other parameters than the first run: training is not "
          "deterministic, or checkpointing changed it"));
    }
    if (!checkpointing) {
      result.plain = run->seconds;
      result.plain_cpu = run->cpu_seconds;
      continue;
    }
    result.checkpointed = run->seconds;
    result.checkpointed_cpu = run->cpu_seconds;
    // Every kCheckpointEvery steps and at the end (newest first), all kept.
    std::vector<int64_t> want = {plain.steps()}, got;
    for (int64_t step = plain.steps() / kCheckpointEvery * kCheckpointEvery; step > 0;
         step -= kCheckpointEvery) {
      if (step != plain.steps()) want.push_back(step);
    }
    for (const v1::CheckpointRecord& r : run->listing.checkpoints()) got.push_back(r.step());
    if (got != want) {
      return absl::DataLossError(absl::StrCat("checkpoints committed at steps [",
                                              absl::StrJoin(got, ", "), "], want [",
                                              absl::StrJoin(want, ", "), "]"));
    }
    result.checkpoint_bytes = run->listing.checkpoints(0).size_bytes();
    absl::StatusOr<TensorTree> saved = SavedParameters(CommittedCheckpointDir(dir, plain.steps()));
    if (!saved.ok()) return saved.status();
    if (*saved != run->result.params) {
      return absl::DataLossError(absl::StrCat("the checkpoint of step ", plain.steps(),
                                              " does not hold the run's final parameters"));
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return result;
}

// Runs o.train_rounds training rounds in `dir` and prints their table. Returns the relative
// slowdown of checkpointing (median over median, minus 1). Errors: RunTrainRound's.
absl::StatusOr<double> MeasureCheckpointOverhead(const Options& o, const std::string& dir) {
  const int64_t steps = kWarmupSteps + o.train_steps;
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(
      absl::StrReplaceAll(kTrainJob,
                          {{"STEPS", absl::StrCat(steps)}, {"WARMUP", absl::StrCat(kWarmupSteps)}}),
      "bench-checkpoint-overhead.yaml");
  if (!spec.ok()) return spec.status();
  std::cout << absl::StrFormat(
      "training: MLP 784-512-256-10, Adam, synthetic classification, data parallel over %d CPU "
      "devices (Train() in this process), global batch %d; %d steps, timed from step %d to the "
      "end; %d rounds, median (min..max)\n",
      RequiredDevices(*spec), spec->batch().global_batch_size(), steps, kWarmupSteps,
      o.train_rounds);
  std::vector<TrainRound> rounds;
  TensorTree reference;
  for (int r = 1; r <= o.train_rounds; ++r) {
    absl::StatusOr<TrainRound> round =
        RunTrainRound(absl::StrCat(dir, "/train-checkpoints-", r), r, *spec, &reference);
    if (!round.ok()) {
      return absl::Status(round.status().code(),
                          absl::StrCat("training round ", r, ": ", round.status().message()));
    }
    rounds.push_back(*round);
  }
  std::cout << absl::StrFormat("%-20s %9s %8s  %-16s  %7s  %s\n", "what", "seconds", "ms/step",
                               "(min..max)", "cpu_s", "notes");
  auto row = [&](const char* what, double TrainRound::*field, double TrainRound::*cpu,
                 const std::string& notes) {
    const std::vector<double> seconds = Column(rounds, field);
    const double median = Median(seconds);
    std::cout << absl::StrFormat("%-20s %9.3f %8.2f  %-16s  %7.3f  %s\n", what, median,
                                 1e3 * median / o.train_steps, Spread(seconds),
                                 Median(Column(rounds, cpu)), notes);
    return median;
  };
  const double plain =
      row("train", &TrainRound::plain, &TrainRound::plain_cpu, "no checkpoint section");
  const double checkpointed =
      row("train + checkpoints", &TrainRound::checkpointed, &TrainRound::checkpointed_cpu,
          absl::StrFormat("every_steps: %d: %d saves in the timed steps, %.1f MiB each",
                          kCheckpointEvery, o.train_steps / kCheckpointEvery,
                          rounds.back().checkpoint_bytes / 1048576.0));
  // Each round's pair (round 1 runs without first, then they alternate): a burst of other
  // load on the machine shows as one slow run.
  std::vector<std::string> pairs;
  for (const TrainRound& r : rounds) {
    pairs.push_back(absl::StrFormat("%.2f/%.2f", r.plain, r.checkpointed));
  }
  std::cout << "rounds, seconds without/with checkpoints: " << absl::StrJoin(pairs, " ") << "\n";
  return checkpointed / plain - 1;
}

int Main(const Options& o) {
  std::string base = o.dir;
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp";
  }
  // Absolute and normalized: a job's checkpoint directory must be.
  std::error_code ec;
  const std::string dir =
      (fs::absolute(base, ec) / absl::StrCat("substrax-bench-checkpoint-", getpid()))
          .lexically_normal()
          .string();
  fs::create_directories(dir, ec);
  if (ec) {
    std::cerr << "checkpoint: cannot create " << dir << ": " << ec.message() << "\n";
    return 1;
  }
  const int64_t data_axis = o.processes / 2;
  const std::map<std::string, GlobalArray> state =
      MakeState(static_cast<int64_t>(o.mib) << 20, data_axis);
  const int64_t bytes = StateBytes(state);
  absl::StatusOr<Mesh> mesh =
      Mesh::Create({"data", "model"}, {data_axis, 2}, MakeUniformCluster(o.processes, 1));
  absl::StatusOr<SimulatedJob> job =
      mesh.ok() ? SimulatedJob::Create(*mesh, state) : absl::StatusOr<SimulatedJob>(mesh.status());
  if (!job.ok()) {
    std::cerr << "checkpoint: " << job.status().message() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat(
      "host: %d CPUs, load average %s at start; dir %s; state %.1f MiB F32 in %d arrays over %d "
      "processes (mesh data=%d, model=2); %d rounds, median (min..max)\n",
      std::thread::hardware_concurrency(), bench::LoadAverage(), dir, bytes / 1048576.0, state.size(),
      o.processes, data_axis, o.rounds);

  std::vector<Round> rounds;
  for (int r = 1; r <= o.rounds; ++r) {
    absl::StatusOr<Round> round = RunRound(dir, r, *job, state);
    if (!round.ok()) {
      std::cerr << "checkpoint: round " << r << ": " << round.status() << "\n";
      fs::remove_all(dir, ec);
      return 1;
    }
    rounds.push_back(*round);
  }

  double cached = 0;
  for (const Round& r : rounds) cached = std::max(cached, r.cached);
  std::cout << absl::StrFormat(
      "reads: after posix_fadvise(DONTNEED) on every file, at most %.0f%% of the files' pages "
      "were in this machine's page cache%s\n",
      100 * cached,
      cached > 0.5 ? ": the reads are from the page cache"
                   : " (the rest comes from the disk, or from a cache below it: a hypervisor's)");
  std::cout << absl::StrFormat("%-17s %9s %9s  %-14s  %s\n", "what", "MB/s", "seconds",
                               "(min..max)", "notes");
  auto row = [&](const char* what, double Round::*field, const std::string& notes) {
    const std::vector<double> seconds = Column(rounds, field);
    const double median = Median(seconds);
    std::cout << absl::StrFormat("%-17s %9.1f %9.3f  %-14s  %s\n", what, bytes / 1e6 / median,
                                 median, Spread(seconds), notes);
    return bytes / 1e6 / median;
  };
  const double plain_write = row("plain write", &Round::plain_write, "write() + fsync, one file");
  const double checkpoint_write = row(
      "checkpoint write", &Round::checkpoint_write,
      absl::StrFormat("encode + WriteShardFile x %d + commit; %.1f MiB of files", o.processes,
                      rounds.back().checkpoint_file_bytes / 1048576.0));
  const double plain_read = row("plain read", &Round::plain_read, "read(), one file");
  const double checkpoint_read =
      row("checkpoint read", &Round::checkpoint_read,
          "Open + ReadBlock of every array whole, XXH3 of every file");

  std::optional<double> overhead;
  if (o.train_rounds > 0) {
    absl::StatusOr<double> measured = MeasureCheckpointOverhead(o, dir);
    if (!measured.ok()) {
      std::cerr << "checkpoint: " << measured.status() << "\n";
      fs::remove_all(dir, ec);
      return 1;
    }
    overhead = *measured;
  }
  fs::remove_all(dir, ec);
  std::cout << absl::StrFormat("ratio_write_vs_plain=%.2f\nratio_read_vs_plain=%.2f\n",
                               checkpoint_write / plain_write, checkpoint_read / plain_read);
  if (overhead.has_value()) {
    std::cout << absl::StrFormat("checkpoint_overhead_every_100_steps=%.3f\n", *overhead);
  }
  return 0;
}

}  // namespace
}  // namespace substrax

int main(int argc, char** argv) {
  CLI::App app{"write and read throughput of a sharded checkpoint vs a plain file of the same "
               "bytes, and the step-time overhead of checkpointing a training job every 100 "
               "steps"};
  substrax::Options o;
  app.add_option("--mib", o.mib, "state to save, in MiB")
      ->check(CLI::Range(1, 16384))
      ->capture_default_str();
  app.add_option("--processes", o.processes,
                 "simulated processes, one device each, on a (data=N/2, model=2) mesh; even")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  app.add_option("--rounds", o.rounds, "rounds; the median is reported")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--dir", o.dir, "where to write (a directory is made there); default $TMPDIR, "
                                 "else /tmp");
  app.add_option("--train-steps", o.train_steps,
                 "timed steps of each training run (after 50 warm-up steps); a multiple of 100")
      ->check(CLI::Range(100, 100000))
      ->capture_default_str();
  app.add_option("--train-rounds", o.train_rounds,
                 "training rounds (a run without and one with checkpoints each); the median is "
                 "reported; 0: no training")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.processes % 2 != 0) {
    std::cerr << "checkpoint: --processes " << o.processes << " is odd: the mesh is (N/2, 2)\n";
    return 2;
  }
  if (o.train_steps % substrax::kCheckpointEvery != 0) {
    std::cerr << "checkpoint: --train-steps " << o.train_steps << " is not a multiple of "
              << substrax::kCheckpointEvery << ": the timed steps hold whole checkpoint "
              << "intervals\n";
    return 2;
  }
  return substrax::Main(o);
}
