#include "core/device_mesh_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace substrax {
namespace {

std::vector<Device> CanonicalOrder(absl::Span<const Device> devices) {
  std::vector<Device> ordered;
  ordered.reserve(devices.size());
  for (auto& [host, host_devices] : GroupByHost(devices)) {
    ordered.insert(ordered.end(), host_devices.begin(), host_devices.end());
  }
  return ordered;
}

// "host-0: 3, host-1: 3" -- for errors that explain why a mesh does not fit.
std::string DevicesPerHost(absl::Span<const Device> devices) {
  std::vector<std::string> parts;
  for (const auto& [host, host_devices] : GroupByHost(devices)) {
    parts.push_back(absl::StrCat(host, ": ", host_devices.size()));
  }
  return absl::StrJoin(parts, ", ");
}

// Up to `max_groups` groups of `group_size` devices, each group within one host.
std::vector<std::vector<Device>> SameHostGroups(absl::Span<const Device> devices,
                                                int group_size, int max_groups) {
  std::vector<std::vector<Device>> groups;
  for (const auto& [host, host_devices] : GroupByHost(devices)) {
    for (size_t start = 0; start + group_size <= host_devices.size(); start += group_size) {
      if (static_cast<int>(groups.size()) == max_groups) return groups;
      groups.emplace_back(host_devices.begin() + start, host_devices.begin() + start + group_size);
    }
  }
  return groups;
}

}  // namespace

absl::StatusOr<Mesh> DeviceMeshManager::CreateDataParallelMesh(absl::Span<const Device> devices) {
  SUBSTRAX_RETURN_IF_ERROR(ValidateDevices(devices));
  std::vector<Device> ordered = CanonicalOrder(devices);
  const int64_t n = static_cast<int64_t>(ordered.size());
  return Mesh::Create({kDataAxis}, {n}, std::move(ordered));
}

absl::StatusOr<Mesh> DeviceMeshManager::CreateModelParallelMesh(absl::Span<const Device> devices,
                                                                int num_devices,
                                                                MeshPlacementOptions options) {
  SUBSTRAX_RETURN_IF_ERROR(ValidateDevices(devices));
  if (num_devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model-parallel mesh: num_devices must be >= 1, got ", num_devices));
  }
  if (num_devices > static_cast<int>(devices.size())) {
    return absl::InvalidArgumentError(absl::StrCat("model-parallel mesh of ", num_devices,
                                                   " devices, but only ", devices.size(),
                                                   " are available (", DevicesPerHost(devices),
                                                   ")"));
  }
  std::vector<std::vector<Device>> groups = SameHostGroups(devices, num_devices, 1);
  std::vector<Device> chosen;
  if (!groups.empty()) {
    chosen = std::move(groups.front());
  } else if (options.allow_cross_host_model_axis) {
    chosen = CanonicalOrder(devices);
    chosen.resize(num_devices);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "model-parallel mesh of ", num_devices, " devices must lie on one host, but no host has ",
        num_devices, " devices (", DevicesPerHost(devices),
        "); use fewer devices or allow cross-host placement of the model axis"));
  }
  return Mesh::Create({kModelAxis}, {num_devices}, std::move(chosen));
}

absl::StatusOr<Mesh> DeviceMeshManager::CreateHybridMesh(absl::Span<const Device> devices,
                                                         int data_parallel_size,
                                                         int model_parallel_size,
                                                         MeshPlacementOptions options) {
  SUBSTRAX_RETURN_IF_ERROR(ValidateDevices(devices));
  const std::string what =
      absl::StrCat("hybrid mesh (data=", data_parallel_size, ", model=", model_parallel_size, ")");
  if (data_parallel_size < 1 || model_parallel_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": both sizes must be >= 1"));
  }
  const int64_t needed = int64_t{data_parallel_size} * model_parallel_size;
  if (needed > static_cast<int64_t>(devices.size())) {
    return absl::InvalidArgumentError(absl::StrCat(what, " needs ", needed, " devices, but only ",
                                                   devices.size(), " are available (",
                                                   DevicesPerHost(devices), ")"));
  }
  std::vector<std::vector<Device>> groups =
      SameHostGroups(devices, model_parallel_size, data_parallel_size);
  std::vector<Device> chosen;
  if (static_cast<int>(groups.size()) == data_parallel_size) {
    for (auto& group : groups) chosen.insert(chosen.end(), group.begin(), group.end());
  } else if (options.allow_cross_host_model_axis) {
    chosen = CanonicalOrder(devices);
    chosen.resize(needed);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " needs ", data_parallel_size, " model-axis groups of ", model_parallel_size,
        " devices, each on one host, but only ", groups.size(), " fit (devices per host: ",
        DevicesPerHost(devices), "); choose a model_parallel_size that divides the devices of "
        "each host, or allow cross-host placement of the model axis"));
  }
  return Mesh::Create({kDataAxis, kModelAxis}, {data_parallel_size, model_parallel_size},
                      std::move(chosen));
}

std::vector<Device> DevicesForBackend(v1::Backend backend, absl::Span<const Device> devices) {
  DeviceKind kind = DeviceKind::kCpu;
  if (backend == v1::BACKEND_CUDA) {
    kind = DeviceKind::kCuda;
  } else if (backend != v1::BACKEND_CPU) {
    for (const Device& d : devices) {
      if (d.kind == DeviceKind::kCuda) kind = DeviceKind::kCuda;
    }
  }
  std::vector<Device> chosen;
  for (const Device& d : devices) {
    if (d.kind == kind) chosen.push_back(d);
  }
  return chosen;
}

absl::StatusOr<Mesh> CreateMeshForJob(const v1::MeshSpec& spec, absl::Span<const Device> devices) {
  const MeshPlacementOptions options{spec.allow_cross_host_model_axis()};
  absl::StatusOr<Mesh> mesh;
  switch (spec.type()) {
    case v1::MESH_TYPE_DATA_PARALLEL: {
      SUBSTRAX_RETURN_IF_ERROR(Annotate(ValidateDevices(devices), "spec.mesh"));
      if (spec.data_parallel_size() > static_cast<int>(devices.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spec.mesh: data-parallel mesh of ", spec.data_parallel_size(), " devices, but only ",
            devices.size(), " are available (", DevicesPerHost(devices), ")"));
      }
      std::vector<Device> chosen = CanonicalOrder(devices);
      chosen.resize(std::max(spec.data_parallel_size(), 0));
      mesh = DeviceMeshManager::CreateDataParallelMesh(chosen);
      break;
    }
    case v1::MESH_TYPE_MODEL_PARALLEL:
      mesh = DeviceMeshManager::CreateModelParallelMesh(devices, spec.num_devices(), options);
      break;
    case v1::MESH_TYPE_HYBRID:
      mesh = DeviceMeshManager::CreateHybridMesh(devices, spec.data_parallel_size(),
                                                 spec.model_parallel_size(), options);
      break;
    default:
      return absl::InvalidArgumentError("spec.mesh.type: unspecified (apply the spec's defaults)");
  }
  if (!mesh.ok()) {
    absl::Status status = Annotate(mesh.status(), "spec.mesh");
    if (!spec.allow_cross_host_model_axis() && absl::StrContains(status.message(), "cross-host")) {
      status = absl::Status(status.code(), absl::StrCat(status.message(),
                                                        " (spec.mesh.allow_cross_host_model_axis)"));
    }
    return status;
  }
  return mesh;
}

MeshInfo DeviceMeshManager::GetMeshInfo(const Mesh& mesh) {
  MeshInfo info;
  info.axis_names = mesh.axis_names();
  info.shape = mesh.shape();
  info.device_count = mesh.size();
  info.hosts = mesh.Hosts();
  info.devices = mesh.devices();
  return info;
}

std::string MeshInfo::ToString() const {
  std::vector<std::string> dims;
  for (size_t i = 0; i < shape.size(); ++i) dims.push_back(absl::StrCat(axis_names[i], "=", shape[i]));
  std::string out = absl::StrCat("mesh (", absl::StrJoin(dims, ", "), "): ", device_count,
                                 device_count == 1 ? " device" : " devices", " on ", hosts.size(),
                                 hosts.size() == 1 ? " host" : " hosts", " (",
                                 absl::StrJoin(hosts, ", "), ")\n");
  if (shape.empty() || devices.empty()) return out;

  // Rows: every combination of the leading axes; columns: the last axis.
  const int64_t columns = shape.back();
  const int64_t rows = static_cast<int64_t>(devices.size()) / columns;
  std::vector<std::string> row_labels(rows);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<std::string> parts;
    int64_t rest = r;
    for (int a = static_cast<int>(shape.size()) - 2; a >= 0; --a) {
      parts.insert(parts.begin(), absl::StrCat(axis_names[a], "=", rest % shape[a]));
      rest /= shape[a];
    }
    row_labels[r] = absl::StrJoin(parts, ",");
  }
  std::vector<std::string> cells(devices.size());
  size_t width = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    const Device& d = devices[i];
    cells[i] = absl::StrCat("d", d.id, " ", d.host, "/", d.LocalName());
    width = std::max(width, cells[i].size());
  }
  std::vector<std::string> headers(columns);
  for (int64_t c = 0; c < columns; ++c) {
    headers[c] = absl::StrCat(axis_names.back(), "=", c);
    width = std::max(width, headers[c].size());
  }
  size_t label_width = 0;
  for (const std::string& label : row_labels) label_width = std::max(label_width, label.size());

  auto pad = [](const std::string& s, size_t w) { return s + std::string(w - s.size(), ' '); };
  std::string line = "  " + std::string(label_width, ' ');
  for (const std::string& h : headers) absl::StrAppend(&line, "  ", pad(h, width));
  out += std::string(line.substr(0, line.find_last_not_of(' ') + 1)) + "\n";
  for (int64_t r = 0; r < rows; ++r) {
    line = "  " + pad(row_labels[r], label_width);
    for (int64_t c = 0; c < columns; ++c) absl::StrAppend(&line, "  ", pad(cells[r * columns + c], width));
    out += line.substr(0, line.find_last_not_of(' ') + 1) + "\n";
  }
  return out;
}

}  // namespace substrax
