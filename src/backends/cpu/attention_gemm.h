// The causal attention kernels' matrix products through gemm.h (plain and
// flash): one head per thread, so every call runs nested, single-threaded,
// inside the kernel's parallel region. Element types are float, or bf16
// (uint16_t) operands on the bf16-native path, where the products take bf16
// and accumulate in f32.
#pragma once

#include <type_traits>

#include "gemm.h"

namespace brisk::cpu {

template <class E>
constexpr core::DType dtype_of = std::is_same_v<E, float> ? core::DType::f32 : core::DType::bf16;

// C (m, n) = alpha op(A) op(B) + beta C, beta 0 or 1.
template <class EA, class EC>
void mm(GemmCache& cache, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const EA* a, int64_t lda,
        const EA* b, int64_t ldb, float beta, EC* c, int64_t ldc) {
  Gemm g;
  g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.beta = beta;
  g.a = a, g.lda = lda, g.b = b, g.ldb = ldb, g.c = c, g.ldc = ldc;
  g.ab_type = dtype_of<EA>, g.c_type = dtype_of<EC>;
  gemm(cache, g);
}

}  // namespace brisk::cpu
