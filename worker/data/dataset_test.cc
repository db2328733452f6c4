#include "worker/data/dataset.h"

#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "substrax/v1/job.pb.h"

namespace substrax {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

MATCHER_P2(StatusIs, code, message_matcher,
           absl::StrCat("has code ", absl::StatusCodeToString(code), " and a message that ",
                        ::testing::DescribeMatcher<std::string>(message_matcher))) {
  return arg.code() == code && ::testing::ExplainMatchResult(
                                   message_matcher, std::string(arg.message()), result_listener);
}

std::string TempPath(const std::string& name) { return ::testing::TempDir() + name; }

// These tests read their own temporary files: no data roots.
const DataAccess& AnyPath() {
  static const DataAccess* const any = new DataAccess(DataAccess::Unconfined());
  return *any;
}

// Writes `bytes` to a fresh file in TEST_TMPDIR, gzip-compressed when asked; returns its path.
std::string WriteFile(const std::string& name, const std::string& bytes, bool gzip = false) {
  const std::string path = TempPath(name);
  if (gzip) {
    gzFile file = gzopen(path.c_str(), "wb");
    EXPECT_NE(file, nullptr) << path;
    EXPECT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    EXPECT_EQ(gzclose(file), Z_OK);
  } else {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  return path;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// An IDX file: big-endian magic and dimensions, then `data`.
std::string Idx(uint32_t magic, const std::vector<uint32_t>& dims, const std::string& data) {
  std::string out;
  auto put = [&out](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  return out + data;
}

constexpr uint32_t kImages = 0x00000803;
constexpr uint32_t kLabels = 0x00000801;
// Three 2x2 images and their labels.
const std::string kPixels(
    "\x00\xff\x33\x66"
    "\x01\x02\x03\x04"
    "\x80\x80\x80\x80",
    12);
const std::string kLabelBytes("\x00\x02\x01", 3);

// --- IDX ----------------------------------------------------------------------------------------

class IdxRoundTripTest : public ::testing::TestWithParam<bool> {};

TEST_P(IdxRoundTripTest, ReadsWhatWasWritten) {
  const bool gzip = GetParam();
  const std::string suffix = gzip ? ".gz" : "";
  const std::string images =
      WriteFile("rt-images" + suffix, Idx(kImages, {3, 2, 2}, kPixels), gzip);
  const std::string labels = WriteFile("rt-labels" + suffix, Idx(kLabels, {3}, kLabelBytes), gzip);
  absl::StatusOr<Dataset> data = ReadIdx(images, labels, AnyPath());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->features.shape(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(data->num_examples(), 3);
  EXPECT_EQ(data->num_features(), 4);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(data->features.data()[i], static_cast<unsigned char>(kPixels[i]) / 255.0f) << i;
  }
  EXPECT_EQ(data->features.data()[1], 1.0f);
  EXPECT_THAT(data->targets.span(), ElementsAre(0, 2, 1));
  EXPECT_EQ(data->num_classes, 3);
}

INSTANTIATE_TEST_SUITE_P(PlainAndGzip, IdxRoundTripTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Gzip" : "Plain"; });

TEST(IdxTest, MissingFileIsNotFound) {
  const std::string labels = WriteFile("nf-labels", Idx(kLabels, {3}, kLabelBytes));
  const std::string missing = TempPath("no-such-images");
  EXPECT_THAT(ReadIdx(missing, labels, AnyPath()).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));

  const std::string images = WriteFile("nf-images", Idx(kImages, {3, 2, 2}, kPixels));
  EXPECT_THAT(ReadIdx(images, TempPath("no-such-labels"), AnyPath()).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-labels")));
}

TEST(IdxTest, BadMagicNamesTheFile) {
  const std::string labels = WriteFile("bm-labels", Idx(kLabels, {3}, kLabelBytes));
  const std::string images = WriteFile("bm-images", Idx(0x00000903, {3, 2, 2}, kPixels));
  EXPECT_THAT(ReadIdx(images, labels, AnyPath()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(images), HasSubstr("not an IDX images file"),
                             HasSubstr("0x00000803"), Not(HasSubstr("0x00000903")))));

  // Images and labels given the wrong way round.
  EXPECT_THAT(
      ReadIdx(labels, images, AnyPath()).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(labels), HasSubstr("swapped"))));
}

TEST(IdxTest, TruncatedFilesAreRejected) {
  const std::string labels = WriteFile("tr-labels", Idx(kLabels, {3}, kLabelBytes));
  // Data cut short, the header cut short, and an empty file.
  for (const std::string& content :
       {Idx(kImages, {3, 2, 2}, kPixels.substr(0, 11)), Idx(kImages, {3, 2}, ""), std::string()}) {
    const std::string images = WriteFile("tr-images", content);
    EXPECT_THAT(ReadIdx(images, labels, AnyPath()).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(images), HasSubstr("truncated"))));
  }
  // A gzip stream cut short.
  const std::string whole = ReadBytes(WriteFile("tr-whole.gz", Idx(kImages, {3, 2, 2}, kPixels),
                                                /*gzip=*/true));
  const std::string cut = WriteFile("tr-cut.gz", whole.substr(0, whole.size() - 10));
  EXPECT_THAT(
      ReadIdx(cut, labels, AnyPath()).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(cut), HasSubstr("truncated"))));
}

TEST(IdxTest, ExtraBytesAndEmptyFilesAreRejected) {
  const std::string labels = WriteFile("ex-labels", Idx(kLabels, {3}, kLabelBytes));
  std::string images = WriteFile("ex-images", Idx(kImages, {3, 2, 2}, kPixels + "xy"));
  EXPECT_THAT(ReadIdx(images, labels, AnyPath()).status().message(),
              AllOf(HasSubstr(images), HasSubstr("2 bytes after")));

  images = WriteFile("ex-images0", Idx(kImages, {0, 2, 2}, ""));
  const std::string labels0 = WriteFile("ex-labels0", Idx(kLabels, {0}, ""));
  EXPECT_THAT(ReadIdx(images, labels0, AnyPath()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(images), HasSubstr("no images"))));
}

TEST(IdxTest, CountMismatchNamesBothFiles) {
  const std::string images = WriteFile("cm-images", Idx(kImages, {3, 2, 2}, kPixels));
  const std::string labels = WriteFile("cm-labels", Idx(kLabels, {2}, kLabelBytes.substr(0, 2)));
  EXPECT_THAT(ReadIdx(images, labels, AnyPath()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(images), HasSubstr("3 images"), HasSubstr(labels),
                             HasSubstr("2 labels"))));
}

TEST(IdxTest, CorruptGzipIsInvalidArgument) {
  const std::string labels = WriteFile("cg-labels", Idx(kLabels, {3}, kLabelBytes));
  std::string bytes = ReadBytes(WriteFile("cg-whole.gz", Idx(kImages, {3, 2, 2}, kPixels), true));
  for (size_t i = 10; i < bytes.size() - 8; ++i) bytes[i] = static_cast<char>(0xff);
  const std::string images = WriteFile("cg-images.gz", bytes);
  EXPECT_THAT(ReadIdx(images, labels, AnyPath()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(images)));
}

// --- CSV ----------------------------------------------------------------------------------------

TEST(CsvTest, ReadsFeaturesInFileOrderAndTheLabelColumn) {
  // A byte order mark, quoted names, spaces, "\r\n" and a blank line are all accepted.
  const std::string path =
      WriteFile("good.csv",
                "\xEF\xBB\xBF\"sepal\", species ,petal\r\n1.5,0,2\r\n\r\n-3,2, 4e-1\r\n0.25,1,0\n");
  absl::StatusOr<Dataset> data = ReadCsv(path, "species", ',', /*classification=*/true, AnyPath());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->features.shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_THAT(data->features.span(), ElementsAre(1.5f, 2.0f, -3.0f, 0.4f, 0.25f, 0.0f));
  EXPECT_EQ(data->targets.shape(), (std::vector<int64_t>{3}));
  EXPECT_THAT(data->targets.span(), ElementsAre(0, 2, 1));
  EXPECT_EQ(data->num_classes, 3);
}

TEST(CsvTest, RegressionTargetsAreAColumn) {
  const std::string path = WriteFile("regression.csv", "x,y\n1,0.5\n2,-1.25\n");
  absl::StatusOr<Dataset> data = ReadCsv(path, "y", ',', /*classification=*/false, AnyPath());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->targets.shape(), (std::vector<int64_t>{2, 1}));
  EXPECT_THAT(data->targets.span(), ElementsAre(0.5f, -1.25f));
  EXPECT_EQ(data->num_classes, 0);
}

TEST(CsvTest, CustomDelimiterAndGzip) {
  const std::string semicolon = WriteFile("semicolon.csv.gz", "a;b;label\n1;2;1\n3;4;0\n", true);
  absl::StatusOr<Dataset> data = ReadCsv(semicolon, "label", ';', true, AnyPath());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->features.span(), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(data->targets.span(), ElementsAre(1, 0));

  const std::string tab = WriteFile("tab.tsv", "label\ta\n1\t7\n");
  data = ReadCsv(tab, "label", '\t', true, AnyPath());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->features.span(), ElementsAre(7));
  // The same file split at the wrong delimiter has one column and no label column.
  EXPECT_EQ(ReadCsv(tab, "label", ',', true, AnyPath()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CsvTest, MissingLabelColumnCountsTheColumnsWithoutQuotingThem) {
  const std::string path = WriteFile("nolabel.csv", "alpha,beta\n1,2\n");
  EXPECT_THAT(ReadCsv(path, "label", ',', true, AnyPath()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path + ":1:"), HasSubstr("'label'"),
                             HasSubstr("header of 2 columns"), Not(HasSubstr("alpha")),
                             Not(HasSubstr("beta")))));
}

TEST(CsvTest, NonNumericCellNamesLineAndColumn) {
  const std::string path = WriteFile("iris.csv", "petal_width,species\n1.0,0\n\nabc,1\n");
  EXPECT_THAT(ReadCsv(path, "species", ',', true, AnyPath()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::Eq(
                           absl::StrCat(path, ":4: column 1: not a number"))));

  const std::string inf = WriteFile("inf.csv", "x,y\n1,inf\n");
  EXPECT_THAT(ReadCsv(inf, "y", ',', false, AnyPath()).status().message(),
              AllOf(HasSubstr(inf + ":2: column 2 ('y', the label)"),
                    HasSubstr("not a finite number"), Not(HasSubstr("inf\n"))));
  const std::string empty_cell = WriteFile("emptycell.csv", "x,y\n,1\n");
  EXPECT_THAT(ReadCsv(empty_cell, "y", ',', false, AnyPath()).status().message(),
              HasSubstr(empty_cell + ":2: column 1: empty"));
}

TEST(CsvTest, ClassLabelsMustBeNonNegativeIntegers) {
  for (const std::string label : {"-1", "1.5"}) {
    const std::string path = WriteFile("badlabel.csv", "x,y\n1,0\n2," + label + "\n");
    EXPECT_THAT(ReadCsv(path, "y", ',', true, AnyPath()).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(path + ":3: column 2 ('y', the label)"),
                               Not(HasSubstr(label)), HasSubstr("non-negative integer"))));
    // The same values are fine as regression targets.
    EXPECT_TRUE(ReadCsv(path, "y", ',', false, AnyPath()).ok());
  }
}

// Whatever a file holds, no error quotes it: a job's error is readable by everyone who may get
// the job.
TEST(CsvTest, ErrorsNeverQuoteTheFile) {
  const std::string secret = "SECRET-5b1e";
  for (const std::string& content :
       {secret + "=1,y\n" + secret + ",0\n", "x,y\n" + secret + ",0\n", "x,y\n1," + secret + "\n",
        secret + "\n", "x,y\n1,2," + secret + "\n", "x," + secret + "\n1,2\n"}) {
    const std::string path = WriteFile("secret.csv", content);
    for (bool classification : {true, false}) {
      const absl::Status s = ReadCsv(path, "y", ',', classification, AnyPath()).status();
      EXPECT_FALSE(s.ok()) << content;
      EXPECT_THAT(s.message(), Not(HasSubstr("SECRET"))) << content;
    }
  }
  const std::string idx = WriteFile("secret.idx", secret + secret);
  const absl::Status s = ReadIdx(idx, idx, AnyPath()).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), Not(HasSubstr("SECRET")));
  EXPECT_THAT(s.message(), Not(HasSubstr("0x53454352")));  // "SECR" as a magic number
}

TEST(CsvTest, OverlongLinesAreRefused) {
  const std::string path = WriteFile("long.csv", "x,y\n" + std::string((16 << 20) + 1, '1') + "\n");
  EXPECT_THAT(ReadCsv(path, "y", ',', false, AnyPath()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path + ":2: the line is 16777217 bytes"),
                             HasSubstr("more than the limit"))));
}

TEST(LoadSplitTest, ConfinedAccessReadsOnlyUnderTheRoots) {
  const std::string path = WriteFile("confined.csv", "x,y\n1,0\n2,1\n");
  v1::DataSpec spec;
  spec.set_format(v1::DATA_FORMAT_CSV);
  spec.mutable_csv()->set_label_column("y");
  spec.mutable_train()->set_path(path);
  const absl::Status none = LoadSplit(spec, false, 1, true, DataAccess::Confined({})).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kPermissionDenied) << none;
  EXPECT_THAT(none.message(), HasSubstr("train split: " + path));
  std::string dir = ::testing::TempDir();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  EXPECT_TRUE(LoadSplit(spec, false, 1, true, DataAccess::Confined({dir})).ok());
  DataAccess small = DataAccess::Confined({dir});
  small.max_file_bytes = 4;
  EXPECT_EQ(LoadSplit(spec, false, 1, true, small).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CsvTest, RaggedRowIsRejected) {
  const std::string path = WriteFile("ragged.csv", "a,b,label\n1,2,0\n3,1\n");
  EXPECT_THAT(
      ReadCsv(path, "label", ',', true, AnyPath()).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::Eq(absl::StrCat(path, ":3: 2 fields, but the header has 3 columns"))));
}

TEST(CsvTest, EmptyHeaderOnlyAndMissingFiles) {
  const std::string empty = WriteFile("empty.csv", "\n\n");
  EXPECT_THAT(ReadCsv(empty, "y", ',', true, AnyPath()).status().message(), HasSubstr("header"));
  const std::string header_only = WriteFile("header.csv", "x,y\n");
  EXPECT_THAT(ReadCsv(header_only, "y", ',', true, AnyPath()).status().message(),
              AllOf(HasSubstr(header_only), HasSubstr("no data rows")));
  const std::string label_only = WriteFile("labelonly.csv", "y\n1\n");
  EXPECT_THAT(ReadCsv(label_only, "y", ',', true, AnyPath()).status().message(),
              HasSubstr("no feature columns"));
  const std::string twice = WriteFile("twice.csv", "y,x,y\n1,2,3\n");
  EXPECT_THAT(ReadCsv(twice, "y", ',', true, AnyPath()).status().message(), HasSubstr("more than one"));
  EXPECT_THAT(ReadCsv(TempPath("missing.csv"), "y", ',', true, AnyPath()).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.csv")));
}

// --- Synthetic ----------------------------------------------------------------------------------

v1::SyntheticOptions Synthetic(v1::SyntheticTask task, int64_t train, int64_t test,
                               int64_t features, int64_t outputs, double noise) {
  v1::SyntheticOptions options;
  options.set_task(task);
  options.set_num_train_examples(train);
  options.set_num_test_examples(test);
  options.set_num_features(features);
  options.set_num_outputs(outputs);
  options.set_noise(noise);
  return options;
}

// Accuracy on `test` of the nearest-centroid classifier fitted to `train`.
double NearestCentroidAccuracy(const Dataset& train, const Dataset& test) {
  const int64_t k = train.num_classes, f = train.num_features();
  std::vector<double> centroids(k * f, 0.0), counts(k, 0.0);
  for (int64_t i = 0; i < train.num_examples(); ++i) {
    const int64_t c = static_cast<int64_t>(train.targets.data()[i]);
    counts[c] += 1;
    for (int64_t j = 0; j < f; ++j) centroids[c * f + j] += train.features.data()[i * f + j];
  }
  for (int64_t c = 0; c < k; ++c) {
    for (int64_t j = 0; j < f; ++j) centroids[c * f + j] /= counts[c];
  }
  int64_t correct = 0;
  for (int64_t i = 0; i < test.num_examples(); ++i) {
    int64_t best = 0;
    double best_distance = INFINITY;
    for (int64_t c = 0; c < k; ++c) {
      double distance = 0;
      for (int64_t j = 0; j < f; ++j) {
        const double d = test.features.data()[i * f + j] - centroids[c * f + j];
        distance += d * d;
      }
      if (distance < best_distance) best_distance = distance, best = c;
    }
    correct += best == static_cast<int64_t>(test.targets.data()[i]);
  }
  return static_cast<double>(correct) / static_cast<double>(test.num_examples());
}

TEST(SyntheticTest, ClassificationShapesLabelsAndDeterminism) {
  const v1::SyntheticOptions options =
      Synthetic(v1::SYNTHETIC_TASK_CLASSIFICATION, 500, 200, 8, 4, 0.0);
  const Dataset train = MakeSynthetic(options, 42, false);
  const Dataset test = MakeSynthetic(options, 42, true);
  EXPECT_EQ(train.features.shape(), (std::vector<int64_t>{500, 8}));
  EXPECT_EQ(train.targets.shape(), (std::vector<int64_t>{500}));
  EXPECT_EQ(test.features.shape(), (std::vector<int64_t>{200, 8}));
  EXPECT_EQ(train.num_classes, 4);
  std::vector<int> seen(4, 0);
  for (float label : train.targets.span()) {
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 4);
    ASSERT_EQ(label, std::floor(label));
    ++seen[static_cast<int>(label)];
  }
  for (int count : seen) EXPECT_GT(count, 80);

  const Dataset again = MakeSynthetic(options, 42, false);
  EXPECT_EQ(again.features, train.features);
  EXPECT_EQ(again.targets, train.targets);
  EXPECT_FALSE(MakeSynthetic(options, 43, false).features == train.features);
  EXPECT_FALSE(test.features == *train.features.SliceRows(0, 200));
}

TEST(SyntheticTest, ClassificationSplitsShareTheirClassesAndOverlapALittle) {
  // Default noise: a classifier fitted to train mostly, but not always, gets test examples right.
  v1::SyntheticOptions options =
      Synthetic(v1::SYNTHETIC_TASK_CLASSIFICATION, 2000, 1000, 16, 5, 0.0);
  double accuracy =
      NearestCentroidAccuracy(MakeSynthetic(options, 7, false), MakeSynthetic(options, 7, true));
  EXPECT_GT(accuracy, 0.75);
  EXPECT_LT(accuracy, 1.0);
  // Little noise: the classes separate.
  options.set_noise(0.1);
  accuracy =
      NearestCentroidAccuracy(MakeSynthetic(options, 7, false), MakeSynthetic(options, 7, true));
  EXPECT_EQ(accuracy, 1.0);
}

// Least-squares fit of targets = [x, 1] theta by the normal equations; returns theta
// ([features + 1, outputs], row-major).
std::vector<double> FitAffine(const Dataset& data) {
  const int64_t f = data.num_features(), p = f + 1, o = data.targets.dim(1);
  std::vector<double> a(p * p, 0.0), b(p * o, 0.0);
  for (int64_t i = 0; i < data.num_examples(); ++i) {
    std::vector<double> x(data.features.data() + i * f, data.features.data() + (i + 1) * f);
    x.push_back(1.0);
    for (int64_t r = 0; r < p; ++r) {
      for (int64_t c = 0; c < p; ++c) a[r * p + c] += x[r] * x[c];
      for (int64_t c = 0; c < o; ++c) b[r * o + c] += x[r] * data.targets.data()[i * o + c];
    }
  }
  // Gauss-Jordan elimination; A is symmetric positive definite, so no pivoting is needed.
  for (int64_t r = 0; r < p; ++r) {
    const double pivot = a[r * p + r];
    for (int64_t c = 0; c < p; ++c) a[r * p + c] /= pivot;
    for (int64_t c = 0; c < o; ++c) b[r * o + c] /= pivot;
    for (int64_t s = 0; s < p; ++s) {
      if (s == r) continue;
      const double factor = a[s * p + r];
      for (int64_t c = 0; c < p; ++c) a[s * p + c] -= factor * a[r * p + c];
      for (int64_t c = 0; c < o; ++c) b[s * o + c] -= factor * b[r * o + c];
    }
  }
  return b;
}

// Root mean square of targets - [x, 1] theta.
double AffineResidual(const Dataset& data, const std::vector<double>& theta) {
  const int64_t f = data.num_features(), o = data.targets.dim(1);
  double sum = 0;
  for (int64_t i = 0; i < data.num_examples(); ++i) {
    for (int64_t c = 0; c < o; ++c) {
      double prediction = theta[f * o + c];
      for (int64_t j = 0; j < f; ++j) {
        prediction += data.features.data()[i * f + j] * theta[j * o + c];
      }
      const double r = data.targets.data()[i * o + c] - prediction;
      sum += r * r;
    }
  }
  return std::sqrt(sum / static_cast<double>(data.num_examples() * o));
}

TEST(SyntheticTest, RegressionTargetsAreAffineInTheFeaturesOnBothSplits) {
  v1::SyntheticOptions options = Synthetic(v1::SYNTHETIC_TASK_REGRESSION, 300, 100, 3, 2, 0.0);
  const Dataset train = MakeSynthetic(options, 5, false);
  const Dataset test = MakeSynthetic(options, 5, true);
  EXPECT_EQ(train.features.shape(), (std::vector<int64_t>{300, 3}));
  EXPECT_EQ(train.targets.shape(), (std::vector<int64_t>{300, 2}));
  EXPECT_EQ(test.targets.shape(), (std::vector<int64_t>{100, 2}));
  EXPECT_EQ(train.num_classes, 0);
  // Fitted on train, exact on test: the same W_true and b_true.
  EXPECT_LT(AffineResidual(test, FitAffine(train)), 1e-5);

  // With noise, the residual is the noise; the features stay the same.
  options.set_noise(0.5);
  const Dataset noisy = MakeSynthetic(options, 5, false);
  EXPECT_EQ(noisy.features, train.features);
  EXPECT_NEAR(AffineResidual(noisy, FitAffine(noisy)), 0.5, 0.05);
  EXPECT_NEAR(AffineResidual(MakeSynthetic(options, 5, true), FitAffine(train)), 0.5, 0.08);
}

// --- LoadSplit ----------------------------------------------------------------------------------

TEST(LoadSplitTest, IdxTrainAndTest) {
  v1::DataSpec spec;
  spec.set_format(v1::DATA_FORMAT_IDX);
  spec.mutable_train()->set_images(WriteFile("ls-images", Idx(kImages, {3, 2, 2}, kPixels)));
  spec.mutable_train()->set_labels(WriteFile("ls-labels", Idx(kLabels, {3}, kLabelBytes)));
  absl::StatusOr<Dataset> train = LoadSplit(spec, false, 1, true, AnyPath());
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->num_examples(), 3);

  EXPECT_THAT(LoadSplit(spec, true, 1, true, AnyPath()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("test split"), HasSubstr("spec.data.test"))));

  spec.mutable_test()->set_images(TempPath("ls-missing"));
  spec.mutable_test()->set_labels(spec.train().labels());
  EXPECT_THAT(LoadSplit(spec, true, 1, true, AnyPath()).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("test split: "), HasSubstr("ls-missing"))));

  EXPECT_EQ(LoadSplit(spec, false, 1, /*classification=*/false, AnyPath()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LoadSplitTest, CsvUsesTheSpecsDelimiter) {
  v1::DataSpec spec;
  spec.set_format(v1::DATA_FORMAT_CSV);
  spec.mutable_train()->set_path(WriteFile("ls.csv", "a;y\n1;2\n"));
  spec.mutable_csv()->set_label_column("y");
  spec.mutable_csv()->set_delimiter(";");
  absl::StatusOr<Dataset> data = LoadSplit(spec, false, 1, false, AnyPath());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->targets.span(), ElementsAre(2));
  spec.mutable_csv()->set_delimiter(";;");
  EXPECT_THAT(LoadSplit(spec, false, 1, false, AnyPath()).status().message(),
              HasSubstr("spec.data.csv.delimiter"));
}

TEST(LoadSplitTest, SyntheticSplitsAndTheirErrors) {
  v1::DataSpec spec;
  spec.set_format(v1::DATA_FORMAT_SYNTHETIC);
  *spec.mutable_synthetic() = Synthetic(v1::SYNTHETIC_TASK_CLASSIFICATION, 50, 20, 4, 3, 0.2);
  absl::StatusOr<Dataset> train = LoadSplit(spec, false, 9, true, AnyPath());
  absl::StatusOr<Dataset> test = LoadSplit(spec, true, 9, true, AnyPath());
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(train->features, MakeSynthetic(spec.synthetic(), 9, false).features);
  EXPECT_EQ(test->num_examples(), 20);

  EXPECT_THAT(LoadSplit(spec, false, 9, /*classification=*/false, AnyPath()).status().message(),
              HasSubstr("does not suit"));
  spec.mutable_synthetic()->set_num_features(0);
  EXPECT_THAT(LoadSplit(spec, false, 9, true, AnyPath()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train split: spec.data.synthetic.num_features: must be in [1,")));
  spec.mutable_synthetic()->set_num_test_examples(0);
  EXPECT_EQ(LoadSplit(spec, true, 9, true, AnyPath()).status().code(), absl::StatusCode::kFailedPrecondition);

  EXPECT_THAT(LoadSplit(v1::DataSpec(), false, 9, true, AnyPath()).status().message(),
              HasSubstr("spec.data.format"));
}

}  // namespace
}  // namespace substrax
