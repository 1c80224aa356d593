// How deep a parsed JSON value nests, found without recursing. nlohmann's
// dump(), its copies (an ordered_json object copies its members as it
// grows) and a schema walk all recurse once per level, and a request's body
// may nest 400,000 deep within its size limit: checked first, that is a
// 400, not a stack overflow.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace brisk::core {

// 1 for a scalar, 2 for [1], ... (nlohmann::json or ordered_json).
template <class Json>
size_t json_nesting(const Json& v) {
  size_t deepest = 0;
  std::vector<std::pair<const Json*, size_t>> todo = {{&v, 1}};
  while (!todo.empty()) {
    const auto [at, depth] = todo.back();
    todo.pop_back();
    deepest = std::max(deepest, depth);
    if (at->is_structured())
      for (const Json& child : *at) todo.emplace_back(&child, depth + 1);
  }
  return deepest;
}

}  // namespace brisk::core
