// Helpers for CPU kernels: bf16 widening/narrowing of whole rows and a
// parallel-for that splits a range into chunks large enough to be worth a
// thread (small tensors run on the calling thread).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "brisk/core/backend.h"
#include "brisk/core/dtype.h"

namespace brisk::cpu {

// Below this many elements a loop is not worth waking the thread team for.
inline constexpr int64_t kParallelGrain = 16384;

// Calls fn(begin, end) over [0, n) split across threads.
template <class Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= grain || omp_get_max_threads() == 1) {
    fn(int64_t(0), n);
    return;
  }
  const int64_t chunks = std::min<int64_t>(omp_get_max_threads(), (n + grain - 1) / grain);
#pragma omp parallel for schedule(static) num_threads(int(chunks))
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    fn(b, e);
  }
}

// Calls fn(i, state) for every i in [0, n), handing items to threads one at
// a time as they finish: for items of uneven cost, such as the attention of
// sequences of different lengths, where an even split of the range leaves
// one thread idle while another works through the long ones. fn(i, state)
// must not depend on which thread runs it. Every thread of the team calls
// setup() once per call, whether or not it gets an item, so per-thread
// buffers (scratch()) reach their size on the first call and a steady state
// allocates nothing, whichever thread takes which item.
template <class Setup, class Fn>
void parallel_for_each(int64_t n, Setup&& setup, Fn&& fn) {
  const int threads = int(std::min<int64_t>(omp_get_max_threads(), std::max<int64_t>(n, 1)));
  if (threads == 1) {
    auto state = setup();
    for (int64_t i = 0; i < n; ++i) fn(i, state);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    auto state = setup();
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) fn(i, state);
  }
}

// Element access for kernels templated on float or bf16 storage (uint16_t).
inline float widen(float v) { return v; }
inline float widen(uint16_t h) { return core::bf16_to_f32(h); }
// f16 storage is spelled core::f16 (uint16_t already means bf16 here), so a
// kernel template instantiated on it gets IEEE half conversions: F16C
// instructions where the build has them, overflow to +-inf either way (the
// loss scaler relies on an overflowing fp16 gradient becoming inf).
inline float widen(core::f16 h) {
#if defined(__F16C__)
  return _cvtsh_ss(h.bits);
#else
  return core::f16_to_f32(h.bits);
#endif
}
template <class T>
inline T narrow(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, core::f16>) {
    core::f16 h;
#if defined(__F16C__)
    h.bits = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
#else
    h.bits = core::f32_to_f16(v);
#endif
    return h;
  } else return core::f32_to_bf16(v);
}

// fn(S{}) with S the storage type of a float dtype as the kernel templates
// spell it: uint16_t for bf16, core::f16 for f16, float otherwise.
template <class Fn>
void with_storage_of(core::DType t, Fn&& fn) {
  switch (t) {
    case core::DType::bf16: return fn(uint16_t{});
    case core::DType::f16: return fn(core::f16{});
    default: return fn(float{});
  }
}

inline void bf16_to_f32_row(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = core::bf16_to_f32(src[i]);
}
inline void f32_to_bf16_row(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = core::f32_to_bf16(src[i]);
}

}  // namespace brisk::cpu
