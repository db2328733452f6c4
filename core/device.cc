#include "core/device.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace substrax {

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

std::string Device::LocalName() const {
  return absl::StrCat(DeviceKindName(kind), ":", local_index);
}

std::string Device::ToString() const {
  return absl::StrCat("device ", id, " (", LocalName(), " on ", host, ")");
}

Device DeviceFromProto(const v1::Device& proto) {
  Device d;
  d.id = proto.id();
  d.host = proto.host();
  d.local_index = proto.local_index();
  d.kind = proto.kind() == v1::DEVICE_KIND_CUDA ? DeviceKind::kCuda : DeviceKind::kCpu;
  d.worker_id = proto.worker_id();
  return d;
}

v1::Device DeviceToProto(const Device& device) {
  v1::Device proto;
  proto.set_id(device.id);
  proto.set_host(device.host);
  proto.set_local_index(device.local_index);
  proto.set_kind(device.kind == DeviceKind::kCuda ? v1::DEVICE_KIND_CUDA : v1::DEVICE_KIND_CPU);
  proto.set_worker_id(device.worker_id);
  return proto;
}

absl::Status ValidateDevices(absl::Span<const Device> devices) {
  if (devices.empty()) {
    return absl::InvalidArgumentError("no devices: a mesh needs at least one device");
  }
  absl::flat_hash_map<int, const Device*> by_id;
  std::map<std::pair<std::string, int>, const Device*> by_place;
  for (const Device& d : devices) {
    if (d.host.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("device ", d.id, " has no host"));
    }
    if (d.local_index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(d.ToString(), ": local index must be >= 0"));
    }
    auto [id_it, id_new] = by_id.emplace(d.id, &d);
    if (!id_new) {
      return absl::InvalidArgumentError(absl::StrCat("device id ", d.id, " appears twice: ",
                                                     id_it->second->ToString(), " and ",
                                                     d.ToString()));
    }
    auto [place_it, place_new] = by_place.emplace(std::make_pair(d.host, d.local_index), &d);
    if (!place_new) {
      return absl::InvalidArgumentError(
          absl::StrCat(place_it->second->ToString(), " and ", d.ToString(),
                       " are the same device of host ", d.host));
    }
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::vector<Device>>> GroupByHost(
    absl::Span<const Device> devices) {
  std::vector<std::pair<std::string, std::vector<Device>>> groups;
  absl::flat_hash_map<std::string, size_t> index;
  for (const Device& d : devices) {
    auto [it, inserted] = index.emplace(d.host, groups.size());
    if (inserted) groups.emplace_back(d.host, std::vector<Device>());
    groups[it->second].second.push_back(d);
  }
  for (auto& [host, host_devices] : groups) {
    std::stable_sort(host_devices.begin(), host_devices.end(),
                     [](const Device& a, const Device& b) {
                       return std::tie(a.local_index, a.id) < std::tie(b.local_index, b.id);
                     });
  }
  return groups;
}

std::vector<Device> MakeUniformCluster(int num_hosts, int devices_per_host, DeviceKind kind) {
  std::vector<Device> devices;
  for (int h = 0; h < num_hosts; ++h) {
    for (int i = 0; i < devices_per_host; ++i) {
      Device d;
      d.id = static_cast<int>(devices.size());
      d.host = absl::StrCat("host-", h);
      d.local_index = i;
      d.kind = kind;
      d.worker_id = d.host;
      devices.push_back(d);
    }
  }
  return devices;
}

}  // namespace substrax
