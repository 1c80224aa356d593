// Pieces shared by the ops over right-padded batches (masked_attention,
// masked_flash_attention, masked_mean): the check of the `lengths` input's
// meta, the packed-qkv index, and the test-case spec of a lengths tensor.
// Lengths are data, not shapes, so their values are checked by the kernels
// (brisk/ops/layout.h: check_lengths), not here.
#pragma once

#include <vector>

#include "attention_shapes.h"
#include "brisk/ops/layout.h"

namespace brisk::ops::detail {

// Input `i` must be an i32 (B) tensor.
inline void check_lengths_meta(std::string_view op, std::span<const TensorMeta> in, size_t i, int64_t B) {
  check_dtype(op, in[i], DType::i32, "lengths");
  check_shape(in[i].shape == Shape{B}, op, "lengths must be (B) = (" + std::to_string(B) + ")", in);
}

// Element (b, t, part, h, i) of packed qkv (B, T, 3C): part 0 = q, 1 = k, 2 = v.
struct PackedQkv {
  AttentionDims d;
  int64_t operator()(int64_t b, int64_t t, int part, int64_t h, int64_t i) const {
    return (b * d.T + t) * 3 * d.C + part * d.C + h * d.hd + i;
  }
};

// Exact lengths for a test case: cases need 1, T and values in between in
// one batch, which a uniform draw does not promise.
inline InputSpec lengths_spec(const std::vector<int>& lengths) {
  std::vector<double> v(lengths.begin(), lengths.end());
  return InputSpec{TensorMeta{Shape{int64_t(lengths.size())}, DType::i32}, 0, 0, false, std::move(v)};
}

// A test configuration: B = lengths.size() sequences padded to T.
struct MaskedConfig {
  int64_t T, C;
  int n_head;
  std::vector<int> lengths;
};

inline std::string masked_label(const MaskedConfig& k, DType t = DType::f32) {
  std::string s = std::string(core::dtype_name(t)) + " B" + std::to_string(k.lengths.size()) + " T" + std::to_string(k.T) + " C" +
                  std::to_string(k.C) + " nh" + std::to_string(k.n_head) + " len";
  for (int l : k.lengths) s += " " + std::to_string(l);
  return s;
}

// A case with probability dropout (AttentionParams::dropout): the kernels'
// query blocks and key tiles with ragged last ones (T 130, 300: lengths
// past a 256-key tile), lengths 1 and T in one batch, one head; bf16 (the
// flash op's) over padded query tiles and lengths off a 16-key step.
struct MaskedDropoutConfig {
  MaskedConfig k;
  DType t;
  float p;
};
inline std::vector<MaskedDropoutConfig> masked_dropout_configs(bool with_bf16) {
  std::vector<MaskedDropoutConfig> v = {{{7, 12, 3, {7, 1, 4}}, DType::f32, 0.2f},
                                        {{130, 32, 2, {1, 130, 64, 65}}, DType::f32, 0.5f},
                                        {{300, 10, 1, {300, 1, 257}}, DType::f32, 0.1f},
                                        {{40, 48, 2, {40, 23, 9}}, DType::f32, 0.3f}};
  if (with_bf16) {
    v.push_back({{40, 48, 2, {40, 17, 31, 16}}, DType::bf16, 0.2f});
    v.push_back({{290, 32, 2, {290, 100, 1}}, DType::bf16, 0.4f});
  }
  return v;
}
inline std::string masked_dropout_label(const MaskedDropoutConfig& c) {
  return masked_label(c.k, c.t) + dropout_suffix(c.p);
}
inline AttentionParams masked_dropout_params(const MaskedDropoutConfig& c) {
  return AttentionParams{c.k.n_head, 0.f, c.p, 3};
}

}  // namespace brisk::ops::detail
