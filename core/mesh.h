// Meshes: the public declarations are in substrax/mesh.h (part of the SDK, docs/sdk.md); this
// header adds the substrax-internal ones that name the wire form (substrax.v1 protos).
#ifndef SUBSTRAX_CORE_MESH_H_
#define SUBSTRAX_CORE_MESH_H_

#include "core/device.h"
#include "substrax/mesh.h"
#include "substrax/v1/topology.pb.h"

namespace substrax {

}  // namespace substrax

#endif  // SUBSTRAX_CORE_MESH_H_
