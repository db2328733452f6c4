#include "core/device_mesh_manager.h"

#include <algorithm>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

// Every device of the mesh is a distinct member of `devices`.
void ExpectDistinctSubset(const Mesh& mesh, const std::vector<Device>& devices) {
  std::set<int> ids;
  for (const Device& d : mesh.devices()) {
    EXPECT_TRUE(ids.insert(d.id).second) << "device used twice: " << d;
    EXPECT_NE(std::find(devices.begin(), devices.end(), d), devices.end()) << d;
  }
}

bool OnOneHost(const std::vector<Device>& group) {
  for (const Device& d : group) {
    if (d.host != group.front().host) return false;
  }
  return true;
}

TEST(DeviceMeshManagerTest, DataParallelMeshUsesEveryDeviceGroupedByHost) {
  for (int hosts = 1; hosts <= 8; ++hosts) {
    for (int per_host = 1; per_host <= 8; ++per_host) {
      std::vector<Device> devices = MakeUniformCluster(hosts, per_host);
      std::shuffle(devices.begin(), devices.end(), std::mt19937(hosts * 31 + per_host));
      auto mesh = DeviceMeshManager::CreateDataParallelMesh(devices);
      ASSERT_TRUE(mesh.ok()) << mesh.status();
      EXPECT_EQ(mesh->axis_names(), std::vector<std::string>{"data"});
      EXPECT_EQ(mesh->shape(), std::vector<int64_t>{hosts * per_host});
      ExpectDistinctSubset(*mesh, devices);
      // Devices of one host are neighbours on the data axis, in local order.
      for (int64_t i = 0; i < mesh->size(); ++i) {
        const Device& d = mesh->devices()[i];
        EXPECT_EQ(d.local_index, i % per_host);
        if (i % per_host != 0) {
          EXPECT_EQ(d.host, mesh->devices()[i - 1].host);
        }
      }
    }
  }
}

TEST(DeviceMeshManagerTest, ModelParallelMeshStaysOnOneHostUnlessAllowed) {
  for (int hosts = 1; hosts <= 8; ++hosts) {
    for (int per_host = 1; per_host <= 8; ++per_host) {
      const std::vector<Device> devices = MakeUniformCluster(hosts, per_host);
      for (int n = 1; n <= hosts * per_host; ++n) {
        auto mesh = DeviceMeshManager::CreateModelParallelMesh(devices, n);
        if (n <= per_host) {
          ASSERT_TRUE(mesh.ok()) << mesh.status();
          EXPECT_EQ(mesh->axis_names(), std::vector<std::string>{"model"});
          EXPECT_EQ(mesh->size(), n);
          EXPECT_TRUE(OnOneHost(mesh->devices()));
          ExpectDistinctSubset(*mesh, devices);
        } else {
          ASSERT_FALSE(mesh.ok());
          EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument);
          EXPECT_THAT(mesh.status().message(), HasSubstr("must lie on one host"));
        }
        auto crossed = DeviceMeshManager::CreateModelParallelMesh(devices, n, {true});
        ASSERT_TRUE(crossed.ok()) << crossed.status();
        EXPECT_EQ(crossed->size(), n);
        ExpectDistinctSubset(*crossed, devices);
      }
      EXPECT_THAT(DeviceMeshManager::CreateModelParallelMesh(devices, 0).status().message(),
                  HasSubstr("must be >= 1"));
      EXPECT_THAT(DeviceMeshManager::CreateModelParallelMesh(devices, hosts * per_host + 1)
                      .status()
                      .message(),
                  HasSubstr("only"));
    }
  }
}

// The hybrid property over every cluster of 1-8 hosts x 1-8 devices and every (dp, mp) that fits:
// a mesh is built exactly when dp model-axis groups fit on single hosts; then every group is on
// one host. When mp divides the devices per host, it always fits. Nothing is placed across hosts
// unless asked, and then it always fits.
TEST(DeviceMeshManagerTest, HybridModelGroupsLieOnOneHost) {
  int built = 0, rejected = 0;
  for (int hosts = 1; hosts <= 8; ++hosts) {
    for (int per_host = 1; per_host <= 8; ++per_host) {
      const std::vector<Device> devices = MakeUniformCluster(hosts, per_host);
      const int total = hosts * per_host;
      for (int mp = 1; mp <= total; ++mp) {
        for (int dp = 1; dp * mp <= total; ++dp) {
          SCOPED_TRACE(testing::Message() << hosts << " hosts x " << per_host << " devices, dp="
                                          << dp << " mp=" << mp);
          auto mesh = DeviceMeshManager::CreateHybridMesh(devices, dp, mp);
          const bool fits = (per_host / mp) * hosts >= dp;
          if (per_host % mp == 0) {
            EXPECT_TRUE(fits);
          }
          if (fits) {
            ASSERT_TRUE(mesh.ok()) << mesh.status();
            ++built;
            EXPECT_EQ(mesh->axis_names(), (std::vector<std::string>{"data", "model"}));
            EXPECT_EQ(mesh->shape(), (std::vector<int64_t>{dp, mp}));
            ExpectDistinctSubset(*mesh, devices);
            auto groups = mesh->AxisGroups("model");
            ASSERT_TRUE(groups.ok());
            ASSERT_EQ(static_cast<int>(groups->size()), dp);
            for (const auto& group : *groups) EXPECT_TRUE(OnOneHost(group));
          } else {
            ASSERT_FALSE(mesh.ok());
            ++rejected;
            EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument);
            EXPECT_THAT(mesh.status().message(), HasSubstr("each on one host"));
            EXPECT_THAT(mesh.status().message(), HasSubstr("devices per host"));
          }
          auto crossed = DeviceMeshManager::CreateHybridMesh(devices, dp, mp, {true});
          ASSERT_TRUE(crossed.ok()) << crossed.status();
          ExpectDistinctSubset(*crossed, devices);
        }
      }
      auto too_big = DeviceMeshManager::CreateHybridMesh(devices, total + 1, 1);
      EXPECT_THAT(too_big.status().message(), HasSubstr("needs " + std::to_string(total + 1)));
    }
  }
  EXPECT_GT(built, 1000);
  EXPECT_GT(rejected, 100);
}

TEST(DeviceMeshManagerTest, HybridUsesWholeGroupsOnUnevenHosts) {
  // host a: 3 devices, host b: 2 devices; mp=2 gives one group on each host.
  std::vector<Device> devices = {
      {0, "a", 0, DeviceKind::kCpu, ""}, {1, "a", 1, DeviceKind::kCpu, ""},
      {2, "a", 2, DeviceKind::kCpu, ""}, {3, "b", 0, DeviceKind::kCpu, ""},
      {4, "b", 1, DeviceKind::kCpu, ""},
  };
  auto mesh = DeviceMeshManager::CreateHybridMesh(devices, 2, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  std::vector<int> ids;
  for (const Device& d : mesh->devices()) ids.push_back(d.id);
  EXPECT_EQ(ids, (std::vector<int>{0, 1, 3, 4}));

  auto no_fit = DeviceMeshManager::CreateHybridMesh(devices, 1, 4);
  EXPECT_EQ(no_fit.status().message(),
            "hybrid mesh (data=1, model=4) needs 1 model-axis groups of 4 devices, each on one "
            "host, but only 0 fit (devices per host: a: 3, b: 2); choose a model_parallel_size "
            "that divides the devices of each host, or allow cross-host placement of the model "
            "axis");
}

TEST(DeviceMeshManagerTest, RejectsBadSizesAndDeviceSets) {
  const std::vector<Device> devices = MakeUniformCluster(2, 2);
  EXPECT_THAT(DeviceMeshManager::CreateHybridMesh(devices, 0, 2).status().message(),
              HasSubstr("both sizes must be >= 1"));
  EXPECT_THAT(DeviceMeshManager::CreateDataParallelMesh({}).status().message(),
              HasSubstr("no devices"));
}

TEST(DeviceMeshManagerTest, MeshInfoPrintsTheGridWithHosts) {
  auto mesh = DeviceMeshManager::CreateHybridMesh(MakeUniformCluster(2, 2), 2, 2);
  ASSERT_TRUE(mesh.ok());
  MeshInfo info = DeviceMeshManager::GetMeshInfo(*mesh);
  EXPECT_EQ(info.device_count, 4);
  EXPECT_EQ(info.hosts, (std::vector<std::string>{"host-0", "host-1"}));
  EXPECT_EQ(info.ToString(),
            "mesh (data=2, model=2): 4 devices on 2 hosts (host-0, host-1)\n"
            "          model=0          model=1\n"
            "  data=0  d0 host-0/cpu:0  d1 host-0/cpu:1\n"
            "  data=1  d2 host-1/cpu:0  d3 host-1/cpu:1\n");

  auto dp = DeviceMeshManager::CreateDataParallelMesh(MakeUniformCluster(1, 2));
  ASSERT_TRUE(dp.ok());
  std::ostringstream os;
  os << DeviceMeshManager::GetMeshInfo(*dp);
  EXPECT_EQ(os.str(),
            "mesh (data=2): 2 devices on 1 host (host-0)\n"
            "    data=0           data=1\n"
            "    d0 host-0/cpu:0  d1 host-0/cpu:1\n");
}

TEST(DeviceMeshManagerTest, BackendSelectsTheDeviceKind) {
  std::vector<Device> devices = MakeUniformCluster(1, 2);
  std::vector<Device> gpus = MakeUniformCluster(1, 3, DeviceKind::kCuda);
  for (Device& g : gpus) {
    g.id += 10;
    g.host = "gpu-host";
  }
  std::vector<Device> mixed = devices;
  mixed.insert(mixed.end(), gpus.begin(), gpus.end());
  EXPECT_EQ(DevicesForBackend(v1::BACKEND_CPU, mixed).size(), 2u);
  EXPECT_EQ(DevicesForBackend(v1::BACKEND_CUDA, mixed).size(), 3u);
  EXPECT_EQ(DevicesForBackend(v1::BACKEND_AUTO, mixed).size(), 3u);
  EXPECT_EQ(DevicesForBackend(v1::BACKEND_AUTO, devices).size(), 2u);
  EXPECT_TRUE(DevicesForBackend(v1::BACKEND_CUDA, devices).empty());
}

TEST(DeviceMeshManagerTest, MeshForJobFollowsTheSpec) {
  const std::vector<Device> devices = MakeUniformCluster(2, 2);
  v1::MeshSpec spec;
  spec.set_type(v1::MESH_TYPE_DATA_PARALLEL);
  spec.set_data_parallel_size(3);
  auto dp = CreateMeshForJob(spec, devices);
  ASSERT_TRUE(dp.ok()) << dp.status();
  EXPECT_EQ(dp->shape(), std::vector<int64_t>{3});
  spec.set_data_parallel_size(5);
  EXPECT_THAT(CreateMeshForJob(spec, devices).status().message(),
              HasSubstr("spec.mesh: data-parallel mesh of 5 devices, but only 4 are available"));

  spec.set_type(v1::MESH_TYPE_HYBRID);
  spec.set_data_parallel_size(1);
  spec.set_model_parallel_size(4);
  EXPECT_THAT(CreateMeshForJob(spec, devices).status().message(),
              HasSubstr("spec.mesh: hybrid mesh (data=1, model=4) needs 1 model-axis groups"));
  spec.set_allow_cross_host_model_axis(true);
  EXPECT_TRUE(CreateMeshForJob(spec, devices).ok());

  spec.set_type(v1::MESH_TYPE_MODEL_PARALLEL);
  spec.set_num_devices(2);
  auto mp = CreateMeshForJob(spec, devices);
  ASSERT_TRUE(mp.ok());
  EXPECT_EQ(mp->axis_names(), std::vector<std::string>{"model"});
}

}  // namespace
}  // namespace substrax
