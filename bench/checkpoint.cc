// Write and read throughput of a sharded checkpoint against a plain file of the same bytes, in
// the same run. See README.md.
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
// are timed; a difference fails the run (exit 1). The last lines are
// `ratio_write_vs_plain=` and `ratio_read_vs_plain=`: checkpoint MB/s over plain MB/s, of the
// median rounds.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/host.h"
#include "core/device.h"
#include "core/mesh.h"
#include "worker/checkpoint/commit.h"
#include "worker/checkpoint/sharded.h"
#include "worker/checkpoint/simulated_job.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;

struct Options {
  int mib = 256;
  int processes = 4;
  int rounds = 3;
  std::string dir;  // empty: $TMPDIR, else /tmp
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

int Main(const Options& o) {
  std::string base = o.dir;
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp";
  }
  const std::string dir = absl::StrCat(base, "/substrax-bench-checkpoint-", getpid());
  std::error_code ec;
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
  fs::remove_all(dir, ec);

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
    std::vector<double> seconds;
    for (const Round& r : rounds) seconds.push_back(r.*field);
    const double median = Median(seconds);
    const std::string range =
        absl::StrFormat("(%.3f..%.3f)", *std::min_element(seconds.begin(), seconds.end()),
                        *std::max_element(seconds.begin(), seconds.end()));
    std::cout << absl::StrFormat("%-17s %9.1f %9.3f  %-14s  %s\n", what, bytes / 1e6 / median,
                                 median, range, notes);
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
  std::cout << absl::StrFormat("ratio_write_vs_plain=%.2f\nratio_read_vs_plain=%.2f\n",
                               checkpoint_write / plain_write, checkpoint_read / plain_read);
  return 0;
}

}  // namespace
}  // namespace substrax

int main(int argc, char** argv) {
  CLI::App app{"write and read throughput of a sharded checkpoint vs a plain file of the same "
               "bytes"};
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
  CLI11_PARSE(app, argc, argv);
  if (o.processes % 2 != 0) {
    std::cerr << "checkpoint: --processes " << o.processes << " is odd: the mesh is (N/2, 2)\n";
    return 2;
  }
  return substrax::Main(o);
}
