// Every op named in op_list.inc is defined, named consistently and has test
// cases: an op without test cases fails the suite.
#include <gtest/gtest.h>

#include "brisk/core/op.h"
#include "brisk/ops/ops.h"

using namespace brisk;

TEST(OpTable, EveryOpIsDefinedWithTestCases) {
  ops::register_ops();
  for (int i = 0; i < core::kNumOps; ++i) {
    const auto k = core::OpKind(i);
    ASSERT_TRUE(core::op_registered(k)) << core::op_name(k);
    const core::OpDef& d = core::op_def(k);
    EXPECT_EQ(d.kind, k);
    EXPECT_EQ(d.name, core::op_name(k));
    ASSERT_NE(d.infer, nullptr) << d.name;
    ASSERT_NE(d.reference, nullptr) << d.name;
    ASSERT_NE(d.test_cases, nullptr) << d.name << " has no test cases";
    EXPECT_FALSE(d.test_cases().empty()) << d.name << " has no test cases";
  }
}
