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
#include "attention_util.h"
#include "flash_gemm.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;
using Dims = AttentionDims;

// ---- f32 and bf16 (flash_gemm.h) ----------------------------------------------------

void flash_attention_f32(const KernelCall& c) {
  flash_gemm::forward_f32(c, attention_dims(c, c.in(0).shape()), nullptr);
}
void flash_attention_backward_f32(const KernelCall& c) {
  flash_gemm::backward_f32(c, attention_dims(c, c.in(1).shape()), nullptr);
}
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
