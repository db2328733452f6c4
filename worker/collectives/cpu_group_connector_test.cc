#include "worker/collectives/cpu_group_connector.h"

#include <atomic>
#include <functional>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "core/device_mesh_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/collectives/hierarchical_communicator.h"

namespace substrax {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// Devices on fake hosts, in one process: the topology is all the connector looks at.
std::vector<Device> OnHosts(const std::vector<std::string>& hosts) {
  std::vector<Device> devices;
  std::map<std::string, int> next_local;
  for (size_t i = 0; i < hosts.size(); ++i) {
    Device d;
    d.id = static_cast<int>(i);
    d.host = hosts[i];
    d.local_index = next_local[hosts[i]]++;
    d.worker_id = "w-" + hosts[i];
    devices.push_back(d);
  }
  return devices;
}

// Connects every device of `mesh` in its own thread (one process unless `processes` says
// otherwise), checks that each device's world all-reduce sums every position, and hands each
// device's communicators to `check`. Returns the log lines; counts the local factory's uses.
struct Connected {
  std::vector<std::string> lines;
  int local_communicators = 0;
};
Connected ConnectMesh(const Mesh& mesh, CpuCollectives collectives,
                      const std::function<void(const Device&, MeshCommunicators&)>& check,
                      std::vector<int> processes = {}) {
  if (processes.empty()) processes.assign(mesh.size(), 0);
  InMemoryStore store;
  absl::Mutex mu;
  Connected out;
  std::atomic<int> local_communicators{0};
  std::vector<std::thread> threads;
  for (const Device& device : mesh.devices()) {
    threads.emplace_back([&, device] {
      CpuGroupConnectorOptions options;
      options.collectives = collectives;
      const LocalFactory gloo = GlooLocalFactory("127.0.0.1");
      options.local.description = "test-local";
      options.local.create = [&, gloo](const LocalCommunicatorOptions& o, Store* s, int rank,
                                       std::vector<RankInfo> ranks, const PeerMonitor* m) {
        ++local_communicators;
        return gloo.create(o, s, rank, std::move(ranks), m);
      };
      options.log = [&](const std::string& line) {
        absl::MutexLock lock(&mu);
        out.lines.push_back(line);
      };
      CpuGroupConnector connector(options, &store, processes, nullptr);
      auto comms = MeshCommunicators::Create(mesh, device.id, connector);
      ASSERT_TRUE(comms.ok()) << comms.status();
      std::vector<double> position = {double(device.id)};
      ASSERT_TRUE((*comms)->world().AllReduce(absl::MakeSpan(position), ReduceOp::kSum).ok());
      EXPECT_EQ(position[0], mesh.size() * (mesh.size() - 1) / 2);
      if (check) check(device, **comms);
    });
  }
  for (auto& t : threads) t.join();
  out.local_communicators = local_communicators;
  return out;
}

template <typename T>
bool Is(Communicator* comm) {
  return dynamic_cast<T*>(comm) != nullptr;
}

TEST(CpuGroupConnectorTest, OneHostUsesTheLocalFactory) {
  auto mesh = DeviceMeshManager::CreateDataParallelMesh(OnHosts({"h", "h", "h"}));
  ASSERT_TRUE(mesh.ok());
  const Connected c = ConnectMesh(*mesh, CpuCollectives::kAuto, nullptr);
  EXPECT_EQ(c.local_communicators, 3);
  EXPECT_THAT(c.lines,
              UnorderedElementsAre("collectives: world (3 ranks): one host (h): test-local"));
  auto single = DeviceMeshManager::CreateDataParallelMesh(OnHosts({"h"}));
  ASSERT_TRUE(single.ok());
  EXPECT_THAT(ConnectMesh(*single, CpuCollectives::kAuto, nullptr).lines,
              UnorderedElementsAre("collectives: world (1 rank): one host (h): test-local"));
}

TEST(CpuGroupConnectorTest, OneRankPerHostIsFlatGloo) {
  auto mesh = DeviceMeshManager::CreateDataParallelMesh(OnHosts({"a", "b", "c"}));
  ASSERT_TRUE(mesh.ok());
  const Connected c =
      ConnectMesh(*mesh, CpuCollectives::kAuto, [](const Device&, MeshCommunicators& comms) {
        EXPECT_TRUE(Is<GlooCommunicator>(&comms.world()));
      });
  EXPECT_EQ(c.local_communicators, 0);
  EXPECT_THAT(c.lines, UnorderedElementsAre(
                           "collectives: world (3 ranks): Gloo: 3 hosts, one rank on each"));
}

// 2 hosts x 2 devices as (data=2, model=2): the world spans both hosts with two ranks on each
// (hierarchical), each model group is on one host (the factory), each data group has one rank
// per host (Gloo); the axis all-reduces cover the right devices.
TEST(CpuGroupConnectorTest, EachGroupTakesItsPath) {
  auto mesh = DeviceMeshManager::CreateHybridMesh(OnHosts({"a", "a", "b", "b"}), 2, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const Connected c =
      ConnectMesh(*mesh, CpuCollectives::kAuto, [&](const Device& d, MeshCommunicators& comms) {
        EXPECT_TRUE(Is<HierarchicalCommunicator>(&comms.world()));
        Communicator* data = *comms.Axis("data");
        Communicator* model = *comms.Axis("model");
        EXPECT_TRUE(Is<GlooCommunicator>(data));
        std::vector<float> over_data = {float(d.id)};
        ASSERT_TRUE(data->AllReduce(absl::MakeSpan(over_data), ReduceOp::kSum).ok());
        EXPECT_EQ(over_data[0], d.local_index + (2 + d.local_index));
        std::vector<float> over_model = {float(d.id)};
        ASSERT_TRUE(model->AllReduce(absl::MakeSpan(over_model), ReduceOp::kMean).ok());
        EXPECT_EQ(over_model[0], d.host == "a" ? 0.5f : 2.5f);
      });
  // The world: a local communicator per rank; each model group: one per rank.
  EXPECT_EQ(c.local_communicators, 8);
  EXPECT_THAT(c.lines, UnorderedElementsAre(
                           "collectives: world (4 ranks): hierarchical: 2 hosts (test-local "
                           "inside a host, Gloo between hosts)",
                           "collectives: axis 'data' group 0.0 (2 ranks): Gloo: 2 hosts, one "
                           "rank on each",
                           "collectives: axis 'data' group 0.1 (2 ranks): Gloo: 2 hosts, one "
                           "rank on each",
                           "collectives: axis 'model' group 0.0 (2 ranks): one host (a): "
                           "test-local",
                           "collectives: axis 'model' group 1.0 (2 ranks): one host (b): "
                           "test-local"));
}

// Hosts of 3, 2 and 1 ranks; every collective of the hierarchical world in group rank order.
TEST(CpuGroupConnectorTest, UnevenHostsAreHierarchical) {
  auto mesh = DeviceMeshManager::CreateDataParallelMesh(OnHosts({"a", "a", "a", "b", "b", "c"}));
  ASSERT_TRUE(mesh.ok());
  const Connected c =
      ConnectMesh(*mesh, CpuCollectives::kAuto, [](const Device& d, MeshCommunicators& comms) {
        Communicator& world = comms.world();
        EXPECT_TRUE(Is<HierarchicalCommunicator>(&world));
        std::vector<float> gathered(6);
        ASSERT_TRUE(
            world.AllGather(std::vector<float>{float(d.id)}, absl::MakeSpan(gathered)).ok());
        EXPECT_EQ(gathered, (std::vector<float>{0, 1, 2, 3, 4, 5}));
      });
  EXPECT_EQ(c.local_communicators, 6);
  EXPECT_THAT(c.lines, UnorderedElementsAre("collectives: world (6 ranks): hierarchical: 3 hosts "
                                            "(test-local inside a host, Gloo between hosts)"));
}

TEST(CpuGroupConnectorTest, GlooChoiceIsFlatGlooEverywhere) {
  auto mesh = DeviceMeshManager::CreateHybridMesh(OnHosts({"a", "a", "b", "b"}), 2, 2);
  ASSERT_TRUE(mesh.ok());
  const Connected c =
      ConnectMesh(*mesh, CpuCollectives::kGloo, [](const Device&, MeshCommunicators& comms) {
        EXPECT_TRUE(Is<GlooCommunicator>(&comms.world()));
        EXPECT_TRUE(Is<GlooCommunicator>(*comms.Axis("data")));
        EXPECT_TRUE(Is<GlooCommunicator>(*comms.Axis("model")));
      });
  EXPECT_EQ(c.local_communicators, 0);
  EXPECT_EQ(c.lines.size(), 5u);
  EXPECT_THAT(c.lines,
              Contains("collectives: world (4 ranks): Gloo (cpu collectives 'gloo'): 2 hosts"));
  EXPECT_THAT(c.lines, Contains("collectives: axis 'model' group 1.0 (2 ranks): Gloo (cpu "
                                "collectives 'gloo'): 1 host"));
}

// One line per group and process: two processes (simulated in one) log the world twice.
TEST(CpuGroupConnectorTest, EachProcessLogsAGroupOnce) {
  auto mesh = DeviceMeshManager::CreateDataParallelMesh(OnHosts({"a", "a", "b", "b"}));
  ASSERT_TRUE(mesh.ok());
  const Connected c = ConnectMesh(*mesh, CpuCollectives::kAuto, nullptr, {0, 0, 1, 1});
  EXPECT_EQ(c.lines.size(), 2u);
}

TEST(CpuGroupConnectorTest, AutoNeedsALocalFactory) {
  auto mesh = DeviceMeshManager::CreateDataParallelMesh(OnHosts({"a", "a"}));
  ASSERT_TRUE(mesh.ok());
  InMemoryStore store;
  CpuGroupConnectorOptions options;
  options.log = [](const std::string&) {};
  CpuGroupConnector connector(options, &store, {0, 0}, nullptr);
  const absl::Status status = MeshCommunicators::Create(*mesh, 0, connector).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("need a factory"));
  CpuGroupConnector short_table(options, &store, {0}, nullptr);
  EXPECT_EQ(MeshCommunicators::Create(*mesh, 0, short_table).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuCollectivesTest, ParsesItsNames) {
  EXPECT_EQ(*ParseCpuCollectives("auto"), CpuCollectives::kAuto);
  EXPECT_EQ(*ParseCpuCollectives("gloo"), CpuCollectives::kGloo);
  const absl::Status bad = ParseCpuCollectives("shm").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("'shm' is not a CPU collectives choice"));
}

}  // namespace
}  // namespace substrax
