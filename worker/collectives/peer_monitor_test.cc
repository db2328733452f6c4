#include "worker/collectives/peer_monitor.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base ? base : "/tmp") + "/" + name;
}

TEST(PeerMonitorTest, CleanExitIsNotADeathAndThreeProcessesConnect) {
  InMemoryStore store;
  std::vector<std::unique_ptr<PeerMonitor>> monitors(3);
  std::vector<std::thread> threads;
  for (int p = 0; p < 3; ++p) {
    threads.emplace_back([&, p] {
      auto m = PeerMonitor::Start({p, 3, "127.0.0.1", absl::Seconds(30)}, &store);
      ASSERT_TRUE(m.ok()) << m.status();
      monitors[p] = std::move(*m);
    });
  }
  for (auto& t : threads) t.join();
  monitors[2].reset();  // says goodbye
  EXPECT_FALSE(monitors[0]->AwaitDeath(absl::Milliseconds(200)));
  EXPECT_TRUE(monitors[1]->Deaths().empty());
}

TEST(PeerMonitorTest, SigkilledPeerIsSeenAtOnce) {
  const std::string dir = TempDir("monitor_store");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = FileStore::Create(dir);
    auto m = PeerMonitor::Start({1, 2, "127.0.0.1", absl::Seconds(30)}, store->get());
    if (!m.ok()) _exit(3);
    (void)(*store)->Set("child_ready", "1");
    pause();  // until killed
    _exit(0);
  }
  auto store = FileStore::Create(dir);
  ASSERT_TRUE(store.ok());
  auto monitor = PeerMonitor::Start({0, 2, "127.0.0.1", absl::Seconds(30)}, store->get());
  ASSERT_TRUE(monitor.ok()) << monitor.status();
  ASSERT_TRUE((*store)->Get("child_ready", absl::Seconds(30)).ok());
  EXPECT_TRUE((*monitor)->Deaths().empty());
  const absl::Time killed = absl::Now();
  kill(child, SIGKILL);
  ASSERT_TRUE((*monitor)->AwaitDeath(absl::Seconds(10)));
  const auto deaths = (*monitor)->Deaths();
  ASSERT_EQ(deaths.size(), 1u);
  EXPECT_EQ(deaths[0].process_index, 1);
  EXPECT_THAT(deaths[0].reason, HasSubstr("without goodbye"));
  EXPECT_LT(deaths[0].time - killed, absl::Seconds(5));
  int status = 0;
  waitpid(child, &status, 0);
}

TEST(PeerMonitorTest, MissingPeerTimesOut) {
  InMemoryStore store;
  auto m = PeerMonitor::Start({0, 2, "127.0.0.1", absl::Milliseconds(100)}, &store);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(PeerMonitor::Start({2, 2}, &store).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace substrax
