// Shape checks shared by the attention op families (plain and flash): both
// take packed qkv (B, T, 3C) with n_head heads of C / n_head columns each.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>

#include "brisk/ops/dropout.h"
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

// The attention ops' inputs: `n` of their own, then the dropout key (2) i32
// when params.dropout > 0 (AttentionParams). Checks the count, the key and p.
inline void check_attention_inputs(std::string_view op, std::span<const TensorMeta> in, const OpParams& params,
                                   size_t n) {
  const float p = std::get<AttentionParams>(params).dropout;
  check_shape(p >= 0.f && p < 1.f, op, "dropout must be in [0, 1), got " + std::to_string(p), in);
  check_count(op, in, p > 0.f ? n + 1 : n);
  if (p > 0.f) {
    check_dtype(op, in[n], DType::i32, "dropout key");
    check_shape(in[n].shape == Shape{2}, op, "the dropout key must be (2)", in);
  }
}

// A test configuration of the causal ops (B, T, C, n_head), and its label.
struct AttentionConfig {
  int64_t B, T, C;
  int n_head;
};
inline std::string attention_label(const AttentionConfig& k, DType t) {
  return std::string(core::dtype_name(t)) + " B" + std::to_string(k.B) + " T" + std::to_string(k.T) + " C" +
         std::to_string(k.C) + " nh" + std::to_string(k.n_head);
}
// One with probability dropout p in dtype t; its label and params (at `site`).
struct AttentionDropoutConfig {
  AttentionConfig k;
  DType t;
  float p;
};
// " dropout P", P as %g: a case label's suffix.
inline std::string dropout_suffix(float p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, " dropout %g", double(p));
  return buf;
}
inline std::string attention_label(const AttentionDropoutConfig& c) { return attention_label(c.k, c.t) + dropout_suffix(c.p); }
inline AttentionParams dropout_params(const AttentionDropoutConfig& c, uint32_t site) {
  return AttentionParams{c.k.n_head, 0.f, c.p, site};
}

// A test case's dropout key: two random words.
inline InputSpec dropout_key_spec() { return ids_spec({2}, int64_t(1) << 30); }

// The node's dropout key when it has one (the last input), appended to a
// backward node's inputs; and the key's (absent) gradient, appended to a
// gradient list.
inline std::vector<ValueId> with_dropout_key(std::vector<ValueId> inputs, const core::Node& n) {
  if (std::get<AttentionParams>(n.params).dropout > 0.f) inputs.push_back(n.inputs.back());
  return inputs;
}
inline std::vector<ValueId> with_key_gradient(std::vector<ValueId> grads, const core::Node& n) {
  if (std::get<AttentionParams>(n.params).dropout > 0.f) grads.push_back(core::kNoValue);
  return grads;
}

// The reference kernels' probability dropout, straight from
// brisk/ops/dropout.h: the factor (0 or 1 / (1 - p)) of probability (b, h,
// t, u) at index ((b * n_head + h) * T + t) * T + u; 1 everywhere when off.
// The key is the op's last input (check_attention_inputs).
class ReferenceProbDropout {
 public:
  ReferenceProbDropout(const KernelCall& c, int64_t n_head, int64_t T) : nh_(n_head), T_(T) {
    const AttentionParams& p = c.p<AttentionParams>();
    if (!(p.dropout > 0.f)) return;
    on_ = true;
    const TensorView& key = c.inputs.back();
    k0_ = uint32_t(int32_t(ld(key, 0)));
    k1_ = uint32_t(int32_t(ld(key, 1)));
    site_ = p.dropout_site;
    threshold_ = dropout_threshold(p.dropout);
    scale_ = 1.0 / (1.0 - double(p.dropout));
  }
  double operator()(int64_t b, int64_t h, int64_t t, int64_t u) const {
    if (!on_) return 1.0;
    const uint64_t i = uint64_t(((b * nh_ + h) * T_ + t) * T_ + u);
    return dropout_bits_at(k0_, k1_, site_, i) >= threshold_ ? scale_ : 0.0;
  }

 private:
  int64_t nh_, T_;
  bool on_ = false;
  uint32_t k0_ = 0, k1_ = 0, site_ = 0, threshold_ = 0;
  double scale_ = 1.0;
};

// The planned workspace of the flash ops (causal and padding-masked), whose
// CPU kernels are backends/cpu/flash_gemm.cpp's (and the register tiles',
// which keep their own thread-local scratch). Per thread: two (kTileQ,
// kTileK) score tiles, a few per-row statistics, and for bf16 the larger of
// its two paths' needs: bf16-emulated widens one head (q, k, v, dy, y, dq,
// dk, dv: at most 8 T x hd); bf16-native keeps P and dS as bf16 (one more
// tile), one query tile's f32 rows of Y or dQ, and the head's f32 dK and dV.
// Probability dropout adds a tile of its factors.
// Linear in T, never T^2. The kernels use tiles of at most these sizes
// (flash_gemm.h) and fall back to their own buffers if a workspace is short
// (more threads than this machine has cores, or run_op). `qkv_at`: the
// input that holds qkv (0 forward, 1 backward); input 0 has the dtype.
inline size_t flash_workspace_bytes(std::span<const TensorMeta> in, const OpParams& params, size_t qkv_at) {
  constexpr int64_t kTileQ = 128, kTileK = 256;
  const bool backward = qkv_at == 1;
  const AttentionDims d = attention_dims(in[qkv_at].shape, std::get<AttentionParams>(params).n_head);
  const bool wide = in[0].dtype != DType::f32;
  const int64_t emulated = (backward ? 8 : 4) * d.T * d.hd;
  const int64_t native = kTileQ * d.hd + (backward ? kTileQ * kTileK + 2 * d.T * d.hd : 0);
  const int64_t dropout = std::get<AttentionParams>(params).dropout > 0.f ? kTileQ * kTileK : 0;  // the factors
  const int64_t per_thread = 2 * kTileQ * kTileK + 4 * kTileQ + dropout + (wide ? std::max(emulated, native) : 0);
  const int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  return size_t(per_thread * threads) * sizeof(float);
}

}  // namespace brisk::ops::detail
