#include "worker/checkpoint/sharded.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/device.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

// A global array whose element at flat index i is i * 0.5 - 3.
Tensor Global(const std::vector<int64_t>& shape) {
  Tensor t(shape);
  for (int64_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(i) * 0.5f - 3.0f;
  return t;
}

// The block `index` of `global`, copied element by element (rank 0, 1 or 2).
Tensor Block(const Tensor& global, const std::vector<IndexRange>& index) {
  std::vector<int64_t> shape;
  for (const IndexRange& r : index) shape.push_back(r.size());
  Tensor out(shape);
  const int64_t cols = global.rank() == 2 ? global.dim(1) : 1;
  int64_t k = 0;
  if (index.empty()) {
    out.data()[0] = global.data()[0];
  } else if (index.size() == 1) {
    for (int64_t i = index[0].start; i < index[0].limit; ++i) out.data()[k++] = global.data()[i];
  } else {
    for (int64_t i = index[0].start; i < index[0].limit; ++i) {
      for (int64_t j = index[1].start; j < index[1].limit; ++j) {
        out.data()[k++] = global.data()[i * cols + j];
      }
    }
  }
  return out;
}

Mesh MakeMesh(int64_t data, int64_t model) {
  return *Mesh::Create({"data", "model"}, {data, model},
                       MakeUniformCluster(static_cast<int>(data), static_cast<int>(model)));
}

ShardLayout LayoutOf(const Mesh& mesh, const PartitionSpec& spec,
                     const std::vector<int64_t>& shape) {
  return *NamedSharding::Create(mesh, spec)->Layout(shape);
}

struct Saved {
  std::string dir;
  std::map<std::string, Tensor> global;
};

// Saves kernel [8, 6] (sharded over both axes), bias [6] (over model, replicated over data)
// and step [] (replicated) from a (2, 2) mesh of 2 hosts, one process per host, as a job would.
Saved SaveOnTwoByTwo(const std::string& name) {
  Saved saved;
  saved.dir = absl::StrCat(::testing::TempDir(), "/", name);
  std::filesystem::remove_all(saved.dir);
  std::filesystem::create_directories(saved.dir);
  const Mesh mesh = MakeMesh(2, 2);
  saved.global = {{"dense/kernel", Global({8, 6})}, {"dense/bias", Global({6})},
                  {"step", Tensor({}, {42})}};
  const std::map<std::string, PartitionSpec> specs = {
      {"dense/kernel", PartitionSpec::Of({"data", "model"})},
      {"dense/bias", PartitionSpec::Of({"model"})},
      {"step", PartitionSpec()}};
  std::map<std::string, ShardLayout> layouts;
  for (const auto& [array, spec] : specs) {
    layouts[array] = LayoutOf(mesh, spec, saved.global[array].shape());
  }
  std::vector<v1::CheckpointFile> entries;
  std::vector<std::vector<Tensor>> keep(2);
  std::map<std::string, LocalArray> all;
  for (int process = 0; process < 2; ++process) {
    std::map<std::string, LocalArray> arrays;
    for (const auto& [array, layout] : layouts) {
      arrays[array].layout = layout;
      all[array].layout = layout;
      keep[process].reserve(16);
      for (const ShardSlice& slice : layout.shards) {
        if (slice.device.host != absl::StrCat("host-", process)) continue;
        keep[process].push_back(Block(saved.global[array], slice.index));
        arrays[array].shards[slice.device.id] = &keep[process].back();
      }
    }
    absl::StatusOr<ProcessShards> shards = EncodeProcessShards(process, arrays);
    EXPECT_TRUE(shards.ok()) << shards.status();
    std::ofstream(saved.dir + "/" + shards->entry.name(), std::ios::binary) << shards->contents;
    entries.push_back(shards->entry);
  }
  absl::StatusOr<v1::CheckpointManifest> manifest = MakeManifest(100, mesh, all, entries);
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(*manifest, &json);
  std::ofstream(saved.dir + "/manifest.json") << json;
  return saved;
}

void ExpectEqual(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got.data()[i], want.data()[i]) << what << " element " << i;  // bitwise
  }
}

TEST(ShardedCheckpointTest, EveryElementIsWrittenExactlyOnce) {
  const Saved saved = SaveOnTwoByTwo("once");
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(saved.dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  int64_t stored = 0;
  for (const v1::CheckpointFile& f : reader->manifest().files()) {
    for (const v1::CheckpointShard& s : f.shards()) {
      int64_t n = 1;
      for (const auto& r : s.index()) n *= r.limit() - r.start();
      stored += n;
    }
  }
  // 48 kernel + 6 bias + 1 step: replicas (bias over data, step everywhere) are not repeated.
  EXPECT_EQ(stored, 48 + 6 + 1);
  EXPECT_EQ(reader->manifest().step(), 100);
}

TEST(ShardedCheckpointTest, RestoresOntoOtherMeshes) {
  const Saved saved = SaveOnTwoByTwo("reshard");
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(saved.dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  // (4, 1): kernel over data only; (1, 1): one device holds everything; (1, 4)-like column
  // blocks: any block can be asked for.
  for (const auto& [data, model] : {std::pair{4, 1}, std::pair{1, 1}, std::pair{2, 2}}) {
    const Mesh mesh = MakeMesh(data, model);
    const ShardLayout kernel =
        LayoutOf(mesh, PartitionSpec::Of({"data", "model"}), {8, 6});
    for (const ShardSlice& slice : kernel.shards) {
      absl::StatusOr<Tensor> block = reader->ReadBlock("dense/kernel", slice.index);
      ASSERT_TRUE(block.ok()) << block.status();
      ExpectEqual(*block, Block(saved.global.at("dense/kernel"), slice.index),
                  absl::StrCat("kernel on (", data, ",", model, ") device ", slice.device.id));
    }
  }
  absl::StatusOr<Tensor> odd = reader->ReadBlock("dense/kernel", {{1, 7}, {2, 5}});
  ASSERT_TRUE(odd.ok()) << odd.status();
  ExpectEqual(*odd, Block(saved.global.at("dense/kernel"), {{1, 7}, {2, 5}}), "odd block");
  ExpectEqual(*reader->ReadBlock("dense/bias", {{0, 6}}), saved.global.at("dense/bias"), "bias");
  ExpectEqual(*reader->ReadBlock("step", {}), saved.global.at("step"), "step");
}

TEST(ShardedCheckpointTest, DamageIsDetectedNeverRead) {
  const Saved saved = SaveOnTwoByTwo("damage");
  // Flip one data byte of process 1's file: same size, different checksum.
  const std::string path = saved.dir + "/process-00001.safetensors";
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-3, std::ios::end);
  f.put('\x7f');
  f.close();
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(saved.dir);
  ASSERT_TRUE(reader.ok());
  absl::StatusOr<Tensor> whole = reader->ReadBlock("dense/kernel", {{0, 8}, {0, 6}});
  EXPECT_EQ(whole.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(whole.status().message(), HasSubstr("process-00001.safetensors is damaged"));
  // Blocks that only process 0 wrote still read.
  EXPECT_TRUE(reader->ReadBlock("dense/kernel", {{0, 4}, {0, 3}}).ok());

  std::filesystem::remove(path);
  EXPECT_EQ(CheckpointReader::Open(saved.dir)
                ->ReadBlock("dense/kernel", {{4, 8}, {0, 6}})
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(CheckpointReader::Open(saved.dir + "/nope").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(CheckpointReader::Open(saved.dir)->ReadBlock("dense/kernel", {{0, 9}, {0, 6}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ShardedCheckpointTest, AManifestWithAGapOrATwiceWrittenBlockIsRefused) {
  const Mesh mesh = MakeMesh(2, 1);
  const ShardLayout layout = LayoutOf(mesh, PartitionSpec::Of({"data"}), {4});
  Tensor top({2}, {1, 2}), bottom({2}, {3, 4});
  std::map<std::string, LocalArray> arrays = {{"w", {layout, {{0, &top}, {1, &bottom}}}}};
  std::map<std::string, LocalArray> first = {{"w", {layout, {{0, &top}}}}};
  absl::StatusOr<ProcessShards> p0 = EncodeProcessShards(0, first);
  ASSERT_TRUE(p0.ok());
  EXPECT_THAT(MakeManifest(1, mesh, arrays, {p0->entry}).status().message(),
              HasSubstr("the shard files hold 2 of its 4 elements"));
  EXPECT_THAT(MakeManifest(1, mesh, arrays, {p0->entry, p0->entry}).status().message(),
              HasSubstr("written twice"));
  Tensor wrong({3}, {1, 2, 3});
  EXPECT_THAT(EncodeProcessShards(0, {{"w", {layout, {{0, &wrong}}}}}).status().message(),
              HasSubstr("has shape (3,), its slice (2,)"));
}

}  // namespace
}  // namespace substrax
