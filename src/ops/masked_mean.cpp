// Mean over the real positions of a right-padded batch, the encoder's
// pooling: x (B, T, C) f32, lengths (B) i32 -> y (B, C) with
// y[b] = mean of x[b, t] over t < lengths[b]. Padding never enters the mean,
// so a sequence's result does not depend on how far it was padded, and the
// backward gives padded positions exactly zero gradient (which is what lets
// masked_attention's padded query rows drop out of the encoder's gradient).
//
// masked_mean_backward needs T, which neither dy (B, C) nor lengths carries:
// it takes ExpandParams{x's shape, axis 1}, the same parameters as `expand`,
// the backward of a plain mean. lengths gets no gradient. f32 only.
#include "masked_shapes.h"

namespace brisk::ops {
using namespace detail;

namespace {

constexpr std::string_view kFwd = "masked_mean", kBwd = "masked_mean_backward";

// Inputs: x (B, T, C) f32, lengths (B) i32.
std::vector<TensorMeta> infer_forward(std::span<const TensorMeta> in, const core::OpParams&) {
  check_count(kFwd, in, 2);
  check_dtype(kFwd, in[0], DType::f32, "x");
  check_shape(in[0].shape.rank() == 3, kFwd, "x must be (B, T, C)", in);
  check_lengths_meta(kFwd, in, 1, in[0].shape[0]);
  return {TensorMeta{Shape{in[0].shape[0], in[0].shape[2]}, DType::f32}};
}

// Inputs: dy (B, C) f32, lengths (B) i32; params: ExpandParams{(B, T, C), 1}.
std::vector<TensorMeta> infer_backward(std::span<const TensorMeta> in, const core::OpParams& params) {
  check_count(kBwd, in, 2);
  check_dtype(kBwd, in[0], DType::f32, "dy");
  check_shape(in[0].shape.rank() == 2, kBwd, "dy must be (B, C)", in);
  const ExpandParams& p = std::get<ExpandParams>(params);
  const Shape& x = p.shape;
  check_shape(p.axis == 1 && x.rank() == 3 && x[0] == in[0].shape[0] && x[2] == in[0].shape[1] && x[1] >= 1, kBwd,
              "params must be ExpandParams{x's shape (B, T, C), axis 1} for dy (B, C), got shape " + x.str(), in);
  check_lengths_meta(kBwd, in, 1, x[0]);
  return {TensorMeta{x, DType::f32}};
}

void forward_reference(const KernelCall& c) {
  const TensorView &x = c.in(0), &y = c.out(0);
  const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
  const int32_t* lengths = c.in(1).as<const int32_t>();
  check_lengths(kFwd, lengths, B, T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < C; ++i) {
      double acc = 0;
      for (int64_t t = 0; t < lengths[b]; ++t) acc += ld(x, (b * T + t) * C + i);
      st(y, b * C + i, acc / double(lengths[b]));
    }
}

void backward_reference(const KernelCall& c) {
  const TensorView &dy = c.in(0), &dx = c.out(0);
  const int64_t B = dx.shape()[0], T = dx.shape()[1], C = dx.shape()[2];
  const int32_t* lengths = c.in(1).as<const int32_t>();
  check_lengths(kBwd, lengths, B, T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < C; ++i)
        st(dx, (b * T + t) * C + i, t < lengths[b] ? ld(dy, b * C + i) / double(lengths[b]) : 0.0);
}

// (T, C, lengths): every batch mixes 1, T and lengths in between; a single
// position; and one large enough (3 x 40 x 300) for the CPU kernel's threads.
struct Config {
  int64_t T, C;
  std::vector<int> lengths;
};
std::vector<Config> configs() {
  return {{7, 5, {7, 1, 4}}, {130, 33, {1, 130, 64, 65}}, {1, 8, {1}}, {19, 64, {19, 1, 10}}, {40, 300, {40, 1, 23}}};
}

std::string label_of(const Config& k) {
  std::string s = "f32 B" + std::to_string(k.lengths.size()) + " T" + std::to_string(k.T) + " C" + std::to_string(k.C) +
                  " len";
  for (int l : k.lengths) s += " " + std::to_string(l);
  return s;
}

std::vector<TestCase> forward_cases() {
  std::vector<TestCase> cases;
  for (const Config& k : configs())
    cases.push_back({label_of(k), {spec({int64_t(k.lengths.size()), k.T, k.C}), lengths_spec(k.lengths)}, NoParams{}});
  return cases;
}

std::vector<TestCase> backward_cases() {
  std::vector<TestCase> cases;
  for (const Config& k : configs()) {
    const int64_t B = int64_t(k.lengths.size());
    cases.push_back({label_of(k), {no_grad(spec({B, k.C})), lengths_spec(k.lengths)}, ExpandParams{Shape{B, k.T, k.C}, 1}});
  }
  return cases;
}

}  // namespace

// ---- masked_mean ---------------------------------------------------------------------------
core::OpDef masked_mean_def() {
  OpDef d;
  d.kind = OpKind::masked_mean;
  d.name = kFwd;
  d.infer = infer_forward;
  // lengths (input 1) are integers: no gradient.
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    if (dy[0] == core::kNoValue) return {core::kNoValue, core::kNoValue};
    return {g.add_node1(OpKind::masked_mean_backward, {dy[0], n.inputs[1]}, ExpandParams{g.shape(n.inputs[0]), 1}),
            core::kNoValue};
  };
  d.reference = forward_reference;
  d.test_cases = forward_cases;
  return d;
}

// ---- masked_mean_backward ------------------------------------------------------------------
core::OpDef masked_mean_backward_def() {
  OpDef d;
  d.kind = OpKind::masked_mean_backward;
  d.name = kBwd;
  d.infer = infer_backward;
  d.reference = backward_reference;
  d.test_cases = backward_cases;
  return d;
}

// ---- builder -----------------------------------------------------------------------------------
ValueId masked_mean(Graph& g, ValueId x, ValueId lengths) {
  register_ops();
  return g.add_node1(OpKind::masked_mean, {x, lengths});
}

}  // namespace brisk::ops
