// ShmCommunicator across processes: forked processes meet through a FileStore and share one
// segment; results are checked bit for bit against sums in rank order (shm_test_util.h), with
// slots small enough that collectives go through them in many pieces. Faults: a process killed
// with SIGKILL in the middle of an all-reduce; the survivor fails in bounded time, UNAVAILABLE
// with a PeerMonitor and DEADLINE_EXCEEDED without. No segment may be left in /dev/shm and no
// child process may be left running.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/poll.h"
#include "worker/collectives/shm_communicator.h"
#include "worker/collectives/shm_test_util.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);  // keys of an earlier run would be read as this one's
  return dir;
}

std::vector<RankInfo> Ranks(int n) {
  std::vector<RankInfo> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.push_back({r, absl::StrCat("device ", r), absl::StrCat("worker w-", r)});
  }
  return ranks;
}

// Forks one process per rank running `body(rank, store)`, whose return value is its exit status.
std::vector<pid_t> ForkRanks(int n, const std::string& dir,
                             const std::function<int(int, FileStore*)>& body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      auto store = FileStore::Create(dir);
      const int code = store.ok() ? body(r, store->get()) : 2;
      std::fflush(nullptr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  return pids;
}

using testing::WaitOrKill;

// Segments of ours that are still in /dev/shm: names start with "substrax-<pid of rank 0>-".
std::vector<std::string> LeftoverSegments(pid_t rank0) {
  std::vector<std::string> found;
  const std::string prefix = absl::StrCat("substrax-", rank0, "-");
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) found.push_back(name);
  }
  return found;
}

void ExpectNoChildren() {
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD) << "a child process is left";
}

struct Shape {
  int ranks;
  size_t slot_bytes;
  ShmWrites writes = ShmWrites::kAuto;
};

class ShmCrossProcessTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ShmCrossProcessTest, EveryCollectiveMatchesTheRankOrderReference) {
  const Shape shape = GetParam();
  const std::string dir = FreshDir(absl::StrCat("shm_cross_", shape.ranks, "_", shape.slot_bytes,
                                                "_", static_cast<int>(shape.writes)));
  std::vector<pid_t> pids = ForkRanks(shape.ranks, dir, [&](int rank, FileStore* store) {
    ShmCommunicatorOptions options;
    options.slot_bytes = shape.slot_bytes;
    options.writes = shape.writes;
    options.timeout = absl::Seconds(60);
    auto comm = ShmCommunicator::Create(options, store, rank, Ranks(shape.ranks), nullptr);
    if (!comm.ok() || (*comm)->in_process()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
      return 1;
    }
    std::string failures;
    int seed = 0;
    // Below one slot, a few pieces, many pieces (4096-byte slots: 256 floats a region).
    for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{5003}, size_t{100003}}) {
      failures += shm_test::ExerciseCollectives(**comm, count, ++seed);
    }
    // Many all-reduces back to back: chunk numbers and regions wrap many times; with kAuto,
    // those of 64 KiB and more run the tuner's trials, and whatever mode is in force, and the
    // ranks may disagree on it for a call after rank 0 changes it.
    for (int k = 0; k < 600 && failures.empty(); ++k) {
      const size_t count = k % 3 == 0 ? 16384 + k : 1 + (k * 37) % 700;
      std::vector<float> data = shm_test::Values<float>(rank, count, k);
      absl::Status s = (*comm)->AllReduce(absl::MakeSpan(data), ReduceOp::kSum);
      if (!s.ok() || shm_test::CountDifferent(
                         data, shm_test::Reference<float>(shape.ranks, count, k, ReduceOp::kSum))) {
        failures += absl::StrCat("back to back ", k, ": ", s.ToString(), "\n");
      }
    }
    std::fprintf(stderr, "%s", failures.c_str());
    return failures.empty() ? 0 : 1;
  });
  for (int r = 0; r < shape.ranks; ++r) {
    EXPECT_EQ(WaitOrKill(pids[r], absl::Now() + absl::Seconds(120)), 0) << "rank " << r;
  }
  EXPECT_THAT(LeftoverSegments(pids[0]), ::testing::IsEmpty());
  ExpectNoChildren();
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ShmCrossProcessTest,
    ::testing::Values(Shape{2, 4096}, Shape{3, 4096}, Shape{2, 4 << 20},
                      Shape{2, 4096, ShmWrites::kCached}, Shape{3, 4096, ShmWrites::kStreaming},
                      Shape{2, 4 << 20, ShmWrites::kStreaming},
                      Shape{2, 4 << 20, ShmWrites::kCached}));

// Rank 1's process is killed in the middle of all-reducing; rank 0 must fail on its own within
// twice the timeout and say why.
void KillMidCollective(bool with_monitor) {
  constexpr absl::Duration kTimeout = absl::Seconds(2);
  const std::string dir = FreshDir(absl::StrCat("shm_kill_", with_monitor));
  std::vector<pid_t> pids = ForkRanks(2, dir, [&](int rank, FileStore* store) {
    std::unique_ptr<PeerMonitor> monitor;
    if (with_monitor) {
      auto started = PeerMonitor::Start({rank, 2, "127.0.0.1", absl::Seconds(30)}, store);
      if (!started.ok()) return 3;
      monitor = std::move(*started);
    }
    ShmCommunicatorOptions options;
    options.timeout = kTimeout;
    options.slot_bytes = 64 << 10;
    PrefixStore prefixed(store, "world");
    auto comm = ShmCommunicator::Create(options, &prefixed, rank, Ranks(2), monitor.get());
    absl::Status status = comm.status();
    std::vector<float> data(1 << 20, 1.0f);
    for (int iteration = 0; status.ok() && iteration < 1000000; ++iteration) {
      status = (*comm)->AllReduce(absl::MakeSpan(data), ReduceOp::kMax);
      if (iteration == 3) (void)store->Set(absl::StrCat("running/", rank), "1");
    }
    (void)store->Set(absl::StrCat("result/", rank),
                     absl::StrCat(static_cast<int>(status.code()), " ",
                                  absl::ToUnixNanos(absl::Now()), "\n", status.message()));
    return 0;
  });
  auto store = FileStore::Create(dir);
  ASSERT_TRUE(store.ok());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE((*store)->Get(absl::StrCat("running/", r), absl::Seconds(60)).ok())
        << "rank " << r << " never started";
  }
  const absl::Time killed = absl::Now();
  kill(pids[1], SIGKILL);
  waitpid(pids[1], nullptr, 0);
  EXPECT_EQ(WaitOrKill(pids[0], killed + 4 * kTimeout), 0) << "the survivor hung";
  auto result = (*store)->Get("result/0", absl::ZeroDuration());
  ASSERT_TRUE(result.ok()) << "rank 0 wrote no result";
  std::pair<std::string, std::string> lines = absl::StrSplit(*result, absl::MaxSplits('\n', 1));
  std::pair<std::string, std::string> head = absl::StrSplit(lines.first, ' ');
  int code = 0;
  int64_t nanos = 0;
  ASSERT_TRUE(absl::SimpleAtoi(head.first, &code) && absl::SimpleAtoi(head.second, &nanos));
  if (with_monitor) {
    EXPECT_EQ(static_cast<absl::StatusCode>(code), absl::StatusCode::kUnavailable) << lines.second;
    EXPECT_THAT(lines.second, HasSubstr("process 1 (worker w-1, rank 1) died"));
  } else {
    EXPECT_EQ(static_cast<absl::StatusCode>(code), absl::StatusCode::kDeadlineExceeded)
        << lines.second;
    EXPECT_THAT(lines.second, HasSubstr("not arrived: rank 1 (device 1, worker w-1)"));
  }
  const absl::Duration took = absl::FromUnixNanos(nanos) - killed;
  EXPECT_LT(took, 2 * kTimeout) << lines.second;
  EXPECT_THAT(LeftoverSegments(pids[0]), ::testing::IsEmpty());
  ExpectNoChildren();
}

TEST(ShmCrossProcessFaultTest, KilledPeerIsNamedByTheMonitor) { KillMidCollective(true); }
TEST(ShmCrossProcessFaultTest, KilledPeerWithoutMonitorTimesOut) { KillMidCollective(false); }

}  // namespace
}  // namespace substrax
