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
#include "brisk/ops/layout.h"
#include "attention_util.h"
#include "flash_gemm.h"
#include "kernels.h"

namespace brisk::cpu {
namespace {

using core::KernelCall;
using Dims = AttentionDims;

// One kernel per direction for f32 and bf16 (registered for both): the
// lengths are checked before flash_gemm's parallel regions (the check throws).
void masked_flash_attention(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(0).shape());
  const int32_t* lengths = c.in(1).as<const int32_t>();
  ops::check_lengths("masked_flash_attention", lengths, d.B, d.T);
  c.in(0).dtype() == core::DType::bf16 ? flash_gemm::forward_bf16(c, d, lengths)
                                       : flash_gemm::forward_f32(c, d, lengths);
}

void masked_flash_attention_backward(const KernelCall& c) {
  const Dims d = attention_dims(c, c.in(1).shape());
  const int32_t* lengths = c.in(4).as<const int32_t>();
  ops::check_lengths("masked_flash_attention_backward", lengths, d.B, d.T);
  c.in(1).dtype() == core::DType::bf16 ? flash_gemm::backward_bf16(c, d, lengths)
                                       : flash_gemm::backward_f32(c, d, lengths);
}

}  // namespace

void register_masked_flash_attention_kernels(core::KernelRegistry& r) {
  for (core::DType t : {core::DType::f32, core::DType::bf16}) {
    r.add(core::OpKind::masked_flash_attention, t, masked_flash_attention);
    r.add(core::OpKind::masked_flash_attention_backward, t, masked_flash_attention_backward);
  }
}

}  // namespace brisk::cpu
