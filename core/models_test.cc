#include "core/models.h"

#include <set>

#include "absl/strings/ascii.h"
#include "core/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

// The table covers every model type of the proto, with the YAML name the reader derives from
// the enum.
TEST(ModelTableTest, HasOneRowPerModelType) {
  const google::protobuf::EnumDescriptor* types = v1::ModelType_descriptor();
  EXPECT_EQ(ModelTable().size(), static_cast<size_t>(types->value_count() - 1));
  for (int i = 1; i < types->value_count(); ++i) {
    const ModelInfo* info = FindModel(static_cast<v1::ModelType>(types->value(i)->number()));
    ASSERT_NE(info, nullptr) << types->value(i)->name();
    EXPECT_EQ(types->value(i)->name(), "MODEL_TYPE_" + absl::AsciiStrToUpper(info->name));
    for (const std::string& field : info->fields) {
      EXPECT_NE(v1::ModelSpec::descriptor()->FindFieldByName(field), nullptr) << field;
    }
  }
  EXPECT_EQ(FindModel(v1::MODEL_TYPE_UNSPECIFIED), nullptr);
}

TEST(ModelTableTest, NamesTasksAndFieldsAsDocumented) {
  EXPECT_EQ(ModelTypeName(v1::MODEL_TYPE_SOFTMAX_REGRESSION), "softmax_regression");
  EXPECT_TRUE(IsClassification(v1::MODEL_TYPE_MLP));
  EXPECT_FALSE(IsClassification(v1::MODEL_TYPE_LINEAR));
  EXPECT_TRUE(FindModel(v1::MODEL_TYPE_MLP)->Uses("hidden_sizes"));
  EXPECT_FALSE(FindModel(v1::MODEL_TYPE_LINEAR)->Uses("num_classes"));
  EXPECT_THAT(ModelNames([](const ModelInfo& m) { return m.tensor_parallel; }),
              ::testing::ElementsAre("mlp"));
}

}  // namespace
}  // namespace substrax
