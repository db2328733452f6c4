#include "worker/checkpoint/safetensors.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A file from its header text and data, as another writer would make it.
std::string File(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

TEST(SafetensorsTest, RoundTripsEveryDtypeShapeAndMetadata) {
  std::vector<SafetensorsTensor> tensors = {
      {"w/kernel", SafetensorsDtype::kF32, {2, 3}, Bytes<float>({1, -2, 3.5f, 0, 1e-30f, 7})},
      {"step", SafetensorsDtype::kI64, {}, Bytes<int64_t>({9000})},
      {"b", SafetensorsDtype::kF64, {2}, Bytes<double>({0.25, -1})},
      {"half", SafetensorsDtype::kBF16, {2}, Bytes<uint16_t>({0x3f80, 0xc000})},
      {"mask", SafetensorsDtype::kBool, {3}, std::string("\1\0\1", 3)},
      {"empty", SafetensorsDtype::kF32, {0, 4}, ""},
      {"quote\"and\\slash", SafetensorsDtype::kU8, {1}, "x"},
  };
  absl::StatusOr<std::string> encoded =
      EncodeSafetensors(tensors, {{"format", "substrax"}, {"step", "9000"}});
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  uint64_t header = 0;
  std::memcpy(&header, encoded->data(), 8);
  EXPECT_EQ(header % 8, 0u);  // the data starts aligned

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Parse(*encoded, "t.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->names(), (std::vector<std::string>{"b", "empty", "half", "mask",
                                                     "quote\"and\\slash", "step", "w/kernel"}));
  EXPECT_EQ(file->metadata().at("step"), "9000");
  for (const SafetensorsTensor& want : tensors) {
    absl::StatusOr<SafetensorsTensor> got = file->Tensor(want.name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->dtype, want.dtype) << want.name;
    EXPECT_EQ(got->shape, want.shape) << want.name;
    EXPECT_EQ(got->bytes, want.bytes) << want.name;
  }
  EXPECT_THAT(file->Tensor("nope").status().message(), HasSubstr("has no tensor 'nope'"));
}

TEST(SafetensorsTest, ReadsWhatTheReferenceFormatDescribes) {
  // The example of the format's description: two I32 tensors and metadata, header unpadded.
  const std::string data = Bytes<int32_t>({1, 2, 3, 4, 5});
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Parse(
      File(R"({"__metadata__":{"foo":"bar"},"b":{"dtype":"I32","shape":[1],"data_offsets":[16,20]},)"
           R"("a":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})",
           data),
      "ref");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("foo"), "bar");
  EXPECT_EQ(file->Tensor("a")->bytes, data.substr(0, 16));
  EXPECT_EQ(file->Tensor("b")->bytes, data.substr(16));
}

TEST(SafetensorsTest, EveryMalformedFileIsRefusedSayingWhy) {
  const std::string four = Bytes<float>({1, 2, 3, 4});
  const std::string good = R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  struct Case {
    std::string contents;
    const char* why;
  };
  const Case cases[] = {
      {"abc", "only 3 bytes"},
      {File(good, four).substr(0, 20), "a header of"},
      {File(good, four.substr(0, 12)), "data_offsets out of the 12 data bytes"},
      {File(good, four + "junk"), "cover 16 of the 20 data bytes"},
      {File("[1,2]", ""), "not a JSON object"},
      {File("{\"x\":", ""), "not valid JSON"},
      {File(R"({"x":{"dtype":"F33","shape":[4],"data_offsets":[0,16]}})", four),
       "dtype 'F33' is not one of"},
      {File(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", four),
       "shape does not match its 16 bytes"},
      {File(R"({"x":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", four),
       "a dimension is not a count"},
      {File(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", four),
       "starts at 8, not at 0"},
      {File(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
            R"("y":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
            four),
       "overlaps another"},
      {File(R"({"x":{"dtype":"F32","shape":[4]}})", four), "needs dtype, shape and data_offsets"},
      {File(R"({"__metadata__":{"k":1}})", ""), "metadata 'k' is not a string"},
      {File(R"({"":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", ""),
       "a tensor has an empty name"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Parse(c.contents, "bad.safetensors");
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << c.why;
    EXPECT_THAT(file.status().message(), HasSubstr(c.why));
    EXPECT_THAT(file.status().message(), HasSubstr("bad.safetensors: not a safetensors file"));
  }
}

TEST(SafetensorsTest, EncodingRefusesWhatCannotBeWritten) {
  EXPECT_THAT(EncodeSafetensors({{"x", SafetensorsDtype::kF32, {3}, "12345678"}}, {})
                  .status()
                  .message(),
              HasSubstr("does not match its 8 bytes"));
  EXPECT_THAT(EncodeSafetensors({{"x", SafetensorsDtype::kU8, {1}, "a"},
                                 {"x", SafetensorsDtype::kU8, {1}, "b"}},
                                {})
                  .status()
                  .message(),
              HasSubstr("given twice"));
  EXPECT_FALSE(EncodeSafetensors({{"__metadata__", SafetensorsDtype::kU8, {1}, "a"}}, {}).ok());
}

TEST(SafetensorsTest, Xxh3OfKnownInputs) {
  EXPECT_EQ(Xxh3Hex(""), "2d06800538d394c2");
  EXPECT_NE(Xxh3Hex("a"), Xxh3Hex("b"));
  EXPECT_EQ(Xxh3Hex("substrax").size(), 16u);
}

}  // namespace
}  // namespace substrax
