// "Did you mean" suggestions for names a user mistyped (YAML keys, optimizer hyper-parameters).
//
// Pure functions; thread-safe.
#ifndef SUBSTRAX_CORE_SUGGEST_H_
#define SUBSTRAX_CORE_SUGGEST_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace substrax {

// Levenshtein distance between `a` and `b`.
size_t EditDistance(absl::string_view a, absl::string_view b);

// " (did you mean 'x'?)" for the last of `candidates` within two edits of `name`, else "".
std::string DidYouMean(absl::string_view name, const std::vector<std::string>& candidates);

}  // namespace substrax

#endif  // SUBSTRAX_CORE_SUGGEST_H_
