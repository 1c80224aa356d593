// CPU kernels for memory-efficient causal attention (flash_attention and its
// backward) on packed qkv.
//
// On AVX2 + FMA CPUs without AVX-512 (cpu_features().attention_tiles) the
// f32 kernels run as register tiles (flash_tiles.h), heads handed out one at
// a time as in attention.cpp. Elsewhere, and for bf16 everywhere, each
// (query tile, key tile) product is one gemm() (flash_gemm.h, shared with
// the padding-masked kernels: tiles, the online softmax, the bf16-native and
// bf16-emulated paths).
#include "brisk/core/op.h"
#include "brisk/cpu/cpu_features.h"
#include "attention_util.h"
#include "flash_gemm.h"
#include "flash_tiles.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;
using Dims = AttentionDims;

// ---- f32: work directly on the packed layout -----------------------------------------
void flash_attention_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const float* qkv = c.in(0).as<float>();
  float* y = c.out(0).as<float>();
  float* lse = c.out(1).as<float>();
  if (cpu_features().attention_tiles) {
    for_each_head(d, flash_tiles::Work::floats(d.T, d.hd), [&](const HeadOffsets& o, float* w) {
      const float* q = qkv + o.qkv;
      flash_tiles::forward_head(q, q + d.C, q + 2 * d.C, 3 * d.C, y + o.y, d.C, lse + o.lse, d.T, {d.T, true}, d.hd,
                                d.scale, flash_tiles::Work(w, d.T, d.hd));
    });
    return;
  }
  flash_gemm::forward<float>(c, d, nullptr);
}

void flash_attention_backward_f32(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
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
                                 dq + 2 * d.C, 3 * d.C, d.T, {d.T, true}, d.hd, d.scale,
                                 flash_tiles::Work(w, d.T, d.hd));
    });
    return;
  }
  flash_gemm::backward<float>(c, d, nullptr);
}

// ---- bf16: native or emulated (flash_gemm.h) -----------------------------------------

void flash_attention_bf16(const KernelCall& c) {
  flash_gemm::forward_bf16(c, attention_dims(c, c.in(0).shape()), nullptr);
}
void flash_attention_backward_bf16(const KernelCall& c) {
  flash_gemm::backward_bf16(c, attention_dims(c, c.in(1).shape()), nullptr);
}

}  // namespace

void register_flash_attention_kernels(core::KernelRegistry& r) {
  r.add(core::OpKind::flash_attention, core::DType::f32, flash_attention_f32);
  r.add(core::OpKind::flash_attention, core::DType::bf16, flash_attention_bf16);
  r.add(core::OpKind::flash_attention_backward, core::DType::f32, flash_attention_backward_f32);
  r.add(core::OpKind::flash_attention_backward, core::DType::bf16, flash_attention_backward_bf16);
}

}  // namespace brisk::cpu
