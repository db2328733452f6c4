#include "core/suggest.h"

#include "gtest/gtest.h"

namespace substrax {
namespace {

TEST(SuggestTest, EditDistanceCountsInsertionsDeletionsAndSubstitutions) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("b1", "b2"), 1u);
  EXPECT_EQ(EditDistance("hidden_size", "hidden_sizes"), 1u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

TEST(SuggestTest, SuggestsOnlyCloseNames) {
  EXPECT_EQ(DidYouMean("specs", {"apiVersion", "kind", "metadata", "spec"}),
            " (did you mean 'spec'?)");
  EXPECT_EQ(DidYouMean("optimiser", {"model", "data"}), "");
}

}  // namespace
}  // namespace substrax
