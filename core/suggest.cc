#include "core/suggest.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace substrax {

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string DidYouMean(absl::string_view name, const std::vector<std::string>& candidates) {
  std::string hint;
  // Two edits catch the usual typos (a dropped or doubled letter, a swap) without suggesting
  // unrelated short names.
  for (const std::string& c : candidates) {
    if (EditDistance(name, c) <= 2) hint = absl::StrCat(" (did you mean '", c, "'?)");
  }
  return hint;
}

}  // namespace substrax
