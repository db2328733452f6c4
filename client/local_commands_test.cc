// Tests of `substraxctl local up|status|down`. They run this test binary itself as a stand-in
// coordinator (it serves the fakes of commands_test_util.h on --listen and writes
// --address-file) and as stand-in workers (`daemon`: wait for a signal); the end-to-end test
// with the real binaries lives in tests/.
#include "client/commands.h"

#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/commands_test_util.h"
#include "client/local_cluster.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/poll.h"

namespace substrax::ctl {
namespace {

TEST(LocalClusterCommandsTest, UpStatusDownAndRestartAfterDeath) {
  std::string dir = ::testing::TempDir();
  if (dir.back() != '/') dir += "/";
  dir += "local";
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  setenv("FAKE_LOCAL_WORKERS", "2", 1);

  std::ostringstream out, err;
  CommandContext ctx;
  ctx.out = &out;
  ctx.err = &err;
  LocalFlags flags;
  flags.state_dir = dir;
  flags.coordinator_binary = std::string(self, static_cast<size_t>(n));
  flags.agent_binary = flags.coordinator_binary;
  flags.job_binary = flags.coordinator_binary;
  flags.start_timeout = absl::Seconds(30);

  ASSERT_EQ(LocalUpCommand(ctx, flags), kExitOk) << err.str();
  std::ifstream address_file(AddressFilePath(dir));
  std::string address;
  std::getline(address_file, address);
  EXPECT_EQ(out.str(), absl::StrCat("export SUBSTRAX_COORDINATOR=", address,
                                    " SUBSTRAX_TLS_CA=", dir, "/tls/ca.crt SUBSTRAX_TLS_CERT=",
                                    dir, "/tls/admin.crt SUBSTRAX_TLS_KEY=", dir,
                                    "/tls/admin.key\n"));
  // The admin's key is the user's alone.
  struct stat key;
  ASSERT_EQ(stat((dir + "/tls/admin.key").c_str(), &key), 0);
  EXPECT_EQ(key.st_mode & 0777, 0600);
  EXPECT_NE(err.str().find("local cluster up: coordinator at " + address), std::string::npos);
  absl::StatusOr<std::vector<LocalProcess>> processes = ReadPidFile(dir);
  ASSERT_TRUE(processes.ok()) << processes.status();
  ASSERT_EQ(processes->size(), 3u);
  EXPECT_EQ((*processes)[0].name, "coordinator");
  EXPECT_EQ((*processes)[2].name, "local-1");

  // Already up: says so, changes nothing.
  out.str("");
  err.str("");
  EXPECT_EQ(LocalUpCommand(ctx, flags), kExitError);
  EXPECT_NE(err.str().find("already running in " + dir + " (coordinator at " + address +
                           "), 3 of 3 processes alive"),
            std::string::npos)
      << err.str();

  out.str("");
  EXPECT_EQ(LocalStatusCommand(ctx, flags), kExitOk) << err.str();
  EXPECT_NE(out.str().find("coordinator address: " + address), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("local-1       "), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("alive"), std::string::npos);
  EXPECT_NE(out.str().find("WORKER    HOST      STATE"), std::string::npos) << out.str();

  // A dead cluster (killed behind our back) is cleaned up by the next `up`.
  for (const LocalProcess& p : *processes) kill(p.pid, SIGKILL);
  for (const LocalProcess& p : *processes) {
    ASSERT_TRUE(testing::PollUntil([&] { return !IsAlive(p); }, absl::Now() + absl::Seconds(5),
                                   absl::StrCat(p.name, " (pid ", p.pid, ") to die")));
  }
  out.str("");
  EXPECT_EQ(LocalStatusCommand(ctx, flags), kExitError);
  EXPECT_NE(out.str().find("dead"), std::string::npos) << out.str();
  err.str("");
  ASSERT_EQ(LocalUpCommand(ctx, flags), kExitOk) << err.str();
  EXPECT_NE(err.str().find("is gone; starting a new one"), std::string::npos) << err.str();

  processes = ReadPidFile(dir);
  ASSERT_TRUE(processes.ok());
  err.str("");
  EXPECT_EQ(LocalDownCommand(ctx, flags), kExitOk);
  EXPECT_NE(err.str().find("stopped coordinator (pid "), std::string::npos) << err.str();
  for (const LocalProcess& p : *processes) EXPECT_FALSE(IsAlive(p)) << p.name;
  EXPECT_EQ(ReadPidFile(dir).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::ifstream(AddressFilePath(dir)).good());
  err.str("");
  EXPECT_EQ(LocalDownCommand(ctx, flags), kExitOk);
  EXPECT_NE(err.str().find("nothing to stop"), std::string::npos);
}

TEST(LocalClusterCommandsTest, MissingBinaryNamesWhatToBuild) {
  std::ostringstream out, err;
  CommandContext ctx;
  ctx.out = &out;
  ctx.err = &err;
  LocalFlags flags;
  flags.state_dir = std::string(::testing::TempDir()) + "/nobin";
  flags.self_dir = "/nonexistent/bazel-bin/client";
  EXPECT_EQ(LocalUpCommand(ctx, flags), kExitError);
  EXPECT_NE(err.str().find("cannot find substrax-coordinator (looked at "
                           "/nonexistent/bazel-bin/client/substrax-coordinator, "
                           "/nonexistent/bazel-bin/coordinator/substrax-coordinator); build it "
                           "with `bazel build //coordinator:substrax-coordinator`"),
            std::string::npos)
      << err.str();
}

// Stand-in coordinator: serves the fakes on --listen's host, writes the bound address to
// --address-file, runs until a signal ends it.
int FakeCoordinatorMain(int argc, char** argv) {
  std::string address_file;
  // Serves mutual TLS with the credentials `local up` made, as the real coordinator would.
  TransportOptions transport;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--address-file" && i + 1 < argc) address_file = argv[i + 1];
    if (absl::StartsWith(arg, "--tls-ca=")) transport.ca_file = arg.substr(9);
    if (absl::StartsWith(arg, "--tls-cert=")) transport.cert_file = arg.substr(11);
    if (absl::StartsWith(arg, "--tls-key=")) transport.key_file = arg.substr(10);
  }
  FakeJobService jobs;
  FakeMetricsService metrics;
  std::string address;
  std::unique_ptr<grpc::Server> server =
      StartFakes(&jobs, &metrics, "127.0.0.1", &address, transport);
  {
    std::ofstream out(address_file + ".tmp");
    out << address << "\n";
  }
  std::rename((address_file + ".tmp").c_str(), address_file.c_str());
  server->Wait();
  return 0;
}

}  // namespace
}  // namespace substrax::ctl

int main(int argc, char** argv) {
  // This binary is also the local-cluster test's coordinator and workers.
  if (argc > 1 && std::string(argv[1]) == "--listen") {
    return substrax::ctl::FakeCoordinatorMain(argc, argv);
  }
  if (argc > 1 && std::string(argv[1]) == "--job-binary") {  // an agent
    pause();  // until SIGTERM
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
