// CPU kernels for memory-efficient bidirectional attention over a
// right-padded batch (masked_flash_attention and its backward).
//
// On AVX2 + FMA CPUs without AVX-512 (cpu_features().attention_tiles) the f32
// kernels run as register tiles (flash_tiles.h), heads handed out one at a
// time as in masked_attention.cpp. Elsewhere, and for bf16 everywhere, they
// are flash_gemm.h's, shared with the causal op: sequence b's key tiles stop
// at its length L = lengths[b], every query row (padded ones too: the op's
// contract) sees all L keys, and the last key tile is rounded up to 16 keys
// with the keys past L masked, so that gemm.h (oneDNN on AVX-512 CPUs) meets
// a few widths rather than one per length. At E1's shape on a Zen 5 (B 16, T
// 512, C 256, 4 heads; bench_attention --masked) fwd+bwd took 41 ms there
// against 68 through the OpenBLAS kernels it replaced (64-row tiles, one
// cblas_sgemm per tile product); 13.3 against 19.7 at B 32, T 256, C 128.
#include "brisk/core/op.h"
#include "brisk/cpu/cpu_features.h"
#include "brisk/ops/layout.h"
#include "attention_util.h"
#include "flash_gemm.h"
#include "flash_tiles.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;
using Dims = AttentionDims;

void masked_flash_attention_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const int32_t* lengths = c.in(1).as<const int32_t>();
  ops::check_lengths("masked_flash_attention", lengths, d.B, d.T);  // before the parallel region: it throws
  const float* qkv = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  float* lse = c.out(1).as<float>();
  if (cpu_features().attention_tiles) {
    for_each_head(d, flash_tiles::Work::floats(d.T, d.hd), [&](const HeadOffsets& o, float* w) {
      const float* q = qkv + o.qkv;
      flash_tiles::forward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, y + o.y, d.C, lse + o.lse, d.T,
                                {lengths[o.b], false}, d.hd, d.scale, flash_tiles::Work(w, d.T, d.hd));
    });
    return;
  }
  flash_gemm::forward<float>(c, d, lengths);
}

void masked_flash_attention_backward_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const int32_t* lengths = c.in(4).as<const int32_t>();
  ops::check_lengths("masked_flash_attention_backward", lengths, d.B, d.T);
  const float* dy = c.in(0).as<float>();
  const float* qkv = c.in(1).as<float>();
  const float* y = c.in(2).as<float>();
  const float* lse = c.in(3).as<float>();
  float* dqkv = c.out(0).as<float>();
  if (cpu_features().attention_tiles) {
    for_each_head(d, flash_tiles::Work::floats(d.T, d.hd), [&](const HeadOffsets& o, float* w) {
      const float* q = qkv + o.qkv;
      float* dq = dqkv + o.qkv;
      flash_tiles::backward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, dy + o.y, y + o.y, d.C, lse + o.lse, dq, dq + d.C,
                                 dq + 2 * d.C, 3 * d.C, d.T, {lengths[o.b], false}, d.hd, d.scale,
                                 flash_tiles::Work(w, d.T, d.hd));
    });
    return;
  }
  flash_gemm::backward<float>(c, d, lengths);
}

// ---- bf16: native or emulated ------------------------------------------------------

void masked_flash_attention_bf16(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const int32_t* lengths = c.in(1).as<const int32_t>();
  ops::check_lengths("masked_flash_attention", lengths, d.B, d.T);
  flash_gemm::forward_bf16(c, d, lengths);
}

void masked_flash_attention_backward_bf16(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const int32_t* lengths = c.in(4).as<const int32_t>();
  ops::check_lengths("masked_flash_attention_backward", lengths, d.B, d.T);
  flash_gemm::backward_bf16(c, d, lengths);
}

}  // namespace

void register_masked_flash_attention_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::masked_flash_attention, core::DType::f32, masked_flash_attention_f32);
  r.add(core::OpKind::masked_flash_attention, core::DType::bf16, masked_flash_attention_bf16);
  r.add(core::OpKind::masked_flash_attention_backward, core::DType::f32, masked_flash_attention_backward_f32);
  r.add(core::OpKind::masked_flash_attention_backward, core::DType::bf16, masked_flash_attention_backward_bf16);
}

}  // namespace brisk::cpu
