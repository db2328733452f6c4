#include "core/input_shape.h"

#include <zlib.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  std::string dir = ::testing::TempDir();
  if (dir.back() != '/') dir += "/";
  return dir + name;
}

std::string WritePlain(const std::string& name, const std::string& bytes) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string WriteGzip(const std::string& name, const std::string& bytes) {
  const std::string path = TempPath(name);
  gzFile file = gzopen(path.c_str(), "wb");
  gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(file);
  return path;
}

// An IDX images header (big-endian) for n images of rows x cols, and their pixels.
std::string IdxImages(uint32_t magic, uint32_t n, uint32_t rows, uint32_t cols) {
  std::string out;
  for (uint32_t v : {magic, n, rows, cols}) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
  }
  return out + std::string(n * rows * cols, '\x7f');
}

v1::DataSpec Idx(const std::string& images) {
  v1::DataSpec data;
  data.set_format(v1::DATA_FORMAT_IDX);
  data.mutable_train()->set_images(images);
  return data;
}

v1::DataSpec Csv(const std::string& path, const std::string& label, const std::string& delim = "") {
  v1::DataSpec data;
  data.set_format(v1::DATA_FORMAT_CSV);
  data.mutable_train()->set_path(path);
  data.mutable_csv()->set_label_column(label);
  data.mutable_csv()->set_delimiter(delim);
  return data;
}

TEST(InputFeaturesTest, SyntheticIsItsNumFeatures) {
  v1::DataSpec data;
  data.set_format(v1::DATA_FORMAT_SYNTHETIC);
  data.mutable_synthetic()->set_num_features(37);
  EXPECT_EQ(*InputFeatures(data), 37);
}

TEST(InputFeaturesTest, IdxIsRowsTimesColsPlainOrGzip) {
  const std::string images = IdxImages(0x803, 3, 5, 7);
  EXPECT_EQ(*InputFeatures(Idx(WritePlain("plain-idx", images))), 35);
  EXPECT_EQ(*InputFeatures(Idx(WriteGzip("images.gz", images))), 35);
}

TEST(InputFeaturesTest, BadIdxNamesFieldAndFile) {
  const std::string labels = WritePlain("labels-idx", IdxImages(0x801, 2, 1, 1).substr(0, 8));
  absl::StatusOr<int64_t> r = InputFeatures(Idx(labels));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("spec.data.train.images: " + labels));

  const std::string wrong = WritePlain("wrong-idx", IdxImages(0x801, 1, 4, 4));
  EXPECT_THAT(InputFeatures(Idx(wrong)).status().message(),
              HasSubstr("magic 0x00000801, expected 0x00000803"));
}

TEST(InputFeaturesTest, UnreadableFileSaysToRunWhereTheDataIs) {
  const std::string missing = TempPath("no-such-images.gz");
  absl::StatusOr<int64_t> r = InputFeatures(Idx(missing));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("spec.data.train.images: cannot read " + missing));
  EXPECT_THAT(r.status().message(), HasSubstr("run this where the data is"));
  EXPECT_EQ(InputFeatures(Csv(missing, "y")).status().code(), absl::StatusCode::kNotFound);
}

TEST(InputFeaturesTest, CsvIsHeaderColumnsLessTheLabel) {
  EXPECT_EQ(*InputFeatures(Csv(WritePlain("a.csv", "x1,x2,x3,y\n1,2,3,0\n"), "y")), 3);
  // A byte order mark, blank lines first, quotes, spaces, CRLF and another delimiter.
  EXPECT_EQ(*InputFeatures(Csv(
                WritePlain("b.csv", "\xEF\xBB\xBF\n\n\"sepal\" ; petal ;species\r\n1;2;a\r\n"),
                "species", ";")),
            2);
  // gzip, and a header without a final newline.
  EXPECT_EQ(*InputFeatures(Csv(WriteGzip("c.csv.gz", "label,a,b,c,d"), "label")), 4);
  // A header longer than one read.
  std::string wide;
  for (int i = 0; i < 20000; ++i) absl::StrAppend(&wide, "feature_", i, ",");
  EXPECT_EQ(*InputFeatures(Csv(WritePlain("wide.csv", wide + "y\n"), "y")), 20000);
}

TEST(InputFeaturesTest, BadCsvIsInvalid) {
  const std::string path = WritePlain("d.csv", "a,b\n1,2\n");
  EXPECT_THAT(InputFeatures(Csv(path, "y")).status().message(),
              HasSubstr("spec.data.train.path: " + path + ": no column 'y'"));
  EXPECT_THAT(InputFeatures(Csv(WritePlain("e.csv", "\n\n"), "y")).status().message(),
              HasSubstr("empty, expected a header row"));
  EXPECT_THAT(InputFeatures(Csv(WritePlain("f.csv", "y\n1\n"), "y")).status().message(),
              HasSubstr("no feature columns"));
}

TEST(InputFeaturesTest, RealFashionMnistIs784) {
  const std::string path = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  if (!std::ifstream(path).good()) {
    GTEST_SKIP() << path << " is not installed (Debian's dataset-fashion-mnist)";
  }
  EXPECT_EQ(*InputFeatures(Idx(path)), 784);
}

TEST(InputShapeTest, TrainExamplesFromHeaders) {
  v1::DataSpec idx;
  idx.set_format(v1::DATA_FORMAT_IDX);
  idx.mutable_train()->set_images("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
  absl::StatusOr<int64_t> n = TrainExamples(idx);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 60000);
  v1::DataSpec synthetic;
  synthetic.set_format(v1::DATA_FORMAT_SYNTHETIC);
  synthetic.mutable_synthetic()->set_num_train_examples(123);
  EXPECT_EQ(*TrainExamples(synthetic), 123);
  v1::DataSpec csv;
  csv.set_format(v1::DATA_FORMAT_CSV);
  EXPECT_EQ(TrainExamples(csv).status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace substrax
