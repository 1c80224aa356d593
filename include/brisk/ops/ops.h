// Graph-building functions: the way models and tests add ops to a graph.
// Each appends one node (shapes checked and inferred immediately) and returns
// its output value(s). They live next to the op definitions in src/ops/.
#pragma once

#include <vector>

#include "brisk/core/graph.h"
#include "brisk/ops/params.h"

namespace brisk::core {
struct Pattern;  // brisk/core/passes.h
}

namespace brisk::ops {

using core::Graph;
using core::ValueId;

// Fills the op table in core with every op of op_list.inc. Idempotent and
// cheap; every builder below calls it, so users rarely need to.
void register_ops();

// ---- elementwise -------------------------------------------------------------
ValueId add(Graph& g, ValueId a, ValueId b);  // b: same shape as a, or a's trailing dims
ValueId mul(Graph& g, ValueId a, ValueId b);
ValueId scale(Graph& g, ValueId a, float s);
ValueId gelu(Graph& g, ValueId x);
// Inverted dropout of x with probability p in [0, 1), its mask a hash of
// key (2) i32, `site` and each element's index (brisk/ops/dropout.h):
// another site or key, another mask.
ValueId dropout(Graph& g, ValueId x, ValueId key, float p, uint32_t site);

// ---- matrix products ---------------------------------------------------------
// op(A) op(B); with `into` (f32, the product's shape): into + op(A) op(B)
// written over into's memory (beta = 1; f32 result whatever A and B are).
ValueId matmul(Graph& g, ValueId a, ValueId b, bool trans_a = false, bool trans_b = false,
               ValueId into = core::kNoValue);
// x (..., in), w (out, in), bias (out) or kNoValue -> (..., out)
ValueId linear(Graph& g, ValueId x, ValueId w, ValueId bias = core::kNoValue);

// ---- normalization, attention ------------------------------------------------
struct LayerNormOut { ValueId y, mean, rstd; };
// narrow_to bf16/f16: y of an f32 x written in that dtype (LayerNormParams).
LayerNormOut layernorm(Graph& g, ValueId x, ValueId weight, ValueId bias, float eps = 1e-5f,
                       core::DType narrow_to = core::DType::f32);
ValueId softmax(Graph& g, ValueId x);
// Dropout of the attention probabilities (AttentionParams::dropout), off by
// default: p in [0, 1), the key (2) i32 and a site as ops::dropout's.
struct AttentionDropout {
  float p = 0.f;
  ValueId key = core::kNoValue;
  uint32_t site = 0;
  // The op's inputs (the key appended when on) and params.
  std::vector<ValueId> inputs(std::vector<ValueId> in) const {
    if (p > 0.f) in.push_back(key);
    return in;
  }
  core::AttentionParams params(int n_head) const { return {n_head, 0.f, p, site}; }
};
// qkv (B, T, 3C) -> (B, T, C); causal.
ValueId attention(Graph& g, ValueId qkv, int n_head, const AttentionDropout& drop = {});
// The same function without a (B, n_head, T, T) intermediate: tiled, online
// softmax, saves only the rows' log-sum-exp (B, n_head, T) for the backward.
ValueId flash_attention(Graph& g, ValueId qkv, int n_head, const AttentionDropout& drop = {});

// ---- encoder over right-padded batches (masked_attention.cpp, masked_flash_attention.cpp, masked_mean.cpp)
// lengths (B) i32: sequence b is real at positions [0, lengths[b]) and padded
// after; every length must lie in [1, T] (kernels throw ShapeError otherwise).
// qkv (B, T, 3C), lengths (B) i32 -> (B, T, C); bidirectional, keys >= lengths[b] masked.
ValueId masked_attention(Graph& g, ValueId qkv, ValueId lengths, int n_head, const AttentionDropout& drop = {});
ValueId masked_flash_attention(Graph& g, ValueId qkv, ValueId lengths, int n_head,
                               const AttentionDropout& drop = {});
// x (B, T, C), lengths (B) i32 -> (B, C): mean over the first lengths[b] positions.
ValueId masked_mean(Graph& g, ValueId x, ValueId lengths);

// ---- embedding, loss ---------------------------------------------------------
ValueId embedding(Graph& g, ValueId ids, ValueId table);  // ids (...) i32, table (V, C) -> (..., C)
// logits (N, V), targets (N) i32 -> scalar mean loss over targets != ignore_index,
// with the targets smoothed by label_smoothing (CrossEntropyParams). With
// class_weights (V) f32 (PyTorch's `weight`), row i counts w[target_i]
// times and the mean divides by the sum of the kept rows' w[target_i]
// (a sum of 0 gives loss 0, as when every target is ignored).
ValueId cross_entropy(Graph& g, ValueId logits, ValueId targets, int ignore_index = -100,
                      float label_smoothing = 0.f, ValueId class_weights = core::kNoValue);

// ---- fused classifier (fused_classifier.cpp) ---------------------------------
// linear(x, w) + cross_entropy + their backward in row chunks, the (N, V)
// logits never stored: x (N, C), w (V, C), targets (N) i32, seed () f32 ->
// {loss (), dx = seed * dloss/dx (N, C), dw (V, C)}.
std::vector<ValueId> classifier_train(Graph& g, ValueId x, ValueId w, ValueId targets, ValueId seed,
                                      int ignore_index = -100);
// Rows per chunk of its kernels (the workspace holds chunk x V f32 logits):
// equal chunks of at most chunk_floats / V rows (0: 64 MiB of f32).
int64_t classifier_chunk_rows(int64_t n, int64_t v, int64_t chunk_floats = 0);
// The pass (core::rewrite): linear(x, w) without bias whose logits only feed a
// cross_entropy becomes classifier_train fed the scalar f32 input `seed_name`,
// which the caller then passes to backward() as the seed.
// chunk_floats goes into the op's params (CrossEntropyParams::chunk_floats).
core::Pattern classifier_fusion(const std::string& seed_name = "loss_scale", int64_t chunk_floats = 0);

// ---- fused MLP / residual ops (linear_gelu.cpp, add_layernorm.cpp) ------------
// linear(x, w, bias) then tanh-GELU: {y = gelu(h), h} with h = x w^T + bias kept
// (a saved output) for the backward. bias may be kNoValue.
std::vector<ValueId> linear_gelu(Graph& g, ValueId x, ValueId w, ValueId bias = core::kNoValue);
// The pass: linear whose output is read only by a gelu becomes linear_gelu.
core::Pattern bias_gelu_fusion();
// s = a + r (r: a's shape or its trailing dims), then layernorm(s) as layernorm().
struct AddLayerNormOut { ValueId s, y, mean, rstd; };
AddLayerNormOut add_layernorm(Graph& g, ValueId a, ValueId r, ValueId weight, ValueId bias, float eps = 1e-5f);
// The pass: add whose output feeds a layernorm becomes add_layernorm; the
// add's other readers (the next residual add) read its s output.
core::Pattern residual_layernorm_fusion();
// The backward pass (run on a graph that has one, after core::backward):
// layernorm_backward whose dx is added to another gradient (the residual
// stream's, in a pre-LN transformer) becomes one layernorm_backward given
// that gradient as its sixth input; a cast narrowing the sum (the gradient
// of a bf16/f16 residual branch) becomes its narrowed fourth output.
core::Pattern residual_layernorm_backward_fusion();
// (dy W) * gelu'(h): the input gradient of a Linear whose input is gelu(h),
// through the GELU; dy (..., out), W (out, in), h (..., in) -> h's shape.
ValueId matmul_gelu_backward(Graph& g, ValueId dy, ValueId w, ValueId h);
// The backward pass: the product dy W of a Linear's input gradient (matmul,
// then a reshape or not) read only by a gelu_backward becomes one
// matmul_gelu_backward (cuBLASLt's DGELU epilogue on CUDA).
core::Pattern gelu_backward_fusion();
// A Linear's parameter gradients in one op: dw = dw_into + dy^T x and
// db = db_into + the column sums of dy, over dy (rows, out), x (rows, in),
// f32 accumulators written in place. Returns {dw, db}.
std::vector<ValueId> linear_param_grad(Graph& g, ValueId dy, ValueId x, ValueId dw_into, ValueId db_into);
// The backward pass: a weight gradient summed into its accumulator
// (matmul(dy, x, into) with dy transposed) and the column sums of the same dy
// summed into the bias's become one linear_param_grad (cuBLASLt's BGRADB
// epilogue on CUDA).
core::Pattern bias_grad_fusion();
// Train graphs in mixed precision: the forward's casts of f32 parameters to
// the compute dtype (one per weight and bias and the tied head's copy: 97 in
// G1) as one cast_many at the first of them. The casts read only
// parameters, so they may all run at the start of the step; the weights'
// copies were alive until the backward anyway (the input-gradient products
// read them), so the peak, at the end of the forward, does not grow.
core::Pattern weight_cast_fusion();

// ---- reductions ---------------------------------------------------------------
ValueId sum(Graph& g, ValueId x, int axis = ReduceParams::kAllAxes, bool keepdim = false);
// into + the column sums of x (rows, C >= 2), into f32 (C), written over into.
ValueId column_sum_into(Graph& g, ValueId x, ValueId into);
ValueId mean(Graph& g, ValueId x, int axis = ReduceParams::kAllAxes, bool keepdim = false);
ValueId expand(Graph& g, ValueId x, const core::Shape& shape, int axis = ReduceParams::kAllAxes);

// ---- shapes -------------------------------------------------------------------
ValueId reshape(Graph& g, ValueId x, const core::Shape& shape);  // a view, no copy
ValueId permute(Graph& g, ValueId x, const core::Shape& dims);
ValueId transpose(Graph& g, ValueId x, int dim0, int dim1);  // a permute
std::vector<ValueId> split(Graph& g, ValueId x, int axis, const core::Shape& sizes);
// split() into any number of pieces (one split node holds at most kMaxRank
// sizes; longer lists split in groups, then each group).
std::vector<ValueId> split_many(Graph& g, ValueId x, int axis, const std::vector<int64_t>& sizes);
ValueId concat(Graph& g, const std::vector<ValueId>& xs, int axis);

// ---- memory -------------------------------------------------------------------
ValueId cast(Graph& g, ValueId x, core::DType to);
// Every x cast to `to` (float dtypes) as one node: one multi-tensor kernel
// where there were xs.size() (weight_cast_fusion). Not differentiable: it is
// made by a pass on a finished train graph.
std::vector<ValueId> cast_many(Graph& g, const std::vector<ValueId>& xs, core::DType to);
ValueId fill(Graph& g, const core::Shape& shape, core::DType dtype, double value);
ValueId copy(Graph& g, ValueId x);
// dst += src in place; returns the new version of dst (same memory).
ValueId accumulate(Graph& g, ValueId dst, ValueId src);

// ---- optimizer ----------------------------------------------------------------
ValueId grad_norm(Graph& g, const std::vector<ValueId>& grads);

}  // namespace brisk::ops
