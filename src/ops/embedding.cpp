// Token embedding: rows of a (V, C) table picked by i32 ids, and its
// backward, a scatter-add of the output gradient's rows into a (V, C)
// gradient: a new one, or the table's accumulated f32 gradient given as a
// third input (core::grad_sink), which saves a (V, C) buffer, its zeroing
// and an accumulate per step. The kernel is chosen by the table's dtype (input 1), not by the
// ids. An out-of-range id is a user error (wrong vocabulary, corrupt data), so
// kernels check every id first and throw a core::Error naming it instead of
// reading out of bounds.
#include "brisk/core/autograd.h"
#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

std::vector<TensorMeta> infer_embedding(std::span<const TensorMeta> in, const core::OpParams&) {
  constexpr std::string_view op = "embedding";
  check_count(op, in, 2);
  check_dtype(op, in[0], DType::i32, "ids");
  check_float(op, in, {1});
  check_shape(in[1].shape.rank() == 2, op, "table must be (V, C)", in);
  Shape out = in[0].shape;
  check_shape(out.rank() < core::kMaxRank, op, "ids rank too large", in);
  out.push_back(in[1].shape[1]);
  return {TensorMeta{out, in[1].dtype}};
}

// Throws core::Error naming the first id outside [0, V).
void check_ids(std::string_view op, const TensorView& ids, int64_t v) {
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t id = int64_t(ld(ids, i));
    if (id < 0 || id >= v)
      throw core::Error(std::string(op) + ": id " + std::to_string(id) + " at position " + std::to_string(i) +
                        " is out of range [0, " + std::to_string(v) + ")");
  }
}

void embedding_reference(const KernelCall& c) {
  const TensorView &ids = c.in(0), &table = c.in(1), &y = c.out(0);
  const int64_t v = table.shape()[0], C = table.shape()[1];
  check_ids("embedding", ids, v);
  for (int64_t n = 0; n < ids.numel(); ++n) {
    const int64_t id = int64_t(ld(ids, n));
    for (int64_t i = 0; i < C; ++i) st(y, n * C + i, ld(table, id * C + i));
  }
}

// inputs dy (..., C), ids (...)[, into (V, C) f32] -> (V, C)
std::vector<TensorMeta> infer_embedding_backward(std::span<const TensorMeta> in, const core::OpParams& params) {
  constexpr std::string_view op = "embedding_backward";
  check_shape(in.size() == 2 || in.size() == 3, op, "takes dy, ids and optionally an f32 accumulator", in);
  check_float(op, in, {0});
  check_dtype(op, in[1], DType::i32, "ids");
  const Shape &dy = in[0].shape, &ids = in[1].shape;
  bool ok = dy.rank() == ids.rank() + 1;
  for (int i = 0; ok && i < ids.rank(); ++i) ok = dy[i] == ids[i];
  check_shape(ok, op, "dy must be (ids..., C)", in);
  const int64_t v = std::get<EmbeddingBackwardParams>(params).num_embeddings;
  check_shape(v > 0, op, "num_embeddings must be > 0", in);
  const TensorMeta out{Shape{v, dy.last()}, in[0].dtype};
  if (in.size() == 3)
    check_shape(in[0].dtype == DType::f32 && in[2] == out, op, "the accumulator must be f32 (V, C), with f32 dy", in);
  return {out};
}

void embedding_backward_reference(const KernelCall& c) {
  const TensorView &dy = c.in(0), &ids = c.in(1), &dt = c.out(0);
  const int64_t v = dt.shape()[0], C = dt.shape()[1];
  check_ids("embedding_backward", ids, v);
  std::vector<double> acc(size_t(v * C), 0.0);
  if (c.inputs.size() == 3)
    for (int64_t i = 0; i < v * C; ++i) acc[size_t(i)] = ld(c.in(2), i);
  for (int64_t n = 0; n < ids.numel(); ++n) {
    const int64_t id = int64_t(ld(ids, n));
    for (int64_t i = 0; i < C; ++i) acc[size_t(id * C + i)] += ld(dy, n * C + i);
  }
  for (int64_t i = 0; i < v * C; ++i) st(dt, i, acc[size_t(i)]);
}

ValueId embedding_backward(Graph& g, ValueId dy, ValueId ids, int64_t num_embeddings, ValueId into) {
  register_ops();
  if (into != core::kNoValue && g.meta(dy).dtype == DType::f32)
    return g.add_node1(OpKind::embedding_backward, {dy, ids, into}, EmbeddingBackwardParams{num_embeddings});
  return g.add_node1(OpKind::embedding_backward, {dy, ids}, EmbeddingBackwardParams{num_embeddings});
}

}  // namespace

core::OpDef embedding_def() {
  OpDef d;
  d.kind = OpKind::embedding;
  d.name = "embedding";
  d.infer = infer_embedding;
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    if (dy[0] == core::kNoValue) return {core::kNoValue, core::kNoValue};
    return {core::kNoValue, embedding_backward(g, dy[0], n.inputs[0], g.shape(n.inputs[1])[0],
                                               core::grad_sink(g, n, n.inputs[1]))};
  };
  d.reference = embedding_reference;
  d.kernel_dtype_input = 1;
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      const std::string tag = t == DType::f32 ? "" : " bf16";
      cases.push_back({"(2,7) V13 C33" + tag, {ids_spec({2, 7}, 13), spec({13, 33}, t)}, NoParams{}});
      cases.push_back({"(5) V3 C8" + tag, {ids_spec({5}, 3), spec({3, 8}, t)}, NoParams{}});
    }
    cases.push_back({"(4,16) V50 C64", {ids_spec({4, 16}, 50), spec({50, 64})}, NoParams{}});
    return cases;
  };
  return d;
}

core::OpDef embedding_backward_def() {
  OpDef d;
  d.kind = OpKind::embedding_backward;
  d.name = "embedding_backward";
  d.infer = infer_embedding_backward;
  d.reference = embedding_backward_reference;
  d.kernel_dtype_input = 0;
  d.output_aliases = {2};  // over the accumulator, when given
  // Low-precision gradients accumulate in an f32 copy of the whole table.
  d.workspace_bytes = [](std::span<const TensorMeta> in, const core::OpParams& params) -> size_t {
    if (in[0].dtype == DType::f32) return 0;
    return size_t(std::get<EmbeddingBackwardParams>(params).num_embeddings * in[0].shape.last()) * sizeof(float);
  };
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      const std::string tag = t == DType::f32 ? "" : " bf16";
      // Few embeddings, many ids: rows collide, which is what the scatter-add must sum.
      cases.push_back({"(2,7) V5 C33" + tag, {spec({2, 7, 33}, t), ids_spec({2, 7}, 5)},
                       EmbeddingBackwardParams{5}});
      cases.push_back({"(40) V13 C17" + tag, {spec({40, 17}, t), ids_spec({40}, 13)}, EmbeddingBackwardParams{13}});
    }
    cases.push_back({"(4,64) V50 C64", {spec({4, 64, 64}), ids_spec({4, 64}, 50)}, EmbeddingBackwardParams{50}});
    // Added to a random accumulator (a kernel that overwrites it fails).
    cases.push_back({"into, (2,7) V5 C33", {spec({2, 7, 33}), ids_spec({2, 7}, 5), no_grad(spec({5, 33}))},
                     EmbeddingBackwardParams{5}});
    cases.push_back({"into, (4,64) V50 C64", {spec({4, 64, 64}), ids_spec({4, 64}, 50), no_grad(spec({50, 64}))},
                     EmbeddingBackwardParams{50}});
    // ~85 ids per row: the GPU kernel's many-ids path (a frequent token), into the accumulator.
    cases.push_back({"into, (4,64) V3 C64", {spec({4, 64, 64}), ids_spec({4, 64}, 3), no_grad(spec({3, 64}))},
                     EmbeddingBackwardParams{3}});
    return cases;
  };
  return d;
}

ValueId embedding(Graph& g, ValueId ids, ValueId table) {
  register_ops();
  return g.add_node1(OpKind::embedding, {ids, table});
}

}  // namespace brisk::ops
