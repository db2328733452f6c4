#include "worker/collectives/mesh_communicators.h"

#include <thread>

#include "core/device_mesh_manager.h"
#include "worker/collectives/gloo_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

// On a (data=2, model=3) mesh, each device sums its row-major position over the world, the data
// axis and the model axis; every sum must cover exactly the right group.
TEST(MeshCommunicatorsTest, AxisGroupsReduceOverTheRightDevices) {
  auto mesh = DeviceMeshManager::CreateHybridMesh(MakeUniformCluster(2, 3), 2, 3);
  ASSERT_TRUE(mesh.ok());
  InMemoryStore store;
  const std::vector<int> processes(6, 0);
  std::vector<std::thread> threads;
  for (const Device& device : mesh->devices()) {
    threads.emplace_back([&, device] {
      GlooGroupConnector connector({}, &store, processes, nullptr);
      auto comms = MeshCommunicators::Create(*mesh, device.id, connector);
      ASSERT_TRUE(comms.ok()) << comms.status();
      const std::vector<int64_t> c = *mesh->CoordinatesOf(device.id);
      const float position = float(c[0] * 3 + c[1]);
      std::vector<float> world = {position};
      ASSERT_TRUE((*comms)->world().AllReduce(absl::MakeSpan(world), ReduceOp::kSum).ok());
      EXPECT_EQ(world[0], 0 + 1 + 2 + 3 + 4 + 5);
      Communicator* data = *(*comms)->Axis("data");
      EXPECT_EQ(data->size(), 2);
      EXPECT_EQ(data->rank(), c[0]);
      std::vector<float> over_data = {position};
      ASSERT_TRUE(data->AllReduce(absl::MakeSpan(over_data), ReduceOp::kSum).ok());
      EXPECT_EQ(over_data[0], c[1] + (3 + c[1]));
      Communicator* model = *(*comms)->Axis("model");
      EXPECT_EQ(model->rank(), c[1]);
      std::vector<float> over_model = {position};
      ASSERT_TRUE(model->AllReduce(absl::MakeSpan(over_model), ReduceOp::kSum).ok());
      EXPECT_EQ(over_model[0], 3 * c[0] * 3 + 3);
      auto missing = (*comms)->Axis("batch");
      EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(missing.status().message()), HasSubstr("has no axis 'batch'"));
    });
  }
  for (auto& t : threads) t.join();
}

TEST(MeshCommunicatorsTest, OneDimensionalMeshReusesTheWorld) {
  auto mesh = DeviceMeshManager::CreateDataParallelMesh(MakeUniformCluster(1, 2));
  ASSERT_TRUE(mesh.ok());
  InMemoryStore store;
  std::vector<std::thread> threads;
  for (const Device& device : mesh->devices()) {
    threads.emplace_back([&, device] {
      GlooGroupConnector connector({}, &store, {0, 0}, nullptr);
      auto comms = MeshCommunicators::Create(*mesh, device.id, connector);
      ASSERT_TRUE(comms.ok()) << comms.status();
      EXPECT_EQ(*(*comms)->Axis("data"), &(*comms)->world());
    });
  }
  for (auto& t : threads) t.join();
  // A process table that does not cover the mesh.
  GlooGroupConnector short_table({}, &store, {0}, nullptr);
  EXPECT_EQ(MeshCommunicators::Create(*mesh, 0, short_table).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace substrax
