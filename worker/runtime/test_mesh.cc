#include "worker/runtime/test_mesh.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/collectives/store.h"

namespace substrax {

void RunOnDevices(const Mesh& mesh, const std::function<void(DeviceContext&)>& body,
                  const ConnectorWrapper& wrap) {
  InMemoryStore store;
  std::vector<std::thread> threads;
  for (const Device& device : mesh.devices()) {
    threads.emplace_back([&, device] {
      std::unique_ptr<GroupConnector> connector = std::make_unique<GlooGroupConnector>(
          GlooCommunicatorOptions(), &store, std::vector<int>(mesh.size(), 0), nullptr);
      if (wrap) connector = wrap(std::move(connector));
      auto comms = MeshCommunicators::Create(mesh, device.id, *connector);
      ASSERT_TRUE(comms.ok()) << comms.status();
      DeviceContext ctx{&mesh, device, *mesh.CoordinatesOf(device.id), comms->get()};
      body(ctx);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace substrax
