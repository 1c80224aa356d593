// A JSON value from a file brisk did not write (a safetensors header, a
// checkpoint's state.json, a dataset's meta.json), as a short text for an
// error message. nlohmann's dump() recurses once per nesting level, so a value
// nested 100,000 deep (which parses fine: the parser is iterative) would
// overflow the stack while reporting it: a value holding containers is only
// described, never dumped.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace brisk::core {

inline std::string json_excerpt(const nlohmann::json& v, size_t max_chars = 60) {
  bool flat = true;
  if (v.is_structured())
    for (const auto& e : v) flat = flat && e.is_primitive();
  std::string s = flat ? v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                       : std::string(v.is_array() ? "an array of " : "an object of ") + std::to_string(v.size()) +
                             (v.is_array() ? " element" : " member") + (v.size() == 1 ? "" : "s");
  return s.size() > max_chars ? s.substr(0, max_chars - 3) + "..." : s;
}

}  // namespace brisk::core
