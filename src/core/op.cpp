// The op table that the ops layer fills (see op.h for why it is filled at
// start-up rather than linked).
#include "brisk/core/op.h"

#include <array>
#include <memory>

#include "brisk/core/error.h"

namespace brisk::core {

namespace {
constexpr std::array<std::string_view, kNumOps> kOpNames = {
#define BRISK_OP(name) #name,
#include "brisk/core/op_list.inc"
#undef BRISK_OP
};

std::array<std::unique_ptr<OpDef>, kNumOps>& table() {
  static std::array<std::unique_ptr<OpDef>, kNumOps> t;
  return t;
}
}  // namespace

std::string_view op_name(OpKind k) { return kOpNames[size_t(k)]; }

void set_op_def(const OpDef& def) { table()[size_t(def.kind)] = std::make_unique<OpDef>(def); }

bool op_registered(OpKind k) { return table()[size_t(k)] != nullptr; }

const OpDef& op_def(OpKind k) {
  const auto& d = table()[size_t(k)];
  if (!d)
    throw BackendError("op '" + std::string(op_name(k)) +
                       "' has no definition: link brisk_ops and call brisk::ops::register_ops()");
  return *d;
}

}  // namespace brisk::core
