// Shape checks shared by the attention op families (plain and flash): both
// take packed qkv (B, T, 3C) with n_head heads of C / n_head columns each.
#pragma once

#include <cmath>
#include <string>

#include "op_util.h"

namespace brisk::ops::detail {

// Shape of one attention problem, read from qkv (B, T, 3C).
struct AttentionDims {
  int64_t B, T, C, nh, hd;
};

inline AttentionDims attention_dims(const Shape& qkv, int n_head) {
  const int64_t C = qkv[2] / 3;
  return {qkv[0], qkv[1], C, n_head, C / n_head};
}

// The softmax scale: explicit, or 1/sqrt(head_dim).
inline double attention_scale(const AttentionParams& p, int64_t hd) {
  return p.scale != 0.f ? double(p.scale) : 1.0 / std::sqrt(double(hd));
}

// Checks qkv and returns its dims; throws ShapeError naming `op`.
inline AttentionDims check_qkv(std::string_view op, std::span<const TensorMeta> in, const TensorMeta& qkv,
                               int n_head) {
  check_shape(qkv.shape.rank() == 3, op, "qkv must be (B, T, 3C)", in);
  check_shape(qkv.shape[2] % 3 == 0, op, "qkv's last dim must be 3C (divisible by 3)", in);
  check_shape(n_head >= 1, op, "n_head must be at least 1", in);
  check_shape((qkv.shape[2] / 3) % n_head == 0, op,
              "C (qkv's last dim / 3) must be divisible by n_head = " + std::to_string(n_head), in);
  return attention_dims(qkv.shape, n_head);
}

}  // namespace brisk::ops::detail
