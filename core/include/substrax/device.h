// Device: one accelerator (or CPU device) of the cluster, and helpers over sets of devices.
//
// Plain values, no threads: safe to copy and share.
#ifndef SUBSTRAX_DEVICE_H_
#define SUBSTRAX_DEVICE_H_

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace substrax {

enum class DeviceKind { kCpu, kCuda };

// "cpu" or "cuda".
const char* DeviceKindName(DeviceKind kind);

struct Device {
  // Cluster-wide id, unique among the devices a mesh is built from.
  int id = 0;
  // Host the device is on; devices of one host share fast links and one worker daemon.
  std::string host;
  // Index of the device on its host.
  int local_index = 0;
  DeviceKind kind = DeviceKind::kCpu;
  // The worker daemon that owns the device (may be empty in pure computations).
  std::string worker_id;

  // "cpu:1" -- the device's name on its host.
  std::string LocalName() const;
  // "device 5 (cpu:1 on host-a)".
  std::string ToString() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.id == b.id && a.host == b.host && a.local_index == b.local_index &&
           a.kind == b.kind && a.worker_id == b.worker_id;
  }
  friend std::ostream& operator<<(std::ostream& os, const Device& d) {
    return os << d.ToString();
  }
};

// Checks that a set of devices can form a mesh: non-empty, ids unique, every device has a host,
// and no two devices share (host, local_index). Errors: INVALID_ARGUMENT naming the offender.
absl::Status ValidateDevices(absl::Span<const Device> devices);

// The devices of each host: hosts in order of first appearance, each host's devices sorted by
// local_index. This is the canonical order meshes are laid out in.
std::vector<std::pair<std::string, std::vector<Device>>> GroupByHost(
    absl::Span<const Device> devices);

// `num_hosts` hosts named "host-0".. with `devices_per_host` devices each; ids 0..n-1 in host
// order. For tests, examples and dry runs (substraxctl plan).
std::vector<Device> MakeUniformCluster(int num_hosts, int devices_per_host,
                                       DeviceKind kind = DeviceKind::kCpu);

}  // namespace substrax

#endif  // SUBSTRAX_DEVICE_H_
