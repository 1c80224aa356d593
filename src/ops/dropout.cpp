// Dropout (inverted, as torch.nn.functional.dropout in training): each
// element is kept with probability 1 - p and scaled by 1 / (1 - p), or
// zeroed. The mask comes from brisk/ops/dropout.h's hash of the key input
// (two i32 words a training micro-step writes), the op's site and the
// element's index, so nothing is stored for the backward: y = x * m / (1 - p)
// has dx = dy * m / (1 - p), the same op with the same key on dy.
#include "brisk/ops/dropout.h"

#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

void check_p(float p) {
  if (!(p >= 0.f && p < 1.f))
    throw core::ShapeError("dropout: p must be in [0, 1), got " + std::to_string(p));
}

}  // namespace

core::OpDef dropout_def() {
  OpDef d;
  d.kind = OpKind::dropout;
  d.name = "dropout";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& params) {
    check_count("dropout", in, 2);
    check_float("dropout", in, {0});
    check_dtype("dropout", in[1], DType::i32, "key");
    check_shape(in[1].shape == Shape{2}, "dropout", "key must be (2)", in);
    check_p(std::get<DropoutParams>(params).p);
    return std::vector<TensorMeta>{in[0]};
  };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    const auto& p = std::get<DropoutParams>(n.params);
    return {dropout(g, dy[0], n.inputs[1], p.p, p.site), core::kNoValue};
  };
  d.reference = [](const KernelCall& c) {
    const auto& p = c.p<DropoutParams>();
    const TensorView &x = c.in(0), &key = c.in(1), &y = c.out(0);
    const uint32_t k0 = uint32_t(int32_t(ld(key, 0))), k1 = uint32_t(int32_t(ld(key, 1)));
    const uint32_t threshold = dropout_threshold(p.p);
    const double scale = 1.0 / (1.0 - double(p.p));
    for (int64_t i = 0; i < x.numel(); ++i)
      st(y, i, dropout_bits_at(k0, k1, p.site, uint64_t(i)) >= threshold ? ld(x, i) * scale : 0.0);
  };
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      const InputSpec key = ids_spec({2}, int64_t(1) << 30);
      cases.push_back({"p 0.1", {spec({7, 13}, t), key}, DropoutParams{0.1f, 0}});
      cases.push_back({"p 0.5 site 3", {spec({2, 5, 33}, t), key}, DropoutParams{0.5f, 3}});
      cases.push_back({"p 0", {spec({64}, t), key}, DropoutParams{0.f, 1}});
      cases.push_back({"p 0.9 threaded", {spec({70001}, t), key}, DropoutParams{0.9f, 7}});
    }
    return cases;
  };
  return d;
}

ValueId dropout(Graph& g, ValueId x, ValueId key, float p, uint32_t site) {
  register_ops();
  return g.add_node1(OpKind::dropout, {x, key}, DropoutParams{p, site});
}

}  // namespace brisk::ops
