// For tests: runs a function on one thread per device of a mesh, each with its DeviceContext
// connected over real Gloo communicators through an in-memory store (one process).
#ifndef SUBSTRAX_WORKER_RUNTIME_TEST_MESH_H_
#define SUBSTRAX_WORKER_RUNTIME_TEST_MESH_H_

#include <functional>
#include <memory>

#include "core/mesh.h"
#include "worker/collectives/gloo_communicator.h"
#include "worker/runtime/spmd.h"

namespace substrax {

// `wrap` (may be null) may replace each connector, e.g. to count collectives.
using ConnectorWrapper = std::function<std::unique_ptr<GroupConnector>(std::unique_ptr<GroupConnector>)>;

// Runs body(ctx) for every device of `mesh` at once; returns when all are done. A device whose
// communicators cannot connect records a gtest failure.
void RunOnDevices(const Mesh& mesh, const std::function<void(DeviceContext&)>& body,
                  const ConnectorWrapper& wrap = nullptr);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_TEST_MESH_H_
