// Shape ops: reshape (a view), permute/transpose, split and concat. They only
// move bytes, so they accept every dtype and their reference kernels copy
// whole elements with memcpy instead of going through doubles (which would
// round i64 values above 2^53). Values are always contiguous, so permute
// materializes its result; reshape is the one op that shares memory.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "op_util.h"

namespace brisk::ops {
using namespace detail;

namespace {

// Copies element `src_i` of `src` to element `dst_i` of `dst` (same dtype).
void copy_element(const TensorView& dst, int64_t dst_i, const TensorView& src, int64_t src_i) {
  const size_t es = core::dtype_size(src.dtype());
  std::memcpy(static_cast<char*>(dst.data) + size_t(dst_i) * es,
              static_cast<const char*>(src.data) + size_t(src_i) * es, es);
}

int checked_axis(std::string_view op, const Shape& s, int axis, std::span<const TensorMeta> in) {
  check_shape(axis >= -s.rank() && axis < s.rank(), op,
              "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(s.rank()), in);
  return axis < 0 ? axis + s.rank() : axis;
}

// Resolves a -1 in `want` against `numel`; throws ShapeError if it cannot fit.
Shape resolve_reshape(const Shape& want, std::span<const TensorMeta> in) {
  const int64_t numel = in[0].shape.numel();
  Shape out = want;
  int unknown = -1;
  int64_t known = 1;
  for (int i = 0; i < want.rank(); ++i) {
    if (want[i] == -1) {
      check_shape(unknown < 0, "reshape", "at most one dim of " + want.str() + " may be -1", in);
      unknown = i;
    } else {
      check_shape(want[i] >= 0, "reshape", "dims of " + want.str() + " must be non-negative or -1", in);
      known *= want[i];
    }
  }
  if (unknown >= 0) {
    check_shape(known > 0 && numel % known == 0, "reshape",
                "cannot infer the -1 dim of " + want.str() + " for " + std::to_string(numel) + " elements", in);
    out[unknown] = numel / known;
  }
  check_shape(out.numel() == numel, "reshape",
              "target " + want.str() + " must have " + std::to_string(numel) + " elements", in);
  return out;
}

// (outer, dim, inner) sizes around `axis`.
void around(const Shape& s, int axis, int64_t& outer, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int i = 0; i < axis; ++i) outer *= s[i];
  for (int i = axis + 1; i < s.rank(); ++i) inner *= s[i];
}

// Zeros of a value's shape and dtype: the gradient of a split output nobody used.
ValueId zeros_like(Graph& g, ValueId v) { return fill(g, g.shape(v), g.meta(v).dtype, 0.0); }

}  // namespace

// split() with any number of pieces: SplitParams holds at most kMaxRank sizes,
// so longer lists split into groups first and then split each group.
std::vector<ValueId> split_many(Graph& g, ValueId x, int axis, const std::vector<int64_t>& sizes) {
  if (sizes.size() <= size_t(core::kMaxRank)) return split(g, x, axis, Shape(sizes.begin(), sizes.end()));
  const size_t per = (sizes.size() + core::kMaxRank - 1) / core::kMaxRank;
  Shape group_sizes;
  for (size_t b = 0; b < sizes.size(); b += per)
    group_sizes.push_back(std::accumulate(sizes.begin() + long(b), sizes.begin() + long(std::min(b + per, sizes.size())),
                                          int64_t(0)));
  const std::vector<ValueId> groups = split(g, x, axis, group_sizes);
  std::vector<ValueId> parts;
  for (size_t gi = 0, b = 0; gi < groups.size(); ++gi, b += per) {
    const std::vector<int64_t> sub(sizes.begin() + long(b), sizes.begin() + long(std::min(b + per, sizes.size())));
    for (ValueId v : split_many(g, groups[gi], axis, sub)) parts.push_back(v);
  }
  return parts;
}

// ---- reshape (a view) ---------------------------------------------------------------
core::OpDef reshape_def() {
  OpDef d;
  d.kind = OpKind::reshape;
  d.name = "reshape";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    check_count("reshape", in, 1);
    return std::vector<TensorMeta>{TensorMeta{resolve_reshape(std::get<ReshapeParams>(p).shape, in), in[0].dtype}};
  };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    return {reshape(g, dy[0], g.shape(n.inputs[0]))};
  };
  // Normally the output is the input's memory and there is nothing to do; a
  // caller that gives it separate memory (the op harness) gets a copy.
  d.reference = [](const KernelCall& c) {
    if (c.out(0).data != c.in(0).data)
      for (int64_t i = 0; i < c.in(0).numel(); ++i) copy_element(c.out(0), i, c.in(0), i);
  };
  d.output_aliases = {0};
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      cases.push_back({"flatten", {spec({3, 5, 7}, t)}, ReshapeParams{Shape{105}}});
      cases.push_back({"infer dim", {spec({6, 13}, t)}, ReshapeParams{Shape{2, -1, 13}}});
      cases.push_back({"rank 4", {spec({2, 3, 4, 5}, t)}, ReshapeParams{Shape{6, 20}}});
    }
    cases.push_back({"to scalar", {spec({1, 1})}, ReshapeParams{Shape{}}});
    cases.push_back({"i32", {ids_spec({4, 9}, 1000)}, ReshapeParams{Shape{-1}}});
    return cases;
  };
  return d;
}

// ---- permute (materialized) -----------------------------------------------------------
core::OpDef permute_def() {
  OpDef d;
  d.kind = OpKind::permute;
  d.name = "permute";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    check_count("permute", in, 1);
    const Shape& dims = std::get<PermuteParams>(p).dims;
    const Shape& s = in[0].shape;
    check_shape(dims.rank() == s.rank(), "permute", "dims " + dims.str() + " must list every axis once", in);
    bool seen[core::kMaxRank] = {};
    Shape out;
    for (int i = 0; i < dims.rank(); ++i) {
      const int64_t a = dims[i] < 0 ? dims[i] + s.rank() : dims[i];
      check_shape(a >= 0 && a < s.rank() && !seen[a], "permute",
                  "dims " + dims.str() + " must be a permutation of the axes", in);
      seen[a] = true;
      out.push_back(s[int(a)]);
    }
    return std::vector<TensorMeta>{TensorMeta{out, in[0].dtype}};
  };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    const Shape& dims = std::get<PermuteParams>(n.params).dims;
    Shape inv = dims;
    for (int i = 0; i < dims.rank(); ++i) {
      const int64_t a = dims[i] < 0 ? dims[i] + dims.rank() : dims[i];
      inv[int(a)] = i;
    }
    return {permute(g, dy[0], inv)};
  };
  d.reference = [](const KernelCall& c) {
    const Shape& dims = c.p<PermuteParams>().dims;
    const Shape& xs = c.in(0).shape();
    const Shape& ys = c.out(0).shape();
    const int r = xs.rank();
    const core::Strides xst = core::contiguous_strides(xs);
    for (int64_t o = 0; o < ys.numel(); ++o) {
      // Unravel the output index; output axis i walks input axis dims[i].
      int64_t rem = o, src = 0;
      for (int i = r - 1; i >= 0; --i) {
        const int64_t a = dims[i] < 0 ? dims[i] + r : dims[i];
        src += (rem % ys[i]) * xst[size_t(a)];
        rem /= ys[i];
      }
      copy_element(c.out(0), o, c.in(0), src);
    }
  };
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      cases.push_back({"2-d transpose", {spec({7, 13}, t)}, PermuteParams{Shape{1, 0}}});
      cases.push_back({"heads", {spec({2, 5, 3, 4}, t)}, PermuteParams{Shape{0, 2, 1, 3}}});
      cases.push_back({"rank 3 rotate", {spec({3, 5, 7}, t)}, PermuteParams{Shape{2, 0, 1}}});
    }
    cases.push_back({"negative dims", {spec({4, 3, 5})}, PermuteParams{Shape{-1, 0, -2}}});
    cases.push_back({"rank 4 reverse", {spec({2, 3, 4, 5})}, PermuteParams{Shape{3, 2, 1, 0}}});
    cases.push_back({"identity", {spec({6, 5})}, PermuteParams{Shape{0, 1}}});
    cases.push_back({"i32", {ids_spec({3, 4, 5}, 1000)}, PermuteParams{Shape{1, 2, 0}}});
    cases.push_back({"size-1 axes merge", {spec({3, 1, 4, 5})}, PermuteParams{Shape{1, 0, 2, 3}}});
    cases.push_back({"threaded rows", {spec({64, 40, 33})}, PermuteParams{Shape{1, 0, 2}}});
    cases.push_back({"threaded gather", {spec({64, 40, 33}, DType::bf16)}, PermuteParams{Shape{2, 1, 0}}});
    return cases;
  };
  return d;
}

// ---- split: one output per size along `axis` ---------------------------------------------
core::OpDef split_def() {
  OpDef d;
  d.kind = OpKind::split;
  d.name = "split";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    check_count("split", in, 1);
    const auto& sp = std::get<SplitParams>(p);
    const int axis = checked_axis("split", in[0].shape, sp.axis, in);
    check_shape(sp.sizes.rank() > 0, "split", "needs at least one size", in);
    int64_t total = 0;
    std::vector<TensorMeta> out;
    for (int j = 0; j < sp.sizes.rank(); ++j) {
      check_shape(sp.sizes[j] > 0, "split", "sizes " + sp.sizes.str() + " must be positive", in);
      total += sp.sizes[j];
      TensorMeta m = in[0];
      m.shape[axis] = sp.sizes[j];
      out.push_back(m);
    }
    check_shape(total == in[0].shape[axis], "split",
                "sizes " + sp.sizes.str() + " must add up to dim " + std::to_string(sp.axis), in);
    return out;
  };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    std::vector<ValueId> parts;
    for (size_t j = 0; j < n.outputs.size(); ++j)
      parts.push_back(dy[j] != core::kNoValue ? dy[j] : zeros_like(g, n.outputs[j]));
    return {concat(g, parts, std::get<SplitParams>(n.params).axis)};
  };
  d.reference = [](const KernelCall& c) {
    const Shape& xs = c.in(0).shape();
    const int axis = xs.normalize_axis(c.p<SplitParams>().axis);
    int64_t outer, inner;
    around(xs, axis, outer, inner);
    int64_t offset = 0;  // start of the current piece along the axis
    for (size_t j = 0; j < c.outputs.size(); ++j) {
      const int64_t len = c.out(int(j)).shape()[axis];
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t k = 0; k < len; ++k)
          for (int64_t i = 0; i < inner; ++i)
            copy_element(c.out(int(j)), (o * len + k) * inner + i, c.in(0), (o * xs[axis] + offset + k) * inner + i);
      offset += len;
    }
  };
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      cases.push_back({"qkv last axis", {spec({2, 5, 21}, t)}, SplitParams{-1, Shape{7, 7, 7}}});
      cases.push_back({"uneven first axis", {spec({13, 3}, t)}, SplitParams{0, Shape{6, 7}}});
      cases.push_back({"rank 4 middle", {spec({2, 5, 3, 4}, t)}, SplitParams{1, Shape{1, 3, 1}}});
    }
    cases.push_back({"axis -2", {spec({3, 9, 5})}, SplitParams{-2, Shape{4, 5}}});
    cases.push_back({"single piece", {spec({4, 6})}, SplitParams{1, Shape{6}}});
    cases.push_back({"i32", {ids_spec({4, 10}, 1000)}, SplitParams{1, Shape{3, 7}}});
    cases.push_back({"threaded", {spec({256, 600})}, SplitParams{-1, Shape{200, 100, 300}}});
    return cases;
  };
  return d;
}

// ---- concat ---------------------------------------------------------------------------------
core::OpDef concat_def() {
  OpDef d;
  d.kind = OpKind::concat;
  d.name = "concat";
  d.infer = [](std::span<const TensorMeta> in, const core::OpParams& p) {
    check_shape(!in.empty(), "concat", "needs at least one input", in);
    const int axis = checked_axis("concat", in[0].shape, std::get<ConcatParams>(p).axis, in);
    TensorMeta out = in[0];
    out.shape[axis] = 0;
    for (const TensorMeta& m : in) {
      check_shape(m.dtype == in[0].dtype, "concat", "inputs must have the same dtype", in);
      bool ok = m.shape.rank() == in[0].shape.rank();
      for (int i = 0; ok && i < m.shape.rank(); ++i) ok = i == axis || m.shape[i] == in[0].shape[i];
      check_shape(ok, "concat", "inputs must match in every dim but axis " + std::to_string(axis), in);
      out.shape[axis] += m.shape[axis];
    }
    return std::vector<TensorMeta>{out};
  };
  d.backward = [](Graph& g, const core::Node& n, std::span<const ValueId> dy) -> std::vector<ValueId> {
    const int axis = std::get<ConcatParams>(n.params).axis;
    std::vector<int64_t> sizes;
    for (ValueId x : n.inputs) sizes.push_back(g.shape(x).dim(axis));
    return split_many(g, dy[0], axis, sizes);
  };
  d.reference = [](const KernelCall& c) {
    const Shape& ys = c.out(0).shape();
    const int axis = ys.normalize_axis(c.p<ConcatParams>().axis);
    int64_t outer, inner;
    around(ys, axis, outer, inner);
    int64_t offset = 0;
    for (size_t j = 0; j < c.inputs.size(); ++j) {
      const int64_t len = c.in(int(j)).shape()[axis];
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t k = 0; k < len; ++k)
          for (int64_t i = 0; i < inner; ++i)
            copy_element(c.out(0), (o * ys[axis] + offset + k) * inner + i, c.in(int(j)), (o * len + k) * inner + i);
      offset += len;
    }
  };
  d.test_cases = [] {
    std::vector<TestCase> cases;
    for (DType t : {DType::f32, DType::bf16}) {
      cases.push_back({"last axis", {spec({2, 5, 7}, t), spec({2, 5, 3}, t), spec({2, 5, 11}, t)}, ConcatParams{-1}});
      cases.push_back({"first axis", {spec({6, 13}, t), spec({7, 13}, t)}, ConcatParams{0}});
      cases.push_back({"rank 4 middle", {spec({2, 1, 3, 4}, t), spec({2, 3, 3, 4}, t)}, ConcatParams{1}});
    }
    cases.push_back({"axis -2", {spec({3, 4, 5}), spec({3, 5, 5})}, ConcatParams{-2}});
    cases.push_back({"single input", {spec({4, 6})}, ConcatParams{0}});
    // More inputs than SplitParams can hold: the backward splits in two levels.
    std::vector<InputSpec> many;
    for (int64_t k = 1; k <= 8; ++k) many.push_back(spec({2, k}));
    cases.push_back({"eight inputs", many, ConcatParams{1}});
    cases.push_back({"threaded", {spec({256, 200}), spec({256, 400})}, ConcatParams{-1}});
    cases.push_back({"i32", {ids_spec({4, 3}, 1000), ids_spec({4, 7}, 1000)}, ConcatParams{1}});
    return cases;
  };
  return d;
}

// ---- builders -------------------------------------------------------------------------------
ValueId reshape(Graph& g, ValueId x, const core::Shape& shape) {
  register_ops();
  return g.add_node1(OpKind::reshape, {x}, ReshapeParams{shape});
}
ValueId permute(Graph& g, ValueId x, const core::Shape& dims) {
  register_ops();
  return g.add_node1(OpKind::permute, {x}, PermuteParams{dims});
}
ValueId transpose(Graph& g, ValueId x, int dim0, int dim1) {
  register_ops();
  const int r = g.shape(x).rank();
  const int a = g.shape(x).normalize_axis(dim0), b = g.shape(x).normalize_axis(dim1);
  Shape dims;
  for (int i = 0; i < r; ++i) dims.push_back(i);
  dims[a] = b;
  dims[b] = a;
  return permute(g, x, dims);
}
std::vector<ValueId> split(Graph& g, ValueId x, int axis, const core::Shape& sizes) {
  register_ops();
  return g.add_node(OpKind::split, {x}, SplitParams{axis, sizes});
}
ValueId concat(Graph& g, const std::vector<ValueId>& xs, int axis) {
  register_ops();
  return g.add_node1(OpKind::concat, xs, ConcatParams{axis});
}

}  // namespace brisk::ops
