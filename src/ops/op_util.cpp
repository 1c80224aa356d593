// Error helpers for op definitions: every message names the op, says what was
// expected and lists the shapes it got.
#include "op_util.h"

namespace brisk::ops::detail {

namespace {
std::string describe(std::span<const TensorMeta> inputs) {
  std::string s;
  for (size_t i = 0; i < inputs.size(); ++i) s += (i ? ", " : "") + inputs[i].str();
  return s;
}
}  // namespace

void check_shape(bool ok, std::string_view op, const std::string& what, std::span<const TensorMeta> inputs) {
  if (!ok) throw core::ShapeError(std::string(op) + ": " + what + " (got " + describe(inputs) + ")");
}

void check_float(std::string_view op, std::span<const TensorMeta> inputs, std::initializer_list<int> which) {
  for (int i : which)
    if (!core::dtype_is_float(inputs[size_t(i)].dtype))
      throw core::DTypeError(std::string(op) + ": input " + std::to_string(i) +
                             " must be a float type (f32, bf16, f16), got " + describe(inputs));
}

void check_dtype(std::string_view op, const TensorMeta& m, DType want, const std::string& what) {
  if (m.dtype != want)
    throw core::DTypeError(std::string(op) + ": " + what + " must be " + std::string(core::dtype_name(want)) +
                           ", got " + m.str());
}

void check_count(std::string_view op, std::span<const TensorMeta> inputs, size_t n) {
  if (inputs.size() != n)
    throw core::ShapeError(std::string(op) + ": expects " + std::to_string(n) + " inputs, got " +
                           std::to_string(inputs.size()) + " (" + describe(inputs) + ")");
}

}  // namespace brisk::ops::detail
