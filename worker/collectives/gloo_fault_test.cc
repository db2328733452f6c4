// Fault tolerance of collectives across processes: two forked processes with two device threads
// each all-reduce in a loop; one process is killed with SIGKILL in the middle;
// every surviving rank must return UNAVAILABLE naming the dead ranks within twice the collective
// timeout, and no process may be left hanging.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/poll.h"
#include "worker/collectives/gloo_communicator.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

constexpr int kProcesses = 2;
constexpr int kDevicesPerProcess = 2;
constexpr absl::Duration kTimeout = absl::Seconds(3);

std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base ? base : "/tmp") + "/gloo_fault";
}

// One runner process: a peer monitor and one thread per device, all-reducing 16 MiB until an
// error; each rank writes "<code> <unix nanos>\n<message>" to the store, then the process exits.
[[noreturn]] void RunProcess(int process) {
  auto store = FileStore::Create(TempDir());
  if (!store.ok()) _exit(2);
  auto monitor = PeerMonitor::Start({process, kProcesses, "127.0.0.1", absl::Seconds(30)},
                                    store->get());
  if (!monitor.ok()) _exit(3);
  std::vector<RankInfo> ranks;
  for (int r = 0; r < kProcesses * kDevicesPerProcess; ++r) {
    ranks.push_back({r / kDevicesPerProcess, absl::StrCat("device ", r), ""});
  }
  std::vector<std::thread> threads;
  for (int d = 0; d < kDevicesPerProcess; ++d) {
    threads.emplace_back([&, d] {
      const int rank = process * kDevicesPerProcess + d;
      GlooCommunicatorOptions options;
      options.timeout = kTimeout;
      PrefixStore prefixed(store->get(), "world");
      auto comm = GlooCommunicator::Create(options, &prefixed, rank, ranks, monitor->get());
      absl::Status status = comm.status();
      std::vector<float> data(4 << 20, 1.0f);
      for (int iteration = 0; status.ok() && iteration < 100000; ++iteration) {
        status = (*comm)->AllReduce(absl::MakeSpan(data), ReduceOp::kSum);
        if (iteration == 3) (void)(*store)->Set(absl::StrCat("running/", rank), "1");
      }
      (void)(*store)->Set(absl::StrCat("result/", rank),
                          absl::StrCat(static_cast<int>(status.code()), " ",
                                       absl::ToUnixNanos(absl::Now()), "\n", status.message()));
    });
  }
  for (auto& t : threads) t.join();
  _exit(0);
}

using testing::WaitOrKill;

TEST(GlooFaultTest, SurvivorsNameTheDeadRanksWithinTwiceTheTimeout) {
  // Keys left by an earlier run would make this one start killing too early.
  std::filesystem::remove_all(TempDir());
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) RunProcess(p);
    pids.push_back(pid);
  }
  auto store = FileStore::Create(TempDir());
  ASSERT_TRUE(store.ok());
  // Every rank is inside the all-reduce loop.
  for (int r = 0; r < kProcesses * kDevicesPerProcess; ++r) {
    ASSERT_TRUE((*store)->Get(absl::StrCat("running/", r), absl::Seconds(60)).ok())
        << "rank " << r << " never started";
  }
  const absl::Time killed = absl::Now();
  kill(pids[1], SIGKILL);
  waitpid(pids[1], nullptr, 0);

  // The survivors must finish on their own: no process is left hanging.
  ASSERT_TRUE(WaitOrKill(pids[0], killed + 4 * kTimeout).has_value())
      << "surviving process hung";
  for (int rank = 0; rank < kDevicesPerProcess; ++rank) {
    auto result = (*store)->Get(absl::StrCat("result/", rank), absl::ZeroDuration());
    ASSERT_TRUE(result.ok()) << "rank " << rank << " wrote no result";
    std::pair<std::string, std::string> lines = absl::StrSplit(*result, absl::MaxSplits('\n', 1));
    std::vector<std::string> head = absl::StrSplit(lines.first, ' ');
    int code = 0;
    int64_t nanos = 0;
    ASSERT_TRUE(absl::SimpleAtoi(head[0], &code) && absl::SimpleAtoi(head[1], &nanos));
    EXPECT_EQ(static_cast<absl::StatusCode>(code), absl::StatusCode::kUnavailable)
        << "rank " << rank << ": " << lines.second;
    EXPECT_THAT(lines.second, HasSubstr("process 1 (ranks 2, 3) died"));
    const absl::Duration took = absl::FromUnixNanos(nanos) - killed;
    std::cerr << "rank " << rank << " after " << took << ": " << lines.second << "\n";
    EXPECT_LT(took, 2 * kTimeout) << "rank " << rank << " took " << took;
  }
}

}  // namespace
}  // namespace substrax
