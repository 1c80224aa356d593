// What a resumed run reports as changed (src/train/resume_changes.cpp): a
// changed value is named, a setting that does not shape the updates is not,
// and a key the stopped run's config predates counts as its default.
#include <gtest/gtest.h>

#include "../../src/train/resume_changes.h"

using brisk::train::detail::changed_settings;

TEST(ResumeChanges, NamesChangedValuesAndTakesMissingKeysAsTheirDefaults) {
  const std::string old_toml = "[train]\nlr = 0.001\nthreads = 2\n";
  const std::string defaults = "[train]\nlr = 0.0006\nthreads = 0\nprecision = \"fp32\"\n";
  // A key written since the stopped run, at its default: nothing changed.
  EXPECT_TRUE(changed_settings(old_toml, "[train]\nlr = 0.001\nthreads = 4\nprecision = \"fp32\"\n", defaults).empty());
  // The same key away from its default is a change, named from the default.
  EXPECT_EQ(changed_settings(old_toml, "[train]\nlr = 0.001\nprecision = \"bf16\"\n", defaults),
            (std::vector<std::string>{"train.precision \"fp32\" -> \"bf16\""}));
  // Without defaults it is "(none)"; a changed lr is named either way.
  EXPECT_EQ(changed_settings(old_toml, "[train]\nlr = 0.002\nprecision = \"fp32\"\n"),
            (std::vector<std::string>{"train.lr 0.001 -> 0.002", "train.precision (none) -> \"fp32\""}));
}
