// Fills core's op table from op_list.inc: every op listed there must have a
// `<name>_def()` in its family file, or the build fails to link.
#include <mutex>

#include "brisk/ops/ops.h"

namespace brisk::ops {

#define BRISK_OP(name) core::OpDef name##_def();
#include "brisk/core/op_list.inc"
#undef BRISK_OP

void register_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
#define BRISK_OP(name) core::set_op_def(name##_def());
#include "brisk/core/op_list.inc"
#undef BRISK_OP
  });
}

}  // namespace brisk::ops
