// CPU kernel of kv_attention (src/ops/kv_attention.cpp says what it computes).
//
// First every row's key and value are copied into its cache slot (all of
// them, so that rows of one prefill see each other), then the (row, head)
// pairs are split across threads: scores against the row's past in one pass
// (a dot product of head_dim floats per position, vectorised), a softmax over
// them (the vectorised fast_exp: libm's expf one position at a time was a
// fifth of a batched decoding step), and the weighted sum of values,
// normalised once at the end. Decoding has one row per sequence and
// a few hundred positions: the work is small next to the Linear layers, and
// the whole past of one head is read once per row.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "brisk/core/error.h"
#include "cpu_util.h"
#include "kernels.h"
#include "vec_math.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;

void kv_attention_f32(const KernelCall& call) {
  const auto& p = call.p<core::AttentionParams>();
  const float* qkv = call.in(0).as<float>();
  const int32_t* rows = call.in(3).as<int32_t>();
  const int32_t* table = call.in(4).as<int32_t>();
  float* kc = call.out(1).as<float>();
  float* vc = call.out(2).as<float>();
  float* y = call.out(0).as<float>();
  const int64_t n = call.in(0).shape()[0], c = call.in(0).shape()[1] / 3;
  const int64_t t = call.in(1).shape()[1], blocks = call.in(1).shape()[0];
  const int64_t seqs = call.in(4).shape()[0], max_blocks = call.in(4).shape()[1];
  const int64_t heads = p.n_head, d = c / heads, context = max_blocks * t;
  const float scale = p.scale > 0 ? p.scale : 1.f / std::sqrt(float(d));

  // Validate every row before touching the cache.
  for (int64_t r = 0; r < n; ++r) {
    const int64_t seq = rows[2 * r], pos = rows[2 * r + 1];
    if (seq < 0 || seq >= seqs || pos < 0 || pos >= context)
      throw core::Error("kv_attention: row " + std::to_string(r) + " (sequence slot " + std::to_string(seq) +
                        ", position " + std::to_string(pos) + ") is outside the block table");
    for (int64_t b = 0; b <= pos / t; ++b) {
      const int32_t block = table[seq * max_blocks + b];
      if (block < 0 || block >= blocks)
        throw core::Error("kv_attention: sequence slot " + std::to_string(seq) + " maps to block " +
                          std::to_string(block) + ", outside the cache of " + std::to_string(blocks));
    }
  }
  auto slot = [&](int64_t seq, int64_t pos) { return (int64_t(table[seq * max_blocks + pos / t]) * t + pos % t) * c; };
  for (int64_t r = 0; r < n; ++r) {
    const int64_t at = slot(rows[2 * r], rows[2 * r + 1]);
    std::memcpy(kc + at, qkv + r * 3 * c + c, size_t(c) * sizeof(float));
    std::memcpy(vc + at, qkv + r * 3 * c + 2 * c, size_t(c) * sizeof(float));
  }

  float* scores_all = static_cast<float*>(call.workspace);
  parallel_for(n * heads, 1, [&](int64_t b, int64_t e) {
    for (int64_t task = b; task < e; ++task) {
      const int64_t r = task / heads, h = task % heads;
      const int64_t seq = rows[2 * r], pos = rows[2 * r + 1];
      const int32_t* blocks_of = table + seq * max_blocks;
      const float* q = qkv + r * 3 * c + h * d;
      float* s = scores_all + task * context;
      // Positions block by block: one table lookup per block, not a division per position.
      float top = -INFINITY;
      for (int64_t j0 = 0; j0 <= pos; j0 += t) {
        const float* k = kc + int64_t(blocks_of[j0 / t]) * t * c + h * d;
        for (int64_t j = j0; j <= std::min(pos, j0 + t - 1); ++j, k += c) {
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < d; ++i) dot += q[i] * k[i];
          s[j] = dot * scale;
          top = std::max(top, s[j]);
        }
      }
      float total = 0.f;
#pragma omp simd reduction(+ : total)
      for (int64_t j = 0; j <= pos; ++j) total += s[j] = fast_exp(s[j] - top);
      float* out = y + r * c + h * d;
      std::fill(out, out + d, 0.f);
      for (int64_t j0 = 0; j0 <= pos; j0 += t) {
        const float* v = vc + int64_t(blocks_of[j0 / t]) * t * c + h * d;
        for (int64_t j = j0; j <= std::min(pos, j0 + t - 1); ++j, v += c) {
          const float pj = s[j];
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) out[i] += pj * v[i];
        }
      }
      const float inv = 1.f / total;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) out[i] *= inv;
    }
  });
}

}  // namespace

void register_kv_attention_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::kv_attention, core::DType::f32, kv_attention_f32);
}

}  // namespace brisk::cpu
