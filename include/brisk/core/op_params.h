// Typed parameters of every op. A graph node carries one OpParams (a variant),
// so a kernel reads `std::get<LayerNormParams>(params).eps` instead of
// decoding bytes. Ops without parameters use NoParams. Parameters are fixed
// when the graph is built; values that change every step (learning rate,
// step count) are passed when the op is run directly (see optim_ops).
#pragma once

#include <variant>

#include "brisk/core/dtype.h"
#include "brisk/core/shape.h"

namespace brisk::core {

struct NoParams {};

struct ScaleParams {
  float scale = 1.f;
};

// C = op(A) @ op(B). A is (..., M, K) (or (..., K, M) when trans_a);
// B is (K, N) shared by every batch, or (..., K, N) with the same batch dims.
struct MatmulParams {
  bool trans_a = false;
  bool trans_b = false;
};

struct LayerNormParams {
  float eps = 1e-5f;
  // layernorm: f32 (the default) writes y in x's dtype; bf16 or f16 writes
  // an f32 x's normalised rows straight in that dtype (mixed precision's
  // LayerNorm feeding a low-precision Linear: no f32 y and no cast after
  // it). Statistics stay f32 either way. layernorm_backward: bf16 or f16
  // adds a fourth output, an f32 dx's copy in that dtype (the gradient of a
  // low-precision residual branch: no cast after it); its rule leaves f32.
  DType narrow_to = DType::f32;
};

// Multi-head self-attention on packed qkv (B, T, 3C) -> (B, T, C), with
// C = n_head * head_dim; scale 0 means 1/sqrt(head_dim). dropout > 0 drops
// the probabilities (inverted dropout, as torch's scaled_dot_product_attention
// with dropout_p): the op then takes a (2) i32 key as its last input, and
// probability (b, h, t, u) is kept as brisk/ops/dropout.h's hash of (key,
// dropout_site, ((b * n_head + h) * T + t) * T + u) decides.
struct AttentionParams {
  int n_head = 1;
  float scale = 0.f;
  float dropout = 0.f;
  uint32_t dropout_site = 0;
};

struct EmbeddingBackwardParams {
  int64_t num_embeddings = 0;  // rows of the table whose gradient is produced
};

struct CrossEntropyParams {
  int ignore_index = -100;  // targets equal to this are left out of the mean
  // cross_entropy: the share e of the target moved evenly onto all V
  // classes (PyTorch's label_smoothing): each kept row's loss is
  // (1 - e) (lse - x_t) + e / V * sum_j (lse - x_j). CPU kernels only.
  float label_smoothing = 0.f;
  // classifier_train only: f32 logits its workspace holds per chunk of rows
  // (0: ops::classifier_chunk_rows's 64 MiB, sized for a CPU's caches). A GPU
  // wants few tall chunks, since its products fill the chip only at
  // thousands of rows: models/gpt.cpp asks for more on device backends.
  int64_t chunk_floats = 0;
};

// axis = kAllAxes reduces everything to a scalar of shape ().
struct ReduceParams {
  static constexpr int kAllAxes = 1000;
  int axis = kAllAxes;
  bool keepdim = false;
};

struct ExpandParams {
  core::Shape shape;  // the shape to broadcast back to
  int axis = ReduceParams::kAllAxes;
};

struct ReshapeParams {
  core::Shape shape;  // one dim may be -1
};

struct PermuteParams {
  core::Shape dims;  // a permutation of 0..rank-1
};

struct SplitParams {
  int axis = -1;
  core::Shape sizes;  // one output per entry
};

struct ConcatParams {
  int axis = -1;
};

struct CastParams {
  core::DType to = core::DType::f32;
};

struct FillParams {
  core::Shape shape;
  core::DType dtype = core::DType::f32;
  double value = 0.0;
};

// linear_packed: the number of output features N (the packed weight holds
// them rounded up to whole panels).
struct PackedLinearParams {
  int64_t out = 0;
};

// Decoupled weight decay (Loshchilov & Hutter). `grad_scale` multiplies the
// gradient first: it folds in clipping and loss-scale removal at no cost.
// Weight decay applies to tensors of rank >= 2 when `decay_matrices` is set (adamw decides per tensor).
struct AdamWParams {
  float lr = 6e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  int64_t step = 1;  // 1-based, for bias correction
  float grad_scale = 1.f;
  // Decoupled weight decay on tensors of rank >= 2 only (weights, embeddings).
  bool decay_matrices = true;
};

// dropout: the probability p in [0, 1) that an element is zeroed, and the
// site that tells this dropout's mask from the others' under one key
// (brisk/ops/dropout.h).
struct DropoutParams {
  float p = 0.f;
  uint32_t site = 0;
};
using OpParams = std::variant<NoParams, ScaleParams, MatmulParams, LayerNormParams, AttentionParams,
                              EmbeddingBackwardParams, CrossEntropyParams, ReduceParams, ExpandParams,
                              ReshapeParams, PermuteParams, SplitParams, ConcatParams, CastParams,
                              FillParams, AdamWParams, PackedLinearParams, DropoutParams>;

}  // namespace brisk::core
