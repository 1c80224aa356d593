// What the JSON tests share: the mask checked against trying every token.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "brisk/infer/json_constraint.h"

namespace brisk::testing {

// The tokens `vocab.mask` leaves at `json`, after checking, token by token,
// that it leaves exactly those whose bytes accepts() takes (a failure names
// the token).
inline std::vector<size_t> mask_checked(const infer::JsonVocabulary& vocab, const std::vector<std::string>& tokens,
                                        const infer::JsonConstraint& json) {
  std::vector<float> row(tokens.size(), 0.f);
  vocab.mask(json, row.data());
  std::vector<size_t> ok;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const bool brute = !tokens[t].empty() && json.accepts(tokens[t]);
    EXPECT_EQ(row[t] == 0.f, brute) << "token " << ::testing::PrintToString(tokens[t]);
    if (brute) ok.push_back(t);
  }
  return ok;
}

}  // namespace brisk::testing
