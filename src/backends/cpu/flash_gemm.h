// Flash attention's (query tile x key tile) products through gemm.h, one
// (batch, head) pair per thread: the kernels of flash_attention.cpp (causal)
// and masked_flash_attention.cpp (bidirectional over a right-padded batch)
// where the AVX2 register tiles (flash_tiles.h) do not run, and every bf16
// kernel of both. The algorithm is described in flash_gemm.cpp.
#pragma once

#include <cstdint>

#include "brisk/core/op.h"
#include "attention_util.h"

namespace brisk::cpu::flash_gemm {

// Query rows and keys per tile. Must not exceed the sizes the ops'
// planned workspace assumes (flash_workspace_bytes, src/ops/attention_shapes.h).
constexpr int64_t kTileQ = 128, kTileK = 256;

// `lengths` (B) i32: each sequence's valid keys, every query row seeing keys
// [0, lengths[b]) (masked_flash_attention); null: causal, query row t seeing
// keys [0, t] (flash_attention). The inputs are the ops' own: forward qkv
// (0) -> y (0), lse (1); backward dy, qkv, y, lse (0-3) -> dqkv (0).
// Masked: the last key tile of a sequence is rounded up to 16 keys, so its
// padded rows of k and v up to there are read (their probability is 0): like
// the padded query rows every row of the output depends on, they must be
// finite, as any model's padded positions are (a NaN there reaches the real
// rows' gradients either way).

// E = float (f32) or uint16_t (bf16-native: bf16 operands where they lie,
// f32 accumulation).
template <class E>
void forward(const core::KernelCall& c, const AttentionDims& d, const int32_t* lengths);
template <class E>
void backward(const core::KernelCall& c, const AttentionDims& d, const int32_t* lengths);

// bf16-emulated: each head's bf16 inputs widened into f32 scratch, the f32
// code, the results narrowed.
void forward_bf16_emulated(const core::KernelCall& c, const AttentionDims& d, const int32_t* lengths);
void backward_bf16_emulated(const core::KernelCall& c, const AttentionDims& d, const int32_t* lengths);

// The f32 kernels of both ops: the AVX2 register tiles where
// cpu_features().attention_tiles says they run (flash_tiles.h), forward<float>
// / backward<float> elsewhere.
void forward_f32(const core::KernelCall& c, const AttentionDims& d, const int32_t* lengths);
void backward_f32(const core::KernelCall& c, const AttentionDims& d, const int32_t* lengths);

// The bf16 kernels of both ops: bf16-native where gemm.h takes bf16
// operands (CPUs with avx512_bf16), emulated elsewhere.
void forward_bf16(const core::KernelCall& c, const AttentionDims& d, const int32_t* lengths);
void backward_bf16(const core::KernelCall& c, const AttentionDims& d, const int32_t* lengths);

}  // namespace brisk::cpu::flash_gemm
