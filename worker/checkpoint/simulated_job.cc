#include "worker/checkpoint/simulated_job.h"

#include <algorithm>
#include <utility>

#include "worker/checkpoint/commit.h"

namespace substrax {

absl::StatusOr<SimulatedJob> SimulatedJob::Create(
    const Mesh& mesh, const std::map<std::string, GlobalArray>& arrays) {
  SimulatedJob job(mesh);
  const std::vector<std::string> hosts = mesh.Hosts();
  job.processes_.resize(hosts.size());
  for (const auto& [name, array] : arrays) {
    absl::StatusOr<NamedSharding> sharding = NamedSharding::Create(mesh, array.spec);
    if (!sharding.ok()) return sharding.status();
    absl::StatusOr<ShardLayout> layout = sharding->Layout(array.value.shape());
    if (!layout.ok()) return layout.status();
    job.layouts_[name].layout = *layout;
    for (const ShardSlice& slice : layout->shards) {
      const size_t process =
          std::find(hosts.begin(), hosts.end(), slice.device.host) - hosts.begin();
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (const IndexRange& r : slice.index) ranges.push_back({r.start, r.limit});
      absl::StatusOr<Tensor> block = array.value.Slice(ranges);
      if (!block.ok()) return block.status();
      job.blocks_.push_back(std::make_unique<Tensor>(*std::move(block)));
      LocalArray& local = job.processes_[process][name];
      local.layout = *layout;
      local.shards[slice.device.id] = job.blocks_.back().get();
    }
  }
  return job;
}

absl::Status SimulatedJob::Save(const std::string& dir, int64_t step, int keep_last) const {
  std::vector<v1::CheckpointFile> entries;
  for (int p = 0; p < processes(); ++p) {
    absl::StatusOr<ProcessShards> shards = EncodeProcessShards(p, processes_[p]);
    if (!shards.ok()) return shards.status();
    if (absl::Status s = WriteShardFile(dir, step, *shards); !s.ok()) return s;
    entries.push_back(std::move(shards->entry));
  }
  absl::StatusOr<v1::CheckpointManifest> manifest =
      MakeManifest(step, mesh_, layouts_, std::move(entries));
  if (!manifest.ok()) return manifest.status();
  return CommitCheckpoint(dir, *manifest, keep_last);
}

}  // namespace substrax
