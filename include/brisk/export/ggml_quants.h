// ggml's weight formats, written by `brisk export gguf` (docs/export.md):
// f32, f16, the 32-element block formats Q8_0 and Q4_0, and the 256-element
// "K-quant" super-block formats Q4_K, Q5_K and Q6_K. Each quantizer follows
// ggml's reference quantizers (quantize_row_*_ref, the path llama-quantize
// takes without an importance matrix) operation for operation, so a file
// written here holds the bytes llama.cpp's own tool writes from the same
// fp32 weights (`GgmlQuants.BytesAreGgmlsOwn`).
//
// Layouts (little-endian, f16 scales), per block:
//   Q8_0 (34 B / 32):  d, int8 q[32]                       x = d q
//   Q4_0 (18 B / 32):  d, q[16] (j low nibble, j+16 high)   x = d (q - 8)
//   Q4_K (144 B / 256): d, dmin, scales[12] (8 x 6-bit scale and min),
//                       q[128] (4-bit)                      x = d sc q - dmin m
//   Q5_K (176 B / 256): d, dmin, scales[12], qh[32] (5th bits), q[128]
//   Q6_K (210 B / 256): ql[128], qh[64], int8 scales[16], d  x = d sc (q - 32)
#pragma once

#include <cstddef>
#include <cstdint>

namespace brisk::exporter::ggml {

// ggml's type ids (ggml.h), as a GGUF tensor info stores them.
enum class Type : uint32_t { f32 = 0, f16 = 1, q4_0 = 2, q8_0 = 8, q4_K = 12, q5_K = 13, q6_K = 14 };

inline constexpr int64_t kSuperBlock = 256;  // QK_K: the K-quants' block length

const char* type_name(Type t);  // "f32", "q4_K", ... as llama.cpp prints them
int64_t block_length(Type t);   // values per block (1 for f32 and f16)
size_t block_bytes(Type t);     // bytes per block
// Bytes of n values, n a multiple of block_length(t).
size_t row_bytes(Type t, int64_t n);

// Writes n values (n a multiple of block_length(t), else
// std::invalid_argument) as row_bytes(t, n) bytes at out. Throws
// std::range_error when a value is too large for the format's f16 values or
// scales (an infinity would be stored).
void quantize(Type t, const float* x, int64_t n, uint8_t* out);

}  // namespace brisk::exporter::ggml
