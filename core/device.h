// Devices: the public declarations are in substrax/device.h (part of the SDK, docs/sdk.md); this
// header adds the substrax-internal ones that name the wire form (substrax.v1 protos).
#ifndef SUBSTRAX_CORE_DEVICE_H_
#define SUBSTRAX_CORE_DEVICE_H_

#include "absl/types/span.h"
#include "substrax/device.h"
#include "substrax/v1/topology.pb.h"

namespace substrax {

Device DeviceFromProto(const v1::Device& proto);
v1::Device DeviceToProto(const Device& device);

}  // namespace substrax

#endif  // SUBSTRAX_CORE_DEVICE_H_
